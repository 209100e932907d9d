#!/usr/bin/env bash
# System calls, context switches and CPU of `flashpool serve` per read: its default pool in
# WORKDIR (this machine's disk), filled with 1 MiB writes, then fio's nbd engine doing 4 KiB
# random reads at iodepth QD over the Unix socket while `perf stat` counts the server's
# `io_uring_enter`, `recvfrom`, `writev`, `sendmsg`, `poll` and `pread64` calls.
#
#   bench/server_syscalls.sh [QD] [RUNTIME_S] [WORKDIR]     (default: 32 4 target/server-syscalls)
#
# FLASHPOOL names the binary (default target/release/flashpool); needs perf with tracepoints.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
qd=${1:-32}
rt=${2:-4}
d=${3:-$root/target/server-syscalls}
fp=${FLASHPOOL:-$root/target/release/flashpool}
rm -rf "$d"
mkdir -p "$d"
"$fp" serve --data "$d/data" --socket "$d/nbd.sock" --listen 127.0.0.1:0 >"$d/log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$d/nbd.sock" ] && break; sleep 0.1; done
uri="nbd+unix:///default?socket=$d/nbd.sock"
fio --name=fill --rw=write --bs=1M --iodepth=8 --ioengine=nbd --uri="$uri" --size=1G \
    --output-format=terse >/dev/null
events=syscalls:sys_enter_io_uring_enter,syscalls:sys_enter_recvfrom,syscalls:sys_enter_writev
events=$events,syscalls:sys_enter_sendmsg,syscalls:sys_enter_poll,syscalls:sys_enter_pread64
perf stat -e "$events,context-switches,task-clock" -p "$pid" -o "$d/perf.txt" &
perf_pid=$!
sleep 0.3
fio --name=p --rw=randread --bs=4k --iodepth="$qd" --ioengine=nbd --uri="$uri" --size=1G \
    --time_based --runtime="$rt" --output-format=json >"$d/fio.json"
kill -INT $perf_pid
wait $perf_pid 2>/dev/null || true
python3 - "$d/fio.json" "$d/perf.txt" "$qd" <<'PY'
import json, sys
t = open(sys.argv[1]).read()
r = json.loads(t[t.index('{'):])['jobs'][0]['read']
n = max(r['total_ios'], 1)
print(f"depth {sys.argv[3]}: {r['iops'] / 1000:.1f} K reads/s, mean {r['clat_ns']['mean'] / 1000:.0f} us, {n} reads")
for line in open(sys.argv[2]):
    f = line.split()
    if len(f) >= 2 and (f[1].startswith('syscalls:') or f[1] in ('context-switches', 'msec')):
        what = 'task-clock (ms)' if f[1] == 'msec' else f[1].replace('syscalls:sys_enter_', '')
        print(f"  {what:20} {float(f[0].replace(',', '')) / n:8.3f} per read")
PY
