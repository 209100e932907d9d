#!/usr/bin/env bash
# What the disk itself has in flight while fio writes 1 MiB sequentially at iodepth 8 (issue 16's
# write point): on a raw file (io_uring, O_DIRECT, overwriting a file fio filled first) and
# through `flashpool serve` on its default pool (fio's nbd engine), for each stripe-writer
# count given, all on WORKDIR's filesystem. Sampled every 10 ms from /sys/block/DEV/inflight
# (writes column) and, over the same seconds, /proc/diskstats (bytes per write request), so
# "MiB in flight" = writes in flight x their mean size. A disk reaches its bandwidth only
# with enough bytes in flight: a server that keeps fewer than the raw file's is bound by its
# own pipeline, not by the disk.
#
#   bench/write_depth.sh [WORKDIR] [RUNTIME_S] [STRIPE_WRITERS...]   (default: target/write-depth 8 2 8)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$root/target/write-depth}
rt=${2:-8}
shift 2 || shift $# || true
writers=("$@")
[ ${#writers[@]} -eq 0 ] && writers=(2 8)
fp=${FLASHPOOL:-$root/target/release/flashpool}
mkdir -p "$work"
src=$(findmnt -n -o SOURCE -T "$work")
dev=$(basename "$(readlink -f "$src")")
inflight=/sys/block/$dev/inflight
[ -r "$inflight" ] || inflight=/sys/class/block/$dev/inflight
wstat() { # "writes completed, sectors written" of $dev now
    awk -v d="$dev" '$3 == d {print $8, $10}' /proc/diskstats
}
measure() { # name, fio args... -> one line
    local name=$1
    shift
    fio --name=w --rw=write --bs=1M --iodepth=8 --size=1G --time_based --runtime="$rt" \
        --output-format=json "$@" >"$work/fio.json" &
    local f=$! s0 s1 depth
    sleep 1
    s0=$(wstat)
    depth=$(local until=$(( $(date +%s%N) + (rt - 2) * 1000000000 ))
        while (( $(date +%s%N) < until )); do cat "$inflight"; sleep 0.01; done |
            awk '{s += $2; n++} END {printf "%.2f", s / n}')
    s1=$(wstat)
    wait "$f"
    python3 - "$work/fio.json" "$name" "$depth" "$s0" "$s1" <<'PY'
import json, sys
t = open(sys.argv[1]).read()
j = json.loads(t[t.index("{"):])["jobs"][0]["write"]
depth = float(sys.argv[3])
w0, s0 = map(int, sys.argv[4].split())
w1, s1 = map(int, sys.argv[5].split())
size = (s1 - s0) * 512 / max(w1 - w0, 1)
print("%-26s %7.0f MiB/s  mean %6.0f us  p99 %7.0f us  disk: %5.2f writes in flight x %4.0f KiB = %5.2f MiB"
      % (sys.argv[2], j["bw_bytes"] / 2**20, j["clat_ns"]["mean"] / 1e3,
         j["clat_ns"]["percentile"]["99.000000"] / 1e3, depth, size / 1024, depth * size / 2**20))
PY
}
raw=$work/raw.img
fio --name=fill --rw=write --bs=1M --iodepth=8 --ioengine=io_uring --direct=1 --filename="$raw" \
    --size=1G --output-format=terse >/dev/null
measure "raw file" --ioengine=io_uring --direct=1 --filename="$raw"
rm -f "$raw"
for n in "${writers[@]}"; do
    d=$work/pool
    rm -rf "$d"
    mkdir -p "$d"
    "$fp" serve --data "$d/data" --socket "$d/nbd.sock" --listen 127.0.0.1:0 --stripe-writers "$n" \
        >"$d/log" 2>&1 &
    sp=$!
    for _ in $(seq 100); do [ -S "$d/nbd.sock" ] && break; sleep 0.1; done
    measure "flashpool, $n stripe writers" --ioengine=nbd --uri="nbd+unix:///default?socket=$d/nbd.sock"
    kill "$sp"
    wait "$sp" 2>/dev/null || true
    rm -rf "$d"
done
