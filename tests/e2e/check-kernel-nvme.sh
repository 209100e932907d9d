#!/bin/bash
# The Linux kernel's own NVMe/TCP initiator against flashpool's NVMe/TCP
# target: starts crates/nvmet/examples/nvmet-mem (a RAM namespace, 4 KiB
# LBAs) on the host's 127.0.0.1:PORT and boots Debian's stock kernel in a
# qemu TCG guest (tests/guest/run-guest.sh) that runs tests/guest/nvme-tcp.sh
# against 10.0.2.2:PORT: `nvme discover` (the discovery controller on the
# same port), `nvme connect -t tcp` (admin and I/O queues, Identify, features,
# keep alive), fio O_DIRECT random writes 4 KiB-256 KiB with fsyncs and crc32c
# verify (in-capsule and R2T/H2CData writes, reads, flushes), mkfs.ext4,
# files, e2fsck -fn, remount and checksum, `nvme disconnect`. Two boots: one
# CPU without digests, then two CPUs (two I/O queues) with header and data
# digests (`nvme connect -g -G`); a third boot connects and the target adds a
# namespace while connected (asynchronous event, Changed Namespace List,
# rescan: nvme0n2 appears, fio verify on it) and removes it again (nvme0n2
# goes away). Then checks the target is still up, exits 0
# on SIGTERM and logged no panic. Fails, never skips, where the guest cannot
# be fetched or booted. Guest consoles: $E2E_LOGS/kernel-nvme-{plain,digests,hotplug}.log.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
NQN=${NVME_NQN:-nqn.2024-01.io.flashpool:e2e-kernel}
guest_nvme_setup 180
bash "$GUEST/fetch.sh" >/dev/null || die "guest packages unavailable (see above)"

start_nvmet_mem --nqn "$NQN" --size "${NVME_SIZE:-256M}"
echo "nvmet-mem on 127.0.0.1:$PORT, $NQN"

# guest_run NAME OPTS SMP: one boot running tests/guest/nvme-tcp.sh.
guest_run() {
    local name=$1 opts=$2 smp=$3 rc=0
    echo "guest ($name, $smp CPU(s)): discover, connect $opts, fio verify, ext4, fsck, disconnect"
    GUEST_SMP=$smp GUEST_LOG=$LOGS/kernel-nvme-$name.log bash "$GUEST/run-guest.sh" "$GUEST/nvme-tcp.sh" \
        NVME_ADDR=10.0.2.2 NVME_PORT="$PORT" NVME_NQN="$NQN" FIO_MB="${FIO_MB:-32}" \
        NVME_CONNECT_OPTS="$opts" || rc=$?
    grep -a -E '^(nvme-tcp|subnqn|traddr|/dev/nvme)' "$LOGS/kernel-nvme-$name.log" | tr -d '\r' || true
    if [ "$rc" -ne 0 ]; then
        echo "--- target log (tail) ---" >&2; tail -30 "$WORK/server.log" >&2
        die "guest NVMe/TCP run $name (console: $LOGS/kernel-nvme-$name.log)"
    fi
}
guest_run plain "" 1
# Header and data digests, two CPUs: two I/O queues.
guest_run digests "-g -G" 2
grep -q 'hdgst=true ddgst=true' "$WORK/server.log" || die "no connection negotiated header and data digests"
grep -q 'creating 2 I/O queues' "$LOGS/kernel-nvme-digests.log" || die "the 2-CPU guest did not create 2 I/O queues"

