#!/bin/bash
# Drive loss and drive add under real client load (flashpool only).
#  1. fio writes with verify while a drive is taken out of service through the admin socket
#     (`flashpool drive fail`): the run completes with no verify error, the server rebuilds,
#     and a second verify pass is clean.
#  2. a drive is added while fio writes with verify (`flashpool drive add` through the admin
#     socket): no verify error; after a restart all the data verifies again, and the space
#     each segment's stripes took is still known (status: segment_utilisation).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
if [ "${SERVER_KIND:-}" != flashpool ]; then echo "SKIP: drive checks need flashpool serve"; exit 0; fi
new_workdir; trap cleanup EXIT
FP="$TARGET/release/flashpool"
SERVER_CMD="$FP serve --rebuild-delay 1 --drive-size 256M --volume-size 256M"
export SERVER_CMD
start_server
JOB=(--name=loss --ioengine=nbd --uri="$URI_UNIX" --rw=randwrite --bsrange=4k-64k
     --size=128M --iodepth=16 --verify=crc32c --verify_fatal=1 --randseed=777)
fio "${JOB[@]}" --output="$WORK/w.out" &
FIO=$!
sleep 1
"$FP" drive --data "$DATA" fail 2
wait "$FIO" || die "fio failed while a drive was lost"
grep -E 'err=' "$WORK/w.out"
if grep -E 'err= *[1-9]|verify: bad' "$WORK/w.out"; then die "verify errors during the drive loss"; fi
for i in $(seq 1 300); do
    "$FP" status --data "$DATA" --json > "$WORK/status.json"
    if $PY -c "import json,sys; r=json.load(open(sys.argv[1]))['rebuild']; sys.exit(0 if not r['needed'] and not r['running'] else 1)" "$WORK/status.json"; then
        break
    fi
    sleep 0.2
done
$PY -c "import json,sys; d=json.load(open(sys.argv[1]))['drives']; assert d[2]['state']=='retired', d; print('drive 2 retired after rebuild')" "$WORK/status.json"
fio "${JOB[@]}" --verify_only --output="$WORK/v.out"
if grep -E 'err= *[1-9]|verify: bad' "$WORK/v.out"; then die "verify errors after the rebuild"; fi
echo "drive loss: no verify error during the run, rebuild done, second verify pass clean"

JOB2=(--name=add --ioengine=nbd --uri="$URI_UNIX" --rw=randwrite --bs=4k --size=64M
      --offset=128M --iodepth=16 --verify=crc32c --verify_fatal=1 --randseed=778)
fio "${JOB2[@]}" --output="$WORK/w2.out" &
FIO=$!
sleep 1
"$FP" drive --data "$DATA" add
wait "$FIO" || die "fio failed while a drive was added"
if grep -E 'err= *[1-9]|verify: bad' "$WORK/w2.out"; then die "verify errors during the drive add"; fi
"$FP" status --data "$DATA" --json > "$WORK/status2.json"
$PY -c "import json,sys; p=json.load(open(sys.argv[1]))['pool']; assert p['drives']==6, p; print('pool has', p['drives'], 'drives, stripes', p['k'], '+', p['m'])" "$WORK/status2.json"
stop_server
start_server
fio "${JOB[@]}" --verify_only --output="$WORK/v2.out"
fio "${JOB2[@]}" --verify_only --output="$WORK/v3.out"
if grep -E 'err= *[1-9]|verify: bad' "$WORK/v2.out" "$WORK/v3.out"; then die "verify errors after restart"; fi
# The cleaner's measure of every segment holding data survives the restart (checkpoint).
"$FP" status --data "$DATA" --json > "$WORK/status3.json"
$PY -c "import json,sys; s=json.load(open(sys.argv[1]))['segment_utilisation']; assert sum(s['tenths'])>0 and s['unknown_space']==0, s; print('segments by utilisation after restart', s['tenths'])" "$WORK/status3.json"
"$FP" status --data "$DATA" | grep 'segments holding data by live share'
stop_server
echo "drive add while serving: no verify error, data verified after restart"
