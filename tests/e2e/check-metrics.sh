#!/bin/bash
# flashpool serve --metrics: scrape /metrics while fio writes and reads over NBD, check that the
# per-volume counters moved by exactly what fio reports it did, that the engine's counters
# agree, that counters never go back between scrapes, and that `promtool check metrics` (Debian
# package prometheus) finds nothing to lint in any scrape.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
case "${SERVER_KIND:-memserve}" in
    flashpool | flashpool-mem) ;;
    *) skip "metrics are a flashpool serve feature (SERVER_KIND=$SERVER_KIND)" ;;
esac
if ! command -v promtool >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        echo "promtool missing: installing Debian's prometheus package for it"
        (apt-get install -y -qq prometheus >/dev/null 2>&1 ||
            (apt-get update -qq && apt-get install -y -qq prometheus >/dev/null 2>&1)) || true
    fi
fi
if ! command -v promtool >/dev/null; then
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
    echo "!! promtool (Debian package prometheus) cannot be installed here: the metrics   !!" >&2
    echo "!! exposition is NOT linted by this run                                         !!" >&2
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
    skip "promtool cannot be installed (apt-get install prometheus failed)"
fi

new_workdir; trap cleanup EXIT
MPORT=$((PORT + 1))
SERVER_CMD="$(server_cmd) --metrics 127.0.0.1:$MPORT"
start_server
URL=http://127.0.0.1:$MPORT/metrics

scrape() { curl -sf "$URL" -o "$1"; }
value() { # value FILE SERIES -> the sample's value (0 when absent)
    awk -v s="$2" '$1 == s { v = $2 } END { print (v == "" ? 0 : v) }' "$1"
}
W='flashpool_volume_bytes_total{op="write",volume="default"}'
WR='flashpool_volume_requests_total{op="write",volume="default"}'
R='flashpool_volume_bytes_total{op="read",volume="default"}'
RR='flashpool_volume_requests_total{op="read",volume="default"}'
F='flashpool_volume_requests_total{op="flush",volume="default"}'

scrape "$WORK/m0.txt"
promtool check metrics < "$WORK/m0.txt"
host0=$(value "$WORK/m0.txt" flashpool_host_write_bytes_total)

# fio writes 64 MiB in 4 KiB..64 KiB random writes at queue depth 16, flushing every 32
# writes, then reads it all back with crc32c verification, while the loop scrapes.
fio --name=metrics --ioengine=nbd --uri="$URI_TCP" --rw=randwrite --bsrange=4k-64k \
    --size=64M --iodepth=16 --fsync=32 --do_verify=1 --verify=crc32c --verify_fatal=1 \
    --output-format=json --output="$WORK/fio.json" &
FIO=$!
n=0; last=0
while kill -0 $FIO 2>/dev/null; do
    scrape "$WORK/during.txt"
    promtool check metrics < "$WORK/during.txt" || die "promtool: scrape $n during fio"
    now=$(value "$WORK/during.txt" "$W")
    awk -v a="$now" -v b="$last" 'BEGIN { exit !(a >= b) }' || die "write bytes went back: $now < $last"
    last=$now; n=$((n + 1))
    sleep 0.2
done
wait $FIO || die "fio failed"
echo "$n scrapes while fio ran"
scrape "$WORK/m1.txt"
promtool check metrics < "$WORK/m1.txt"
grep -E '^flashpool_(volume_(bytes|requests)_total|host_write_bytes_total|write_amplification_ratio|nbd_connections)' "$WORK/m1.txt"

$PY - "$WORK/fio.json" "$WORK/m0.txt" "$WORK/m1.txt" <<'PY'
import json, re, sys
fio = json.load(open(sys.argv[1]))["jobs"][0]
def load(p):
    m = {}
    for line in open(p):
        if line.startswith("#") or not line.strip():
            continue
        k, v = line.rsplit(" ", 1)
        m[k] = float(v)
    return m
m0, m1 = load(sys.argv[2]), load(sys.argv[3])
def d(k):
    return m1.get(k, 0) - m0.get(k, 0)
vol = lambda name, op: f'flashpool_volume_{name}_total{{op="{op}",volume="default"}}'
w_bytes, w_ios = fio["write"]["io_bytes"], fio["write"]["total_ios"]
r_bytes, r_ios = fio["read"]["io_bytes"], fio["read"]["total_ios"]
print(f"fio: {w_ios} writes, {w_bytes} bytes; {r_ios} verify reads, {r_bytes} bytes; "
      f"sync {fio['sync']['total_ios'] if 'sync' in fio else '?'}")
assert d(vol("bytes", "write")) == w_bytes, (d(vol("bytes", "write")), w_bytes)
assert d(vol("requests", "write")) == w_ios, (d(vol("requests", "write")), w_ios)
assert d(vol("bytes", "read")) == r_bytes, (d(vol("bytes", "read")), r_bytes)
assert d(vol("requests", "read")) == r_ios, (d(vol("requests", "read")), r_ios)
assert d(vol("requests", "flush")) >= w_ios // 32 - 1, d(vol("requests", "flush"))
assert d(vol("errors", "write")) == 0
# The histogram counted every request.
h = 'flashpool_volume_request_duration_seconds_count{op="write",volume="default"}'
assert d(h) == w_ios, (d(h), w_ios)
# The engine saw the same host bytes (fio writes whole 4 KiB blocks).
assert d("flashpool_host_write_bytes_total") == w_bytes, (d("flashpool_host_write_bytes_total"), w_bytes)
assert d("flashpool_media_parity_bytes_total") > 0
wa = m1['flashpool_write_amplification_ratio{cause="all"}']
assert 0 < wa < 5, wa
print(f"counters moved by what fio did; write amplification {wa:.3f}")
PY

# The Grafana dashboard's queries: valid PromQL (promtool parses them as recording rules), and
# every flashpool metric they name is one the server exports (block-device drive counters
# appear only for block-device members, so those are checked against the source).
$PY - "$ROOT/deploy/grafana/flashpool.json" "$WORK/m1.txt" "$ROOT/crates/cli/src/ops/metrics.rs" "$WORK/rules.yml" <<'PY'
import json, re, sys
d = json.load(open(sys.argv[1]))
scrape = open(sys.argv[2]).read()
source = open(sys.argv[3]).read()
exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
for q in exprs:
    for name in set(re.findall(r"flashpool_[a-z0-9_]+", q)):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in scrape or f'"{name}"' in source or f'"{base}"' in source, f"dashboard names {name}, not exported"
with open(sys.argv[4], "w") as f:
    f.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, q in enumerate(exprs):
        q = q.replace("$instance", ".*").replace("$volume", ".*")
        f.write(f"      - record: dashboard:q{i}\n        expr: {json.dumps(q)}\n")
print(f"dashboard: {len(exprs)} queries name exported metrics")
PY
promtool check rules "$WORK/rules.yml"
stop_server
