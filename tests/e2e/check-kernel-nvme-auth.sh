#!/bin/bash
# NVMe/TCP in-band authentication (DH-HMAC-CHAP) and the host allow-list with
# the Linux kernel's own initiator: starts crates/nvmet/examples/nvmet-mem on
# the host's 127.0.0.1:PORT with --allow-host and --dhchap-secret FILE (a
# mode-600 file of `HOSTNQN DHHC-1:..: [CTRL-SECRET]` lines written here with
# fresh random keys) and boots a qemu TCG guest running
# tests/guest/nvme-auth.sh, which connects with `nvme connect --hostnqn H
# --dhchap-secret ...` and checks: the right secret connects and 4 MiB of
# O_DIRECT data round-trips (32-, 48- and 64-byte keys: SHA-256, SHA-384,
# SHA-512), a wrong secret, no secret, a host not on the list (with or
# without a secret) and a wrong controller secret are refused, bidirectional
# authentication (--dhchap-ctrl-secret) connects, an allow-listed host without
# a secret connects. Two boots: the NULL DH group, then the target preferring
# ffdhe2048 (a real DH exchange). Also: a bad secrets file stops nvmet-mem at
# startup with the line number, and a world-readable one gets a warning.
#
# Debian bookworm's default kernel (6.1) is built without CONFIG_NVME_AUTH, so
# this check boots bookworm's linux-image-6.12.*+deb12-amd64 package (the
# newest apt knows; GUEST_AUTH_KERNEL_PKG overrides) from its own cache
# ($TARGET/guest-cache-auth). It exits 77 (SKIP) only when that kernel lacks
# in-band authentication; it fails where the guest cannot be fetched or booted.
# Guest consoles: $E2E_LOGS/kernel-nvme-auth-{null,ffdhe}.log.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
NQN=${NVME_NQN:-nqn.2024-01.io.flashpool:e2e-auth}
guest_nvme_setup 240
guest_newer_kernel
if grep -q 'CONFIG_NVME_HOST_AUTH' "$config"; then
    auth_opt=CONFIG_NVME_HOST_AUTH
else
    auth_opt=CONFIG_NVME_AUTH
fi
if ! grep -q "^$auth_opt=y" "$config"; then
    echo "SKIP: the guest kernel $kpkg has no in-band authentication ($auth_opt is not set in $(basename "$config"))"
    exit 77
fi
echo "guest kernel $kpkg: $auth_opt=y"

# secret HASH LEN: a fresh DHHC-1 secret (as `nvme gen-dhchap-key` writes them).
secret() {
    python3 -c 'import base64, os, sys, zlib
k = os.urandom(int(sys.argv[2]))
print("DHHC-1:%s:%s:" % (sys.argv[1], base64.b64encode(k + zlib.crc32(k).to_bytes(4, "little")).decode()))' "$1" "$2"
}
HOST_A=nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-4000-8000-00000000000a
HOST_B=nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-4000-8000-00000000000b
HOST_C=nqn.2014-08.org.nvmexpress:uuid:cccccccc-0000-4000-8000-00000000000c
HOST_D=nqn.2014-08.org.nvmexpress:uuid:dddddddd-0000-4000-8000-00000000000d
HOST_PLAIN=nqn.2014-08.org.nvmexpress:uuid:eeeeeeee-0000-4000-8000-00000000000e
HOST_DENIED=nqn.2014-08.org.nvmexpress:uuid:ffffffff-0000-4000-8000-00000000000f
KEY_A=$(secret 01 32) KEY_A_WRONG=$(secret 01 32) KEY_B=$(secret 00 32) CTRL_B=$(secret 02 48)
KEY_C=$(secret 02 48) KEY_D=$(secret 03 64)
SECRETS=$WORK/dhchap-secrets
umask 077
cat > "$SECRETS" <<EOF
# host NQN, its secret, [controller secret]
$HOST_A $KEY_A
$HOST_B $KEY_B $CTRL_B
$HOST_C	$KEY_C
$HOST_D $KEY_D
EOF
umask 022

# A bad secrets file: nvmet-mem refuses to start, naming the line; never echoes the secret.
printf '# comment\n%s DHHC-1:01:AAAA:\n' "$HOST_A" > "$WORK/bad-secrets"
chmod 600 "$WORK/bad-secrets"
if "$TARGET/release/examples/nvmet-mem" --listen 127.0.0.1:0 --dhchap-secret "$WORK/bad-secrets" \
    >"$WORK/bad.out" 2>&1; then
    die "nvmet-mem started with a bad secrets file"
