#!/usr/bin/env bash
# Do io_uring's registered files and fixed (registered) buffers pay on this machine's disk?
# fio on a raw file of WORKDIR's filesystem (io_uring, O_DIRECT), the two I/O shapes that
# matter to flashpool's drives: 4 KiB random reads at depth 32 (the read queue) and 1 MiB
# writes at depth 8 (a stripe writer's chunk writes), each plain, with `registerfiles`, with
# `fixedbufs` and with both, in turns for ROUNDS rounds. Prints IOPS or bandwidth and fio's
# own CPU per I/O (user + system): what the option saves is CPU, the disk's rate is the same.
#
#   bench/uring_options.sh [WORKDIR] [ROUNDS] [RUNTIME_S]   (default: target/uring-options 3 3)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$root/target/uring-options}
rounds=${2:-3}
rt=${3:-3}
mkdir -p "$work"
img=$work/raw.img
[ -f "$img" ] || fio --name=fill --filename="$img" --size=1G --rw=write --bs=1M --iodepth=8 \
    --direct=1 --ioengine=io_uring --output-format=terse >/dev/null
one() { # rw bs iodepth options...
    local rw=$1 bs=$2 qd=$3
    shift 3
    fio --name=p --filename="$img" --size=1G --rw="$rw" --bs="$bs" --iodepth="$qd" \
        --direct=1 --ioengine=io_uring "$@" --time_based --runtime="$rt" \
        --output-format=json >"$work/fio.json"
    python3 - "$rw" "$bs" "$qd" "${*:-plain}" "$rt" "$work/fio.json" <<'PY'
import json, sys
rw, bs, qd, opts, rt, path = sys.argv[1:]
j = json.load(open(path))['jobs'][0]
d = j['read'] if 'read' in rw else j['write']
cpu = (j['usr_cpu'] + j['sys_cpu']) / 100 * float(rt) * 1e6 / max(d['total_ios'], 1)
rate = f"{d['iops'] / 1000:7.1f} K IOPS" if bs == '4k' else f"{d['bw'] / 1024:7.0f} MiB/s"
print(f"{rw:9} {bs:3} qd{qd:<3} {opts:36} {rate}  fio CPU/IO {cpu:6.1f} us")
PY
}
for r in $(seq "$rounds"); do
    echo "round $r"
    for opts in "" "--registerfiles=1" "--fixedbufs=1" "--registerfiles=1 --fixedbufs=1"; do
        # shellcheck disable=SC2086 # the options are separate words
        one randread 4k 32 $opts
    done
    for opts in "" "--registerfiles=1" "--fixedbufs=1" "--registerfiles=1 --fixedbufs=1"; do
        # shellcheck disable=SC2086
        one write 1M 8 $opts
    done
done
