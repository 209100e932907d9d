# Shared helpers for the NBD end-to-end checks (sourced, not run).
#
# The server under test is chosen by SERVER_KIND:
#   memserve  - crates/nbd/examples/memserve (memory exports, --data persists)
#   flashpool - `flashpool serve` (the real product)
# or given whole by SERVER_CMD (a command prefix that accepts
# --data DIR --listen HOST:PORT --socket PATH and --stdio).
# Both start the server the same way:
#   $SERVER_CMD --data DIR --listen 127.0.0.1:PORT --socket SOCK

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$E2E_DIR/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
PY=/usr/bin/python3            # Debian's python3 has the nbd module

server_cmd() {
    if [ -n "${SERVER_CMD:-}" ]; then echo "$SERVER_CMD"; return; fi
    case "${SERVER_KIND:-memserve}" in
        memserve) echo "$TARGET/release/examples/memserve --size ${MEMSERVE_SIZE:-1G}" ;;
        flashpool) echo "$TARGET/release/flashpool serve" ;;
        flashpool-mem) echo "$TARGET/release/flashpool serve --memory" ;;
        *) echo "unknown SERVER_KIND ${SERVER_KIND}" >&2; return 1 ;;
    esac
}

build_server() {
    [ -n "${SERVER_CMD:-}" ] && return 0
    case "${SERVER_KIND:-memserve}" in
        memserve) (cd "$ROOT" && cargo build --release -q -p flashpool-nbd --example memserve) ;;
        flashpool | flashpool-mem) (cd "$ROOT" && cargo build --release -q -p flashpool) ;;
    esac
}

# A private work dir per check; removed on exit by the caller's trap.
new_workdir() {
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/nbd-e2e.XXXXXX")
    DATA=$WORK/data
    SOCK=$WORK/nbd.sock
    PORT=${PORT:-$((20000 + RANDOM % 20000))}
    URI_UNIX="nbd+unix:///?socket=$SOCK"
    URI_TCP="nbd://127.0.0.1:$PORT/"
}

# start_server: start in the background, wait until it answers.
start_server() {
    local cmd; cmd=$(server_cmd) || return 1
    # shellcheck disable=SC2086
    $cmd --data "$DATA" --listen "127.0.0.1:$PORT" --socket "$SOCK" \
        >>"$WORK/server.log" 2>&1 &
    SERVER_PID=$!
    local i
    for i in $(seq 1 300); do
        if [ -S "$SOCK" ] && timeout 5 nbdinfo --size "$URI_UNIX" >/dev/null 2>&1; then
            return 0
        fi
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "server exited early:" >&2; tail -20 "$WORK/server.log" >&2
            return 1
        fi
        sleep 0.1
    done
    echo "server did not come up" >&2
    return 1
}

# stop_server: SIGTERM, wait, require exit status 0.
stop_server() {
    [ -n "${SERVER_PID:-}" ] || return 0
    kill -TERM "$SERVER_PID" 2>/dev/null
    local rc=0
    wait "$SERVER_PID" || rc=$?
    SERVER_PID=
    if [ "$rc" -ne 0 ]; then
        echo "server exited with status $rc" >&2; tail -20 "$WORK/server.log" >&2
        return 1
    fi
    if [ -e "$SOCK" ]; then echo "socket file left behind" >&2; return 1; fi
}

cleanup() {
    if [ -n "${SERVER_PID:-}" ]; then kill -TERM "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; fi
    [ -n "${WORK:-}" ] && rm -rf "$WORK"
}

export_size() { nbdinfo --size "$URI_UNIX"; }

die() { echo "FAILED: $*" >&2; exit 1; }
skip() { echo "SKIP: $*" >&2; exit 77; }

# guest_nvme_setup TIMEOUT: what every kernel NVMe/TCP check starts with: GUEST (tests/guest),
# LOGS, GUEST_TIMEOUT (default TIMEOUT s), a work dir cleaned up on exit, and nvmet-mem built.
guest_nvme_setup() {
    GUEST=$ROOT/tests/guest
    LOGS=${E2E_LOGS:-/tmp/nbd-e2e-logs}
    mkdir -p "$LOGS"
    export GUEST_TIMEOUT=${GUEST_TIMEOUT:-$1}
    new_workdir
    trap cleanup EXIT
    (cd "$ROOT" && cargo build --release -q -p flashpool-nvmet --example nvmet-mem) || die "cannot build nvmet-mem"
}

# guest_newer_kernel: fetches the guest with bookworm's newest linux-image-6.*+deb12 (6.12:
# in-band authentication and NVMe/TCP TLS, which the default 6.1 lacks; GUEST_AUTH_KERNEL_PKG
# overrides) into its own cache ($TARGET/guest-cache-auth, GUEST_AUTH_CACHE overrides); sets
# kpkg and config (the kernel's config file).
guest_newer_kernel() {
    kpkg=${GUEST_AUTH_KERNEL_PKG:-$(apt-cache search --names-only '^linux-image-6\.[0-9]+\.[0-9]+\+deb12-amd64$' 2>/dev/null |
        awk '{print $1}' | sort -V | tail -1)}
    [ -n "$kpkg" ] || die "no linux-image-6.*+deb12-amd64 package known to apt (run apt-get update)"
    export GUEST_CACHE=${GUEST_AUTH_CACHE:-$TARGET/guest-cache-auth} GUEST_KERNEL_PKG=$kpkg
    bash "$GUEST/fetch.sh" >/dev/null || die "guest packages or $kpkg unavailable (see above)"
    config=$(ls "$GUEST_CACHE"/kernel/boot/config-* | head -1)
}

# start_nvmet_mem ARGS...: nvmet-mem on 127.0.0.1:$PORT with ARGS (log: $WORK/server.log,
# truncated), in the background (SERVER_PID); returns once it printed its nvme-tcp:// URI.
start_nvmet_mem() {
    NVMET_LOG=${NVMET_LOG:-info} "$TARGET/release/examples/nvmet-mem" --listen "127.0.0.1:$PORT" "$@" \
        >"$WORK/server.log" 2>&1 &
    SERVER_PID=$!
    local _i
    for _i in $(seq 1 100); do
        grep -q '^nvme-tcp://' "$WORK/server.log" && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/server.log" >&2; die "nvmet-mem exited early"; }
        sleep 0.1
    done
    die "nvmet-mem did not come up"
}