# Hot-plug: the guest connects and waits; the target adds namespace 2
# (SIGUSR1), the kernel gets the asynchronous event, reads the Changed
# Namespace List, rescans and nvme0n2 appears; fio verify on it; then the
# target removes it (SIGUSR2) and nvme0n2 must go away.
cat > "$WORK/hotplug.sh" <<'GUEST'
set -eu
fail() { echo "hotplug FAILED: $*"; dmesg | grep -i nvme | tail -20; exit 1; }
mkdir -p /etc/nvme
[ -s /etc/nvme/hostnqn ] || nvme gen-hostnqn > /etc/nvme/hostnqn
nvme connect -t tcp -a "$NVME_ADDR" -s "$NVME_PORT" -n "$NVME_NQN" || fail "nvme connect"
ns2() { for b in /sys/block/nvme*n2; do case ${b##*/} in *c*) continue ;; esac; [ -e "$b" ] && echo "${b##*/}"; done; }
i=0; while [ ! -b /dev/nvme0n1 ]; do i=$((i + 1)); [ $i -gt 300 ] && fail "no nvme0n1"; sleep 0.1; done
[ -z "$(ns2)" ] || fail "namespace 2 before the hot-plug"
echo "hotplug: connected, waiting for namespace 2"
i=0; while [ -z "$(ns2)" ]; do i=$((i + 1)); [ $i -gt 600 ] && fail "namespace 2 never appeared"; sleep 0.1; done
dev=/dev/$(ns2)
i=0; while [ ! -b "$dev" ]; do i=$((i + 1)); [ $i -gt 100 ] && fail "no $dev"; sleep 0.1; done
echo "hotplug: $dev appeared, $(blockdev --getsize64 "$dev") bytes"
fio --name=hp --filename="$dev" --direct=1 --ioengine=libaio --iodepth=8 --rw=randwrite --bs=4k \
    --size=8m --verify=crc32c --verify_fatal=1 --do_verify=1 >/tmp/fio.out 2>&1 || { cat /tmp/fio.out; fail "fio on $dev"; }
echo "hotplug: verified, waiting for removal"
i=0; while [ -n "$(ns2)" ]; do i=$((i + 1)); [ $i -gt 600 ] && fail "namespace 2 never went away"; sleep 0.1; done
echo "hotplug: $dev removed"
dmesg | grep -i nvme | tail -8 | sed 's/^/hotplug dmesg: /'
nvme disconnect -n "$NVME_NQN" || fail "nvme disconnect"
echo "hotplug: done"
GUEST
HLOG=$LOGS/kernel-nvme-hotplug.log
echo "guest (hotplug): namespace 2 added and removed while connected"
rm -f "$HLOG" # an old console must not answer wait_console
GUEST_LOG=$HLOG bash "$GUEST/run-guest.sh" "$WORK/hotplug.sh" \
    NVME_ADDR=10.0.2.2 NVME_PORT="$PORT" NVME_NQN="$NQN" &
GPID=$!
wait_console() { # wait_console PATTERN: until the guest console shows it (or the guest ends)
    local i
    for i in $(seq 1 1800); do
        grep -aq "$1" "$HLOG" 2>/dev/null && return 0
        kill -0 "$GPID" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
hp_rc=0
if wait_console 'hotplug: connected'; then
    kill -USR1 "$SERVER_PID"
    if wait_console 'hotplug: verified'; then kill -USR2 "$SERVER_PID"; fi
fi
wait "$GPID" || hp_rc=$?
grep -a -E '^hotplug' "$HLOG" | tr -d '\r' || true
if [ "$hp_rc" -ne 0 ]; then
    echo "--- target log (tail) ---" >&2; tail -30 "$WORK/server.log" >&2
    die "guest hot-plug run (console: $HLOG)"
fi
grep -q 'added namespace 2' "$WORK/server.log" && grep -q 'removed namespace 2' "$WORK/server.log" ||
    die "the target did not add and remove namespace 2"

kill -0 "$SERVER_PID" 2>/dev/null || die "nvmet-mem died during the run"
if grep -q 'panicked' "$WORK/server.log"; then cat "$WORK/server.log" >&2; die "nvmet-mem panicked"; fi
kill -TERM "$SERVER_PID"
wait "$SERVER_PID" || die "nvmet-mem exited with status $? on SIGTERM"
SERVER_PID=
echo "kernel NVMe/TCP initiator: discover, connect, fio verify, ext4, fsck, disconnect, digests, 2 queues, namespace hot-plug passed"
