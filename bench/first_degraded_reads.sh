#!/bin/bash
# The first seconds of reads after a member fails: the default pool (file drives on this
# machine's disk) filled with 1 MiB writes, `flashpool drive fail 2`, a wait of WAIT_S seconds
# (the server's rebuild held off), then 4 KiB random reads at depth 32 over NBD for RUNTIME_S:
# IOPS, p99, p99.99 and the slowest read. Reads that had to scan their segment's chunk
# headers first show in the tail. Builds take turns round by round (the machine is noisy).
#
#   bench/first_degraded_reads.sh ROUNDS WAIT_S RUNTIME_S BINARY...
set -euo pipefail
ROUNDS=${1:?rounds}; WAIT=${2:?seconds to wait after the failure}; RT=${3:?seconds of reads}
shift 3
[ $# -gt 0 ] || { echo "give one or more flashpool binaries" >&2; exit 2; }
WORK=${WORK:-$(dirname "$0")/../target/first-degraded}
mkdir -p "$WORK"; WORK=$(cd "$WORK" && pwd)
for r in $(seq "$ROUNDS"); do
    for bin in "$@"; do
        d="$WORK/pool"; rm -rf "$d"; mkdir -p "$d"
        "$bin" serve --data "$d/data" --socket "$d/nbd.sock" --listen 127.0.0.1:0 \
            --rebuild-delay 100000 > "$d/log" 2>&1 &
        pid=$!
        for _ in $(seq 100); do [ -S "$d/nbd.sock" ] && break; sleep 0.1; done
        uri="nbd+unix:///default?socket=$d/nbd.sock"
        fio --name=p --rw=write --bs=1M --iodepth=8 --ioengine=nbd --uri="$uri" --size=1G \
            --output-format=terse > /dev/null
        "$bin" drive --data "$d/data" fail 2 > /dev/null
        sleep "$WAIT"
        fio --name=p --rw=randread --bs=4k --iodepth=32 --ioengine=nbd --uri="$uri" --size=1G \
            --time_based --runtime="$RT" --output-format=json > "$d/fio.json"
        python3 - "$r" "$bin" "$d/fio.json" <<'PY'
import json, sys
t = open(sys.argv[3]).read()
j = json.loads(t[t.index('{'):])['jobs'][0]['read']
p = j['clat_ns']['percentile']
print(f"round {sys.argv[1]} {sys.argv[2]}: {j['iops']/1000:.1f} K IOPS, p99 {p['99.000000']/1000:.0f} us,"
      f" p99.99 {p['99.990000']/1000:.0f} us, max {j['clat_ns']['max']/1000:.0f} us")
PY
        kill "$pid"; wait "$pid" 2>/dev/null || true
        rm -rf "$d"
    done
done
