#!/bin/bash
# A/B of two flashpool builds under a long 1 MiB write stream: a new default pool (file drives
# on this machine's real disk) per build and round, its 1 GiB volume filled once, then
# SECONDS of 1 MiB writes at iodepth 8 over it, long enough for the log to go round the
# drives several times, so the cleaner and checkpoints work under the stream. Per run:
# MiB/s, p99 completion latency, the 100 ms intervals in which nothing completed (stalls),
# the server's CPU per MiB, and the cleaner's counters. The builds interleave round by round
# so both see the same machine (it is shared and noisy).
#
#   bench/ab_overwrite.sh OLD_BINARY NEW_BINARY [ROUNDS] [SECONDS]
#
# SERVE_ARGS adds flags to both servers (`--memory` for memory drives).
set -euo pipefail
A=${1:?old flashpool binary}; B=${2:?new flashpool binary}
ROUNDS=${3:-3}; SECS=${4:-10}
WORK=${WORK:-$(dirname "$0")/../target/ab-overwrite}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
HZ=$(getconf CLK_TCK)
for r in $(seq "$ROUNDS"); do
    for which in A B; do
        bin=$A; [ "$which" = B ] && bin=$B
        d="$WORK/$which"; rm -rf "$d"; mkdir -p "$d"
        # shellcheck disable=SC2086
        "$bin" serve --data "$d/data" --socket "$d/nbd.sock" --listen 127.0.0.1:0 ${SERVE_ARGS:-} >"$d/log" 2>&1 &
        srv=$!
        for _ in $(seq 300); do [ -S "$d/nbd.sock" ] && break; sleep 0.1; done
        uri="nbd+unix:///default?socket=$d/nbd.sock"
        fio --name=fill --rw=write --bs=1M --iodepth=8 --ioengine=nbd --uri="$uri" --size=1G \
            --output-format=terse >/dev/null
        t0=$(awk '{print $14+$15}' "/proc/$srv/stat")
        (cd "$d" && fio --name=p --rw=write --bs=1M --iodepth=8 --ioengine=nbd --uri="$uri" \
            --size=1G --time_based --runtime="$SECS" --write_bw_log=bw --log_avg_msec=100 \
            --output-format=json >fio.json)
        t1=$(awk '{print $14+$15}' "/proc/$srv/stat")
        counters=$("$bin" status --data "$d/data" --json 2>/dev/null || echo '{}')
        kill "$srv"; wait "$srv" 2>/dev/null || true
        python3 - "$d/fio.json" "$d/bw_bw.1.log" "$(( t1 - t0 ))" "$HZ" "$SECS" "$counters" \
            "$r" "$which" <<'PY'
import json, sys
t = open(sys.argv[1]).read()
j = json.loads(t[t.index("{"):])["jobs"][0]["write"]
mib = j["io_bytes"] / 2**20
p99 = j["clat_ns"]["percentile"]["99.000000"] / 1e6
# fio logs an interval only when something completed in it: the gaps are the stalls.
ts = [int(l.split(",")[0]) for l in open(sys.argv[2]) if l.strip()]
secs = int(sys.argv[5])
slots = set(t // 100 for t in ts)
stalled = sum(1 for s in range(1, secs * 10) if s not in slots)
cpu = float(sys.argv[3]) / float(sys.argv[4])
try:
    c = json.loads(sys.argv[6]).get("counters", {})
except ValueError:
    c = {}
gc = "cleaned %s (unread %s)" % (c.get("gc_segments_cleaned", "?"), c.get("gc_segments_unread", "-"))
print("round %s %s: %6.0f MiB/s  p99 %6.1f ms  stalled 100 ms intervals %3d of %d  "
      "server CPU %4.0f us/MiB  %s" % (sys.argv[7], sys.argv[8], mib / secs, p99, stalled,
                                      secs * 10 - 1, cpu * 1e6 / mib, gc))
PY
    done
done
rm -rf "$WORK"
