#!/usr/bin/env bash
# The project's test command (README "Quick start"): builds the release binaries the end-to-end
# tests start, then runs every test in the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --bins
cargo test --release --workspace
