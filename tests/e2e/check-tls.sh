#!/bin/bash
# TLS with libnbd's clients (GnuTLS) against `flashpool serve --tls`: TLS-PSK and X.509
# (with client certificates), nbdinfo, nbdcopy round trip, fio verify and qemu-img over TLS;
# a plain client refused when TLS is required, a wrong key and an untrusted certificate
# refused; --tls on still serves plain clients.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
[ "${SERVER_KIND:-}" = flashpool ] || skip "TLS flags are flashpool serve's"
command -v openssl >/dev/null || skip "openssl CLI not installed"
new_workdir
trap 'cleanup' EXIT
FP=$TARGET/release/flashpool
T=$WORK/tls; mkdir -p "$T/pki" "$T/client" "$T/other" "$T/noclient" "$T/qemu"
printf 'alice:%s\n' "$(openssl rand -hex 32)" > "$T/keys.psk"
printf 'alice:%s\n' "$(openssl rand -hex 32)" > "$T/wrong.psk"
cp "$T/keys.psk" "$T/qemu/keys.psk"   # qemu's tls-creds-psk reads DIR/keys.psk
cert() { # cert NAME CA_DIR OUT_CERT OUT_KEY [SAN]
    openssl req -newkey rsa:2048 -nodes -keyout "$4" -out "$T/$1.csr" -subj "/CN=$1" 2>/dev/null
    if [ -n "${5:-}" ]; then printf 'subjectAltName=%s\n' "$5" > "$T/$1.ext"; else : > "$T/$1.ext"; fi
    openssl x509 -req -in "$T/$1.csr" -CA "$2/ca-cert.pem" -CAkey "$2/ca-key.pem" \
        -CAcreateserial -out "$3" -days 2 -extfile "$T/$1.ext" 2>/dev/null
}
for ca in pki other; do
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$T/$ca/ca-key.pem" \
        -out "$T/$ca/ca-cert.pem" -days 2 -subj "/CN=flashpool test CA $ca" 2>/dev/null
done
cert server "$T/pki" "$T/pki/server-cert.pem" "$T/pki/server-key.pem" "IP:127.0.0.1,DNS:localhost"
cert client "$T/pki" "$T/client/client-cert.pem" "$T/client/client-key.pem"
cp "$T/pki/ca-cert.pem" "$T/client/"; cp "$T/pki/ca-cert.pem" "$T/noclient/"
# A client whose certificate another CA signed (the server's CA does not trust it).
cert stranger "$T/other" "$T/other/client-cert.pem" "$T/other/client-key.pem"
cp "$T/other/client-cert.pem" "$T/other/client-key.pem" "$T/noclient/" 2>/dev/null || true
mkdir -p "$T/untrusted"; cp "$T/pki/ca-cert.pem" "$T/other/client-cert.pem" "$T/other/client-key.pem" "$T/untrusted/"

