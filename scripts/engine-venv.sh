#!/usr/bin/env bash
# The Python side of the real-engine end-to-end tests (tests/engines/, tests/tests/engines_*.rs):
#
# 1. a venv at target/engine-venv with the few PyPI packages the engines' publisher modules and
#    our driver import (msgspec, pyzmq, pydantic, xxhash; pinned below);
# 2. the vLLM and SGLang wheels, `pip download --no-deps`, kept in a cache dir
#    (${CKF_WHEEL_CACHE:-$HOME/.cache/ckf-relay/wheels}) and reused when present;
# 3. ONLY the two publisher modules taken out of them (vllm/distributed/kv_events.py,
#    sglang/srt/disaggregation/kv_events.py) into target/engine-publishers/, beside the stub
#    modules of tests/engines/stubs/ that stand in for the few package imports they make.
#
# Idempotent: a second run checks and reuses everything. The engines' code is never committed:
# it lives under target/ (ignored) and in the wheel cache. The last line printed is the python
# interpreter to use (scripts/test.sh exports it as CKF_ENGINE_PYTHON); everything else goes
# to stderr.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

VLLM_VERSION="0.33.0"
SGLANG_VERSION="0.5.23"
# Versions the publishers were checked with (any recent release of each should do).
PY_PACKAGES=("msgspec==0.22.0" "pyzmq==27.3.0" "pydantic==2.14.3" "xxhash==4.1.0")

VENV="$ROOT/target/engine-venv"
OUT="$ROOT/target/engine-publishers"
STUBS="$ROOT/tests/engines/stubs"
CACHE="${CKF_WHEEL_CACHE:-$HOME/.cache/ckf-relay/wheels}"

log() { echo "engine-venv: $*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

# --- 1. the venv ---------------------------------------------------------------------------
stamp="$VENV/.ckf-packages"
if [[ ! -x "$VENV/bin/python" ]] || [[ "$(cat "$stamp" 2>/dev/null)" != "${PY_PACKAGES[*]}" ]]; then
    log "creating $VENV with ${PY_PACKAGES[*]}"
    python3 -m venv "$VENV" || fail "python3 -m venv failed (Debian: apt-get install python3-venv)"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "${PY_PACKAGES[@]}" >&2 \
        || fail "pip install ${PY_PACKAGES[*]} failed"
    echo "${PY_PACKAGES[*]}" >"$stamp"
fi
PY="$VENV/bin/python"

# --- 2. the wheels (download once, keep in the cache) ---------------------------------------
mkdir -p "$CACHE"
wheel() { # name version -> path of the cached wheel (downloads it when missing)
    local name="$1" version="$2" found
    found="$(find "$CACHE" -maxdepth 1 -name "${name}-${version}-*.whl" | sort | head -n 1)"
    if [[ -z "$found" ]]; then
        log "downloading ${name}==${version} (no deps) into $CACHE"
        "$VENV/bin/pip" download --quiet --disable-pip-version-check --no-deps \
            --dest "$CACHE" "${name}==${version}" >&2 || fail "pip download ${name}==${version} failed"
        found="$(find "$CACHE" -maxdepth 1 -name "${name}-${version}-*.whl" | sort | head -n 1)"
        [[ -n "$found" ]] || fail "pip download left no ${name}-${version}-*.whl in $CACHE"
    fi
    echo "$found"
}
VLLM_WHEEL="$(wheel vllm "$VLLM_VERSION")"
SGLANG_WHEEL="$(wheel sglang "$SGLANG_VERSION")"

# --- 3. the two modules, plus the stubs ------------------------------------------------------
rm -rf "$OUT"
mkdir -p "$OUT"
cp -R "$STUBS/." "$OUT/"
"$PY" - "$OUT" "$VLLM_WHEEL" "$SGLANG_WHEEL" <<'PY' || fail "extracting the publisher modules failed"
import pathlib
import sys
import zipfile

out = pathlib.Path(sys.argv[1])
for wheel, member in (
    (sys.argv[2], "vllm/distributed/kv_events.py"),
    (sys.argv[3], "sglang/srt/disaggregation/kv_events.py"),
):
    with zipfile.ZipFile(wheel) as archive:
        data = archive.read(member)  # KeyError names the member if a release moved it
    target = out / member
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
PY
# Each package directory on the way is a (stub) package, so the real module imports as
# vllm.distributed.kv_events / sglang.srt.disaggregation.kv_events.
for dir in vllm/distributed sglang/srt/disaggregation; do
    [[ -f "$OUT/$dir/__init__.py" ]] || : >"$OUT/$dir/__init__.py"
done

# The check that all of it fits: both real modules import with the stubs.
PYTHONPATH="$OUT" "$PY" -c 'import vllm.distributed.kv_events, sglang.srt.disaggregation.kv_events' \
    || fail "the publisher modules do not import with the stubs in $OUT"
log "ready: vllm ${VLLM_VERSION}, sglang ${SGLANG_VERSION} publishers in $OUT"
echo "$PY"
