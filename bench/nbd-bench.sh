#!/bin/bash
# NBD front-end benchmark (issue 3): fio --ioengine=nbd, 4 KiB randread and
# randwrite at iodepth 1 and 32, over one Unix socket, against
#   flashpool      `flashpool serve --memory --ec 4+1` (memory drives, 4+1 parity,
#                  large enough that the pool does not clean during a run; adaptive
#                  busy polling up to `--busy-poll-us FP_POLL_US`, the default 50)
#   flashpool-nopoll the same with busy polling off (`--busy-poll-us 0`)
#   flashpool-gc   the same on small drives: every randwrite run cleans (GC cost)
#   nbdkit-null    nbdkit's null plugin (a server that does nothing: the ceiling)
#   nbdkit-memory  nbdkit's memory plugin (a RAM disk)
#   qemu-nbd       qemu-nbd serving a raw file on /dev/shm
#   memserve       crates/nbd/examples/memserve: our NBD front-end over a plain
#                  RAM disk (no pool engine), to split front-end from engine cost
#   memserve-null  memserve --null: our front-end over an export that stores nothing
#                  (like nbdkit-null): the front-end's own floor, not in the default set
# in one run. Servers are interleaved round by round (ROUNDS rounds), so a
# change in background load hits every server alike; the table reports the
# median over rounds and the min-max spread, plus the ratios the issue sets
# targets for, each computed inside one round. Every point runs on a fresh
# server whose export was prefilled with 1 MiB sequential writes.
#
# Per point: IOPS, mean and p99 completion latency (fio), and the server's
# CPU time per I/O: utime+stime of the server process from /proc/PID/stat
# over fio's measured window, divided by the I/Os fio completed in it; the
# client's (fio's usr+sys from its JSON) likewise. Before measuring, each
# server rests a second per GiB it holds (see quiesce); after each server
# exits the script waits for free page reporting to go quiet (see settle).
# "other CPU" is what every process other than the server and fio used in
# the same window (100 = one core): the background load that makes a point
# noisy.
#
#   bench/nbd-bench.sh            # build, measure, rewrite the "## NBD front-end"
#                                 # section of docs/PERFORMANCE.md
# Knobs: RUNTIME (s per point, 5), RAMP (s, 1), ROUNDS (3), SIZE (1G),
#   SERVERS ("flashpool flashpool-nopoll flashpool-gc nbdkit-null nbdkit-memory qemu-nbd
#   memserve"), FP_DRIVE_SIZE (2G), FP_GC_DRIVE_SIZE (512M), FP_POLL_US (50),
#   RWS ("randread randwrite"), QDS ("1 32"),
#   DOC (file whose NBD section is rewritten; docs/PERFORMANCE.md; "-": print only),
#   FLASHPOOL (binary; default: built here in release), KEEP (keep the work dir),
#   FLASHPOOL_BASE (another flashpool binary, measured as server "flashpool-base":
#   a before/after comparison in the same run; MEMSERVE_BASE likewise for
#   "memserve-base"),
#   NO_INSTALL=1 (never apt-get).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
HERE=$ROOT/bench
RUNTIME=${RUNTIME:-5}; RAMP=${RAMP:-1}; ROUNDS=${ROUNDS:-3}; SIZE=${SIZE:-1G}
SERVERS=${SERVERS:-"flashpool flashpool-nopoll flashpool-gc nbdkit-null nbdkit-memory qemu-nbd memserve"}
RWS=${RWS:-"randread randwrite"}; QDS=${QDS:-"1 32"}
# flashpool's memory drives: large enough that the pool never cleans during a run (the prefill
# plus the writes of one run stay below the cleaner's watermark), and for `flashpool-gc` small
# enough that the 1 GiB volume fills 60 % of the pool and every randwrite run cleans.
FP_DRIVE_SIZE=${FP_DRIVE_SIZE:-2G}; FP_GC_DRIVE_SIZE=${FP_GC_DRIVE_SIZE:-512M}
# The longest busy poll of `flashpool`, `flashpool-gc` and `memserve` (serve --busy-poll-us;
# `flashpool-nopoll` runs with 0).
FP_POLL_US=${FP_POLL_US:-50}
DOC=${DOC:-$ROOT/docs/PERFORMANCE.md}
CMDLINE="$(printf '%q ' "$0" "$@")"
ENVLINE=""
for v in RUNTIME RAMP ROUNDS SIZE SERVERS RWS QDS FP_DRIVE_SIZE FP_GC_DRIVE_SIZE FP_POLL_US FLASHPOOL FLASHPOOL_BASE MEMSERVE_BASE; do
    if printenv "$v" >/dev/null; then ENVLINE+="$v=$(printf '%q' "${!v}") "; fi
