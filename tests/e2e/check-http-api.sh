#!/bin/bash
# The admin JSON API of flashpool serve (--api, --api-token-file), driven with curl: refused
# without the bearer token (401); a volume created over HTTP is served over NBD at once
# (nbdinfo, nbdcopy round trip); resized and deleted; a drive failed and readmitted; the
# automatic rebuild and the cleaner paused and resumed; the CLI keeps working through the
# admin socket meanwhile.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
case "${SERVER_KIND:-memserve}" in
    flashpool | flashpool-mem) ;;
    *) skip "the admin API is a flashpool serve feature (SERVER_KIND=$SERVER_KIND)" ;;
esac
new_workdir; trap cleanup EXIT
APORT=$((PORT + 1))
TOKEN_FILE=$WORK/api-token
( umask 077; openssl rand -hex 24 > "$TOKEN_FILE" )
TOKEN=$(cat "$TOKEN_FILE")
SERVER_CMD="$(server_cmd) --api 127.0.0.1:$APORT --api-token-file $TOKEN_FILE"
start_server
API=http://127.0.0.1:$APORT/api/v1
FLASHPOOL=$TARGET/release/flashpool

# call METHOD PATH [JSON] -> body on stdout; the status code in $WORK/code
call() {
    curl -s -o "$WORK/body" -w '%{http_code}' -X "$1" -H "Authorization: Bearer $TOKEN" \
        -H 'Content-Type: application/json' ${3:+--data "$3"} "$API$2" > "$WORK/code"
    cat "$WORK/body"
}
expect() { # expect CODE METHOD PATH [JSON]
    local want=$1; shift
    call "$@" > /dev/null
    [ "$(cat "$WORK/code")" = "$want" ] || die "$* answered $(cat "$WORK/code"), not $want: $(cat "$WORK/body")"
}
field() { $PY -c "import json,sys; v=json.load(open('$WORK/body')); print(eval(sys.argv[1]))" "$1"; }

# No token, a wrong token: 401, and nothing done.
code=$(curl -s -o /dev/null -w '%{http_code}' "$API/status")
[ "$code" = 401 ] || die "status without a token answered $code"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Authorization: Bearer nope' \
    --data '{"name":"sneaky","size":"1M"}' "$API/volumes")
[ "$code" = 401 ] || die "create with a wrong token answered $code"
grep -qi '^WWW-Authenticate: Bearer' <<<"$(curl -s -i "$API/status")" || die "no WWW-Authenticate"

expect 200 GET /status
echo "status: $(field 'v["protection"]["summary"]')"
[ "$(field 'v["pool"]["drives"]')" = 5 ] || die "status: $(cat "$WORK/body")"

# A volume created over HTTP, served over NBD.
expect 201 POST /volumes '{"name":"e2e","size":"64M","compression":"lz4"}'
expect 409 POST /volumes '{"name":"e2e","size":"64M"}'
expect 400 POST /volumes '{"name":"empty","size":0}'
[ "$(nbdinfo --size "nbd://127.0.0.1:$PORT/e2e")" = $((64 << 20)) ] || die "nbdinfo size of e2e"
grep -q 'export="e2e"' <<<"$(nbdinfo --list "$URI_TCP")" || die "e2e not listed"
head -c $((16 << 20)) /dev/urandom > "$WORK/in.bin"
nbdcopy "$WORK/in.bin" "nbd://127.0.0.1:$PORT/e2e"
nbdcopy "nbd://127.0.0.1:$PORT/e2e" "$WORK/out.bin"
cmp -n $((16 << 20)) "$WORK/out.bin" "$WORK/in.bin" || die "read back differs"
expect 200 GET /volumes/e2e
[ "$(field 'v["allocated_bytes"]')" = $((16 << 20)) ] || die "allocated: $(cat "$WORK/body")"

# Resize: grow; shrinking over data needs force.
expect 200 PATCH /volumes/e2e '{"size":"128M"}'
[ "$(nbdinfo --size "nbd://127.0.0.1:$PORT/e2e")" = $((128 << 20)) ] || die "size after growing"
expect 409 PATCH /volumes/e2e '{"size":"8M"}'
expect 200 PATCH /volumes/e2e '{"size":"8M","force":true}'

# Drives: pause the automatic rebuild, fail one, see it, readmit it.
expect 200 POST /rebuild/pause
expect 200 POST /drives/1/fail
expect 200 GET /drives
[ "$(field 'v["drives"][1]["state"]')" = failed ] || die "drive 1: $(cat "$WORK/body")"
# A second member down is more than parity covers: refused as a conflict, nothing changed.
expect 409 POST /drives/2/fail
expect 200 GET /drives
[ "$(field 'v["drives"][2]["state"]')" = active ] || die "drive 2 after a refused fail: $(cat "$WORK/body")"
# The CLI sees the same through the admin socket (memory pools have none).
if [ "$SERVER_KIND" != flashpool-mem ]; then
    "$FLASHPOOL" drive list --data "$DATA" | grep -E '^ *1 +failed' || die "CLI drive list"
fi
expect 200 POST /drives/1/readmit
expect 200 POST /rebuild/resume
expect 404 POST /drives/99/fail

# Cleaner and scrub.
expect 200 POST /cleaner/pause
expect 200 POST /cleaner/run '{"free_segments": 1}'
expect 200 POST /cleaner/resume
expect 200 POST /scrub '{"check_only": true}'
echo "scrub: $(field 'v["stripes_checked"]') stripes checked"

# The contract's edges: a 405 names what the route takes (Allow), a route the API lacks is
# 404 whatever the method, null is no field's value, URL segments are percent-decoded, the
# auth scheme's name is case-insensitive, a GET refuses body fields.
grep -qi '^Allow: GET, POST' <<<"$(curl -s -i -X PUT -H "Authorization: Bearer $TOKEN" "$API/volumes")" \
    || die "405 without Allow"
expect 404 POST /rebuild/foo
expect 404 POST /drives/0/foo
expect 400 POST /scrub '{"check_only":null}'
expect 400 POST /drives '{"path":null}'
expect 200 GET /volumes/%65%32e
[ "$(field 'v["name"]')" = e2e ] || die "percent-decoded name: $(cat "$WORK/body")"
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: bearer $TOKEN" "$API/status")
[ "$code" = 200 ] || die "lower-case bearer answered $code"
expect 400 GET /status '{"x":1}'
# The volume commands reach the running server through its admin socket.
if [ "$SERVER_KIND" != flashpool-mem ]; then
    "$FLASHPOOL" volume list --data "$DATA" | grep -q '^e2e ' || die "CLI volume list"
fi

# Delete: gone from the API and from NBD.
expect 200 DELETE /volumes/e2e
expect 404 GET /volumes/e2e
if nbdinfo --size "nbd://127.0.0.1:$PORT/e2e" 2>/dev/null; then die "deleted volume still served"; fi
if [ "$SERVER_KIND" != flashpool-mem ]; then
    grep -q 'volume default' <<<"$("$FLASHPOOL" status --data "$DATA")" || die "CLI status"
fi
echo "admin API ok"
stop_server
