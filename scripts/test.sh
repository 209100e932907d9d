#!/usr/bin/env bash
# The project's test command (README, CI): formatting, lints, every Rust test, then the
# end-to-end checks with real NBD clients against `flashpool serve`.
#
# As root, missing client packages (tests/e2e/apt-packages.txt) are installed with apt-get.
# FLASHPOOL_SKIP_E2E=1 runs the Rust part only.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n=== %s (%s) ===\n' "$*" "$(date -u +%H:%M:%S)"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo test"
# The deterministic simulation runs this many seeds (each seed is a pool, a workload, faults,
# crashes and reopens); FLASHPOOL_DST_SECONDS=N runs it for as long as asked instead.
export FLASHPOOL_DST_SEEDS=${FLASHPOOL_DST_SEEDS:-1000}
cargo test --workspace

step "NBD tests again with every connection on reactors (Config::reactors)"
FLASHPOOL_NBD_REACTORS=2 cargo test -p flashpool-nbd

step "engine tests on file drives without io_uring (the synchronous fallback)"
FLASHPOOL_IO_URING=off FLASHPOOL_MODEL_CASES=16 cargo test -p flashpool-engine --test read_batching --test model

step "short fuzz run (libFuzzer via cargo-fuzz when installed)"
bash fuzz/run.sh "${FLASHPOOL_FUZZ_SECONDS:-15}"

if [ "${FLASHPOOL_SKIP_E2E:-0}" != 1 ]; then
    step "end-to-end checks with real NBD clients"
    E2E_INSTALL=1 bash tests/e2e/run-all.sh flashpool
    step "client checks again with connections on reactors (serve --nbd-reactors 2, from the environment)"
    FLASHPOOL_NBD_REACTORS=2 E2E_ONLY=nbdinfo,fio-mixed-2conn-flush,fio-scattered-1m-reads,fio-log-wraps,tcp-and-unix,nbdcopy-64m,qemu-img,tls,faults-under-load,kernel-nbd \
        bash tests/e2e/run-all.sh flashpool
    step "the client checks again on memory drives (the inline path; checks that restart the server need drives that persist)"
    E2E_ONLY=nbdinfo,probe,fio-randwrite-4k,fio-mixed-2conn-flush,fio-trim,tcp-and-unix,nbdcopy-64m,qemu-img \
        bash tests/e2e/run-all.sh flashpool-mem
fi
