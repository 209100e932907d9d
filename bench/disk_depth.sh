#!/usr/bin/env bash
# How many reads the disk itself has in flight (/sys/block/DEV/inflight, sampled every 10 ms)
# while fio does 4 KiB random reads at iodepth 32: on a raw file (io_uring, O_DIRECT) and
# through `flashpool serve` on its default pool (fio's nbd engine), both on WORKDIR's
# filesystem. A server that keeps the client's depth on the disk shows about the raw
# file's number; the gap is requests waiting in the server, the socket or the client.
#
#   bench/disk_depth.sh [WORKDIR] [RUNTIME_S]      (default: target/depth-bench 5)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$root/target/depth-bench}
rt=${2:-5}
fp=${FLASHPOOL:-$root/target/release/flashpool}
mkdir -p "$work"
src=$(findmnt -n -o SOURCE -T "$work")
dev=$(basename "$(readlink -f "$src")")
stat=/sys/block/$dev/inflight
[ -r "$stat" ] || stat=/sys/class/block/$dev/inflight
sample() { # seconds -> mean reads in flight
    local n=$(( $1 * 100 )) i
    for ((i = 0; i < n; i++)); do cat "$stat"; sleep 0.01; done |
        awk '{s += $1; n++} END {printf "%.1f", s / n}'
}
run() { # name, fio args...
    local name=$1
    shift
    fio --name=p --rw=randread --bs=4k --iodepth=32 --size=1G --time_based --runtime="$rt" \
        --output-format=json "$@" >"$work/fio.json" &
    local f=$!
    sleep 1
    local depth
    depth=$(sample $(( rt - 2 )))
    wait "$f"
    python3 - "$work/fio.json" "$name" "$depth" <<'PY'
import json, sys
t = open(sys.argv[1]).read()
j = json.loads(t[t.index("{"):])["jobs"][0]["read"]
print("%-22s %8.0f IOPS  mean %6.0f us  disk in flight %s" % (
    sys.argv[2], j["iops"], j["clat_ns"]["mean"] / 1e3, sys.argv[3]))
PY
}
raw=$work/raw.img
fio --name=p --rw=write --bs=1M --iodepth=8 --ioengine=io_uring --direct=1 --filename="$raw" \
    --size=1G --output-format=terse >/dev/null
run "raw file" --ioengine=io_uring --direct=1 --filename="$raw"
rm -f "$raw"
for bp in 50 0; do
    d=$work/pool
    rm -rf "$d"
    mkdir -p "$d"
    "$fp" serve --data "$d/data" --socket "$d/nbd.sock" --listen 127.0.0.1:0 --busy-poll-us "$bp" \
        >"$d/log" 2>&1 &
    sp=$!
    for _ in $(seq 100); do [ -S "$d/nbd.sock" ] && break; sleep 0.1; done
    u="nbd+unix:///default?socket=$d/nbd.sock"
    fio --name=p --rw=write --bs=1M --iodepth=8 --ioengine=nbd --uri="$u" --size=1G \
        --output-format=terse >/dev/null
    run "flashpool busy-poll $bp" --ioengine=nbd --uri="$u"
    kill "$sp"
    wait "$sp" 2>/dev/null || true
    rm -rf "$d"
done
