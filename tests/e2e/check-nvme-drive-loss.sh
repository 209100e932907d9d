#!/bin/bash
# NVMe/TCP reads through a drive loss and its rebuild (flashpool only). The default kind of
# pool (file drives, so reads go on the engine's read queues), two volumes (a second created
# through the admin socket while serving) filled through NBD with fio's verify pattern; then
# the nvme-load initiator keeps 32 random 4 KiB reads in flight on one I/O queue, to both
# namespaces in turn (a read queue each, waited on together), and 8 random 1 MiB reads on
# another, over NVMe/TCP, while `flashpool drive fail` takes a drive out and the server
# rebuilds its data onto the others. Every read completes without an error (nvme-load exits 1
# on any failed, short or stray response), the rebuild finishes, the server stops cleanly,
# and all the data of both volumes verifies through NBD afterwards.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
if [ "${SERVER_KIND:-}" != flashpool ]; then echo "SKIP: the pool's NVMe/TCP door needs flashpool serve"; exit 0; fi
new_workdir; trap cleanup EXIT
FP="$TARGET/release/flashpool"
(cd "$ROOT" && cargo build --release -q -p flashpool-nvmet --example nvme-load) || die "cannot build nvme-load"
LOAD="$TARGET/release/examples/nvme-load"
NVME_PORT=$((PORT + 1))
SERVER_CMD="$FP serve --rebuild-delay 1 --drive-size 256M --volume-size 256M --nvme-tcp 127.0.0.1:$NVME_PORT"
export SERVER_CMD
start_server
URI=$(grep -o 'nvme-tcp://[^ ]*' "$WORK/server.log" | head -1)
[ -n "$URI" ] || die "the server printed no NVMe/TCP URI"
adm() { $PY -c "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall((sys.argv[2]+'\n').encode()); print(s.makefile().readline())" "$DATA/admin.sock" "$1"; }
out=$(adm "volume create second 268435456 off"); grep -q '"id":2' <<<"$out" || die "volume create did not give id 2: $out"
JOB=(--name=fill --ioengine=nbd --uri="$URI_UNIX" --rw=randwrite --bsrange=4k-128k --size=192M
     --iodepth=16 --verify=crc32c --verify_fatal=1 --randseed=4242)
JOB2=(--name=fill2 --ioengine=nbd --uri="nbd+unix:///second?socket=$SOCK" --rw=randwrite
      --bsrange=4k-128k --size=192M --iodepth=16 --verify=crc32c --verify_fatal=1 --randseed=4343)
fio "${JOB[@]}" --do_verify=0 --output="$WORK/fill.out" || die "the fill through NBD failed"
fio "${JOB2[@]}" --do_verify=0 --output="$WORK/fill2.out" || die "the fill of the second volume failed"
"$LOAD" --addr "$URI" --nsid 1,2 --rw randread --qd 32 --seconds 6 --size 192M >"$WORK/load-4k.out" 2>&1 &
L4K=$!
"$LOAD" --addr "$URI" --rw randread --qd 8 --bs 1M --seconds 6 --size 192M >"$WORK/load-1m.out" 2>&1 &
L1M=$!
sleep 2
"$FP" drive --data "$DATA" fail 2
wait "$L4K" || { cat "$WORK/load-4k.out" >&2; die "NVMe/TCP 4 KiB reads failed through the drive loss"; }
wait "$L1M" || { cat "$WORK/load-1m.out" >&2; die "NVMe/TCP 1 MiB reads failed through the drive loss"; }
cat "$WORK/load-4k.out" "$WORK/load-1m.out"
rebuilt=
for _ in $(seq 1 300); do
    "$FP" status --data "$DATA" --json >"$WORK/status.json"
    if $PY -c "import json,sys; r=json.load(open(sys.argv[1]))['rebuild']; sys.exit(0 if not r['needed'] and not r['running'] else 1)" "$WORK/status.json"; then
        rebuilt=1
        break
    fi
    sleep 0.1
done
[ -n "$rebuilt" ] || die "the rebuild did not finish"
fio "${JOB[@]}" --verify_only --output="$WORK/verify.out" || { cat "$WORK/verify.out" >&2; die "verify after the rebuild failed"; }
if grep -E 'err= *[1-9]|verify: bad' "$WORK/verify.out"; then die "verify errors after the rebuild"; fi
fio "${JOB2[@]}" --verify_only --output="$WORK/verify2.out" || { cat "$WORK/verify2.out" >&2; die "verify of the second volume failed"; }
if grep -E 'err= *[1-9]|verify: bad' "$WORK/verify2.out"; then die "verify errors on the second volume"; fi
grep -q panicked "$WORK/server.log" && die "the server panicked"
stop_server || die "the server did not stop cleanly"
echo "NVMe/TCP reads (32 x 4 KiB on two namespaces, 8 x 1 MiB) through a drive loss and its rebuild: no error; both volumes verify"
