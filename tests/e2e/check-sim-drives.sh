#!/bin/bash
# flashpool serve --sim-drives: a pool whose members are simulated SSDs (flashpool-sim's FTL
# behind every drive). fio writes and verifies over NBD, then overwrites the volume three times
# at random so the pool cleans and the drives fill; `status --json` must then report the
# end-to-end write amplification (host write to NAND program), consistent with the pool's own
# factor times the drives', the drives' erases, and the segments the pool discarded on them;
# with NAND timing in real time (the default), every drive's read and write latency.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
case "${SERVER_KIND:-memserve}" in
    flashpool) ;;
    *) skip "simulated drives are a flashpool serve feature, checked once (SERVER_KIND=$SERVER_KIND)" ;;
esac
FP="$TARGET/release/flashpool"
new_workdir; trap cleanup EXIT
SERVER_CMD="$(server_cmd) --sim-drives small --drive-size 256M --volume-size 400M"
start_server

fio --name=sim --ioengine=nbd --uri="$URI_TCP" --rw=randwrite --bs=4k --size=256M \
    --iodepth=16 --do_verify=1 --verify=crc32c --verify_fatal=1 --output="$WORK/fio1.txt" ||
    die "fio verify on simulated drives failed: $(tail -5 "$WORK/fio1.txt")"
fio --name=churn --ioengine=nbd --uri="$URI_TCP" --rw=randwrite --bs=4k --size=400M \
    --io_size=1200M --iodepth=32 --output="$WORK/fio2.txt" ||
    die "fio overwrites failed: $(tail -5 "$WORK/fio2.txt")"
fio --name=sim --ioengine=nbd --uri="$URI_TCP" --rw=randwrite --bs=4k --size=256M \
    --iodepth=16 --do_verify=1 --verify=crc32c --verify_fatal=1 --output="$WORK/fio3.txt" ||
    die "fio verify after the churn failed: $(tail -5 "$WORK/fio3.txt")"

"$FP" status --data "$DATA" --json > "$WORK/status.json"
"$FP" status --data "$DATA" | grep "end-to-end" || die "status prints no end-to-end line"
$PY - "$WORK/status.json" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
e, w = s["end_to_end"], s["write_amplification"]
assert e is not None, "no end_to_end section with simulated drives"
host = w["host_write_bytes"]
assert host >= (256 + 1200 + 256) << 20, host
# What reached the drives: the pool's own amplification (rounded up to device pages).
pool_wa = w["total"]
assert e["drive_written_bytes"] >= host * pool_wa * 0.99, (e, pool_wa)
assert e["device_waf"] >= 1.0, e
assert abs(e["waf"] - e["media_programmed_bytes"] / host) < 1e-9, e
assert e["media_programmed_bytes"] >= e["drive_written_bytes"], e
assert e["erases"] > 0, "the drives never erased: they were not filled"
assert e["discarded_bytes"] > 0, "the pool discarded nothing on its drives"
drives = [d["media"] for d in s["drives"]]
assert all(m is not None for m in drives), s["drives"]
assert sum(m["programmed_bytes"] for m in drives) == e["media_programmed_bytes"], drives
for m in drives:
    c = m["erase_count"]
    assert 0 <= c["min"] <= c["mean"] <= c["max"], c
    assert m["erases"] > 0 and m["device_waf"] >= 1.0, m
# Real-time NAND timing (the default): every drive timed its operations, and no read is
# faster than the preset's tR (25 us) nor a write than its tPROG (200 us); programs and
# erases ahead of reads on a die show in the read tail.
for d in s["drives"]:
    l = d["latency"]
    assert l is not None, d
    r, w = l["read"], l["write"]
    assert r["count"] > 0 and w["count"] > 0, l
    assert 25 <= r["p50_us"] <= r["p99_us"] <= r["p999_us"] <= r["max_us"], r
    assert w["mean_us"] >= 200, w
    assert r["max_us"] >= 200, ("no read ever waited behind a program", r)
print(f"end-to-end WAF {e['waf']:.3f} = pool {pool_wa:.3f} x drives {e['device_waf']:.3f} "
      f"(+ page rounding); {e['erases']} erases, {e['discarded_bytes'] >> 20} MiB discarded")
r = s["drives"][0]["latency"]["read"]
print(f"drive 0 reads: p50 {r['p50_us']:.0f} us, p99 {r['p99_us']:.0f} us, p99.9 {r['p999_us']:.0f} us")
PYEOF
stop_server
echo "PASS"
