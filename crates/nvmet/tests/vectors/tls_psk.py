#!/usr/bin/env python3
"""Independent computation (Python hashlib/hmac, no flashpool code) of the NVMe/TCP TLS PSK
derivation as libnvme 1.13 / nvme-cli 2.13 do it (src/nvme/linux.c: derive_retained_key,
derive_psk_digest, derive_tls_key), to check `crates/nvmet/src/psk.rs` against.

    configured key   = base64-decoded NVMeTLSkey-1:HH:...: minus its CRC-32
    HKDF-Extract     = HMAC(salt = empty, ikm)            (RFC 5869)
    HKDF-Expand(L)   = T(1) | T(2) ... with T(i) = HMAC(PRK, T(i-1) | info | i)
    libnvme's "Expand-Label" info (not RFC 8446's: no length byte before label and context,
    and the 16-bit length in host order, little-endian on x86):
        info = le16(L) | "tls13 " | label | context
    retained PSK     = Expand(Extract(configured), le16(L) "tls13 HostNQN" hostnqn, L)
                       (HH = 00: the configured key itself)
    digest (v1)      = base64(HMAC_hash(retained, hostnqn " " subnqn " NVMe-over-Fabrics"))
    identity         = "NVMe0RHH host sub"  or  "NVMe1RHH host sub digest"
    TLS PSK          = Expand(Extract(retained), le16(L) "tls13 nvme-tls-psk" ctx, L)
                       ctx = the identity (v0), or "HH " digest (v1)
The hash of all steps is SHA-256 for 32-byte keys (HH 01) and SHA-384 for 48-byte ones.

Run it to print the vectors the Rust unit tests hold (hex).
"""
import base64
import hashlib
import hmac
import struct
import zlib


def hkdf(md, ikm, info, length):
    prk = hmac.new(b"", ikm, md).digest()
    out, t, i = b"", b"", 1
    while len(out) < length:
        t = hmac.new(prk, t + info + bytes([i]), md).digest()
        out += t
        i += 1
    return out[:length]


def label_info(length, label, context):
    return struct.pack("<H", length) + b"tls13 " + label + context


def parse(interchange):
    _, hh, b64, _ = interchange.split(":")
    raw = base64.b64decode(b64)
    key, crc = raw[:-4], raw[-4:]
    assert zlib.crc32(key).to_bytes(4, "little") == crc
    return int(hh), key


def derive(interchange, host, sub, version):
    hh, key = parse(interchange)
    md = hashlib.sha256 if len(key) == 32 else hashlib.sha384
    cipher = hh if hh else (1 if len(key) == 32 else 2)
    if hh:
        retained = hkdf(md, key, label_info(len(key), b"HostNQN", host.encode()), len(key))
    else:
        retained = key
    if version == 0:
        identity = "NVMe0R%02d %s %s" % (cipher, host, sub)
        ctx = identity.encode()
    else:
        mac = hmac.new(retained, ("%s %s NVMe-over-Fabrics" % (host, sub)).encode(), md).digest()
        digest = base64.b64encode(mac).decode()
        identity = "NVMe1R%02d %s %s %s" % (cipher, host, sub, digest)
        ctx = ("%02d " % cipher).encode() + digest.encode()
    psk = hkdf(md, retained, label_info(len(key), b"nvme-tls-psk", ctx), len(key))
    return retained, identity, psk


KEY32 = bytes.fromhex("5512DBB6737D0106F65975B773DFB011FFC344BCF442E2DD6D8BC4870B5D5B03")
KEY48 = KEY32 + bytes.fromhex("FFC344BCF442E2DD6D8BC4870B5D5B03")


def interchange(hh, key):
    return "NVMeTLSkey-1:%02d:%s:" % (hh, base64.b64encode(key + zlib.crc32(key).to_bytes(4, "little")).decode())


if __name__ == "__main__":
    host, sub = "nqn.psk-test-host", "nqn.psk-test-subsys"
    for hh, key in ((1, KEY32), (2, KEY48), (0, KEY32)):
        ic = interchange(hh, key)
        for v in (0, 1):
            retained, identity, psk = derive(ic, host, sub, v)
            print(ic)
            print("  v%d retained %s" % (v, retained.hex()))
            print("  v%d identity %s" % (v, identity))
            print("  v%d tls psk  %s" % (v, psk.hex()))