done

need=""
command -v fio >/dev/null || need+=" fio"
command -v nbdkit >/dev/null || need+=" nbdkit"
command -v qemu-nbd >/dev/null || need+=" qemu-utils"
command -v nbdinfo >/dev/null || need+=" libnbd-bin"
command -v python3 >/dev/null || need+=" python3"
if [ -n "$need" ]; then
    if [ -z "${NO_INSTALL:-}" ] && [ "$(id -u)" = 0 ]; then
        apt-get update -qq
        # shellcheck disable=SC2086
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need
    else
        echo "missing:$need (apt-get install them)" >&2; exit 1
    fi
fi

if [ -z "${FLASHPOOL:-}" ]; then
    (cd "$ROOT" && cargo build --release -q -p flashpool)
    FLASHPOOL=${CARGO_TARGET_DIR:-$ROOT/target}/release/flashpool
fi
MEMSERVE=${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/memserve
case " $SERVERS " in *" memserve "*|*" memserve-null "*)
    (cd "$ROOT" && cargo build --release -q -p flashpool-nbd --example memserve) ;;
esac

WORK=$(mktemp -d /tmp/nbd-bench.XXXXXX)
SOCK=$WORK/nbd.sock
URI="nbd+unix:///?socket=$SOCK"
IMG=/dev/shm/nbd-bench-$$.raw
SERVER_PID=""
stop_server() {
    [ -n "$SERVER_PID" ] || return 0
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
}
# Free page reporting hands memory a server freed back to the host after it exits, in bursts
# about every 2 s (10 GiB of flashpool's memory drives take ~30 s), and slows whatever runs
# meanwhile: the next server would pay for its predecessor in its measured window. Wait until
# the kernel's counter of handed-back memory has been still for 3 s (at most 90 s).
settle() {
    local f=/sys/module/page_reporting/parameters/reported_kib prev cur still=0
    [ -r "$f" ] || return 0
    prev=$(cat "$f")
    for _ in $(seq 90); do
        sleep 1; cur=$(cat "$f")
        if [ "$cur" = "$prev" ]; then still=$((still + 1)); else still=0; fi
        [ "$still" -ge 3 ] && return 0
        prev=$cur
    done
}
# A server that just made the host back many GiB (flashpool's memory drives are prefaulted at
# start: 10 GiB) leaves the machine slow for seconds afterwards: fio spent ~40 % more CPU per
# write in the window right after that prefault than 15 s later. So before measuring, every
# server waits one second per GiB it holds (at least one): the same rule for all.
quiesce() {
    local kib
    kib=$(awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0)
    sleep $(( ${kib:-0} / 1048576 > 1 ? ${kib:-0} / 1048576 : 1 ))
}
cleanup() { stop_server; rm -f "$IMG"; if [ -z "${KEEP:-}" ]; then rm -rf "$WORK"; else echo "kept $WORK" >&2; fi; }
trap cleanup EXIT INT TERM

