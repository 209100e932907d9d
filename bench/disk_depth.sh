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
. "$root/bench/disk_inflight.sh"
stat=$(inflight_file "$(disk_of "$work")")
switches() { # pid -> "tid:switches ..." of each of its threads now (empty without a pid)
    [ -n "${1:-}" ] || return 0
    local t
    for t in /proc/"$1"/task/*; do
        awk -v t="${t##*/}" '/ctxt_switches/ {s += $2} END {printf "%s:%d ", t, s}' \
            "$t/status" 2>/dev/null || true
    done
}
run() { # name, server pid or "", fio args...
    local name=$1 srv=$2
    shift 2
    local c0 c1
    fio --name=p --rw=randread --bs=4k --iodepth=32 --size=1G --time_based --runtime="$rt" \
        --output-format=json "$@" >"$work/fio.json" &
    local f=$!
    sleep 1
    # Counted while the connection's thread lives (it ends with the connection).
    c0=$(switches "$srv")
    local depth
    depth=$(mean_in_flight "$stat" 1 $(( rt - 2 )))
    c1=$(switches "$srv")
    # io_uring workers in the server: reads the kernel could not issue at once (punted).
    local workers=0
    [ -z "$srv" ] || workers=$(cat /proc/"$srv"/task/*/comm 2>/dev/null | grep -c '^iou-wrk' || true)
    wait "$f"
    python3 - "$work/fio.json" "$name" "$depth" "$c0" "$c1" "$workers" "$srv" "$(( rt - 2 ))" <<'PY'
import json, sys
t = open(sys.argv[1]).read()
job = json.loads(t[t.index("{"):])["jobs"][0]
j = job["read"]
n = max(j["total_ios"], 1)
line = "%-22s %8.0f IOPS  mean %6.0f us  disk in flight %s  fio: %.0f%% CPU, %.2f switches/read" % (
    sys.argv[2], j["iops"], j["clat_ns"]["mean"] / 1e3, sys.argv[3],
    job["usr_cpu"] + job["sys_cpu"], job["ctx"] / n)
if sys.argv[7]:
    # Switches of the threads alive at both counts, over the sampled seconds, against the
    # reads of those seconds at fio's rate.
    count = lambda a: dict(map(int, x.split(":")) for x in a.split())
    c0, c1 = count(sys.argv[4]), count(sys.argv[5])
    delta = sum(c1[t] - c0[t] for t in c1 if t in c0)
    reads = max(j["iops"] * int(sys.argv[8]), 1)
    line += "  server: %.2f switches/read, %s io_uring workers (any ring)" % (
        delta / reads, sys.argv[6])
print(line)
PY
}
raw=$work/raw.img
fio --name=p --rw=write --bs=1M --iodepth=8 --ioengine=io_uring --direct=1 --filename="$raw" \
    --size=1G --output-format=terse >/dev/null
run "raw file" "" --ioengine=io_uring --direct=1 --filename="$raw"
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
    run "flashpool busy-poll $bp" "$sp" --ioengine=nbd --uri="$u"
    kill "$sp"
    wait "$sp" 2>/dev/null || true
    rm -rf "$d"
done
