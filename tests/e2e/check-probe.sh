#!/bin/bash
# The libnbd probe (probe.py) over the Unix socket and over TCP.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
new_workdir; trap cleanup EXIT
start_server
$PY "$E2E_DIR/probe.py" "$URI_UNIX"
$PY "$E2E_DIR/probe.py" "$URI_TCP" | tail -1
stop_server
