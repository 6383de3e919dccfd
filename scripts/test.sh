#!/usr/bin/env bash
# The project's test command (README "Quick start"): builds the release binaries the end-to-end
# tests start, sets up the real engines' publishers (scripts/engine-venv.sh: a Python venv with
# vLLM's and SGLang's publisher modules, for tests/tests/engines_*.rs), then runs every test in
# the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --bins
if [[ "${CKF_SKIP_ENGINE_TESTS:-}" != "1" ]]; then
    CKF_ENGINE_PYTHON="$(./scripts/engine-venv.sh | tail -n 1)"
    export CKF_ENGINE_PYTHON
fi
cargo test --release --workspace
# The Mooncake replay needs the public trace, which is not in the repository: #[ignore]d, run
# here when the file is there (CKF_TRACE, or shared/data/traces beside the checkout, as in CI).
trace="${CKF_TRACE:-$(pwd)/../shared/data/traces/mooncake_conversation_trace.jsonl}"
if [[ -f "$trace" ]]; then
    CKF_TRACE="$trace" cargo test --release -p ckf-cli --test replay_mooncake -- --ignored
else
    echo "note: no Mooncake trace at $trace: the trace replay test did not run" >&2
fi
# The full-disk tests mount a tmpfs, which needs root: #[ignore]d, run here when root (CI is).
if [[ "$(id -u)" == "0" ]]; then
    cargo test --release -p ckf-e2e --test durability -- --ignored
else
    echo "note: not root: the two full-disk (tmpfs) tests of tests/durability.rs did not run" >&2
fi
