#!/bin/bash
# A/B of two flashpool builds writing: a new default pool (file drives on this machine's real
# disk) per build and round, its 1 GiB default volume filled with 1 MiB writes at iodepth 8
# and then overwritten once; bandwidth of each pass, the server's CPU over both, and the
# chunks per drive write (engine counters `chunk_writes` / `drive_writes`; a build without
# them prints nothing there). The two builds interleave round by round so both see the same
# machine (it is shared and noisy).
#
#   bench/ab_fill.sh OLD_BINARY NEW_BINARY [ROUNDS]
set -euo pipefail
A=${1:?old flashpool binary}; B=${2:?new flashpool binary}
ROUNDS=${3:-3}
WORK=${WORK:-$(dirname "$0")/../target/ab-fill}
mkdir -p "$WORK"
HZ=$(getconf CLK_TCK)
bw() { python3 -c '
import json, sys
t = sys.stdin.read()
print(round(json.loads(t[t.index("{"):])["jobs"][0]["write"]["bw"] / 1024))'; }
for r in $(seq "$ROUNDS"); do
    for which in A B; do
        bin=$A; [ "$which" = B ] && bin=$B
        d="$WORK/$which"; rm -rf "$d"; mkdir -p "$d"
        "$bin" serve --data "$d/data" --socket "$d/nbd.sock" --listen 127.0.0.1:0 >"$d/log" 2>&1 &
        srv=$!
        for _ in $(seq 300); do [ -S "$d/nbd.sock" ] && break; sleep 0.1; done
        uri="nbd+unix:///default?socket=$d/nbd.sock"
        pass() { fio --name=p --rw=write --bs=1M --iodepth=8 --ioengine=nbd --uri="$uri" \
            --size=1G --output-format=json | bw; }
        fill=$(pass); over=$(pass)
        ticks=$(awk '{print $14+$15}' "/proc/$srv/stat")
        gathered=$("$bin" status --data "$d/data" --json 2>/dev/null | python3 -c '
import json, sys
c = json.load(sys.stdin).get("counters", {})
if "drive_writes" in c:
    print("%.2f chunks per drive write" % (c["chunk_writes"] / max(1, c["drive_writes"])))
' || true)
        kill "$srv"; wait "$srv" 2>/dev/null || true
        printf 'round %s %s: fill %s MiB/s, overwrite %s MiB/s, server CPU %.2f s for 2 GiB  %s\n' \
            "$r" "$which" "$fill" "$over" "$(echo "$ticks $HZ" | awk '{print $1/$2}')" "$gathered"
    done
done
rm -rf "$WORK"
