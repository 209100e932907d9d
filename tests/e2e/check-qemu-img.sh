#!/bin/bash
# qemu-img convert / compare / map and qemu-io against the export.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
new_workdir; trap cleanup EXIT
start_server
SIZE=$(export_size)
[ "$SIZE" -ge $((64 << 20)) ] || die "export smaller than 64 MiB"
# A sparse 64 MiB source: random data in a few places, holes elsewhere.
truncate -s 64M "$WORK/src.raw"
for off in 0 5 17 40 63; do
    head -c 1M /dev/urandom | dd of="$WORK/src.raw" bs=1M seek=$off conv=notrunc status=none
done
qemu-img info "$URI_UNIX"
# Zero the target window first so compare sees the source's holes.
qemu-io -f raw "$URI_UNIX" -c "write -z 0 64M" >/dev/null
qemu-img convert -n -f raw --target-image-opts "$WORK/src.raw" \
    "driver=raw,size=$((64 << 20)),file.driver=nbd,file.path=$SOCK"
qemu-img compare --image-opts "driver=raw,file.filename=$WORK/src.raw" \
    "driver=raw,size=$((64 << 20)),file.driver=nbd,file.path=$SOCK"
qemu-img map --output=json -f raw "$URI_UNIX" > "$WORK/map.json"
$PY - "$WORK/map.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
def at(off):
    return next(e for e in m if e["start"] <= off < e["start"] + e["length"])
MiB = 1 << 20
assert at(0)["data"] and not at(0)["zero"], at(0)
assert at(17 * MiB)["data"], at(17 * MiB)
assert at(30 * MiB)["zero"], ("hole expected", at(30 * MiB))
print("qemu-img map ok:", len(m), "extents")
PY
# qemu-io: patterns, zeroes, discard, flush, async and FUA writes.
qemu-io -f raw "$URI_UNIX" \
    -c 'write -P 0xab 0 1M' -c 'read -P 0xab 0 1M' \
    -c 'write -z 4M 1M' -c 'read -P 0 4M 1M' \
    -c 'write -z -u 8M 1M' -c 'discard 16M 1M' -c flush \
    -c 'aio_write -P 0xcd 32M 64k' -c aio_flush -c 'read -P 0xcd 32M 64k' \
    -c 'write -f -P 0xee 40M 64k' -c 'read -P 0xee 40M 64k' > "$WORK/qio.out"
if grep -iE 'fail|error|mismatch' "$WORK/qio.out"; then die "qemu-io reported a problem"; fi
echo "qemu-io ok"
stop_server
