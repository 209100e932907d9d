# shellcheck shell=sh
# Guest script (busybox sh, runs as /test.sh): the kernel's own NBD client
# against an NBD server on the host. Proves, through /dev/nbd0 of a stock
# Debian kernel: O_DIRECT random writes of 4 KiB and of mixed sizes up to 1 MiB
# read back intact (fio crc32c verify) with fsync (NBD FLUSH) in between;
# blkdiscard (NBD TRIM) makes a written range read back as zeros; an ext4
# filesystem made, filled and unmounted passes e2fsck -fn; and, in a later boot
# against a restarted server, the filesystem is still clean and every file's
# checksum matches.
#
# Environment (run-guest.sh NAME=VALUE): NBD_PORT (required), PHASE=write|verify,
# NBD_HOST (default 10.0.2.2), NBD_EXPORT (default "default"), NBD_CONNS
# (connections, default 1), FIO_MB (size of each fio run, default 32),
# SUMS_HASH (verify: sha256 of the checksum list the write phase printed).
set -eu
HOST=${NBD_HOST:-10.0.2.2}
EXPORT=${NBD_EXPORT:-default}
FIO_MB=${FIO_MB:-32}
DEV=/dev/nbd0
MNT=/mnt/fs
T0=$(date +%s)
step() { echo "kernel-nbd [$(($(date +%s) - T0))s]: $*"; }
fail() { echo "kernel-nbd FAILED: $*"; exit 1; }
: "${NBD_PORT:?NBD_PORT not set}" "${PHASE:?PHASE not set}"

connect() {
    step "nbd-client $HOST $NBD_PORT $DEV -N $EXPORT -C ${NBD_CONNS:-1}"
    nbd-client "$HOST" "$NBD_PORT" "$DEV" -N "$EXPORT" -b 4096 -C "${NBD_CONNS:-1}" ||
        fail "nbd-client could not connect"
    i=0
    while [ "$(cat /sys/block/nbd0/size)" = 0 ]; do
        i=$((i + 1)); [ $i -gt 50 ] && fail "$DEV has no size after connecting"
        sleep 0.1
    done
    SIZE=$(blockdev --getsize64 $DEV)
    step "$DEV: $SIZE bytes, logical block $(blockdev --getss $DEV)," \
        "discard max $(cat /sys/block/nbd0/queue/discard_max_bytes)"
    [ "$SIZE" -ge $((512 << 20)) ] || fail "export is smaller than 512 MiB"
}

disconnect() {
    step "nbd-client -d $DEV"
    nbd-client -d $DEV || fail "nbd-client -d failed"
    i=0
    while [ "$(cat /sys/block/nbd0/size)" != 0 ]; do
        i=$((i + 1)); [ $i -gt 50 ] && fail "$DEV still connected after -d"
        sleep 0.1
    done
}

fsck_clean() {
    step "e2fsck -fn $DEV"
    e2fsck -fn $DEV || fail "e2fsck found problems ($1)"
}

if [ "$PHASE" = write ]; then
    connect
    step "fio: 4 KiB random writes, ${FIO_MB} MiB, O_DIRECT, fsync every 64, crc32c verify"
    fio --name=randwrite-4k --filename=$DEV --direct=1 --ioengine=libaio --iodepth=16 \
        --rw=randwrite --bs=4k --offset=0 --size="$FIO_MB"m --fsync=64 --end_fsync=1 \
        --verify=crc32c --verify_fatal=1 --do_verify=1 --randseed=1 \
        >/tmp/fio1.out 2>&1 || { cat /tmp/fio1.out; fail "fio 4k verify"; }
    grep -E '^ *(READ|WRITE):' /tmp/fio1.out | sed 's/^ */kernel-nbd   fio /' || true
    step "fio: mixed sizes 4 KiB-1 MiB, ${FIO_MB} MiB, O_DIRECT, fdatasync every 8, crc32c verify"
    fio --name=randwrite-mixed --filename=$DEV --direct=1 --ioengine=libaio --iodepth=8 \
        --rw=randwrite --bssplit=4k/25:16k/15:64k/20:256k/20:1m/20 \
        --offset=$((FIO_MB * 2))m --size="$FIO_MB"m --fdatasync=8 --end_fsync=1 \
        --verify=crc32c --verify_fatal=1 --do_verify=1 --randseed=2 \
        >/tmp/fio2.out 2>&1 || { cat /tmp/fio2.out; fail "fio mixed verify"; }
    grep -E '^ *(READ|WRITE):' /tmp/fio2.out | sed 's/^ */kernel-nbd   fio /' || true

    off=$((FIO_MB * 4))
    step "blkdiscard: 8 MiB at ${off} MiB written, discarded, read back as zeros"
    dd if=/dev/urandom of=/tmp/rand bs=1M count=8 2>/dev/null
    dd if=/tmp/rand of=$DEV bs=1M seek=$off count=8 oflag=direct conv=fsync 2>/dev/null
    got=$(dd if=$DEV bs=1M skip=$off count=8 iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1)
    [ "$got" = "$(sha256sum </tmp/rand | cut -d' ' -f1)" ] || fail "8 MiB written with dd did not read back"
    /sbin/blkdiscard -o $((off << 20)) -l $((8 << 20)) $DEV || fail "blkdiscard failed"
    zero=$(head -c $((8 << 20)) /dev/zero | sha256sum | cut -d' ' -f1)
    got=$(dd if=$DEV bs=1M skip=$off count=8 iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1)
    [ "$got" = "$zero" ] || fail "a discarded range does not read back as zeros"

    step "mkfs.ext4 $DEV"
    mkfs.ext4 -q -F $DEV || fail "mkfs.ext4"
    mkdir -p $MNT
    mount -t ext4 $DEV $MNT || fail "mount"
    step "writing a tree of files"
    n=0
    for d in 1 2 3 4; do
        mkdir -p $MNT/tree/d$d/sub
        for f in 1 2 3 4 5 6 7 8 9 10; do
            n=$((n + 1))
            head -c $((n * 7919 + f)) /dev/urandom > $MNT/tree/d$d/f$f
            echo "file $n of the kernel-nbd check" > $MNT/tree/d$d/sub/small$f
        done
    done
    dd if=/dev/urandom of=$MNT/tree/big bs=1M count=16 2>/dev/null
    (cd $MNT && find tree -type f | sort | xargs sha256sum) > $MNT/sums
    sums_hash=$(sha256sum $MNT/sums | cut -d' ' -f1)
    sync
    step "umount"
    umount $MNT
    fsck_clean "after the first mount"
    # The host hands this to the verify phase (the list lives on the filesystem).
    echo "KERNEL-NBD-SUMS $sums_hash"
    disconnect
elif [ "$PHASE" = verify ]; then
    : "${SUMS_HASH:?SUMS_HASH not set}"
    connect
    fsck_clean "after the server restarted"
    mkdir -p $MNT
    mount -t ext4 $DEV $MNT || fail "mount after restart"
    got=$(sha256sum $MNT/sums | cut -d' ' -f1)
    [ "$got" = "$SUMS_HASH" ] || fail "the checksum list changed across the restart ($got, wrote $SUMS_HASH)"
    step "checking $(wc -l < $MNT/sums) files"
    (cd $MNT && sha256sum -c -s sums) || fail "file checksums differ after the restart"
    step "rewrite after restart: one more file, sync, umount, fsck"
    dd if=/dev/urandom of=$MNT/after bs=1M count=4 2>/dev/null
    sync
    umount $MNT
    fsck_clean "after writing again"
    disconnect
else
    fail "PHASE must be write or verify"
fi
step "done"
