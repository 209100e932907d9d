#!/bin/bash
# A/B of two flashpool builds on the default file-drive pool (this machine's real disk):
# random 4 KiB reads at iodepth 1 and 32 over NBD (fio's nbd engine), IOPS, mean latency
# and server CPU per I/O, the two builds interleaved round by round so both see the same
# machine (it is shared and noisy).
#
#   bench/ab_randread.sh OLD_BINARY NEW_BINARY [ROUNDS] [RUNTIME_S]
#
# POINTS="rw:bs:iodepth ..." picks other read points (default "randread:4k:1 randread:4k:32";
# "read:1M:8" is the 1 MiB sequential read of what the fill wrote).
#
# Each round starts a fresh `flashpool serve --data DIR` per build, fills its 1 GiB default
# volume with 1 MiB writes, then runs the two points.
#
# RAW=1 also runs the points with fio straight on a 1 GiB file in WORK (io_uring, O_DIRECT:
# the physical limit) before the first round and after the last, for ratios in the same run.
# EXTRA="BIN_C BIN_D ..." adds more builds to each round, labelled C, D, ... in turn.
set -euo pipefail
A=${1:?old flashpool binary}; B=${2:?new flashpool binary}
ROUNDS=${3:-3}; RT=${4:-4}
WORK=${WORK:-$(dirname "$0")/../target/ab-randread}
mkdir -p "$WORK"
POINTS=${POINTS:-randread:4k:1 randread:4k:32}
LABELS=(A B C D E F G H)
# shellcheck disable=SC2086 # EXTRA is a list of words
[ $(( 2 + $(echo ${EXTRA:-} | wc -w) )) -le ${#LABELS[@]} ] || { echo "at most 8 builds" >&2; exit 2; }
point() { # label server-pid|- rw:bs:iodepth fio-target-args...: one point, its summary line
    local label=$1 pid=$2 pt=$3 t0=0 t1=0 out rw bs qd
    shift 3
    IFS=: read -r rw bs qd <<<"$pt"
    [ "$pid" = - ] || t0=$(awk '{print $14+$15}' "/proc/$pid/stat")
    out=$(fio --name=p --rw="$rw" --bs="$bs" --iodepth="$qd" "$@" \
        --size=1G --time_based --runtime="$RT" --output-format=json)
    [ "$pid" = - ] || t1=$(awk '{print $14+$15}' "/proc/$pid/stat")
    python3 - "$label" "$pt" "$pid" $((t1 - t0)) "$(getconf CLK_TCK)" <<PY
import json, sys
t = '''$out'''
j = json.loads(t[t.index('{'):])['jobs'][0]['read']
label, pt, pid, ticks, hz = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
cpu = "" if pid == "-" else f"  server CPU/IO {ticks / hz * 1e6 / j['total_ios']:5.1f} us"
print(f"{label:4} {pt:16} {j['iops']/1000:7.1f} K IOPS {j['bw']/1024:7.0f} MiB/s"
      f"  mean {j['clat_ns']['mean']/1000:7.1f} us" + cpu)
PY
}
raw() { # with RAW=1: the points on the raw file (filled once)
    [ "${RAW:-0}" = 1 ] || return 0
    [ -f "$WORK/raw.img" ] || fio --name=fill --filename="$WORK/raw.img" --size=1G --rw=write \
        --bs=1M --iodepth=8 --direct=1 --ioengine=io_uring --output-format=terse > /dev/null
    for pt in $POINTS; do
        point RAW - "$pt" --filename="$WORK/raw.img" --direct=1 --ioengine=io_uring
    done
}
raw
for r in $(seq "$ROUNDS"); do
    i=0
    for bin in "$A" "$B" ${EXTRA:-}; do
        which=${LABELS[i]}
        i=$((i + 1))
        d="$WORK/$which"; rm -rf "$d"; mkdir -p "$d"
        "$bin" serve --data "$d/data" --socket "$d/nbd.sock" --listen 127.0.0.1:0 > "$d/log" 2>&1 &
        pid=$!
        for _ in $(seq 100); do [ -S "$d/nbd.sock" ] && break; sleep 0.1; done
        uri="nbd+unix:///default?socket=$d/nbd.sock"
        fio --name=p --rw=write --bs=1M --iodepth=8 --ioengine=nbd --uri="$uri" --size=1G \
            --output-format=terse > /dev/null
        echo "round $r"
        for pt in $POINTS; do
            point "$which" "$pid" "$pt" --ioengine=nbd --uri="$uri"
        done
        kill "$pid"; wait "$pid" 2>/dev/null || true
        rm -rf "$d"
    done
done
raw
rm -f "$WORK/raw.img"
