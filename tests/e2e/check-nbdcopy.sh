#!/bin/bash
# nbdcopy round trip of a random 64 MiB file: file -> export -> file.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
new_workdir; trap cleanup EXIT
start_server
head -c $((64 << 20)) /dev/urandom > "$WORK/src.raw"
# The export may be larger than the file: compare the first 64 MiB.
[ "$(export_size)" -ge $((64 << 20)) ] || die "export smaller than 64 MiB"
nbdcopy --flush "$WORK/src.raw" "$URI_UNIX"
nbdcopy "$URI_UNIX" "$WORK/back.raw"
cmp -n $((64 << 20)) "$WORK/src.raw" "$WORK/back.raw" || die "nbdcopy round trip differs"
# nbdcopy through two connections at once, export -> null, with progress.
nbdcopy --connections=2 "$URI_TCP" null:
echo "nbdcopy round trip of 64 MiB ok"
stop_server
