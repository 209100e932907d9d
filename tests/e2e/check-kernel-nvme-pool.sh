#!/bin/bash
# The Linux kernel's NVMe/TCP initiator against `flashpool serve --nvme-tcp` (flashpool only):
# the pool's volume as a namespace, through the same engine calls as NBD. One qemu TCG guest
# boot (tests/guest/nvme-tcp.sh): `nvme discover` lists the pool's subsystem (NQN from the
# pool's UUID), `nvme connect`, fio O_DIRECT random writes with crc32c verify, mkfs.ext4,
# files, e2fsck -fn, `nvme disconnect`; then the server stops cleanly (exit 0) and, restarted,
# the volume still holds the ext4 filesystem (e2fsck over NBD on the host). Fails, never
# skips, where the guest cannot run.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
if [ "${SERVER_KIND:-}" != flashpool ]; then echo "SKIP: the pool's NVMe/TCP door needs flashpool serve"; exit 0; fi
GUEST=$ROOT/tests/guest
LOGS=${E2E_LOGS:-/tmp/nbd-e2e-logs}
mkdir -p "$LOGS"
export GUEST_TIMEOUT=${GUEST_TIMEOUT:-180}
new_workdir; trap cleanup EXIT
FP="$TARGET/release/flashpool"
NVME_PORT=$((PORT + 1))
bash "$GUEST/fetch.sh" >/dev/null || die "guest packages unavailable (see above)"
SERVER_CMD="$FP serve --volume-size 256M --nvme-tcp 127.0.0.1:$NVME_PORT" start_server
NQN=$(grep -o 'nqn\.[^ ]*pool-[0-9a-f-]*' "$WORK/server.log" | head -1)
[ -n "$NQN" ] || die "the server printed no NVMe/TCP URI"
echo "flashpool serve: NBD on $PORT, NVMe/TCP on $NVME_PORT, $NQN"
rc=0
GUEST_LOG=$LOGS/kernel-nvme-pool.log bash "$GUEST/run-guest.sh" "$GUEST/nvme-tcp.sh" \
    NVME_ADDR=10.0.2.2 NVME_PORT="$NVME_PORT" NVME_NQN="$NQN" FIO_MB="${FIO_MB:-32}" || rc=$?
if [ "$rc" -ne 0 ]; then
    tail -30 "$WORK/server.log" >&2
    die "guest NVMe/TCP run against the pool (console: $LOGS/kernel-nvme-pool.log)"
fi
grep -q panicked "$WORK/server.log" && die "the server panicked"
stop_server
start_server
# The guest left an ext4 filesystem on the volume: it is intact after the restart.
rm -f "$WORK/vol.img"
nbdcopy "$URI_UNIX" "$WORK/vol.img"
e2fsck -fn "$WORK/vol.img" || die "the filesystem written over NVMe/TCP is damaged after a restart"
stop_server
echo "kernel NVMe/TCP initiator against the pool: discover, connect, fio verify, ext4, fsck; intact after a restart"
