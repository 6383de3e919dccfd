#!/usr/bin/env bash
# Starts one ckf-indexer (3 lanes) and three ckf-producers on loopback, loads them with the first
# 2,000 requests of the Mooncake conversation trace (`ckf replay`), then runs `ckf load` with
# every argument list given on the command line (one run per argument, split on spaces), e.g.
#   scripts/query-load.sh "--mode unary --concurrency 1" "--mode batch --batch 64"
# Each run prints its summary; the cluster is stopped at the end. Binaries: target/release
# (BIN=dir to use others, e.g. an older build's indexer for a before/after comparison:
# INDEXER_BIN=path; INDEXER_ENV="VAR=value ..." for its environment only). Ports 17400.. (PORT_BASE=...).
# INDEXER_CPUS=list / CLIENT_CPUS=list pin the indexer / `ckf load` to those CPUs (`taskset -c`),
# e.g. INDEXER_CPUS=1 CLIENT_CPUS=0 keeps the load generator off the indexer's core.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
INDEXER_BIN=${INDEXER_BIN:-$BIN/ckf-indexer}
TRACE=${TRACE:-../shared/data/traces/mooncake_conversation_trace.jsonl}
P=${PORT_BASE:-17400}
DIR=$(mktemp -d)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
pin() { if [ -n "$1" ]; then echo taskset -c "$1"; fi; }
# shellcheck disable=SC2046
env ${INDEXER_ENV:-} $(pin "${INDEXER_CPUS:-}") "$INDEXER_BIN" --lanes dc-a,dc-b,dc-c --expected-blocks 1000000 \
    --listen 127.0.0.1:$P --metrics-listen 127.0.0.1:$((P + 1)) >"$DIR/indexer.log" 2>&1 &
pids+=($!)
producers=()
for i in 0 1 2; do
    dc=dc-$(printf "\\x$(printf %x $((97 + i)))")
    "$BIN/ckf-producer" --dc "$dc" --indexer http://127.0.0.1:$P --expected-blocks 1000000 \
        --listen 127.0.0.1:$((P + 10 + i)) --metrics-listen 127.0.0.1:$((P + 20 + i)) \
        >"$DIR/$dc.log" 2>&1 &
    pids+=($!)
    producers+=(--producer "$dc=http://127.0.0.1:$((P + 10 + i))")
done
"$BIN/ckf" replay --trace "$TRACE" --limit 2000 --indexer http://127.0.0.1:$P "${producers[@]}" \
    --json >"$DIR/replay.json"
for run in "$@"; do
    echo "== ckf load --indexer http://127.0.0.1:$P --trace $TRACE --limit 2000 $run"
    # shellcheck disable=SC2046,SC2086
    $(pin "${CLIENT_CPUS:-}") "$BIN/ckf" load --indexer http://127.0.0.1:$P --trace "$TRACE" --limit 2000 $run
done
