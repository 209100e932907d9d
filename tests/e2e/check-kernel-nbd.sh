#!/bin/bash
# The Linux kernel's own NBD client against the server under test: boots
# Debian's stock kernel in a qemu TCG guest (tests/guest/run-guest.sh) that
# connects /dev/nbd0 to the server on the host (127.0.0.1:PORT, 10.0.2.2:PORT
# from the guest) with nbd-client, runs fio O_DIRECT random writes (4 KiB and
# mixed sizes up to 1 MiB) with flushes and crc32c verify, blkdiscard and a
# zero read-back, mkfs.ext4, a tree of files, e2fsck -fn, disconnect
# (tests/guest/kernel-nbd.sh PHASE=write); then restarts the server (SIGTERM)
# and, in a second boot over two connections, e2fsck -fn again and checks
# every file's checksum (PHASE=verify). Fails, never skips, where the guest
# cannot be fetched or booted. Guest consoles: $E2E_LOGS/kernel-nbd-*.log.
set -euo pipefail
export SERVER_KIND=${SERVER_KIND:-flashpool}
source "$(dirname "$0")/lib.sh"
GUEST=$ROOT/tests/guest
LOGS=${E2E_LOGS:-/tmp/nbd-e2e-logs}
mkdir -p "$LOGS"
export GUEST_TIMEOUT=${GUEST_TIMEOUT:-150}
new_workdir
trap cleanup EXIT

cmd=$(server_cmd)
[ -x "${cmd%% *}" ] || build_server || die "cannot build the server"

# Fetch and build first, so a broken harness fails before the server starts.
bash "$GUEST/fetch.sh" >/dev/null || die "guest packages unavailable (see above)"

start_server
echo "server on 127.0.0.1:$PORT; guest 1: write"
GUEST_LOG=$LOGS/kernel-nbd-write.log bash "$GUEST/run-guest.sh" "$GUEST/kernel-nbd.sh" \
    PHASE=write NBD_PORT="$PORT" NBD_CONNS=1 FIO_MB="${FIO_MB:-32}" ||
    die "guest write phase (console: $LOGS/kernel-nbd-write.log)"
grep -a '^kernel-nbd' "$LOGS/kernel-nbd-write.log" | tr -d '\r'
sums=$(grep -a '^KERNEL-NBD-SUMS ' "$LOGS/kernel-nbd-write.log" | tr -d '\r' | awk '{print $2}')
[ ${#sums} -eq 64 ] || die "the write phase printed no checksum list hash"

echo "restarting the server"
stop_server
start_server
echo "guest 2: verify after restart (2 connections)"
GUEST_LOG=$LOGS/kernel-nbd-verify.log bash "$GUEST/run-guest.sh" "$GUEST/kernel-nbd.sh" \
    PHASE=verify NBD_PORT="$PORT" NBD_CONNS=2 SUMS_HASH="$sums" ||
    die "guest verify phase (console: $LOGS/kernel-nbd-verify.log)"
grep -a '^kernel-nbd' "$LOGS/kernel-nbd-verify.log" | tr -d '\r'
stop_server
echo "kernel NBD client: write, restart, verify passed"
