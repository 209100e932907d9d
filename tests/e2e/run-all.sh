#!/bin/bash
# Run every NBD end-to-end check against one server kind.
#
#   tests/e2e/run-all.sh [memserve|flashpool]      (default: memserve)
#
# SERVER_CMD overrides the server command (see lib.sh). Clients come from
# Debian (tests/e2e/apt-packages.txt); with E2E_INSTALL=1 missing ones are
# installed with apt-get. Prints PASS/FAIL/SKIP per check and finally
# "N passed, N failed, N skipped"; exits non-zero if anything failed.
# Logs: $E2E_LOGS (default /tmp/nbd-e2e-logs).
set -uo pipefail
export SERVER_KIND=${1:-${SERVER_KIND:-memserve}}
source "$(dirname "$0")/lib.sh"
LOGS=${E2E_LOGS:-/tmp/nbd-e2e-logs}
mkdir -p "$LOGS"

have_clients() {
    local c
    for c in fio nbdinfo nbdcopy nbdfuse qemu-img qemu-io mkfs.ext4 e2fsck losetup fusermount3; do
        command -v "$c" >/dev/null || { echo "missing client: $c"; return 1; }
    done
    $PY -c 'import nbd' 2>/dev/null || { echo "missing python3-libnbd"; return 1; }
}
if ! have_clients; then
    if [ "${E2E_INSTALL:-0}" = 1 ] && [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            $(grep -v '^#' "$E2E_DIR/apt-packages.txt") >/dev/null
    fi
    have_clients || { echo "FAIL: e2e clients not installed (E2E_INSTALL=1 installs them)"; echo "0 passed, 1 failed"; exit 1; }
fi

echo "building server ($SERVER_KIND)..."
if ! build_server; then echo "FAIL: build"; echo "0 passed, 1 failed"; exit 1; fi
echo "server command: $(server_cmd)"

CHECKS=(
    "nbdinfo:check-nbdinfo.sh"
    "probe:check-probe.sh"
    "fio-randwrite-4k:check-fio.sh randwrite"
    "fio-mixed-2conn-flush:check-fio.sh mixed"
    "fio-trim:check-fio.sh trim"
    "fio-scattered-1m-reads:check-fio.sh scattered"
    "fio-log-wraps:check-fio.sh wrap"
    "tcp-and-unix:check-both.sh"
    "nbdcopy-64m:check-nbdcopy.sh"
    "qemu-img:check-qemu-img.sh"
    "ext4-nbdfuse:check-fs.sh"
    "restart-persistence:check-restart.sh"
    "tls:check-tls.sh"
    "metrics:check-metrics.sh"
    "http-api:check-http-api.sh"
    "sim-drives:check-sim-drives.sh"
    "stdio-and-activation:check-spawn.sh"
    "drive-loss-and-add:check-drives.sh"
    "nvme-reads-through-drive-loss:check-nvme-drive-loss.sh"
    "members-loop-devices:check-members.sh"
    "faults-under-load:check-faults.sh"
    "fault-matrix:check-fault-matrix.sh"
    "bitrot-two-members:check-bitrot.sh"
    "fill-and-lose-a-member:check-fill.sh"
    "host-filesystem-full:check-hostfull.sh"
    "kill9-crash:../crash/kill9.sh 4"
    "kernel-nbd:check-kernel-nbd.sh"
    "nvme-namespaces:check-nvme-namespaces.sh"
    "kernel-nvme:check-kernel-nvme.sh"
    "kernel-nvme-auth:check-kernel-nvme-auth.sh"
    "kernel-nvme-tls:check-kernel-nvme-tls.sh"
    "kernel-nvme-pool:check-kernel-nvme-pool.sh"
)
pass=0; fail=0; skipped=0
for entry in "${CHECKS[@]}"; do
    name=${entry%%:*}; cmd=${entry#*:}
    if [ -n "${E2E_ONLY:-}" ] && ! [[ ",$E2E_ONLY," == *",$name,"* ]]; then continue; fi
    log="$LOGS/$name.log"
    start=$(date +%s)
    # shellcheck disable=SC2086
    # From the logs dir: fio leaves its verify state files in the working directory.
    (cd "$LOGS" && timeout -k 10 "${E2E_TIMEOUT:-600}" bash "$E2E_DIR/"$cmd > "$log" 2>&1)
    rc=$?
    secs=$(( $(date +%s) - start ))
    if [ $rc -eq 0 ]; then
        echo "PASS: $name (${secs}s)"; pass=$((pass + 1))
    elif [ $rc -eq 77 ]; then
        echo "SKIP: $name: $(grep -h '^SKIP' "$log" | tail -1)"; skipped=$((skipped + 1))
    else
        echo "FAIL: $name (exit $rc, ${secs}s, log $log)"; fail=$((fail + 1))
        tail -25 "$log" | sed 's/^/    /'
    fi
done
echo "$pass passed, $fail failed, $skipped skipped"
[ $fail -eq 0 ]