fi
grep -q 'line 2' "$WORK/bad.out" || { cat "$WORK/bad.out" >&2; die "the bad-secrets error does not name line 2"; }
echo "bad secrets file refused: $(head -1 "$WORK/bad.out")"
# A world-readable one: a warning (and it still serves).
cp "$SECRETS" "$WORK/open-secrets" && chmod 644 "$WORK/open-secrets"
timeout 2 "$TARGET/release/examples/nvmet-mem" --listen 127.0.0.1:0 --dhchap-secret "$WORK/open-secrets" \
    >"$WORK/open.out" 2>&1 || true
grep -q 'readable by others' "$WORK/open.out" || { cat "$WORK/open.out" >&2; die "no warning for a world-readable secrets file"; }
echo "world-readable secrets file: warned"

start_target() { # start_target EXTRA-ARGS...
    start_nvmet_mem --nqn "$NQN" --size 64M --allow-host "$HOST_PLAIN" --dhchap-secret "$SECRETS" "$@"
    grep -q 'readable by others' "$WORK/server.log" && die "warned about a mode-600 secrets file"
    return 0
}
stop_target() {
    kill -0 "$SERVER_PID" 2>/dev/null || die "nvmet-mem died during the run"
    if grep -q 'panicked' "$WORK/server.log"; then cat "$WORK/server.log" >&2; die "nvmet-mem panicked"; fi
    kill -TERM "$SERVER_PID"
    wait "$SERVER_PID" || die "nvmet-mem exited with status $? on SIGTERM"
    SERVER_PID=
}

guest_run() { # guest_run NAME
    local name=$1 rc=0
    echo "guest ($name): right/wrong/no secret, allow-list, bidirectional, SHA-256/384/512"
    GUEST_LOG=$LOGS/kernel-nvme-auth-$name.log bash "$GUEST/run-guest.sh" "$GUEST/nvme-auth.sh" \
        NVME_ADDR=10.0.2.2 NVME_PORT="$PORT" NVME_NQN="$NQN" \
        HOST_A="$HOST_A" KEY_A="$KEY_A" KEY_A_WRONG="$KEY_A_WRONG" HOST_B="$HOST_B" KEY_B="$KEY_B" \
        CTRL_B="$CTRL_B" HOST_C="$HOST_C" KEY_C="$KEY_C" HOST_D="$HOST_D" KEY_D="$KEY_D" \
        HOST_PLAIN="$HOST_PLAIN" HOST_DENIED="$HOST_DENIED" || rc=$?
    grep -a -E '^nvme-auth' "$LOGS/kernel-nvme-auth-$name.log" | tr -d '\r' || true
    if [ "$rc" -ne 0 ]; then
        echo "--- target log (tail) ---" >&2; tail -30 "$WORK/server.log" >&2
        die "guest NVMe/TCP auth run $name (console: $LOGS/kernel-nvme-auth-$name.log)"
    fi
    # The target's view: each hash was negotiated, refusals were logged.
    for h in sha256 sha384 sha512; do
        grep -q "hash=\"hmac($h)\"\|hash=hmac($h)" "$WORK/server.log" || die "$name: no host authenticated with $h"
    done
    grep -q 'bidirectional=true' "$WORK/server.log" || die "$name: no bidirectional authentication"
    grep -q 'does not match its secret' "$WORK/server.log" || die "$name: the wrong secret was not logged"
    grep -q 'host not allowed' "$WORK/server.log" || die "$name: the refused host was not logged"
}

start_target
guest_run null
grep -q 'dhgroup="null"\|dhgroup=null' "$WORK/server.log" || die "null: the NULL DH group was not used"
stop_target
start_target --dhchap-dhgroup ffdhe2048
guest_run ffdhe
grep -q 'dhgroup="ffdhe2048"\|dhgroup=ffdhe2048' "$WORK/server.log" || die "ffdhe: ffdhe2048 was not used"
stop_target
echo "kernel NVMe/TCP in-band authentication: DH-HMAC-CHAP SHA-256/384/512, NULL and ffdhe2048, bidirectional, wrong/no secret refused, allow-list passed"
