#!/bin/bash
# Fetches (never installs) the Debian trixie user space the NVMe/TCP TLS check needs in the
# guest: nvme-cli 2.13 (libnvme 1.13: `nvme check-tls-key --insert`, `nvme connect --tls`),
# ktls-utils 1.0.0 (tlshd, the TLS handshake agent of the kernel) and keyutils (keyctl), with
# trixie's glibc and every library they load. bookworm's nvme-cli (2.3) has no TLS, and trixie
# binaries need trixie's glibc, so they get a tree of their own in the guest, /opt/trixie
# (bin/, lib/ with the loader), run through trixie's loader:
#   /opt/trixie/run PROGRAM ARGS   (= ld-linux-x86-64.so.2 --library-path /opt/trixie/lib ...)
# and /opt/trixie/{nvme,tlshd,keyctl} wrappers. The bookworm tools of the base initramfs are
# untouched. Uses a private apt state (trixie's package lists in the cache, not the host's).
# Prints the path of the extra initramfs archive ($CACHE/trixie.cpio.gz), appended to the
# base one by run-guest.sh (GUEST_EXTRA_INITRD). A complete cache is reused offline.
#
#   tests/guest/fetch-trixie.sh        GUEST_TRIXIE_CACHE=DIR overrides the cache dir
set -euo pipefail
GUEST_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$GUEST_DIR/../.." && pwd)
CACHE=${GUEST_TRIXIE_CACHE:-$ROOT/target/guest-cache-trixie}
SUITE=${GUEST_TRIXIE_SUITE:-trixie}
PACKAGES=(nvme-cli libnvme1t64 ktls-utils keyutils libkeyutils1 libc6 libatomic1 libjson-c5
          libssl3t64 libgnutls30t64 libp11-kit0 libidn2-0 libunistring5 libtasn1-6
          libnettle8t64 libhogweed6t64 libgmp10 libffi8 libzstd1 zlib1g libglib2.0-0t64
          libpcre2-8-0 libnl-3-200 libnl-genl-3-200)
PROGRAMS=(usr/sbin/nvme usr/sbin/tlshd usr/bin/keyctl)
STAMP_VERSION=1
die() { echo "trixie fetch FAILED: $*" >&2; exit 1; }

out=$CACHE/trixie.cpio.gz
stamp=$CACHE/fetched.stamp
if [ -f "$stamp" ] && [ -f "$out" ] && [ "$(cat "$stamp")" = "v$STAMP_VERSION $SUITE ${PACKAGES[*]}" ]; then
    echo "$out"; exit 0
fi
command -v apt-get >/dev/null || die "apt-get not found"
mkdir -p "$CACHE/apt/lists/partial" "$CACHE/apt/cache/archives/partial" "$CACHE/debs"
echo "deb http://deb.debian.org/debian $SUITE main" > "$CACHE/apt/sources.list"
o=(-o "Dir::Etc::SourceList=$CACHE/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
   -o "Dir::State::Lists=$CACHE/apt/lists" -o "Dir::Cache=$CACHE/apt/cache"
   -o Dir::State::Status=/dev/null -o APT::Sandbox::User=root)
apt-get "${o[@]}" update -q >&2 || die "apt-get update of $SUITE failed (no network to deb.debian.org?)"
rm -f "$CACHE"/debs/*.deb
(cd "$CACHE/debs" && apt-get "${o[@]}" download -q "${PACKAGES[@]}" >&2) || die "apt-get download failed"
rm -rf "$CACHE/root"
mkdir -p "$CACHE/root"
for d in "$CACHE"/debs/*.deb; do dpkg-deb -x "$d" "$CACHE/root"; done
for p in "${PROGRAMS[@]}"; do [ -x "$CACHE/root/$p" ] || die "$p missing from the $SUITE packages"; done

# The archive: programs, every shared object of the packages (by file name, links resolved),
# the loader, the wrappers.
python3 - "$CACHE/root" "$out" "${PROGRAMS[@]}" <<'PY'
import gzip, os, stat, sys
root, out, programs = sys.argv[1], sys.argv[2], sys.argv[3:]
entries, seen, ino = [], set(), [5000]
def entry(name, mode, data=b""):
    ino[0] += 1
    nb = name.encode() + b"\0"
    hdr = "070701" + "".join("%08x" % v for v in (ino[0], mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(nb), 0))
    b = hdr.encode() + nb
    b += b"\0" * (-len(b) % 4)
    b += data + b"\0" * (-len(data) % 4)
    entries.append(b)
def dirs(path):
    parts = path.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d not in seen:
            seen.add(d); entry(d, stat.S_IFDIR | 0o755)
def file(path, data, mode=0o755):
    if path in seen: return
    dirs(path); seen.add(path); entry(path, stat.S_IFREG | mode, data)
libs = 0
for d in ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu"):
    full = os.path.join(root, d)
    for f in sorted(os.listdir(full)) if os.path.isdir(full) else []:
        p = os.path.join(full, f)
        if ".so" in f and os.path.isfile(p):
            file("opt/trixie/lib/" + f, open(os.path.realpath(p), "rb").read()); libs += 1
for p in programs:
    name = os.path.basename(p)
    file("opt/trixie/bin/" + name, open(os.path.join(root, p), "rb").read())
    file("opt/trixie/" + name, ("#!/bin/sh\nexec /opt/trixie/lib/ld-linux-x86-64.so.2 "
         "--library-path /opt/trixie/lib /opt/trixie/bin/%s \"$@\"\n" % name).encode())
file("opt/trixie/run", b"#!/bin/sh\np=$1; shift\nexec /opt/trixie/lib/ld-linux-x86-64.so.2 "
     b"--library-path /opt/trixie/lib \"$p\" \"$@\"\n")
entry("TRAILER!!!", 0)
tmp = out + ".tmp"
with open(tmp, "wb") as f:
    f.write(gzip.compress(b"".join(entries), compresslevel=6))
os.replace(tmp, out)
print("trixie archive %s: %d programs, %d libraries" % (out, len(programs), libs), file=sys.stderr)
PY
printf 'v%s %s %s' "$STAMP_VERSION" "$SUITE" "${PACKAGES[*]}" > "$stamp"
echo "$out"
