#!/usr/bin/env bash
# 1 MiB sequential writes (iodepth 8, fio's nbd engine) on the default file-drive pool with
# N stripe writer threads (`flashpool serve --stripe-writers N`), next to fio on a raw file of
# the same filesystem: how many writers the drives' bandwidth needs on this machine.
#
#   bench/stripe_writers.sh [WORKDIR] [RUNTIME_S] [WRITERS...]    (default: target/sw-bench 5 1 2 4 8)
#
# Each point: a fresh pool, a 1 GiB prefill, then RUNTIME_S of overwrites (the disk_bench
# point "write 1M qd8"); MiB/s, mean and p99 completion latency, server CPU per MiB.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$root/target/sw-bench}
rt=${2:-5}
shift $(( $# >= 2 ? 2 : $# ))
writers=${*:-1 2 4 8}
fp=${FLASHPOOL:-$root/target/release/flashpool}
mkdir -p "$work"
summary() {
    python3 - "$@" <<'PY'
import json, sys
t = open(sys.argv[1]).read()
j = json.loads(t[t.index("{"):])["jobs"][0]["write"]
bw, mean = j["bw"] / 1024, j["clat_ns"]["mean"] / 1e3
p99 = j["clat_ns"]["percentile"]["99.000000"] / 1e3
s = "%12s: %7.0f MiB/s  mean %8.0f us  p99 %8.0f us" % (sys.argv[2], bw, mean, p99)
if len(sys.argv) > 3:
    s += "  server CPU %6.0f us/MiB" % (float(sys.argv[3]) * 1e6 / j["total_ios"])
print(s)
PY
}
raw=$work/raw.img
rm -f "$raw"
fio --name=p --rw=write --bs=1M --iodepth=8 --ioengine=io_uring --direct=1 --filename="$raw" --size=1G --output-format=terse >/dev/null
fio --name=p --rw=write --bs=1M --iodepth=8 --ioengine=io_uring --direct=1 --filename="$raw" --size=1G \
    --time_based --runtime="$rt" --output-format=json >"$work/fio.json"
summary "$work/fio.json" "raw file"
rm -f "$raw"
hz=$(getconf CLK_TCK)
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
    t0=$(awk '{print $14 + $15}' /proc/$sp/stat)
    fio --name=p --rw=write --bs=1M --iodepth=8 --ioengine=nbd --uri="$u" --size=1G \
        --time_based --runtime="$rt" --output-format=json >"$work/fio.json"
    t1=$(awk '{print $14 + $15}' /proc/$sp/stat)
    summary "$work/fio.json" "$w writers" "$(python3 -c "print(($t1 - $t0) / $hz)")"
    kill "$sp"
    wait "$sp" 2>/dev/null || true
    rm -rf "$d"
done
