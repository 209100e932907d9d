#!/bin/bash
# Volumes created, resized and deleted on a running `flashpool serve --nvme-tcp` appear,
# change and disappear as NVMe namespaces at once (issue 17; flashpool only): a volume created
# through the admin socket takes NSID = its id and serves I/O from the NVMe/TCP load generator
# (crates/nvmet/examples/nvme-load.rs); after its deletion the NSID is refused (Invalid
# Namespace). The kernel initiator's rescan on the asynchronous event this sends is proven in
# kernel-nvme (nvmet-mem hotplug).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
if [ "${SERVER_KIND:-}" != flashpool ]; then echo "SKIP: namespace checks need flashpool serve"; exit 0; fi
new_workdir; trap cleanup EXIT
(cd "$ROOT" && cargo build --release -q -p flashpool-nvmet --example nvme-load) || die "cannot build nvme-load"
LOAD="$TARGET/release/examples/nvme-load"
NPORT=$((PORT + 1))
SERVER_CMD="$TARGET/release/flashpool serve --drive-size 128M --volume-size 64M --nvme-tcp 127.0.0.1:$NPORT" start_server
URI=$(grep -o "nvme-tcp://[^ ]*" "$WORK/server.log" | head -1)
[ -n "$URI" ] || die "no nvme-tcp address printed"
# One admin-socket command; its JSON answer on stdout. (Captured before grepping: `grep -q`
# in a pipe may close it before the answer is written, which pipefail would count.)
adm() { $PY -c "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall((sys.argv[2]+'\n').encode()); print(s.makefile().readline())" "$DATA/admin.sock" "$1"; }
if "$LOAD" --addr "$URI" --nsid 2 --rw randread --seconds 1 --qd 4 --size 8M 2> "$WORK/before.err"; then
    die "NSID 2 served before any such volume"
fi
out=$(adm "volume create extra 33554432"); grep -q '"id":2' <<<"$out" || die "volume create did not give id 2: $out"
"$LOAD" --addr "$URI" --nsid 2 --rw randwrite --seconds 1 --qd 8 --size 32M || die "the new volume is not a namespace"
out=$(adm "volume resize extra 67108864"); grep -q resized <<<"$out" || die "resize refused: $out"
# The namespace grew with the volume: I/O past the old end works.
"$LOAD" --addr "$URI" --nsid 2 --rw randwrite --seconds 1 --qd 8 --size 64M || die "the resized namespace refuses I/O past its old end"
out=$(adm "volume delete extra"); grep -q deleted <<<"$out" || die "delete refused: $out"
if "$LOAD" --addr "$URI" --nsid 2 --rw randread --seconds 1 --qd 4 --size 8M 2> "$WORK/after.err"; then
    die "NSID 2 still served after its volume was deleted"
fi
grep -q "SC 0x0b" "$WORK/after.err" || { cat "$WORK/after.err"; die "the deleted namespace was not refused as invalid"; }
"$LOAD" --addr "$URI" --nsid 1 --rw randread --seconds 1 --qd 4 --size 8M || die "the default volume's namespace broke"
grep -q panicked "$WORK/server.log" && die "the server panicked"
stop_server
echo PASS
