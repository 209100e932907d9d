# shellcheck shell=sh
# Guest script (busybox sh, runs as /test.sh) of tests/e2e/check-kernel-nvme-auth.sh:
# the kernel's NVMe/TCP initiator (nvme-cli) with in-band authentication
# (DH-HMAC-CHAP) against a target on the host whose subsystem requires it.
# Needs a kernel with CONFIG_NVME_HOST_AUTH (Debian's 6.1 has none; the
# check boots Debian bookworm's 6.12 kernel package).
#
# Environment (from the host): NVME_ADDR, NVME_PORT, NVME_NQN; HOST_A/KEY_A
# (a host and its secret), KEY_A_WRONG (another secret), HOST_B/KEY_B/CTRL_B
# (a host with a controller secret: bidirectional), HOST_C/KEY_C and
# HOST_D/KEY_D (48- and 64-byte keys: SHA-384, SHA-512), HOST_PLAIN (allowed
# without a secret), HOST_DENIED (not allowed). Each accepted connection writes
# 4 MiB of random data with O_DIRECT and reads it back (sha256).
set -eu
T0=$(date +%s)
step() { echo "nvme-auth [$(($(date +%s) - T0))s]: $*"; }
kmsg() { dmesg | grep -i nvme | tail -${1:-12} | sed 's/^/nvme-auth dmesg: /'; }
fail() { echo "nvme-auth FAILED: $*"; kmsg 30; exit 1; }
: "${NVME_ADDR:?}" "${NVME_PORT:?}" "${NVME_NQN:?}"

mkdir -p /etc/nvme
[ -s /etc/nvme/hostid ] || cat /proc/sys/kernel/random/uuid > /etc/nvme/hostid

dev_of() { # dev_of [TRIES]: the namespace block device of NVME_NQN, waiting TRIES x 0.1 s (100)
    i=0
    while [ $i -lt "${1:-100}" ]; do
        for b in /sys/block/nvme*n*; do
            case ${b##*/} in *c*) continue ;; esac
            [ -e "$b/device/subsysnqn" ] && [ "$(cat "$b/device/subsysnqn")" = "$NVME_NQN" ] &&
                [ -b "/dev/${b##*/}" ] && { echo "/dev/${b##*/}"; return 0; }
        done
        i=$((i + 1)); sleep 0.1
    done
    return 1
}

# accept NAME HOSTNQN OPTS...: connect must succeed, I/O must round-trip.
accept() {
    name=$1 host=$2; shift 2
    step "$name: nvme connect --hostnqn $host $(echo "$*" | sed 's/DHHC-1:[^ ]*/DHHC-1:<secret>/g')"
    nvme connect -t tcp -a "$NVME_ADDR" -s "$NVME_PORT" -n "$NVME_NQN" --hostnqn="$host" "$@" ||
        fail "$name: nvme connect was refused"
    dev=$(dev_of) || fail "$name: no namespace block device after connecting"
    dd if=/dev/urandom of=/tmp/data bs=1M count=4 2>/dev/null
    dd if=/tmp/data of="$dev" bs=1M count=4 oflag=direct 2>/dev/null || fail "$name: write"
    dd if="$dev" of=/tmp/back bs=1M count=4 iflag=direct 2>/dev/null || fail "$name: read"
    [ "$(sha256sum < /tmp/data)" = "$(sha256sum < /tmp/back)" ] || fail "$name: data read back differs"
    step "$name: connected as $dev, 4 MiB written and read back intact"
    kmsg 4
    nvme disconnect -n "$NVME_NQN" >/dev/null || fail "$name: nvme disconnect"
    i=0; while dev_of 1 >/dev/null 2>&1 && [ $i -lt 50 ]; do i=$((i + 1)); sleep 0.1; done
}

# refuse NAME HOSTNQN OPTS...: connect must fail, no device may appear.
refuse() {
    name=$1 host=$2; shift 2
    step "$name: nvme connect --hostnqn $host $(echo "$*" | sed 's/DHHC-1:[^ ]*/DHHC-1:<secret>/g') (must be refused)"
    if nvme connect -t tcp -a "$NVME_ADDR" -s "$NVME_PORT" -n "$NVME_NQN" --hostnqn="$host" "$@" \
        >/tmp/connect.out 2>&1; then
        cat /tmp/connect.out
        nvme disconnect -n "$NVME_NQN" >/dev/null 2>&1 || true
        fail "$name: nvme connect succeeded"
    fi
    step "$name: refused: $(tr '\n' ' ' < /tmp/connect.out)"
    kmsg 3
    [ -z "$(dev_of 1 2>/dev/null || true)" ] || fail "$name: a namespace appeared anyway"
}

accept sha256 "$HOST_A" --dhchap-secret="$KEY_A"
refuse wrong-secret "$HOST_A" --dhchap-secret="$KEY_A_WRONG"
refuse no-secret "$HOST_A"
refuse not-allowed "$HOST_DENIED"
refuse not-allowed-with-a-secret "$HOST_DENIED" --dhchap-secret="$KEY_A"
accept allowed-without-secret "$HOST_PLAIN"
accept bidirectional "$HOST_B" --dhchap-secret="$KEY_B" --dhchap-ctrl-secret="$CTRL_B"
refuse wrong-ctrl-secret "$HOST_B" --dhchap-secret="$KEY_B" --dhchap-ctrl-secret="$KEY_A"
accept sha384 "$HOST_C" --dhchap-secret="$KEY_C"
accept sha512 "$HOST_D" --dhchap-secret="$KEY_D"
dmesg | grep -a 'authenticated with hash' | sed 's/^/nvme-auth dmesg: /' | sort -u -k4 | tail -8
step "done"
