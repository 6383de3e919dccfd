#!/usr/bin/env bash
# Runs one coverage-guided fuzz target of fuzz/fuzz_targets/ for SECONDS (libFuzzer through
# cargo-fuzz) on the stable toolchain: RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass its -Z flags.
# Installs cargo-fuzz from crates.io when it is missing. The corpus grows in
# fuzz/corpus/TARGET (seeded from the project's fixtures); a crash is written to
# fuzz/artifacts/TARGET/ and the script exits non-zero (reproduce it with
# `scripts/fuzz.sh TARGET 0 fuzz/artifacts/TARGET/crash-...`, then make it a regression test
# in the decoder's crate).
#
#   scripts/fuzz.sh list                 # the targets
#   scripts/fuzz.sh TARGET SECONDS       # e.g. scripts/fuzz.sh relay_frame 120
#   scripts/fuzz.sh all SECONDS          # every target, SECONDS each
#
# FUZZ_SANITIZER=address adds AddressSanitizer (slower; the decoders are safe Rust).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
export RUSTC_BOOTSTRAP=1

targets() { sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^ckf-fuzz$'; }

if [[ "${1:-}" == "list" ]]; then
    targets
    exit 0
fi
if [[ $# -lt 2 ]]; then
    echo "usage: scripts/fuzz.sh TARGET|all SECONDS [ARTIFACT]   (scripts/fuzz.sh list)" >&2
    exit 2
fi
target=$1
seconds=$2
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz
fi
sanitizer=${FUZZ_SANITIZER:-none}

seed() {
    local corpus=corpus/$1
    mkdir -p "$corpus"
    case $1 in
        engine_batch | engine_frame)
            cp -n ../engine/tests/fixtures/*.msgpack "$corpus"/ 2>/dev/null || true
            ;;
    esac
}

run() {
    local t=$1
    if [[ $# -ge 2 ]]; then
        # reproduce one input
        cargo fuzz run --sanitizer "$sanitizer" "$t" "$2"
        return
    fi
    seed "$t"
    cargo fuzz run --sanitizer "$sanitizer" "$t" "corpus/$t" -- \
        -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1
}

if [[ "$target" == "all" ]]; then
    for t in $(targets); do
        echo "== $t (${seconds}s)"
        run "$t"
    done
else
    run "$target" "${@:3}"
fi
