#!/bin/bash
# Restart persistence: write with fio (verify data recorded), stop the
# server with SIGTERM, start it again on the same data dir, verify.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
new_workdir; trap cleanup EXIT
start_server
JOB=(--name=persist --ioengine=nbd --uri="$URI_UNIX" --rw=randwrite --bsrange=4k-64k
     --size=64M --iodepth=16 --verify=crc32c --verify_fatal=1 --randseed=4242)
fio "${JOB[@]}" --do_verify=0 --output="$WORK/w.out"
grep -E 'err=' "$WORK/w.out"
# Unflushed writes must survive a clean stop too: no FLUSH was sent.
stop_server
start_server
fio "${JOB[@]}" --verify_only --output="$WORK/v.out"
grep -E 'err=' "$WORK/v.out"
if grep -E 'err= *[1-9]|verify: bad' "$WORK/v.out"; then die "data lost across restart"; fi
stop_server
echo "fio data verified after SIGTERM + restart"
