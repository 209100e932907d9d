#!/usr/bin/env bash
# Issue 16's one open target in one short call (about 4 minutes), for a lent many-core
# machine: 4 KiB random reads at depth 32 through one NBD connection (and at depth 1 beside
# it), interleaved round by round across the ways of serving it, with fio on a raw file of
# the same filesystem before the first round and after the last (bench/ab_randread.sh RAW=1):
#
#   A  this build, a thread per connection (the default)
#   B  this build, connections on reactors (half the CPUs)
#   C  this build, a thread per connection, the server pinned to the upper half of the CPUs
#      (taskset; fio is left to the scheduler): whether the server sharing a core with fio's
#      client is what one connection loses
#   D  FLASHPOOL_EPOLL, if given: a build whose connection thread waits in epoll as a
#      reactor does (branch experiment/epoll-wait), a thread per connection
#   E  (D if FLASHPOOL_EPOLL is not given) FLASHPOOL_POLL, if given: a build whose reactors
#      poll once they have answered everything (branch experiment/reactor-poll), on reactors
#
#   bench/device_qd32.sh OUTDIR [ROUNDS] [RUNTIME_S]     (default: 3 rounds of 4 s points)
#
# With WAKE_PINGPONG naming the example wake_pingpong (crates/engine/examples), it also
# measures a wake-up's cost there, on one CPU and across two (about 10 s).
#
# Here:   bench/portable_bundle.sh .devbench/bundle.tar.xz target/release/flashpool \
#           target/release/examples/wake_pingpong \
#           [EPOLL_BUILD/flashpool-epoll] [POLL_BUILD/flashpool-poll]
# There:  tar xJf .devbench/bundle.tar.xz -C /tmp/b && PATH=/tmp/b/bin:$PATH \
#           FLASHPOOL=/tmp/b/bin/flashpool WAKE_PINGPONG=/tmp/b/bin/wake_pingpong \
#           [FLASHPOOL_EPOLL=/tmp/b/bin/flashpool-epoll] \
#           [FLASHPOOL_POLL=/tmp/b/bin/flashpool-poll] bash bench/device_qd32.sh "$OUT"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: bench/device_qd32.sh OUTDIR [ROUNDS] [RUNTIME_S]}
rounds=${2:-3}
rt=${3:-4}
mkdir -p "$out"
fp=${FLASHPOOL:-$root/target/release/flashpool}
work=${WORKDIR:-$root/target/device-qd32}
mkdir -p "$work"
n=$(nproc)
half=$((n / 2))
[ "$half" -ge 1 ] || half=1
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')  commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "cpus: $n  $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
    echo "filesystem: $(findmnt -n -o FSTYPE,SOURCE -T "$work")"
} | tee "$out/machine.txt"
# shellcheck source=bench/wrap.sh
source "$root/bench/wrap.sh" # wrap AT CMD [ARGS]: a server wrapper for the A/B script
wrap "$work/reactors" "\"$fp\"" "--nbd-reactors $half"
if command -v taskset >/dev/null && [ "$n" -ge 2 ]; then
    wrap "$work/pinned" "taskset -c $half-$((n - 1)) \"$fp\""
else
    wrap "$work/pinned" "\"$fp\""
    echo "C is not pinned (no taskset or one CPU)" | tee -a "$out/machine.txt"
fi
# The builds after A and B (ab_randread.sh labels them C, D, ... in this order).
extra="$work/pinned"
names="A threads, B reactors ($half), C threads pinned to CPUs $half-$((n - 1))"
next=D
if [ -n "${FLASHPOOL_EPOLL:-}" ] && [ -x "$FLASHPOOL_EPOLL" ]; then
    extra="$extra $FLASHPOOL_EPOLL"
    names="$names, $next threads waiting in epoll ($FLASHPOOL_EPOLL)"
    next=E
fi
if [ -n "${FLASHPOOL_POLL:-}" ] && [ -x "$FLASHPOOL_POLL" ]; then
    wrap "$work/poll-reactors" "\"$FLASHPOOL_POLL\"" "--nbd-reactors $half"
    extra="$extra $work/poll-reactors"
    names="$names, $next polling reactors ($FLASHPOOL_POLL)"
fi
echo "builds: $names" | tee -a "$out/machine.txt"
# shellcheck disable=SC2086 # a list of paths without spaces
RAW=1 EXTRA="$extra" POINTS="randread:4k:32 randread:4k:1" WORK="$work/ab" \
    bash "$root/bench/ab_randread.sh" "$fp" "$work/reactors" "$rounds" "$rt" 2>&1 \
    | tee "$out/qd32.txt"
# What a wake-up costs there, on one CPU and across two (the example wake_pingpong).
if [ -n "${WAKE_PINGPONG:-}" ] && [ -x "$WAKE_PINGPONG" ]; then
    "$WAKE_PINGPONG" 10000 2 2>&1 | tee "$out/wake_pingpong.txt"
fi
# Medians per build and point.
python3 - "$out/qd32.txt" <<'PY' | tee "$out/summary.txt"
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\w+)\s+(\S+)\s+([\d.]+) K IOPS.*mean\s+([\d.]+) us", line)
    if m:
        runs.setdefault((m[1], m[2]), []).append((float(m[3]), float(m[4])))
med = {key: (statistics.median(k for k, _ in v), statistics.median(x for _, x in v))
       for key, v in runs.items()}
for (b, pt), v in sorted(runs.items(), key=lambda x: (x[0][1], x[0][0])):
    k, lat = med[(b, pt)]
    ratio = ""
    if b != "RAW" and ("RAW", pt) in med:
        rk, rlat = med[("RAW", pt)]
        ratio = f"{k / rk:.2f}x raw, mean latency {lat - rlat:+.0f} us over raw"
    print(f"{pt:16} {b:4} median {k:6.1f} K ({', '.join(f'{x:.1f}' for x, _ in v)}), mean {lat:6.0f} us  {ratio}")
PY
