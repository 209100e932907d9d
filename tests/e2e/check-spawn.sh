#!/bin/bash
# Spawnable server: libnbd starts it itself, with --stdio (connect_command)
# and with systemd socket activation (nbdinfo -- [ SERVER ]).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
new_workdir; trap cleanup EXIT
read -r -a CMD <<< "$(server_cmd)"
mkdir -p "$DATA"
# Socket activation: nbdinfo passes a listening socket as fd 3.
nbdinfo --json -- [ "${CMD[@]}" --data "$DATA" ] > "$WORK/act.json"
$PY -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['exports'][0]['export-size']>0; print('socket activation ok')" "$WORK/act.json"
head -c 4M /dev/urandom > "$WORK/4m"
nbdcopy --flush "$WORK/4m" -- [ "${CMD[@]}" --data "$DATA" ]
# --stdio: connect_command runs the server on a socketpair; data written
# in one run is read back in the next (same data dir).
$PY - "$DATA" "$WORK/4m" "${CMD[@]}" <<'PY'
import nbd, sys
data, src, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
want = open(src, "rb").read()
h = nbd.NBD()
h.connect_command(cmd + ["--stdio", "--data", data])
assert h.pread(len(want), 0) == want, "data written via socket activation not read back"
h.pwrite(b"stdio!" * 100, 8 << 20)
h.flush()
h.shutdown()
del h  # waits for the server process to exit
h = nbd.NBD()
h.connect_command(cmd + ["--stdio", "--data", data])
assert h.pread(600, 8 << 20) == b"stdio!" * 100
h.shutdown()
print("--stdio ok")
PY
