# Sourced by the bench scripts that watch the disk under their work dir (disk_depth.sh,
# stripe_writers.sh): which block device it is, and what it has in flight.

# disk_of DIR -> the block device (name in /sys/block) of DIR's filesystem.
disk_of() {
    basename "$(readlink -f "$(findmnt -n -o SOURCE -T "$1")")"
}

# inflight_file DEV -> the file whose two columns are DEV's reads and writes in flight.
inflight_file() {
    local f=/sys/block/$1/inflight
    [ -r "$f" ] || f=/sys/class/block/$1/inflight
    echo "$f"
}

# mean_in_flight FILE COLUMN SECONDS -> the mean of COLUMN (1: reads, 2: writes) of FILE,
# sampled every 10 ms until the time is up.
mean_in_flight() {
    local until=$(( $(date +%s%N) + $3 * 1000000000 ))
    while (( $(date +%s%N) < until )); do cat "$1"; sleep 0.01; done |
        awk -v c="$2" '{s += $c; n++} END {printf "%.2f", s / n}'
}
