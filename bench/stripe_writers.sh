#!/usr/bin/env bash
# 1 MiB sequential writes (iodepth 8, fio's nbd engine) on the default file-drive pool with
# N stripe writer threads (`flashpool serve --stripe-writers N`), next to fio on a raw file of
# the same filesystem: how many writers the drives' bandwidth needs on this machine, and what
# each keeps in flight at the disk.
#
#   bench/stripe_writers.sh [WORKDIR] [RUNTIME_S] [WRITERS...]    (default: target/sw-bench 5 1 2 4 8)
#
# Each point: a fresh pool (the raw file: a fresh file), a 1 GiB prefill, then RUNTIME_S
# (at least 3) of overwrites (the disk_bench point "write 1M qd8"); MiB/s, mean and p99
# completion latency, server CPU per MiB, and the disk's writes in flight
# (/sys/block/DEV/inflight, sampled every 10 ms from 1 s in until 1 s before the end) times
# their mean size over the same seconds (/proc/diskstats): a disk reaches its bandwidth only
# with enough bytes in flight, so a server that keeps fewer than the raw file's is bound by
# its own pipeline, not by the disk.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$root/target/sw-bench}
rt=${2:-5}
shift $(( $# >= 2 ? 2 : $# ))
writers=${*:-1 2 4 8}
fp=${FLASHPOOL:-$root/target/release/flashpool}
mkdir -p "$work"
. "$root/bench/disk_inflight.sh"
dev=$(disk_of "$work")
inflight=$(inflight_file "$dev")
wstat() { # "writes completed, sectors written" of the disk now
    awk -v d="$dev" '$3 == d {print $8, $10}' /proc/diskstats
}
# measure NAME SERVER_PID|"" FIO_ARGS...: one timed run of overwrites, and its line.
measure() {
    local name=$1 sp=$2
    shift 2
    local t0=0 t1=0 s0 s1 depth
    [ -z "$sp" ] || t0=$(awk '{print $14 + $15}' /proc/$sp/stat)
    fio --name=p --rw=write --bs=1M --iodepth=8 --size=1G --time_based --runtime="$rt" \
        --output-format=json "$@" >"$work/fio.json" &
    local f=$!
    sleep 1
    s0=$(wstat)
    depth=$(mean_in_flight "$inflight" 2 $(( rt - 2 )))
    s1=$(wstat)
    wait "$f"
    [ -z "$sp" ] || t1=$(awk '{print $14 + $15}' /proc/$sp/stat)
    python3 - "$work/fio.json" "$name" "$depth" "$s0" "$s1" "$sp" "$(( t1 - t0 ))" \
        "$(getconf CLK_TCK)" <<'PY'
import json, sys
t = open(sys.argv[1]).read()
j = json.loads(t[t.index("{"):])["jobs"][0]["write"]
bw, mean = j["bw"] / 1024, j["clat_ns"]["mean"] / 1e3
p99 = j["clat_ns"]["percentile"]["99.000000"] / 1e3
s = "%12s: %7.0f MiB/s  mean %8.0f us  p99 %8.0f us" % (sys.argv[2], bw, mean, p99)
if sys.argv[6]:
    s += "  server CPU %6.0f us/MiB" % (float(sys.argv[7]) / float(sys.argv[8]) * 1e6 / j["total_ios"])
depth = float(sys.argv[3])
w0, s0 = map(int, sys.argv[4].split())
w1, s1 = map(int, sys.argv[5].split())
size = (s1 - s0) * 512 / max(w1 - w0, 1)
s += "  disk: %5.2f writes in flight x %4.0f KiB = %5.2f MiB" % (depth, size / 1024, depth * size / 2**20)
print(s)
PY
}
raw=$work/raw.img
rm -f "$raw"
fio --name=p --rw=write --bs=1M --iodepth=8 --ioengine=io_uring --direct=1 --filename="$raw" --size=1G --output-format=terse >/dev/null
measure "raw file" "" --ioengine=io_uring --direct=1 --filename="$raw"
rm -f "$raw"
for w in $writers; do
    d=$work/pool-$w
    rm -rf "$d"
    mkdir -p "$d"
    "$fp" serve --data "$d/data" --socket "$d/nbd.sock" --listen 127.0.0.1:0 --stripe-writers "$w" \
        >"$d/log" 2>&1 &
    sp=$!
    for _ in $(seq 100); do [ -S "$d/nbd.sock" ] && break; sleep 0.1; done
    u="nbd+unix:///default?socket=$d/nbd.sock"
    fio --name=p --rw=write --bs=1M --iodepth=8 --ioengine=nbd --uri="$u" --size=1G --output-format=terse >/dev/null
    measure "$w writers" "$sp" --ioengine=nbd --uri="$u"
    kill "$sp"
    wait "$sp" 2>/dev/null || true
    rm -rf "$d"
done
