#!/usr/bin/env bash
# The disk in flashpool's own write pattern, without flashpool: what the default pool's drive
# files can take. A log-structured pool writes each drive file sequentially, a stripe's chunks
# to every drive at once, each drive a few writes deep; fio does the same here (one job per
# file, io_uring, O_DIRECT, sequential writes of SIZE at DEPTH per file) on DRIVES files of
# the filesystem under WORKDIR, in three states of the files:
#
#   fresh     made by `fallocate` (what `flashpool serve` makes): every write lands in
#             unwritten extents, which the filesystem converts as each write completes
#   sparse    made by `truncate` (`serve --sparse`): every write allocates
#   written   the same files again, now written once (what a pool meets after its log has
#             gone once round its drives, and what a block device always is)
#
#   bench/drive_pattern.sh [WORKDIR] [DRIVES] [MIB_PER_FILE] [SIZE:DEPTH ...]
#       (default: target/drive-pattern 5 600 128k:2 512k:2 1m:2 2m:2)
#
# Prints MiB/s over all files for each point; the pool's host bandwidth is at most this times
# k/(k+m) (parity goes to the drives too).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$root/target/drive-pattern}
drives=${2:-5}
mib=${3:-600}
shift $(( $# >= 3 ? 3 : $# ))
points=${*:-128k:2 512k:2 1m:2 2m:2}
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
run() { # SIZE DEPTH: one pass over every file, MiB/s
    local jobs=()
    for i in $(seq 0 $((drives - 1))); do jobs+=(--name="d$i" --filename="$work/d$i"); done
    fio --rw=write --bs="$1" --iodepth="$2" --ioengine=io_uring --direct=1 --size="${mib}M" \
        --group_reporting --output-format=json "${jobs[@]}" | python3 -c '
import json, sys
print(round(json.load(sys.stdin)["jobs"][0]["write"]["bw"] / 1024))'
}
make() { # fallocate|truncate
    rm -f "$work"/d*
    for i in $(seq 0 $((drives - 1))); do
        if [ "$1" = fallocate ]; then fallocate -l "${mib}M" "$work/d$i"; else truncate -s "${mib}M" "$work/d$i"; fi
    done
    sync
}
printf '%-10s %10s %10s %10s   (MiB/s over %s files of %s MiB, %s)\n' point fresh sparse written \
    "$drives" "$mib" "$(df --output=fstype "$work" | tail -1)"
for p in $points; do
    size=${p%%:*} depth=${p##*:}
    make truncate
    sparse=$(run "$size" "$depth")
    make fallocate
    fresh=$(run "$size" "$depth")
    written=$(run "$size" "$depth")
    printf '%-10s %10s %10s %10s\n' "$size x$depth" "$fresh" "$sparse" "$written"
done
