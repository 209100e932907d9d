#!/bin/bash
# Member failures and admin commands against a running `flashpool serve` with a verifying
# writer (fio, crc32c verify), flashpool only:
#  1. `drive fail` of one member is accepted; a second failure on 4+1 is refused (parity
#     covers 1) unless --force; `status` keeps answering and names the failed member, when
#     and why; the failure survives a restart (persisted at once, not at the next checkpoint).
#  2. `drive remove` while fio writes on a 5-drive 4+1 pool (the remove leaves fewer members
#     than the stripe width: stripes narrow): no panic, no hang, fio verifies, status answers
#     during and after; `drive readmit` of a failed member that was not rebuilt works online.
#  3. Bit rot on one member's file under the running server: `flashpool scrub` finds it,
#     repairs it, a second scrub is clean and fio verifies. Then a member failed, rebuilt and
#     readmitted while its rebuild runs: it ends in service if the readmit said so.
#  4. Sharp edges: `status | head -1` ends quietly; `volume resize` below written data needs
#     --force; a busy --listen port or a bad address is refused before a data dir is made.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
if [ "${SERVER_KIND:-}" != flashpool ]; then echo "SKIP: fault checks need flashpool serve"; exit 0; fi
new_workdir; trap cleanup EXIT
FP="$TARGET/release/flashpool"
JOB=(--name=f --ioengine=nbd --uri="$URI_UNIX" --rw=randwrite --bsrange=4k-64k --size=96M
     --iodepth=16 --verify=crc32c --verify_fatal=1 --randseed=4242)
no_verify_errors() { if grep -E 'err= *[1-9]|verify: bad' "$1"; then die "verify errors in $1"; fi; }

# --- 1. fail one, refuse a second, persisted across a restart ---
SERVER_CMD="$FP serve --rebuild-delay 3600 --drive-size 256M --volume-size 128M" start_server
fio "${JOB[@]}" --output="$WORK/w1.out" &
FIO=$!
sleep 1
"$FP" drive --data "$DATA" fail 0
if "$FP" drive --data "$DATA" fail 1 2> "$WORK/second.err"; then die "a second failure on 4+1 was accepted"; fi
grep -q "parity covers 1" "$WORK/second.err" || { cat "$WORK/second.err"; die "refusal does not say why"; }
"$FP" status --data "$DATA" > "$WORK/st1.txt"
grep -E "drive +0: failed .*out of service since .*failed by request" "$WORK/st1.txt" || { cat "$WORK/st1.txt"; die "status does not say when and why drive 0 failed"; }
grep -q "protection: 4+1, one member down: no further failure tolerated" "$WORK/st1.txt" || { cat "$WORK/st1.txt"; die "protection line"; }
grep -q "rebuild: needed, not started yet" "$WORK/st1.txt" || { cat "$WORK/st1.txt"; die "rebuild line"; }
grep -Eq "write amplification over the last [0-9]+ s: [1-9]" "$WORK/st1.txt" || { cat "$WORK/st1.txt"; die "no write amplification over a recent window"; }
wait "$FIO" || die "fio failed while a member was failed"
no_verify_errors "$WORK/w1.out"
kill -9 "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=
rm -f "$SOCK" "$DATA/admin.sock"
SERVER_CMD="$FP serve --rebuild-delay 3600" start_server
"$FP" status --data "$DATA" --json | $PY -c "import json,sys; d=json.load(sys.stdin)['drives']; assert d[0]['state']=='failed', d; print('failure persisted across kill -9 and restart')"
fio "${JOB[@]}" --verify_only --output="$WORK/v1.out"
no_verify_errors "$WORK/v1.out"
stop_server

# --- 2. remove under load (narrowing), readmit online ---
rm -rf "$DATA"
SERVER_CMD="$FP serve --rebuild-delay 3600 --drive-size 256M --volume-size 128M" start_server
fio "${JOB[@]}" --output="$WORK/w2.out" &
FIO=$!
sleep 1
timeout 120 "$FP" drive --data "$DATA" remove 4 || die "drive remove under load failed or hung"
timeout 10 "$FP" status --data "$DATA" >/dev/null || die "status hangs after a remove under load"
"$FP" drive --data "$DATA" fail 2
timeout 120 "$FP" drive --data "$DATA" readmit 2 || die "readmit under load failed"
wait "$FIO" || die "fio failed during remove/readmit"
no_verify_errors "$WORK/w2.out"
grep -q panicked "$WORK/server.log" && die "the server panicked"
"$FP" status --data "$DATA" --json | $PY -c "
import json,sys
v=json.load(sys.stdin); d=v['drives']; p=v['pool']
assert d[4]['state']=='retired' and d[2]['state']=='active', d
assert p['members']==4 and p['width_now']==3, p
print('remove under load: stripes now', p['width_now'], '+', p['m'], 'on', p['members'], 'members')"
fio "${JOB[@]}" --verify_only --output="$WORK/v2.out"
no_verify_errors "$WORK/v2.out"

