#!/usr/bin/env bash
# Many connections at once (issue 16, reactors): 16 fio jobs of 4 KiB random reads at depth 4,
# each its own NBD connection, against `flashpool serve` with a thread per connection and with
# reactors, on memory drives and on the default file-drive pool in WORKDIR (a real disk), the
# servers taking turns round by round. Per run: IOPS, p99 latency, the server's CPU time per
# I/O (utime+stime over the fio run).
#
#   bash bench/many_connections.sh [ROUNDS] [REACTORS...]      (defaults: 2 rounds; 1 and 2)
#
# ONLY=REGEX runs only the rows whose name matches (e.g. ONLY=reactors2-file).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
fp=${FLASHPOOL:-$root/target/release/flashpool}
work=${WORKDIR:-$root/target/many-connections}
rounds=${1:-2}
shift || true
reactors=("$@")
[ $# -eq 0 ] && reactors=(1 2)
run() { # name, serve args...
    local name=$1; shift
    [[ $name =~ ${ONLY:-.} ]] || return 0
    local w=$work/$name
    rm -rf "$w"; mkdir -p "$w"
    "$fp" serve --data "$w/data" --socket "$w/nbd.sock" --listen 127.0.0.1:0 "$@" >"$w/log" 2>&1 &
    local srv=$!
    # Memory drives are touched whole at start (5 GiB by default): seconds on a busy machine.
    for _ in $(seq 600); do [ -S "$w/nbd.sock" ] && break; sleep 0.1; done
    local uri="nbd+unix:///default?socket=$w/nbd.sock"
    fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --size=256M --iodepth=8 >/dev/null
    local t0 t1
    t0=$(awk '{print $14+$15}' "/proc/$srv/stat")
    fio --name=r --ioengine=nbd --uri="$uri" --rw=randread --bs=4k --size=256M --iodepth=4 \
        --numjobs=16 --group_reporting --time_based --runtime=5 --output-format=json >"$w/fio.json"
    t1=$(awk '{print $14+$15}' "/proc/$srv/stat")
    kill -INT "$srv"; wait "$srv" || true
    # The pool's drive files take GiBs (allocated at full size): not kept.
    rm -rf "$w/data"
    python3 - "$name" "$t0" "$t1" "$(getconf CLK_TCK)" "$w/fio.json" <<'PY'
import json, sys
name, t0, t1, hz = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
raw = open(sys.argv[5]).read()
r = json.loads(raw[raw.index("{"):])["jobs"][0]["read"]
cpu = (t1 - t0) / hz * 1e6 / r["total_ios"]
print(f"{name:18} {r['iops'] / 1000:7.1f} K IOPS  p99 {r['clat_ns']['percentile']['99.000000'] / 1000:6.0f} us"
      f"  server CPU {cpu:5.1f} us/IO")
PY
}
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')  cpus: $(nproc)  filesystem: $(findmnt -n -o FSTYPE,SOURCE -T "$(dirname "$work")")"
for r in $(seq "$rounds"); do
    echo "round $r"
    run threads-memory --memory
    for n in "${reactors[@]}"; do run "reactors$n-memory" --memory --nbd-reactors "$n"; done
    run threads-file
    for n in "${reactors[@]}"; do run "reactors$n-file" --nbd-reactors "$n"; done
done
