#!/bin/bash
# The filesystem under the drive files fills up (a small tmpfs; flashpool only, as root):
#  1. without --sparse, a pool larger than the filesystem is refused at creation (drive files
#     are allocated up front, so the host filesystem can never fill under the pool);
#     With no --drive-size, the default 1 GiB files are made as large as fits instead (a tenth
#     of the room left), or refused when that is under 64 MiB;
#  2. with --sparse, writes past what the filesystem holds get ENOSPC from the server, no
#     member is marked failed, and every block acknowledged and flushed before reads back,
#     also after a kill -9 and a restart on the still-full filesystem.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
if [ "${SERVER_KIND:-}" != flashpool ]; then echo "SKIP: host-full checks need flashpool serve"; exit 0; fi
[ "$(id -u)" = 0 ] || skip "mounting a tmpfs needs root"
new_workdir
SMALL="$WORK/small"
mkdir -p "$SMALL"
mount -t tmpfs -o size=96M tmpfs "$SMALL" || skip "cannot mount a tmpfs here"
FIT="$WORK/fit"
trap 'cleanup_small' EXIT
cleanup_small() { cleanup_server; umount "$SMALL" "$FIT" 2>/dev/null || true; rm -rf "$WORK"; }
cleanup_server() { if [ -n "${SERVER_PID:-}" ]; then kill -TERM "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=; fi; }
FP="$TARGET/release/flashpool"
DATA="$SMALL/data"
if "$FP" serve --data "$DATA" --listen "127.0.0.1:$PORT" --drive-size 64M --volume-size 256M 2> "$WORK/refused.err"; then
    die "a pool of 5 x 64 MiB allocated drives was created on a 96 MiB filesystem"
fi
grep -q "MiB free" "$WORK/refused.err" || { cat "$WORK/refused.err"; die "the refusal does not say why"; }
[ -z "$(ls -A "$DATA/drives" 2>/dev/null)" ] || die "a refused creation left drive files"
if "$FP" serve --data "$DATA" --listen "127.0.0.1:$PORT" --volume-size 256M 2> "$WORK/refused.err"; then
    die "a pool with default-size drives was created on a 96 MiB filesystem"
fi
grep -q "MiB free" "$WORK/refused.err" || { cat "$WORK/refused.err"; die "the refusal does not say why"; }
# The default size on a filesystem with room for 5 x 64 MiB and a tenth to spare: fitted.
mkdir -p "$FIT"
mount -t tmpfs -o size=400M tmpfs "$FIT" || die "cannot mount a second tmpfs"
SAVED_DATA=$DATA; DATA="$FIT/data"
SERVER_CMD="$FP serve --volume-size 256M" start_server || die "default drive files not fitted to a 400 MiB filesystem"
grep -q "made smaller" "$WORK/server.log" || die "the log does not say the drive files were made smaller"
sizes=$(stat -c %s "$DATA"/drives/* | sort -u)
[ "$sizes" = $((64 << 20)) ] || die "fitted drive files are $sizes bytes, expected 64 MiB"
$PY "$E2E_DIR/fill.py" "$URI_UNIX" write $((32 << 20)) "$WORK/fit.state" >/dev/null
$PY "$E2E_DIR/fill.py" "$URI_UNIX" verify "$WORK/fit.state" || die "data lost on fitted drives"
stop_server
umount "$FIT"
DATA=$SAVED_DATA
echo "default drive files on a 400 MiB filesystem: 5 x 64 MiB, said in the log, data written and read back"
rm -rf "$DATA"
SERVER_CMD="$FP serve --sparse --rebuild-reserve off --drive-size 64M --volume-size 256M" start_server
$PY "$E2E_DIR/fill.py" "$URI_UNIX" write $((256 << 20)) "$WORK/fill.state" | tee "$WORK/fill.out"
grep -q "ENOSPC: True" "$WORK/fill.out" || die "the server never answered ENOSPC on a full filesystem"
"$FP" status --data "$DATA" --json | $PY -c "
import json,sys
d=json.load(sys.stdin)['drives']
assert all(x['state']=='active' for x in d), d
print('host filesystem full: ENOSPC to the client, all', len(d), 'members still active')"
$PY "$E2E_DIR/fill.py" "$URI_UNIX" verify "$WORK/fill.state" || die "acknowledged data lost when the filesystem filled"
# kill -9 with the filesystem still full: the server comes back on it (recovery may not be able
# to write; it must still serve what was flushed) and nothing flushed is lost.
kill -9 "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=
rm -f "$SOCK"
SERVER_CMD="$FP serve --sparse --rebuild-reserve off" start_server || die "no restart on the full filesystem after kill -9"
$PY "$E2E_DIR/fill.py" "$URI_UNIX" verify "$WORK/fill.state" || die "flushed data lost across kill -9 on a full filesystem"
# It serves read-only, and says so.
"$FP" status --data "$DATA" --json | $PY -c "
import json,sys
p=json.load(sys.stdin)['pool']
assert p['read_only'], p
print('after kill -9 on the full filesystem: serving read-only:', p['read_only'])"
grep -q "^READ-ONLY" <<<"$("$FP" status --data "$DATA")" || die "status text does not say the pool is read-only"
grep -q panicked "$WORK/server.log" && die "the server panicked"
echo "full host filesystem: creation refused when allocated; sparse pool answers ENOSPC, fails no member, survives kill -9"
