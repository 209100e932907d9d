#!/bin/bash
# Admin operations in many orders against a running `flashpool serve`, with a flush-journal
# writer running throughout (journal.py: one request at a time, a flush every 1-8 writes, every
# write logged before it is sent), flashpool only (issue 15).
#
# For each pool shape (5 drives 4+1, 6 drives 4+2, 6 drives 4+1) and each of ORDERS orders
# (a seeded shuffle of fail, readmit, rebuild, remove, add, replace, with a kill -9 of the
# server at a seeded point among them; a failed member waits for `drive rebuild` or a readmit,
# so what follows a failure runs degraded):
#   - every command either succeeds or is refused with a reason on stderr; it never hangs
#     (60 s) and the server never panics;
#   - after each step the server answers `status`, the rebuild it started finishes (or status
#     says why not), the writer is still writing (it stops at the first error a host would see);
#   - after a kill -9 the server restarts on the same data dir and every block the journal
#     promised (the last flushed write of each block, or a later one) reads back;
#   - at the end of the order, and again after a clean restart, the whole journal verifies.
# Seeds: FAULT_SEED (default 1); ORDERS per shape (default 1: three orders in CI, about 2 minutes); SHAPES to run some only
# (e.g. SHAPES=6:4+2, DRIVES:K+M each). A failure prints the seed, the
# shape, the order and the step.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
if [ "${SERVER_KIND:-}" != flashpool ]; then echo "SKIP: fault checks need flashpool serve"; exit 0; fi
FP="$TARGET/release/flashpool"
J="$ROOT/tests/e2e/journal.py"
SEED=${FAULT_SEED:-1}
ORDERS=${ORDERS:-1}
new_workdir; trap 'stop_writer || true; cleanup' EXIT

WRITER_PID=
WRITER_RUNS=0
start_writer() {
    rm -f "$WORK/stop"
    WRITER_RUNS=$((WRITER_RUNS + 1))
    $PY "$J" "$URI_UNIX" write "$WORK/journal.log" "$((SEED * 100 + WRITER_RUNS))" --stop "$WORK/stop" \
        >>"$WORK/writer.out" 2>&1 &
    WRITER_PID=$!
}
# Stops the writer after a last flush; fails if it had stopped on an error.
stop_writer() {
    [ -n "$WRITER_PID" ] || return 0
    touch "$WORK/stop"
    local rc=0
    timeout 60 tail --pid="$WRITER_PID" -f /dev/null || true
    wait "$WRITER_PID" || rc=$?
    WRITER_PID=
    return $rc
}
writer_alive() { [ -n "$WRITER_PID" ] && kill -0 "$WRITER_PID" 2>/dev/null; }
where() { echo "seed $SEED, shape $SHAPE, order [$ORDER], step $STEP"; }
fail() { tail -5 "$WORK/writer.out" >&2 || true; tail -20 "$WORK/server.log" >&2 || true; die "$(where): $*"; }
no_panic() { if grep -q "panicked" "$WORK/server.log"; then fail "the server panicked"; fi; }

