#!/bin/bash
# nbdinfo --json / --list / --map against the server under test.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
new_workdir; trap cleanup EXIT
start_server

nbdinfo --json "$URI_TCP" > "$WORK/info.json"
$PY - "$WORK/info.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["protocol"] == "newstyle-fixed", j["protocol"]
assert j["structured"] is True
e = j["exports"][0]
for k in ["can_cache", "can_df", "can_fast_zero", "can_flush", "can_fua",
          "can_multi_conn", "can_trim", "can_zero"]:
    assert e[k] is True, k
assert e["is_read_only"] is False
assert "base:allocation" in e["contexts"], e["contexts"]
assert (e["block_size_minimum"], e["block_size_preferred"], e["block_size_maximum"]) == (1, 4096, 32 << 20)
assert e["export-size"] > 0
print("nbdinfo --json ok:", e["export-name"], e["export-size"])
PY

nbdinfo --list --json "$URI_UNIX" > "$WORK/list.json"
$PY -c "import json,sys; j=json.load(open(sys.argv[1])); assert len(j['exports'])>=1; print('nbdinfo --list ok:', [e['export-name'] for e in j['exports']])" "$WORK/list.json"

# Write 1 MiB at 16 MiB, zero 4 MiB..8 MiB, then the map must show it.
$PY - "$URI_UNIX" <<'PY'
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.zero(4 << 20, 4 << 20)
h.pwrite(b"\xab" * (1 << 20), 16 << 20)
h.flush(); h.shutdown()
PY
nbdinfo --map --json "$URI_UNIX" > "$WORK/map.json"
nbdinfo --map "$URI_UNIX" | head -5
$PY - "$WORK/map.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
def status_at(off):
    for e in m:
        if e["offset"] <= off < e["offset"] + e["length"]:
            return e["type"]
assert status_at(16 << 20) == 0, ("data expected", status_at(16 << 20))
assert status_at(6 << 20) & 2, ("zero expected", status_at(6 << 20))
total = sum(e["length"] for e in m)
print("nbdinfo --map ok:", len(m), "extents covering", total)
PY
stop_server
