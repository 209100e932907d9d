#!/bin/bash
# fio --ioengine=nbd with crc32c verification. MODE:
#   randwrite - 4 KiB random writes, then verify (Unix socket)
#   mixed     - 512 B..128 KiB random reads+writes, flush every 64 I/Os,
#               2 connections (TCP), verify
#   trim      - random trims beside verified random writes (both must
#               hold: trimmed blocks read zero, the others verify), and
#               verified trim+write sequences
#   wrap      - 5 x 192 MiB drives: 1 MiB writes at iodepth 8 over 256 MiB,
#               verified, 6 passes (the log goes round the drives twice, so
#               the cleaner frees segments under the stream), restart, verify
#   scattered - 64 MiB written in 4 KiB writes in random order (so a 1 MiB
#               read is up to 256 drive reads), then read back in 1 MiB
#               reads, 8 in flight, every byte compared; then fio's 1 MiB
#               reads at iodepth 8 over it (a reactor once spun for ever on
#               the thousands of drive reads in flight this makes)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
MODE=${1:?mode}
new_workdir; trap cleanup EXIT
if [ "$MODE" = wrap ]; then
    SERVER_CMD="$(server_cmd) --drive-size 192M --volume-size 256M" start_server
else
    start_server
fi
common=(--verify=crc32c --verify_fatal=1 --output="$WORK/fio.out")
case "$MODE" in
    randwrite)
        fio --name=randwrite --ioengine=nbd --uri="$URI_UNIX" --rw=randwrite --bs=4k --size=128M \
            --iodepth=16 --do_verify=1 "${common[@]}" ;;
    mixed)
        fio --name=mixed --ioengine=nbd --uri="$URI_TCP" --rw=randrw --bsrange=512-128k --size=128M \
            --iodepth=32 --numjobs=2 --offset_increment=128M --verify_backlog=256 \
            --fsync=64 --group_reporting "${common[@]}" ;;
    trim)
        # Region A [0,32M): random 4 KiB writes (checksummed). Region B
        # [32M,64M): filled, then every 64 KiB block trimmed once in random
        # order. A must still verify; B must read back as zeroes.
        A=(--name=a --ioengine=nbd --uri="$URI_UNIX" --rw=randwrite --bs=4k --offset=0 \
           --size=32M --iodepth=16 --verify=crc32c --verify_fatal=1)
        fio "${A[@]}" --do_verify=0 --output="$WORK/f1.out"
        fio --name=b --ioengine=nbd --uri="$URI_UNIX" --rw=write --bs=1M --offset=32M \
            --size=32M --iodepth=4 --output="$WORK/f2.out"
        fio --name=randtrim --ioengine=nbd --uri="$URI_UNIX" --rw=randtrim --bs=64k \
            --offset=32M --size=32M --iodepth=8 --output="$WORK/f3.out"
        fio "${A[@]}" --verify_only --output="$WORK/f4.out"
        $PY - "$URI_UNIX" <<'PY'
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
for off in range(32 << 20, 64 << 20, 4 << 20):
    assert h.pread(4 << 20, off) == bytes(4 << 20), f"trimmed range at {off} is not zero"
print("trimmed region reads as zeroes")
PY
        # Trim-then-write sequences, verified. iodepth 1: fio does not wait for
        # the trim before writing the same block, and NBD may reorder them.
        fio --name=trimwrite --ioengine=nbd --uri="$URI_UNIX" --rw=trimwrite --bs=64k \
            --size=64M --iodepth=1 --do_verify=1 "${common[@]}"
        cat "$WORK"/f[1-4].out >> "$WORK/fio.out" ;;
    wrap)
        W=(--name=wrap --ioengine=nbd --uri="$URI_UNIX" --rw=write --bs=1M --size=256M \
           --iodepth=8 --verify=crc32c --verify_fatal=1)
        fio "${W[@]}" --loops=6 --do_verify=1 --output="$WORK/fio.out"
        [ "${SERVER_KIND:-}" = flashpool-mem ] || {
            counters=$("$TARGET/release/flashpool" status --data "$DATA" --json)
            echo "$counters" | $PY -c '
import json, sys
c = json.load(sys.stdin)["counters"]
print("segments cleaned", c["gc_segments_cleaned"], "unread", c["gc_segments_unread"])
assert c["gc_segments_cleaned"] > 0, "the log never went round: nothing cleaned"'
            stop_server
            SERVER_CMD="$(server_cmd) --drive-size 192M --volume-size 256M" start_server
            fio "${W[@]}" --verify_only --output="$WORK/f2.out"
            cat "$WORK/f2.out" >> "$WORK/fio.out"
        } ;;
    scattered)
        timeout 300 $PY - "$URI_UNIX" <<'PY'
import nbd, random, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
B, size, depth = 4096, 64 << 20, 32
rng = random.Random(20261127)
data = rng.randbytes(size)
order = list(range(size // B)); rng.shuffle(order)
cookies = []
for n in order:
    while h.aio_in_flight() >= depth:
        h.poll(-1)
    cookies.append(h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(data[n * B:(n + 1) * B])), n * B))
while h.aio_in_flight() > 0:
    h.poll(-1)
assert all(h.aio_command_completed(c) for c in cookies), "a write did not complete"
h.flush()
print(f"{len(order)} 4 KiB writes in random order")
MiB = 1 << 20
for rnd in range(3):
    reads = {}
    for off in range(0, size, MiB):
        while h.aio_in_flight() >= 8:
            h.poll(-1)
        b = nbd.Buffer(MiB)
        reads[h.aio_pread(b, off)] = (off, b)
    while h.aio_in_flight() > 0:
        h.poll(-1)
    for c, (off, b) in reads.items():
        assert h.aio_command_completed(c), f"read at {off} did not complete"
        assert b.to_bytearray() == data[off:off + MiB], f"round {rnd}: 1 MiB at {off} differs"
print("read back in 1 MiB reads, 8 in flight, 3 times: every byte as written")
h.shutdown()
PY
        fio --name=scattered --ioengine=nbd --uri="$URI_UNIX" --rw=read --bs=1M --size=64M \
            --iodepth=8 --loops=4 --output="$WORK/fio.out" ;;
    *) die "unknown mode $MODE" ;;
esac
grep -E 'err=|IOPS' "$WORK/fio.out"
if grep -E 'err= *[1-9]|verify: bad|fatal' "$WORK/fio.out"; then die "fio reported errors"; fi
stop_server
