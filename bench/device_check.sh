#!/usr/bin/env bash
# The issue-16 measurements in one call, for a machine lent for a few minutes (the 16-core
# device machine): the real-disk table (bench/disk_bench.py, with its flashpool-reactors
# target: connections on reactor threads against a thread each), the same two again over
# three interleaved rounds with the raw file around them (bench/ab_randread.sh), reads in
# flight at the disk (bench/disk_depth.sh), 1 MiB writes with 2 and 8 stripe writers and the
# bytes the disk has in flight under them (bench/stripe_writers.sh), 16 connections on
# reactors against a thread each (bench/many_connections.sh), one checkpoint's timing from
# the server's debug log (how long writers were held, how long the flush took), and last,
# when NVME_LOAD names the nvme-load example, one round of NVMe/TCP against NBD on the
# file-drive pool (bench/nvme_vs_nbd.py). With FLASHPOOL_B naming a second build, one more
# A/B of the two on reactors (1.5 minutes). About 7.5 minutes without it; each part's output
# goes to OUTDIR as it finishes, so a run cut short still returns what it measured.
#
# Here:       bench/portable_bundle.sh .devbench/bundle.tar.xz target/release/flashpool \
#               target/release/examples/nvme-load [OTHER_BUILD/flashpool-b]
# There:      tar xJf .devbench/bundle.tar.xz -C /tmp/b && PATH=/tmp/b/bin:$PATH \
#               FLASHPOOL=/tmp/b/bin/flashpool NVME_LOAD=/tmp/b/bin/nvme-load \
#               [FLASHPOOL_B=/tmp/b/bin/flashpool-b] \
#               bash bench/device_check.sh /tmp/r > "$OUT/log" 2>&1; tar czf "$OUT/r.tgz" -C /tmp r
#             (the device tool returns at most 8 files from $OUT; OUTDIR holds more)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: bench/device_check.sh OUTDIR}
mkdir -p "$out"
fp=${FLASHPOOL:-$root/target/release/flashpool}
work=${WORKDIR:-$root/target/device-check}
mkdir -p "$work"
export FLASHPOOL=$fp
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')  commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "cpus: $(nproc)  $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
    echo "filesystem: $(findmnt -n -o FSTYPE,SOURCE -T "$work")"
} | tee "$out/machine.txt"

python3 "$root/bench/disk_bench.py" --runtime 5 --rounds 1 --flashpool "$fp" \
    --workdir "$work/disk-bench" 2>&1 | tee "$out/disk_bench.txt"
# A wrapper at $2 running build $1 with its connections on reactors (half the CPUs).
# shellcheck source=bench/wrap.sh
source "$root/bench/wrap.sh"
on_reactors() { wrap "$2" "\"$1\"" "--nbd-reactors $(( $(nproc) / 2 ))"; }
# Threads against reactors on the points where they part (depth 32 and 1 MiB reads ahead on
# reactors, depth 1 behind), three interleaved rounds with the raw file's points around them.
on_reactors "$fp" "$work/fp-reactors"
RAW=1 POINTS="randread:4k:32 randread:4k:1 read:1M:8" WORK="$work/ab" \
    bash "$root/bench/ab_randread.sh" "$fp" "$work/fp-reactors" 3 4 2>&1 \
    | tee "$out/threads_vs_reactors.txt"
# A second build to judge on reactors (FLASHPOOL_B, e.g. the branch experiment/reactor-poll:
# a reactor that polls once it has answered everything), against this one, both on reactors.
if [ -n "${FLASHPOOL_B:-}" ] && [ -x "$FLASHPOOL_B" ]; then
    on_reactors "$FLASHPOOL_B" "$work/fpb-reactors"
    POINTS="randread:4k:1 randread:4k:32 read:1M:8" WORK="$work/ab-b" \
        bash "$root/bench/ab_randread.sh" "$work/fp-reactors" "$work/fpb-reactors" 3 4 2>&1 \
        | tee "$out/reactors_a_vs_b.txt"
fi
bash "$root/bench/disk_depth.sh" "$work/depth" 5 2>&1 | tee "$out/disk_depth.txt"
bash "$root/bench/stripe_writers.sh" "$work/sw" 8 2 8 2>&1 | tee "$out/stripe_writers.txt"
WORKDIR="$work/mc" bash "$root/bench/many_connections.sh" 1 4 8 2>&1 | tee "$out/many_connections.txt"

# One checkpoint under a 1 MiB write stream: the engine logs its phases at debug level.
pool=$work/cp
rm -rf "$pool"
mkdir -p "$pool"
RUST_LOG=flashpool_engine::checkpoint=debug "$fp" serve --data "$pool/data" \
    --socket "$pool/nbd.sock" --listen 127.0.0.1:0 >"$pool/log" 2>&1 &
srv=$!
trap 'kill $srv 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$pool/nbd.sock" ] && break; sleep 0.1; done
fio --name=cp --rw=write --bs=1M --iodepth=8 --ioengine=nbd \
    --uri="nbd+unix:///default?socket=$pool/nbd.sock" --size=3G --output-format=json \
    >"$pool/fio.json"
# How many chunk writes the stripe writers merged into one drive write (queued stripes).
"$fp" status --data "$pool/data" --json | python3 -c '
import json, sys
c = json.load(sys.stdin)["counters"]
print("chunk writes %d in %d drive writes (%.2f chunks per write)" % (
    c["chunk_writes"], c["drive_writes"], c["chunk_writes"] / max(1, c["drive_writes"])))
' | tee "$out/gathered.txt" || true
kill $srv
wait $srv 2>/dev/null || true
python3 - "$pool/fio.json" <<'PY' | tee "$out/checkpoint.txt"
import json, sys
t = open(sys.argv[1]).read()
j = json.loads(t[t.index("{"):])["jobs"][0]["write"]
p = j["clat_ns"]["percentile"]
print("1 MiB writes over 3 GiB: %.0f MiB/s, p99 %.1f ms, p99.9 %.1f ms" % (
    j["bw"] / 1024, p["99.000000"] / 1e6, p["99.900000"] / 1e6))
PY
sed 's/\x1b\[[0-9;]*m//g' "$pool/log" | grep "checkpoint written" | tee -a "$out/checkpoint.txt"

# NVMe/TCP against NBD on the file-drive pool: server CPU per read through each door.
if [ -n "${NVME_LOAD:-}" ] && [ -x "$NVME_LOAD" ]; then
    python3 "$root/bench/nvme_vs_nbd.py" --runtime 4 --rounds 1 --file-drives \
        --flashpool "$fp" --load "$NVME_LOAD" 2>&1 | tee "$out/nvme_vs_nbd.txt" || true
fi
