#!/bin/bash
# Bit rot on two members at once, under a running `flashpool serve`, then scrub (issue 15;
# one member's rot is check-faults.sh's): flashpool only.
#  1. 4+2 (6 drives): the same 4 KiB ranges overwritten with random bytes on two members'
#     files (so some stripes lose two chunks). Scrub repairs everything (two parity chunks
#     cover it), reports no unrecoverable block, a second scrub is clean, the flush journal
#     (journal.py) verifies. Then more rot, a kill -9 of the server in the middle of a scrub,
#     a restart: a scrub finishes the repair and everything verifies.
#  2. 4+1 (5 drives): the same two-member rot is beyond one parity chunk: scrub repairs what
#     it can, lists the lost blocks by volume and offset (only blocks the journal wrote, and
#     only those that really read back as errors: a rotten chunk's intact blocks are not
#     lost), status counts them, the server keeps serving, and every other block the journal
#     promised still verifies.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
if [ "${SERVER_KIND:-}" != flashpool ]; then echo "SKIP: bit-rot checks need flashpool serve"; exit 0; fi
new_workdir; trap cleanup EXIT
FP="$TARGET/release/flashpool"
J="$E2E_DIR/journal.py"
URI="nbd+unix:///default?socket=$SOCK"

# Overwrites the same N 4 KiB ranges (spread over the drive, past the superblocks) of members
# $2 and $3 with random bytes; seed $1.
rot() {
    local seed=$1 a=$2 b=$3 i off
    for i in $(seq 0 47); do
        off=$(( 256 + (seed * 7919 + i * 1009) % 6000 ))
        for d in "$a" "$b"; do
            dd if=/dev/urandom of="$DATA/drives/drive-$d.img" bs=4k seek=$off count=1 \
                conv=notrunc status=none
        done
    done
}
scrub_json() { timeout 300 "$FP" scrub --data "$DATA" --json; }

# --- 1. 4+2: two members' rot is repaired ---
SERVER_CMD="$FP serve --drives 6 --ec 4+2 --drive-size 192M --volume-size 96M" start_server
$PY "$J" "$URI" write "$WORK/j1.log" 11 --max 3000 > /dev/null
rot 1 1 2
scrub_json > "$WORK/s1.json"
$PY - "$WORK/s1.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["bad_chunks"] > 0 and r["segments_repaired"] > 0, r
assert not r["unrecoverable"], ("4+2 lost blocks to rot on two members", r)
print(f"4+2 scrub: {r['bad_chunks']} bad chunks, {r['segments_repaired']} segments repaired, none lost")
EOF
"$FP" scrub --data "$DATA" --check-only --json | $PY -c 'import json,sys; r=json.load(sys.stdin); assert r["bad_chunks"]==0, r; print("second scrub clean")'
$PY "$J" "$URI" verify "$WORK/j1.log" || die "4+2: data lost after a two-member repair"
# kill -9 during a scrub's repair, restart, finish.
rot 2 3 4
( timeout 300 "$FP" scrub --data "$DATA" --json > /dev/null 2>&1 || true ) &
SCRUB=$!
sleep 0.3
kill -9 "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=
wait "$SCRUB" || true
rm -f "$SOCK"
SERVER_CMD="$FP serve" start_server || die "no restart after kill -9 during a scrub"
scrub_json > "$WORK/s2.json"
$PY -c 'import json,sys; r=json.load(open(sys.argv[1])); assert not r["unrecoverable"], r; print("after kill -9 mid-scrub: scrub found", r["bad_chunks"], "bad chunks, none lost")' "$WORK/s2.json"
"$FP" scrub --data "$DATA" --check-only --json | $PY -c 'import json,sys; r=json.load(sys.stdin); assert r["bad_chunks"]==0, r'
$PY "$J" "$URI" verify "$WORK/j1.log" || die "4+2: data lost after kill -9 during a scrub"
grep -q panicked "$WORK/server.log" && die "the server panicked"
stop_server

# --- 2. 4+1: the same rot is beyond parity where it meets; scrub says what is lost ---
rm -rf "$DATA"
SERVER_CMD="$FP serve --drive-size 192M --volume-size 96M" start_server
$PY "$J" "$URI" write "$WORK/j2.log" 12 --max 3000 > /dev/null
rot 3 1 2
# Lost blocks make the scrub exit non-zero (after printing its report).
rc=0; scrub_json > "$WORK/s3.json" || rc=$?
[ $rc -ne 0 ] || die "scrub exited 0 although it lost blocks"
"$FP" status --data "$DATA" --json > "$WORK/st3.json"
$PY - "$WORK/s3.json" "$WORK/j2.log" "$WORK/st3.json" "$J" <<'EOF'
import importlib.util, json, sys
r = json.load(open(sys.argv[1]))
spec = importlib.util.spec_from_file_location("journal", sys.argv[4])
j = importlib.util.module_from_spec(spec); spec.loader.exec_module(j)
written = j.promised(sys.argv[2])
lost = r["unrecoverable"]
assert r["bad_chunks"] > 0, r
assert lost, ("rot on two of 4+1's members lost nothing?", r)
for b in lost:
    assert b["volume"] == "default", b
    assert b["offset"] % 4096 == 0 and b["offset"] // 4096 in written, ("a lost block the journal never wrote", b)
st = json.load(open(sys.argv[3]))
assert st["counters"]["unrecoverable_blocks"] >= len(lost), (st["counters"], len(lost))
print(f"4+1 scrub: {r['bad_chunks']} bad chunks, {r['segments_repaired']} segments repaired, "
      f"{len(lost)} blocks lost and listed")
json.dump([b["offset"] // 4096 for b in lost], open(sys.argv[1] + ".lost", "w"))
EOF
# Every block the journal promised verifies, but for the lost ones (which read as errors).
$PY - "$URI" "$WORK/j2.log" "$WORK/s3.json.lost" "$J" <<'EOF'
import importlib.util, json, sys
import nbd
spec = importlib.util.spec_from_file_location("journal", sys.argv[4])
j = importlib.util.module_from_spec(spec); spec.loader.exec_module(j)
lost = set(json.load(open(sys.argv[3])))
want = j.promised(sys.argv[2])
h = nbd.NBD(); h.connect_uri(sys.argv[1])
bad = errors = listed_but_readable = wrong_listed = 0
for b, (allowed, flushed) in sorted(want.items()):
    try:
        got = h.pread(4096, b * 4096)
    except nbd.Error:
        errors += 1
        assert b in lost, f"block {b} reads as an error but scrub did not list it"
        continue
    import struct
    blk, stamp = struct.unpack("<QQ", got[:16])
    ok = blk == b and stamp in allowed and got == j.block_bytes(b, stamp)
    if b in lost:
        listed_but_readable += 1
        wrong_listed += not ok
        continue
    if not ok:
        bad += 1
assert bad == 0, f"{bad} blocks not lost by scrub hold wrong data"
print(f"4+1: {len(want) - len(lost)} blocks verified, {errors} lost blocks read as errors, "
      f"{listed_but_readable} listed as lost read back ({wrong_listed} of them wrong)")
assert wrong_listed == 0, "a block read back wrong data without an error"
assert listed_but_readable == 0, "scrub listed blocks as lost that read back intact"
assert errors == len(lost), (errors, len(lost))

EOF
grep -q panicked "$WORK/server.log" && die "the server panicked"
stop_server
echo "PASS"