launch() {   # launch KIND: start one server on $SOCK, set SERVER_PID
    rm -f "$SOCK"; rm -rf "$WORK/data"
    case $1 in
        flashpool|flashpool-base|flashpool-gc|flashpool-nopoll)
            bin=$FLASHPOOL; [ "$1" = flashpool-base ] && bin=${FLASHPOOL_BASE:?set FLASHPOOL_BASE}
            ds=$FP_DRIVE_SIZE; [ "$1" = flashpool-gc ] && ds=$FP_GC_DRIVE_SIZE
            poll=$FP_POLL_US; [ "$1" = flashpool-nopoll ] && poll=0
            "$bin" serve --memory --ec 4+1 --drive-size "$ds" --busy-poll-us "$poll" --data "$WORK/data" \
                --listen "127.0.0.1:$((20000 + RANDOM % 20000))" --socket "$SOCK" \
                >"$WORK/server-$1.log" 2>&1 & ;;
        memserve|memserve-base|memserve-null)
            bin=$MEMSERVE; [ "$1" = memserve-base ] && bin=${MEMSERVE_BASE:?set MEMSERVE_BASE}
            null=(); [ "$1" = memserve-null ] && null=(--null)
            "$bin" --size "$SIZE" --no-tcp --socket "$SOCK" --busy-poll-us "$FP_POLL_US" "${null[@]}" \
                >"$WORK/server-$1.log" 2>&1 & ;;
        nbdkit-null|nbdkit-memory)
            nbdkit -f -U "$SOCK" "${1#nbdkit-}" "$SIZE" >"$WORK/server-$1.log" 2>&1 & ;;
        qemu-nbd)
            rm -f "$IMG"; truncate -s "$SIZE" "$IMG"
            qemu-nbd -k "$SOCK" -f raw -x '' -t -e 4 --cache=none --aio=io_uring "$IMG" \
                >"$WORK/server-$1.log" 2>&1 & ;;
        *) echo "unknown server $1" >&2; exit 2 ;;
    esac
    SERVER_PID=$!
    for _ in $(seq 1200); do   # up to 60 s: serve --memory prefaults its drives first
        [ -S "$SOCK" ] && nbdinfo --size "$URI" >/dev/null 2>&1 && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.05
    done
    echo "server $1 did not start:" >&2; cat "$WORK/server-$1.log" >&2; exit 1
}

versions="fio $(fio --version | sed 's/^fio-//'), $(nbdkit --version), $(qemu-nbd --version | head -1), kernel $(uname -r), $(nproc) CPUs"
echo "$versions" >&2
# Every point gets a fresh server with its export prefilled once, so each
# starts from the same state (and the memory pool never runs out of space).
for round in $(seq "$ROUNDS"); do
    for srv in $SERVERS; do
        for rw in $RWS; do for qd in $QDS; do
            launch "$srv"
            if [ "$srv" != nbdkit-null ] && [ "$srv" != memserve-null ]; then   # allocate everything: reads hit data
                fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=1M --iodepth=8 \
                    --size="$SIZE" --output="$WORK/fill.txt" >/dev/null
            fi
            quiesce "$SERVER_PID"
            base="$WORK/$srv-$rw-qd$qd-r$round"
            fio --name=b --ioengine=nbd --uri="$URI" --rw="$rw" --bs=4k --size="$SIZE" \
                --iodepth="$qd" --time_based --runtime="$RUNTIME" --ramp_time="$RAMP" \
                --norandommap --randrepeat=0 --lat_percentiles=1 \
                --output-format=json --output="$base.json" >/dev/null &
            fio_pid=$!
            sleep "$RAMP"   # CPU is counted over the measured window only
            python3 "$HERE/nbd-bench.py" snap "$SERVER_PID" "$base.cpu0"
            wait "$fio_pid"
            python3 "$HERE/nbd-bench.py" snap "$SERVER_PID" "$base.cpu1"
            python3 "$HERE/nbd-bench.py" point "$base" >&2
            stop_server
            settle
        done; done
    done
done

python3 "$HERE/nbd-bench.py" report "$WORK" \
    --servers "$SERVERS" --rws "$RWS" --qds "$QDS" --rounds "$ROUNDS" \
    --command "${ENVLINE}${CMDLINE}" --versions "$versions" \
    --setup "fio ioengine=nbd, bs=4k, size=$SIZE, runtime ${RUNTIME} s after ${RAMP} s ramp, norandommap, one job, Unix socket; $ROUNDS rounds" \
    --extra "$HERE/nbd-notes.md" --doc "$DOC"