status_json() { timeout 30 "$FP" status --data "$DATA" --json; }
# Waits (at most 120 s) until no rebuild is running; a failed one must say why (a pending one,
# waiting for `drive rebuild`, is left pending).
wait_rebuild() {
    local s
    for _ in $(seq 1 240); do
        s=$(status_json) || fail "status did not answer"
        case $($PY -c 'import json,sys; print(json.load(sys.stdin)["rebuild"]["state"])' <<<"$s") in
            idle | pending) return 0 ;;
            failed) $PY -c 'import json,sys; r=json.load(sys.stdin)["rebuild"]; assert r["last_error"], r; print("rebuild failed, status says:", r["last_error"])' <<<"$s"
                    return 0 ;;
        esac
        sleep 0.5
    done
    fail "rebuild did not finish in 120 s"
}
# A member index in the given state ("active", "failed"), chosen by the seed; empty if none.
member() {
    status_json | $PY -c '
import json, random, sys
d = [x["index"] for x in json.load(sys.stdin)["drives"] if x["state"] == sys.argv[1]]
print(random.Random(int(sys.argv[2])).choice(d) if d else "")' "$1" "$((SEED * 7919 + STEP))"
}
# Runs an admin command: success, or a refusal with a reason; never a hang.
admin() {
    local rc=0
    timeout 60 "$FP" drive --data "$DATA" "$@" >"$WORK/cmd.out" 2>"$WORK/cmd.err" || rc=$?
    [ $rc -ne 124 ] || fail "drive $* hung"
    if [ $rc -ne 0 ]; then
        [ -s "$WORK/cmd.err" ] || fail "drive $* failed (exit $rc) without a reason"
        grep -q "panicked" "$WORK/cmd.err" && fail "drive $* panicked"
        echo "    drive $*: refused: $(head -1 "$WORK/cmd.err")"
    else
        echo "    drive $*: ok"
    fi
}
kill9() {
    stop_writer_hard
    kill -9 "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=
    rm -f "$SOCK"
    start_server || fail "no restart after kill -9"
    $PY "$J" "$URI_UNIX" verify "$WORK/journal.log" || fail "flushed data lost across kill -9"
    start_writer
}
# The writer dies with the server: kill it first, its log is what it had sent.
stop_writer_hard() {
    [ -n "$WRITER_PID" ] || return 0
    kill -9 "$WRITER_PID" 2>/dev/null || true
    wait "$WRITER_PID" 2>/dev/null || true
    WRITER_PID=
}

NEW=0
run_order() {
    local op n
    for op in $ORDER; do
        STEP=$((STEP + 1))
        case $op in
            fail | remove)
                n=$(member active)
                if [ -n "$n" ]; then admin "$op" "$n"; else echo "    $op: no active member"; fi ;;
            readmit)
                n=$(member failed)
                if [ -n "$n" ]; then admin readmit "$n"; else echo "    readmit: no failed member"; fi ;;
            rebuild) admin rebuild ;;
            add) NEW=$((NEW + 1)); admin add "$WORK/extra-$NEW.img" ;;
            replace)
                n=$(member active); NEW=$((NEW + 1))
                if [ -n "$n" ]; then admin replace "$n" "$WORK/extra-$NEW.img"; else echo "    replace: no active member"; fi ;;
            kill9) echo "    kill -9"; kill9 ;;
        esac
        no_panic
        wait_rebuild
        writer_alive || { wait "$WRITER_PID" || true; WRITER_PID=; fail "the writer stopped on an error"; }
        sleep 1
    done
}

for SHAPE in ${SHAPES:-5:4+1 6:4+2 6:4+1}; do
    case $SHAPE in 5:4+1) shape_no=1 ;; 6:4+2) shape_no=2 ;; 6:4+1) shape_no=3 ;; *) shape_no=4 ;; esac
    # shellcheck disable=SC2086
    set -- ${SHAPE/:/ }
    for o in $(seq 1 "$ORDERS"); do
        ORDER=$($PY -c '
import random, sys
r = random.Random(int(sys.argv[1]))
ops = ["fail", "readmit", "rebuild", "remove", "add", "replace"]
r.shuffle(ops)
ops.insert(r.randrange(len(ops) + 1), "kill9")
print(" ".join(ops))' "$((SEED * 1000 + o * 10 + shape_no))")
        STEP=0
        echo "shape $1 drives $2, order $o: $ORDER"
        rm -rf "$DATA" "$WORK/journal.log" "$WORK"/extra-*.img
        SERVER_CMD="$FP serve --drives $1 --ec $2 --drive-size 192M --volume-size 96M --rebuild-delay 3600" \
            start_server || fail "server did not start"
        export SERVER_CMD="$FP serve --rebuild-delay 3600"
        start_writer
        sleep 2
        run_order
        STEP=end
        stop_writer || fail "the writer stopped on an error"
        $PY "$J" "$URI_UNIX" verify "$WORK/journal.log" || fail "journal does not verify"
        stop_server || fail "unclean stop"
        start_server || fail "no restart"
        $PY "$J" "$URI_UNIX" verify "$WORK/journal.log" || fail "journal does not verify after a restart"
        stop_server || fail "unclean stop"
        unset SERVER_CMD
    done
done
echo "PASS"
