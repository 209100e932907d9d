#!/bin/bash
# NVMe/TCP over TLS 1.3 with pre-shared keys, with the Linux kernel's own initiator: starts
# crates/nvmet/examples/nvmet-mem on the host's 127.0.0.1:PORT with `--tls require --tls-psk
# FILE` (a mode-600 file of `HOSTNQN NVMeTLSkey-1:..:` lines written here with fresh random
# keys, as `nvme gen-tls-key` prints them), an allow-list and a DH-HMAC-CHAP secret for one
# host, and boots a qemu TCG guest running tests/guest/nvme-tls.sh: tlshd (ktls-utils 1.0.0)
# runs the handshakes, `nvme check-tls-key --insert` (nvme-cli 2.13) puts the derived keys into
# the .nvme keyring, and `nvme connect --tls` must connect and round-trip 4 MiB of O_DIRECT
# data with SHA-256 keys (v1 and v0 identities, TLS_AES_128_GCM_SHA256); a wrong key and a
# plain connect are refused; TLS with DH-HMAC-CHAP connects. A SHA-384 key is tried: trixie's
# tlshd cannot do it (docs/NVME.md, TLS limits), so its refusal must be that one. Also: a bad PSK file stops nvmet-mem naming the line, a
# world-readable one is refused.
#
# The guest boots Debian bookworm's linux-image-6.12 package (CONFIG_NVME_TCP_TLS=y; the
# cache of check-kernel-nvme-auth.sh, $TARGET/guest-cache-auth, is shared) with the trixie
# tree of tests/guest/fetch-trixie.sh appended to its initramfs (bookworm's nvme-cli has no
# TLS). Exits 77 (SKIP) only when that kernel lacks CONFIG_NVME_TCP_TLS; it fails where the
# guest cannot be fetched or booted. Guest console: $E2E_LOGS/kernel-nvme-tls.log.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
NQN=${NVME_NQN:-nqn.2024-01.io.flashpool:e2e-tls}
guest_nvme_setup 300
guest_newer_kernel
if ! grep -q "^CONFIG_NVME_TCP_TLS=y" "$config"; then
    echo "SKIP: the guest kernel $kpkg has no NVMe/TCP TLS (CONFIG_NVME_TCP_TLS is not set)"
    exit 77
fi
extra=$(bash "$GUEST/fetch-trixie.sh") || die "cannot fetch the trixie packages (nvme-cli 2.13, ktls-utils)"
echo "guest kernel $kpkg: CONFIG_NVME_TCP_TLS=y; trixie tools: $extra"

# psk HH LEN: a fresh configured PSK in interchange format (as `nvme gen-tls-key` prints it).
psk() {
    python3 -c 'import base64, os, sys, zlib
k = os.urandom(int(sys.argv[2]))
print("NVMeTLSkey-1:%s:%s:" % (sys.argv[1], base64.b64encode(k + zlib.crc32(k).to_bytes(4, "little")).decode()))' "$1" "$2"
}
secret() {
    python3 -c 'import base64, os, zlib
k = os.urandom(32)
print("DHHC-1:01:%s:" % base64.b64encode(k + zlib.crc32(k).to_bytes(4, "little")).decode())'
}
HOST_A=nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-4000-8000-0000000000a1
HOST_B=nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-4000-8000-0000000000b2
HOST_C=nqn.2014-08.org.nvmexpress:uuid:cccccccc-0000-4000-8000-0000000000c3
HOST_D=nqn.2014-08.org.nvmexpress:uuid:dddddddd-0000-4000-8000-0000000000d4
HOST_E=nqn.2014-08.org.nvmexpress:uuid:eeeeeeee-0000-4000-8000-0000000000e5
PSK_A=$(psk 01 32) PSK_B=$(psk 01 32) PSK_E=$(psk 02 48) PSK_C=$(psk 01 32) PSK_C_WRONG=$(psk 01 32) PSK_D=$(psk 01 32)
DHCHAP_D=$(secret)
umask 077
cat > "$WORK/tls-psk" <<EOF2
# host NQN, its configured PSK
$HOST_A $PSK_A
$HOST_B	$PSK_B
$HOST_C $PSK_C
$HOST_D $PSK_D
$HOST_E $PSK_E
EOF2
echo "$HOST_D $DHCHAP_D" > "$WORK/dhchap-secrets"
umask 022

# A bad PSK file: refused naming the line, never echoing the key.
printf '# comment\n%s NVMeTLSkey-1:01:AAAA:\n' "$HOST_A" > "$WORK/bad-psk"
chmod 600 "$WORK/bad-psk"
if "$TARGET/release/examples/nvmet-mem" --listen 127.0.0.1:0 --tls require --tls-psk "$WORK/bad-psk" \
    >"$WORK/bad.out" 2>&1; then
    die "nvmet-mem started with a bad PSK file"
fi
grep -q 'line 2' "$WORK/bad.out" || { cat "$WORK/bad.out" >&2; die "the bad-PSK error does not name line 2"; }
echo "bad PSK file refused: $(head -1 "$WORK/bad.out")"
cp "$WORK/tls-psk" "$WORK/open-psk" && chmod 644 "$WORK/open-psk"
if timeout 5 "$TARGET/release/examples/nvmet-mem" --listen 127.0.0.1:0 --tls on --tls-psk "$WORK/open-psk" \
    >"$WORK/open.out" 2>&1; then
    die "nvmet-mem started with a world-readable PSK file"
fi
grep -q 'readable by others' "$WORK/open.out" || { cat "$WORK/open.out" >&2; die "no error for a world-readable PSK file"; }
echo "world-readable PSK file refused"

