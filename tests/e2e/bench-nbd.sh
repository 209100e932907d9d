#!/bin/bash
# NBD front-end benchmark: fio (ioengine=nbd) 4 KiB random reads and
# writes at iodepth 1 and 32 against the server under test and, when
# installed, the peers nbdkit (null, memory) and qemu-nbd (a /dev/shm raw
# file), over the same transport in the same run. Reports IOPS, mean and
# p99 latency and the server's CPU time per I/O (utime+stime from /proc).
#
#   tests/e2e/bench-nbd.sh [memserve|flashpool]
# Knobs: RUNTIME (s, default 5), RAMP (s, 1), SIZE (1G), TRANSPORT
# (unix|tcp), SERVERS ("ours nbdkit-null nbdkit-memory qemu-nbd"),
# RWS ("randread randwrite"), QDS ("1 32"), OUT (markdown table file).
set -euo pipefail
export SERVER_KIND=${1:-${SERVER_KIND:-memserve}}
source "$(dirname "$0")/lib.sh"
RUNTIME=${RUNTIME:-5}; RAMP=${RAMP:-1}; SIZE=${SIZE:-1G}
TRANSPORT=${TRANSPORT:-unix}
SERVERS=${SERVERS:-"ours nbdkit-null nbdkit-memory qemu-nbd"}
RWS=${RWS:-"randread randwrite"}; QDS=${QDS:-"1 32"}
OUT=${OUT:-/dev/stdout}
CLK=$(getconf CLK_TCK)
build_server
new_workdir; trap 'cleanup; rm -f /dev/shm/nbd-bench.raw' EXIT

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

launch() {   # launch KIND -> sets SERVER_PID and URI
    local kind=$1
    rm -f "$SOCK"
    local listen=(); local uri
    if [ "$TRANSPORT" = unix ]; then uri="nbd+unix:///?socket=$SOCK"; else uri="nbd://127.0.0.1:$PORT/"; fi
    case $kind in
        ours)
            rm -rf "$DATA"
            # shellcheck disable=SC2086
            $(server_cmd) --data "$DATA" --listen "127.0.0.1:$PORT" --socket "$SOCK" >"$WORK/s.log" 2>&1 & ;;
        nbdkit-null|nbdkit-memory)
            command -v nbdkit >/dev/null || return 1
            if [ "$TRANSPORT" = unix ]; then listen=(-U "$SOCK"); else listen=(-i 127.0.0.1 -p "$PORT"); fi
            nbdkit -f "${listen[@]}" "${kind#nbdkit-}" "$SIZE" >"$WORK/s.log" 2>&1 & ;;
        qemu-nbd)
            command -v qemu-nbd >/dev/null || return 1
            truncate -s "$SIZE" /dev/shm/nbd-bench.raw
            if [ "$TRANSPORT" = unix ]; then listen=(-k "$SOCK"); else listen=(-b 127.0.0.1 -p "$PORT"); fi
            qemu-nbd "${listen[@]}" -f raw -x '' -t -e 4 --cache=none --aio=io_uring /dev/shm/nbd-bench.raw >"$WORK/s.log" 2>&1 & ;;
    esac
    SERVER_PID=$!
    URI=$uri
    for _ in $(seq 200); do timeout 2 nbdinfo --size "$URI" >/dev/null 2>&1 && return 0; sleep 0.05; done
    return 1
}

printf '| server | transport | rw | iodepth | IOPS | mean lat (us) | p99 lat (us) | server CPU us/IO |\n|---|---|---|---:|---:|---:|---:|---:|\n' > "$WORK/table"
for srv in $SERVERS; do
    if ! launch "$srv"; then echo "skip $srv (not available)" >&2; cleanup_one=1; kill "$SERVER_PID" 2>/dev/null || true; continue; fi
    # Prefill so reads hit data, not holes.
    fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=1M --size="$SIZE" --iodepth=4 >/dev/null
    for rw in $RWS; do for qd in $QDS; do
        c0=$(cpu_ticks "$SERVER_PID")
        fio --name=b --ioengine=nbd --uri="$URI" --rw="$rw" --bs=4k --size="$SIZE" --iodepth="$qd" \
            --time_based --runtime="$RUNTIME" --ramp_time="$RAMP" --norandommap --lat_percentiles=1 \
            --output-format=json --output="$WORK/r.json"
        c1=$(cpu_ticks "$SERVER_PID")
        $PY - "$WORK/r.json" "$srv" "$TRANSPORT" "$rw" "$qd" "$((c1 - c0))" "$CLK" "$RUNTIME" "$RAMP" >> "$WORK/table" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); srv, tr, rw, qd, ticks, clk, rt, ramp = sys.argv[2:]
d = j["jobs"][0]["read" if rw == "randread" else "write"]
iops = d["iops"]; lat = d["lat_ns"]
p99 = lat.get("percentile", {}).get("99.000000", 0) / 1000
# CPU ticks cover ramp + runtime; I/Os counted by fio cover runtime only.
ios = iops * (float(rt) + float(ramp))
cpu_us = int(ticks) / int(clk) * 1e6 / ios if ios else 0
print(f"| {srv} | {tr} | {rw} | {qd} | {iops:,.0f} | {lat['mean']/1000:.1f} | {p99:.1f} | {cpu_us:.2f} |")
PY
        tail -1 "$WORK/table" >&2
    done; done
    kill -TERM "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=
done
cat "$WORK/table" > "$OUT"
