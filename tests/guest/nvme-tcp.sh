# shellcheck shell=sh
# Guest script (busybox sh, runs as /test.sh): the kernel's NVMe/TCP initiator
# (nvme-tcp, driven by nvme-cli). Proves that a target's namespace, reached
# with `nvme discover` and `nvme connect -t tcp`, takes O_DIRECT random writes
# that read back intact (fio crc32c verify) and holds an ext4 filesystem that
# passes e2fsck -fn, and that `nvme disconnect` releases it.
#
# The hook for flashpool's NVMe/TCP test: run it with NVME_ADDR=10.0.2.2
# NVME_PORT=<host port> NVME_NQN=<subsystem NQN> against a target on the host.
# Without NVME_ADDR it tests itself against the guest kernel's own target
# (nvmet-tcp on 127.0.0.1:4420 exporting a 64 MiB file), so the initiator side
# of the harness is known to work before any flashpool target exists.
# FIO_MB (default 16) sizes the fio run; NVME_CONNECT_OPTS adds options to
# `nvme connect` (e.g. "-g -G" for header and data digests).
set -eu
FIO_MB=${FIO_MB:-16}
T0=$(date +%s)
step() { echo "nvme-tcp [$(($(date +%s) - T0))s]: $*"; }
# The kernel's nvme messages (connect, queues, warnings), for the host log.
kmsg() { dmesg | grep -i nvme | tail -20 | sed 's/^/nvme-tcp dmesg: /'; }
fail() { echo "nvme-tcp FAILED: $*"; kmsg; exit 1; }

if [ -z "${NVME_ADDR:-}" ]; then
    NVME_ADDR=127.0.0.1 NVME_PORT=4420 NVME_NQN=nqn.2024-01.io.flashpool:guest-selftest
    step "self-test: nvmet-tcp target on $NVME_ADDR:$NVME_PORT, $NVME_NQN"
    modprobe nvmet-tcp || fail "modprobe nvmet-tcp"
    grep -q ' /sys/kernel/config ' /proc/mounts || mount -t configfs none /sys/kernel/config
    truncate -s 64M /tmp/nvme.img
    t=/sys/kernel/config/nvmet
    mkdir "$t/subsystems/$NVME_NQN"
    echo 1 > "$t/subsystems/$NVME_NQN/attr_allow_any_host"
    mkdir "$t/subsystems/$NVME_NQN/namespaces/1"
    printf /tmp/nvme.img > "$t/subsystems/$NVME_NQN/namespaces/1/device_path"
    # tmpfs has no O_DIRECT in 6.1: the file backend must use the page cache.
    echo 1 > "$t/subsystems/$NVME_NQN/namespaces/1/buffered_io"
    echo 1 > "$t/subsystems/$NVME_NQN/namespaces/1/enable"
    mkdir "$t/ports/1"
    echo ipv4 > "$t/ports/1/addr_adrfam"
    echo tcp > "$t/ports/1/addr_trtype"
    echo "$NVME_ADDR" > "$t/ports/1/addr_traddr"
    echo "$NVME_PORT" > "$t/ports/1/addr_trsvcid"
    ln -s "$t/subsystems/$NVME_NQN" "$t/ports/1/subsystems/$NVME_NQN"
fi
: "${NVME_PORT:?NVME_PORT not set}" "${NVME_NQN:?NVME_NQN not set}"

mkdir -p /etc/nvme
[ -s /etc/nvme/hostnqn ] || nvme gen-hostnqn > /etc/nvme/hostnqn
step "nvme discover -t tcp -a $NVME_ADDR -s $NVME_PORT"
nvme discover -t tcp -a "$NVME_ADDR" -s "$NVME_PORT" || fail "nvme discover"
step "nvme connect -t tcp -a $NVME_ADDR -s $NVME_PORT -n $NVME_NQN ${NVME_CONNECT_OPTS:-}"
# shellcheck disable=SC2086
nvme connect -t tcp -a "$NVME_ADDR" -s "$NVME_PORT" -n "$NVME_NQN" ${NVME_CONNECT_OPTS:-} || fail "nvme connect"
i=0
dev=
while [ -z "$dev" ]; do
    # The namespace's block device (nvmeXnY; nvmeXcZnY are multipath's hidden paths).
    for b in /sys/block/nvme*n*; do
        case ${b##*/} in *c*) continue ;; esac
        [ -e "$b/device/subsysnqn" ] && [ "$(cat "$b/device/subsysnqn")" = "$NVME_NQN" ] &&
            [ -b "/dev/${b##*/}" ] && dev=/dev/${b##*/} && break
    done
    i=$((i + 1)); [ $i -gt 100 ] && fail "no namespace block device after connecting"
    [ -n "$dev" ] || sleep 0.1
done
nvme list || true
step "$dev: $(blockdev --getsize64 "$dev") bytes; fio 4 KiB-256 KiB random writes, ${FIO_MB} MiB, crc32c verify"
fio --name=nvme-verify --filename="$dev" --direct=1 --ioengine=libaio --iodepth=16 \
    --rw=randwrite --bssplit=4k/50:64k/30:256k/20 --size="$FIO_MB"m --fsync=32 --end_fsync=1 \
    --verify=crc32c --verify_fatal=1 --do_verify=1 >/tmp/fio.out 2>&1 || { cat /tmp/fio.out; fail "fio verify"; }
step "mkfs.ext4, files, e2fsck -fn"
mkfs.ext4 -q -F "$dev" || fail "mkfs.ext4"
mkdir -p /mnt/nvme
mount -t ext4 "$dev" /mnt/nvme || fail "mount"
dd if=/dev/urandom of=/mnt/nvme/data bs=1M count=4 2>/dev/null
sum=$(sha256sum < /mnt/nvme/data)
umount /mnt/nvme
e2fsck -fn "$dev" || fail "e2fsck"
mount -t ext4 -o ro "$dev" /mnt/nvme || fail "mount again"
[ "$(sha256sum < /mnt/nvme/data)" = "$sum" ] || fail "file changed across a remount"
umount /mnt/nvme
step "nvme disconnect -n $NVME_NQN"
nvme disconnect -n "$NVME_NQN" || fail "nvme disconnect"
kmsg
step "done"
