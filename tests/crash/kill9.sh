#!/bin/bash
# Process crash test: kill -9 `flashpool serve` at random moments and check that everything
# a client saw flushed survives the restart.
#
#   tests/crash/kill9.sh [ROUNDS]        (default 5; KILL9_SEED=N picks the random moments)
#
# Each round, against one data dir:
#   1. fio writes a region (`--verify=crc32c --verify_state_save=1 --fsync=8 --end_fsync=1`)
#      to completion, so everything it wrote is flushed;
#   2. tests/crash/journal.py writes random 4 KiB blocks to another region with periodic
#      FLUSH (and some FUA), journaling each write before it is sent and each flush after it
#      returns, while the server is killed with SIGKILL at a random moment;
#   3. the server restarts (recovery) and journal.py checks that every block holds its last
#      flushed write or a later one, and fio `--verify_only` re-reads the fio region.
# Prints PASS/FAIL per round and "N passed, N failed"; exit 1 if anything failed.
# FLASHPOOL_BIN overrides the binary (default: cargo build --release -p flashpool).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
ROUNDS=${1:-${KILL9_ROUNDS:-5}}
SEED=${KILL9_SEED:-$RANDOM}
RANDOM=$SEED
PY=/usr/bin/python3
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${FLASHPOOL_BIN:-$TARGET/release/flashpool}

for c in fio nbdinfo; do
    command -v $c >/dev/null || { echo "SKIP: $c not installed"; exit 77; }
done
$PY -c 'import nbd' 2>/dev/null || { echo "SKIP: python3-libnbd not installed"; exit 77; }
if [ -z "${FLASHPOOL_BIN:-}" ]; then
    (cd "$ROOT" && cargo build --release -q -p flashpool) || { echo "FAIL: build"; echo "0 passed, 1 failed"; exit 1; }
fi

WORK=$(mktemp -d /tmp/flashpool-kill9.XXXXXX)
DATA=$WORK/data; SOCK=$WORK/nbd.sock; PORT=$((20000 + RANDOM % 20000))
URI="nbd+unix:///?socket=$SOCK"
SERVER_PID=; WRITER_PID=
cleanup() {
    [ -n "$WRITER_PID" ] && kill -9 "$WRITER_PID" 2>/dev/null
    [ -n "$SERVER_PID" ] && kill -9 "$SERVER_PID" 2>/dev/null
    wait 2>/dev/null
    [ "${KILL9_KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT
echo "kill9: seed $SEED (rerun with KILL9_SEED=$SEED), $ROUNDS rounds, work dir $WORK"

start_server() {
    rm -f "$SOCK"
    "$BIN" serve --data "$DATA" --socket "$SOCK" --listen "127.0.0.1:$PORT" \
        --drive-size 256M --volume-size 256M >>"$WORK/server.log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 1 600); do
        if [ -S "$SOCK" ] && timeout 5 nbdinfo --size "$URI" >/dev/null 2>&1; then return 0; fi
        kill -0 "$SERVER_PID" 2>/dev/null || { tail -5 "$WORK/server.log"; return 1; }
        sleep 0.1
    done
    return 1
}

# fio region: 128M..192M of the default volume; journal region: the first 32 MiB.
FIO=(--ioengine=nbd --uri="$URI" --rw=randwrite --bsrange=4k-64k --offset=128M --size=64M
     --io_size=24M --iodepth=8 --verify=crc32c --verify_fatal=1 --directory="$WORK")
pass=0; fail=0
if ! start_server; then echo "FAIL: server did not start"; echo "0 passed, 1 failed"; exit 1; fi
for r in $(seq 1 "$ROUNDS"); do
    problem=
    fioseed=$((SEED * 100 + r))
    (cd "$WORK" && fio --name=kill9 "${FIO[@]}" --randseed=$fioseed --do_verify=0 \
        --verify_state_save=1 --fsync=8 --end_fsync=1 --output="$WORK/fio-w$r.out") \
        || problem="fio write failed (see $WORK/fio-w$r.out)"
    "$PY" "$HERE/journal.py" write "$URI" "$WORK/journal-$r" $((SEED * 1000 + r)) 8192 \
        $((1 + RANDOM % 64)) 2>>"$WORK/writer.log" &
    WRITER_PID=$!
    # Kill at a random moment 0.3 to 3 s into the journal writes.
    sleep "$((RANDOM % 3)).$((RANDOM % 10))$((RANDOM % 10))"
    sleep 0.3
    kill -9 "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null; SERVER_PID=
    wait "$WRITER_PID" 2>/dev/null; WRITER_PID=
    writes=$(grep -c '^W' "$WORK/journal-$r" || true)
    flushes=$(grep -c '^F' "$WORK/journal-$r" || true)
    if ! start_server; then
        echo "FAIL: round $r: server did not restart after kill -9"; fail=$((fail + 1)); break
    fi
    if [ -z "$problem" ]; then
        out=$("$PY" "$HERE/journal.py" verify "$URI" "$WORK/journal-$r" "$WORK/state.json" 2>&1) \
            || problem="journal: $out"
    fi
    if [ -z "$problem" ]; then
        (cd "$WORK" && fio --name=kill9 "${FIO[@]}" --randseed=$fioseed --verify_only \
            --output="$WORK/fio-v$r.out") >/dev/null 2>&1 \
            && ! grep -qE 'err= *[1-9]|verify: bad' "$WORK/fio-v$r.out" \
            || problem="fio --verify_only found bad data (see $WORK/fio-v$r.out)"
    fi
    if [ -z "$problem" ]; then
        echo "PASS: round $r: killed after $writes journal writes / $flushes flushes; $out; fio region verified"
        pass=$((pass + 1))
    else
        echo "FAIL: round $r: $problem"; fail=$((fail + 1)); KILL9_KEEP=1
    fi
done
kill -TERM "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; SERVER_PID=
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
