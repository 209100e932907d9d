#!/bin/bash
# TCP and Unix socket at once: verified random I/O on both transports in
# parallel (different regions), plus a connection that goes away mid-run.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
new_workdir; trap cleanup EXIT
start_server
fio --name=unix --ioengine=nbd --uri="$URI_UNIX" --rw=randrw --bs=4k --offset=0 --size=48M \
    --iodepth=16 --verify=crc32c --verify_fatal=1 --output="$WORK/u.out" &
U=$!
fio --name=tcp --ioengine=nbd --uri="$URI_TCP" --rw=randrw --bs=16k --offset=64M --size=48M \
    --iodepth=16 --verify=crc32c --verify_fatal=1 --output="$WORK/t.out" &
T=$!
# A client killed in the middle of its reads must not disturb the others.
timeout -s KILL 1 nbdcopy "$URI_UNIX" null: || true
wait $U; wait $T
grep -h 'err=' "$WORK/u.out" "$WORK/t.out"
if grep -E 'err= *[1-9]|verify: bad' "$WORK/u.out" "$WORK/t.out"; then die "errors"; fi
stop_server