start_nvmet_mem --nqn "$NQN" --size 64M --allow-host "$HOST_A" --allow-host "$HOST_B" --allow-host "$HOST_C" \
    --allow-host "$HOST_E" --dhchap-secret "$WORK/dhchap-secrets" --tls require --tls-psk "$WORK/tls-psk"

rc=0
echo "guest: TLS identities v1 and v0, SHA-384 tried, wrong key, plain refused, TLS + DH-HMAC-CHAP"
GUEST_EXTRA_INITRD=$extra GUEST_LOG=$LOGS/kernel-nvme-tls.log bash "$GUEST/run-guest.sh" "$GUEST/nvme-tls.sh" \
    NVME_ADDR=10.0.2.2 NVME_PORT="$PORT" NVME_NQN="$NQN" \
    HOST_A="$HOST_A" PSK_A="$PSK_A" HOST_B="$HOST_B" PSK_B="$PSK_B" HOST_C="$HOST_C" \
    PSK_C_WRONG="$PSK_C_WRONG" HOST_D="$HOST_D" PSK_D="$PSK_D" DHCHAP_D="$DHCHAP_D" \
    HOST_E="$HOST_E" PSK_E="$PSK_E" || rc=$?
grep -a -E '^nvme-tls' "$LOGS/kernel-nvme-tls.log" | tr -d '\r' || true
cp "$WORK/server.log" "$LOGS/kernel-nvme-tls-target.log" 2>/dev/null || true
if [ "$rc" -ne 0 ]; then
    echo "--- target log (tail) ---" >&2; tail -30 "$WORK/server.log" >&2
    die "guest NVMe/TCP TLS run (console: $LOGS/kernel-nvme-tls.log, target: $LOGS/kernel-nvme-tls-target.log)"
fi
# The target's view.
grep -q 'TLS secure channel established.*TLS_AES_128_GCM_SHA256' "$WORK/server.log" || die "no TLS_AES_128_GCM_SHA256 session"
grep -q 'TLS secure channel established.*version=0' "$WORK/server.log" || die "no session with a v0 identity"
grep -q 'TLS secure channel established.*version=1' "$WORK/server.log" || die "no session with a v1 identity"
if grep -qa 'SHA384-CONNECTED' "$LOGS/kernel-nvme-tls.log"; then
    grep -q 'TLS secure channel established.*TLS_AES_256_GCM_SHA384' "$WORK/server.log" || die "no TLS_AES_256_GCM_SHA384 session"
else
    grep -q 'tls_parse_ctos_psk:bad extension' "$WORK/server.log" ||
        die "SHA-384 refused for another reason than tlshd's SHA-256 binder (see the target log)"
    echo "note: SHA-384 PSK refused: this tlshd (GnuTLS without SHA-384 PSK credentials) sends a SHA-256 binder with SHA-384 suites only"
fi
grep -q 'TLS connection refused' "$WORK/server.log" || die "the wrong key was not logged"
grep -q 'plain NVMe/TCP connection refused' "$WORK/server.log" || die "the plain connection was not logged"
grep -q 'bidirectional=' "$WORK/server.log" || die "no DH-HMAC-CHAP over TLS"
kill -0 "$SERVER_PID" 2>/dev/null || die "nvmet-mem died during the run"
if grep -q 'panicked' "$WORK/server.log"; then die "nvmet-mem panicked"; fi
kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || die "nvmet-mem exited with status $? on SIGTERM"
SERVER_PID=

# The product as users run it: `flashpool serve --nvme-tls require` with the same key file,
# the pool's volume as the namespace (flashpool only).
if [ "${SERVER_KIND:-}" = flashpool ]; then
    NVME_PORT=$((PORT + 1))
    cp "$WORK/server.log" "$LOGS/kernel-nvme-tls-target.log"
    : > "$WORK/server.log"
    SERVER_CMD="$TARGET/release/flashpool serve --volume-size 64M --nvme-tcp 127.0.0.1:$NVME_PORT --nvme-allow-host $HOST_A --nvme-tls require --nvme-tls-psk $WORK/tls-psk" start_server
    POOL_NQN=$(grep -o 'nqn\.[^ ]*pool-[0-9a-f-]*' "$WORK/server.log" | head -1)
    [ -n "$POOL_NQN" ] || die "flashpool serve printed no NVMe/TCP URI"
    rc=0
    GUEST_EXTRA_INITRD=$extra GUEST_LOG=$LOGS/kernel-nvme-tls-serve.log bash "$GUEST/run-guest.sh" "$GUEST/nvme-tls.sh" \
        NVME_ADDR=10.0.2.2 NVME_PORT="$NVME_PORT" NVME_NQN="$POOL_NQN" ONLY_A=1 \
        HOST_A="$HOST_A" PSK_A="$PSK_A" || rc=$?
    grep -a -E '^nvme-tls' "$LOGS/kernel-nvme-tls-serve.log" | tr -d '\r' || true
    if [ "$rc" -ne 0 ]; then
        tail -30 "$WORK/server.log" >&2
        die "guest NVMe/TCP TLS run against flashpool serve (console: $LOGS/kernel-nvme-tls-serve.log)"
    fi
    grep -q 'TLS secure channel established' "$WORK/server.log" || die "flashpool serve logged no TLS session"
    grep -q 'plain NVMe/TCP connection refused' "$WORK/server.log" || die "flashpool serve did not log the plain refusal"
    grep -q panicked "$WORK/server.log" && die "flashpool serve panicked"
    stop_server
    echo "flashpool serve --nvme-tls require: the kernel initiator connected over TLS to the pool's volume; plain refused"
fi
echo "kernel NVMe/TCP TLS (nvmet-mem): PSK SHA-256, identities v0 and v1, wrong key and plain refused, TLS + DH-HMAC-CHAP"
