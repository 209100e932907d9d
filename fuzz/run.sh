#!/bin/bash
# Short fuzz run of every target: fuzz/run.sh [SECONDS_PER_TARGET]   (default 30)
# With cargo-fuzz and a nightly toolchain: libFuzzer on each target, seeded from
# fuzz/corpus/<target> (new finds go to fuzz/corpus-new/<target>, crashes to fuzz/artifacts).
# Without them: the same targets as stable random-input tests (tests/random_inputs.rs).
set -euo pipefail
cd "$(dirname "$0")"
SECS=${1:-30}
TARGETS=(nbd_handshake nbd_session nbd_request decode_formats open_corrupt_pool nvme_session)
# Known false leak reports (see the file).
export LSAN_OPTIONS="suppressions=$PWD/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
if cargo +nightly fuzz --version >/dev/null 2>&1; then
    # The corpus checks and a few random inputs on stable first (cheap, and they name a
    # missing seed corpus, which libFuzzer only reports as "No such file or directory").
    FUZZ_CASES=200 cargo test --release --test random_inputs
    for t in "${TARGETS[@]}"; do
        mkdir -p "corpus-new/$t"
        echo "== $t (${SECS}s)"
        cargo +nightly fuzz run --features libfuzzer "$t" "corpus-new/$t" "corpus/$t" -- \
            -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048
    done
else
    echo "cargo-fuzz or nightly missing: running the targets as random-input tests"
    FUZZ_CASES=$((SECS * 200)) cargo test --release --test random_inputs
fi
