# Sourced by the device scripts: `wrap AT COMMAND [ARGS]` writes an executable at AT that runs
# COMMAND (shell words, quoted as needed) with the caller's arguments and then ARGS, so a
# benchmark that takes a server binary can run it with extra flags or under taskset.
wrap() {
    local at=$1
    shift
    printf '#!/bin/sh\nexec %s "$@" %s\n' "$1" "${2:-}" >"$at"
    chmod +x "$at"
}
