#!/bin/bash
# A/B of two flashpool builds that keeps both servers up: each serves its own default pool
# (five 1 GiB drive files under WORK, this machine's disk), filled once with 1 MiB writes, and
# the fio points then alternate between them round after round, so each pool goes on from
# where its last point left it (the log wraps, the cleaner works) and both see the same
# machine (it is shared and noisy). Needs about 10 GiB free.
#
#   bench/ab_steady.sh OLD_BINARY NEW_BINARY ROUNDS SECONDS POINT...
#
# POINT is rw:bs:iodepth[:jobs], e.g. randwrite:4k:32 or randread:4k:32:4. FIO_EXTRA adds fio
# options to every point (FIO_EXTRA="--norandommap --randrepeat=0": uniform random offsets
# with repeats, which leave segments partly live, instead of fio's default map, which visits
# every block once per pass); SERVE_ARGS adds `serve` options to both servers. A binary may be a
# wrapper script (to give one side other options). Prints per point: IOPS, mean and p99
# completion latency, server CPU (utime+stime) per I/O.
set -euo pipefail
A=${1:?old flashpool binary}; B=${2:?new flashpool binary}; R=${3:?rounds}; S=${4:?seconds}
shift 4
[ $# -gt 0 ] || { echo "no points given" >&2; exit 2; }
WORK=${WORK:-$(cd "$(dirname "$0")/.." && pwd)/target/ab-steady}
rm -rf "$WORK"; mkdir -p "$WORK"
declare -A PID URI
cleanup() {
    for x in A B; do [ -n "${PID[$x]:-}" ] && kill "${PID[$x]}" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
for x in A B; do
    bin=${!x}; mkdir -p "$WORK/$x"
    # shellcheck disable=SC2086
    "$bin" serve --data "$WORK/$x/data" --socket "$WORK/$x/nbd.sock" --listen 127.0.0.1:0 \
        ${SERVE_ARGS:-} > "$WORK/$x/log" 2>&1 &
    PID[$x]=$!
    for _ in $(seq 100); do [ -S "$WORK/$x/nbd.sock" ] && break; sleep 0.1; done
    URI[$x]="nbd+unix:///default?socket=$WORK/$x/nbd.sock"
    fio --name=fill --rw=write --bs=1M --iodepth=8 --ioengine=nbd --uri="${URI[$x]}" \
        --size=1G --output-format=terse > /dev/null
done
sleep 5
for r in $(seq "$R"); do
    for pt in "$@"; do
        for x in A B; do
            IFS=: read -r rw bs qd jobs <<<"$pt"
            t0=$(awk '{print $14+$15}' "/proc/${PID[$x]}/stat")
            # shellcheck disable=SC2086
            out=$(fio --name=p --rw="$rw" --bs="$bs" --iodepth="$qd" --numjobs="${jobs:-1}" \
                --group_reporting --ioengine=nbd --uri="${URI[$x]}" --size=1G ${FIO_EXTRA:-} \
                --time_based --runtime="$S" --output-format=json)
            t1=$(awk '{print $14+$15}' "/proc/${PID[$x]}/stat")
            python3 - "$x" "$r" "$pt" $((t1 - t0)) "$(getconf CLK_TCK)" "$out" <<'PY'
import json, sys
x, r, pt, ticks, hz, out = sys.argv[1:]
j = json.loads(out[out.index('{'):])['jobs'][0]
d = j['read'] if j['read']['total_ios'] else j['write']
print(f"{x} round {r} {pt:18} {d['iops'] / 1000:7.1f} K  mean {d['clat_ns']['mean'] / 1000:7.1f} us"
      f"  p99 {d['clat_ns']['percentile']['99.000000'] / 1000:7.0f} us"
      f"  server CPU/IO {int(ticks) / int(hz) * 1e6 / d['total_ios']:6.1f} us")
PY
        done
    done
done