serve() { # serve ARGS...: start flashpool serve with TLS flags, wait for its port
    "$FP" serve --data "$DATA" --listen "127.0.0.1:$PORT" --socket "$SOCK" "$@" \
        >>"$WORK/server.log" 2>&1 &
    SERVER_PID=$!
    local i
    for i in $(seq 1 300); do
        (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || { tail -20 "$WORK/server.log" >&2; die "server exited"; }
        sleep 0.1
    done
    die "server did not come up"
}
PSK="nbds://alice@127.0.0.1:$PORT/default?tls-psk-file=$T/keys.psk"

# 1. Flag errors are clear and touch no data dir.
if "$FP" serve --data "$WORK/never" --tls require 2>"$WORK/err"; then die "--tls require without credentials accepted"; fi
grep -q "needs --tls-certificates DIR or --tls-psk FILE" "$WORK/err" || die "unclear error: $(cat "$WORK/err")"
if "$FP" serve --data "$WORK/never" --tls require --tls-certificates "$WORK/none" 2>"$WORK/err"; then die "missing certificates accepted"; fi
grep -q "ca-cert.pem is missing" "$WORK/err" || die "unclear error: $(cat "$WORK/err")"
[ ! -e "$WORK/never" ] || die "a refused serve created its data dir"

# 2. TLS-PSK, required.
serve --tls require --tls-psk "$T/keys.psk"
[ "$(timeout 20 nbdinfo --size "$PSK")" -gt 0 ] || die "nbdinfo over TLS-PSK"
if timeout 20 nbdinfo --size "nbd://127.0.0.1:$PORT/default" 2>"$WORK/err"; then die "plain client served while TLS is required"; fi
grep -qi "tls" "$WORK/err" || die "plain refusal does not mention TLS: $(cat "$WORK/err")"
if timeout 20 nbdinfo --size "nbds://alice@127.0.0.1:$PORT/default?tls-psk-file=$T/wrong.psk" 2>/dev/null; then die "wrong key accepted"; fi
head -c $((16 << 20)) /dev/urandom > "$WORK/src.raw"
nbdcopy --flush "$WORK/src.raw" "$PSK"
nbdcopy "$PSK" "$WORK/back.raw"
cmp -n $((16 << 20)) "$WORK/src.raw" "$WORK/back.raw" || die "nbdcopy round trip over TLS differs"
if command -v qemu-nbd >/dev/null; then
    # fio's nbd engine may not read key files (libnbd's URI rule), so qemu-nbd, a TLS-PSK
    # client of ours, re-exports the volume in the clear on a local socket for fio: every
    # byte fio writes and verifies crosses our TLS link.
    qemu-nbd --object "tls-creds-psk,id=tls0,dir=$T/qemu,username=alice,endpoint=client" \
        --image-opts "driver=nbd,server.type=inet,server.host=127.0.0.1,server.port=$PORT,export=default,tls-creds=tls0" \
        -k "$WORK/proxy.sock" -t -e 4 --cache=none >"$WORK/proxy.log" 2>&1 &
    PROXY=$!
    for i in $(seq 1 100); do [ -S "$WORK/proxy.sock" ] && break; sleep 0.1; done
    fio --name=tls --ioengine=nbd --uri="nbd+unix:///?socket=$WORK/proxy.sock" --rw=randwrite \
        --bs=4k --size=32M --offset=32M --iodepth=16 --verify=crc32c --verify_fatal=1 \
        --do_verify=1 --output-format=terse >/dev/null || { cat "$WORK/proxy.log" >&2; die "fio verify over TLS-PSK"; }
    kill "$PROXY"; wait "$PROXY" 2>/dev/null || true
fi
if command -v qemu-img >/dev/null; then
    qemu-img info --object "tls-creds-psk,id=tls0,dir=$T/qemu,username=alice,endpoint=client" \
        --image-opts "driver=nbd,host=127.0.0.1,port=$PORT,export=default,tls-creds=tls0" \
        >"$WORK/qi" || die "qemu-img over TLS-PSK"
    grep -q "virtual size" "$WORK/qi" || die "qemu-img info output"
fi
stop_server

# 3. X.509 with client certificates, required.
serve --tls require --tls-certificates "$T/pki" --tls-verify-peer
X509="nbds://127.0.0.1:$PORT/default"
[ "$(timeout 20 nbdinfo --size "$X509?tls-certificates=$T/client")" -gt 0 ] || die "nbdinfo over X.509"
nbdcopy "$X509?tls-certificates=$T/client" "$WORK/back2.raw"
cmp -n $((16 << 20)) "$WORK/src.raw" "$WORK/back2.raw" || die "data read over X.509 differs"
if timeout 20 nbdinfo --size "$X509?tls-certificates=$T/untrusted" 2>/dev/null; then die "untrusted client certificate accepted"; fi
if timeout 20 nbdinfo --size "$X509?tls-certificates=$T/other" 2>/dev/null; then die "client trusting another CA connected"; fi
stop_server

# 4. TLS on: both kinds of client.
serve --tls on --tls-psk "$T/keys.psk"
[ "$(timeout 20 nbdinfo --size "nbd://127.0.0.1:$PORT/default")" -gt 0 ] || die "plain client with --tls on"
[ "$(timeout 20 nbdinfo --size "$PSK")" -gt 0 ] || die "TLS client with --tls on"
stop_server
echo "TLS (PSK and X.509) with nbdinfo, nbdcopy, fio verify and qemu-img ok"