# --- 3. bit rot, scrub, repair ---
D2="$DATA/drives/drive-1.img"
# 64 blocks spread over the whole drive: some land in the segments holding data now.
for i in $(seq 0 63); do
    dd if=/dev/urandom of="$D2" bs=4k seek=$((256 + i * 1009)) count=1 conv=notrunc status=none
done
"$FP" scrub --data "$DATA" --json > "$WORK/scrub1.json"
$PY -c "
import json,sys
r=json.load(open(sys.argv[1]))
assert r['bad_chunks']>0 and r['segments_repaired']>0 and not r['unrecoverable'], r
print('scrub: %d bad chunks, %d segments repaired' % (r['bad_chunks'], r['segments_repaired']))" "$WORK/scrub1.json"
"$FP" scrub --data "$DATA" --check-only --json > "$WORK/scrub2.json"
$PY -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['bad_chunks']==0, r; print('second scrub clean')" "$WORK/scrub2.json"
"$FP" status --data "$DATA" | grep -E "^errors: .* [1-9][0-9]* segments repaired" || die "status does not count the repair"
fio "${JOB[@]}" --verify_only --output="$WORK/v3.out"
no_verify_errors "$WORK/v3.out"

# --- 3b. readmit while the member's rebuild runs, under load ---
# A readmit that says the member is back leaves it in service (a rebuild that chose it before
# must not retire it when it ends: RELIABILITY.md finding 35); one refused because the rebuild
# got there first leaves it retired. Either way fio verifies and nothing is short of a chunk.
fio "${JOB[@]}" --output="$WORK/w3b.out" &
FIO=$!
sleep 1
"$FP" drive --data "$DATA" fail 1
timeout 120 "$FP" drive --data "$DATA" rebuild > "$WORK/rebuild3b.out" 2>&1 &
RB=$!
for _ in $(seq 1 200); do
    st=$("$FP" status --data "$DATA" --json | $PY -c "import json,sys; print(json.load(sys.stdin)['rebuild']['state'])")
    [ "$st" = running ] && break
    sleep 0.05
done
if timeout 120 "$FP" drive --data "$DATA" readmit 1 > "$WORK/readmit3b.out" 2>&1; then
    want=active
else
    want=retired
    grep -q "retired" "$WORK/readmit3b.out" || { cat "$WORK/readmit3b.out"; die "readmit during a rebuild refused for another reason"; }
fi
wait "$RB" || { cat "$WORK/rebuild3b.out"; die "the rebuild failed"; }
wait "$FIO" || die "fio failed during the readmit"
no_verify_errors "$WORK/w3b.out"
"$FP" status --data "$DATA" --json | $PY -c "
import json,sys
v=json.load(sys.stdin); d=v['drives']; p=v['protection']
assert d[1]['state']=='$want', ('readmit answered', '$want', d)
assert p['members_down']==0 and v['rebuild']['state']=='idle', (p, v['rebuild'])
print('readmit while its rebuild ran (rebuild was', '$st' + '): member 1', d[1]['state'], '|', p['summary'])"
fio "${JOB[@]}" --verify_only --output="$WORK/v3b.out"
no_verify_errors "$WORK/v3b.out"

# --- 4. sharp edges ---
# Like coreutils, the CLI is ended by SIGPIPE when head goes away (exit 141 for that side of
# the pipe): no panic, nothing on stderr.
set +o pipefail
out=$("$FP" status --data "$DATA" 2>"$WORK/pipe.err" | head -1)
set -o pipefail
[ -n "$out" ] || die "status printed nothing"
if [ -s "$WORK/pipe.err" ]; then cat "$WORK/pipe.err"; die "status | head -1 complained"; fi
stop_server
if "$FP" volume --data "$DATA" resize default 4M 2>"$WORK/shrink.err"; then die "shrinking below written data without --force"; fi
grep -q -- "--force" "$WORK/shrink.err" || { cat "$WORK/shrink.err"; die "shrink refusal"; }
"$FP" volume --data "$DATA" resize default 4M --force
python3 -c "import socket,time,sys; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); print(s.getsockname()[1]); sys.stdout.flush(); time.sleep(30)" > "$WORK/port" &
HOLD=$!
for _ in $(seq 50); do [ -s "$WORK/port" ] && break; sleep 0.1; done
if "$FP" serve --data "$WORK/new1" --listen "127.0.0.1:$(cat "$WORK/port")" 2>"$WORK/busy.err"; then die "busy port accepted"; fi
kill "$HOLD"
[ -e "$WORK/new1" ] && die "a busy port left a data dir behind"
if "$FP" serve --data "$WORK/new2" --listen "not-an-address" 2>/dev/null; then die "bad --listen accepted"; fi
[ -e "$WORK/new2" ] && die "a bad --listen left a data dir behind"
echo "fail/refuse/persist, remove and readmit under load, sharp edges: all as documented"
