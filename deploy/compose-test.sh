#!/usr/bin/env bash
# End-to-end test of the shipped deployment (issue 5), run by CI (.ci/run):
#   0. the Kubernetes manifests pass a real schema validator (kubernetes-validate, from PyPI)
#      and the compose file parses (with and without the prometheus profile);
#   1. build the image (deploy/build-image.sh, reusing the workspace's release build);
#   2. `up -d` the compose stack under a unique project, wait for every healthcheck, let the
#      stack's own replay client finish, replay a generated trace and check query results
#      through the indexer (`ckf lanes`, `ckf query`);
#   3. WAN partition: disconnect producer-dc-b from `wan`; its lane is retired within the
#      indexer's heartbeat deadline while dc-a and dc-c keep answering unchanged; reconnect:
#      the lane is ready again with the same content, plus what dc-b ingested meanwhile;
#   4. restart the indexer container: all lanes recover, content intact, no manual step;
#   5. `down -v` leaves no container, network or volume of the project.
# The stack is always torn down (trap). An unreachable Docker engine is a failure, never a skip.
#
# Environment: CKF_COMPOSE_PROJECT (default ckftest<pid><time>), CKF_IMAGE (default
# ckf-relay:local), CKF_SKIP_BUILD=1 (reuse an already built image), CKF_KEEP=1 (leave the
# stack up on failure, for debugging).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPLOY="$ROOT/deploy"
PROJECT="${CKF_COMPOSE_PROJECT:-ckftest$$$(date +%s)}"
export CKF_IMAGE="${CKF_IMAGE:-ckf-relay:local}"
# Heartbeat deadline of deploy/compose/indexer.toml, in seconds (checked against the file below).
HEARTBEAT_DEADLINE_S=3
# Slack on top of the deadline for the indexer's deadline tick and this script's polling.
RETIRE_SLACK_S=4
K8S_VALIDATE_VERSION=1.37.0   # kubernetes-validate release (ships the schemas)
K8S_SCHEMA_VERSION=1.33.0     # Kubernetes API version the manifests are validated against

START=$SECONDS
log() { printf '[compose-test %4ss] %s\n' "$((SECONDS - START))" "$*"; }
fail() {
    printf '[compose-test %4ss] FAIL: %s\n' "$((SECONDS - START))" "$*" >&2
    exit 1
}

# --- 0. prerequisites: fail loudly, never skip --------------------------------------------------
command -v docker >/dev/null || fail "docker CLI not found: this test needs Docker Engine + compose"
if ! docker info >/dev/null 2>&1; then
    docker info >&2 || true
    fail "Docker engine unreachable (docker info failed): this test needs a running engine"
fi
if docker compose version >/dev/null 2>&1; then
    COMPOSE_BIN=(docker compose)
elif command -v docker-compose >/dev/null && docker-compose version >/dev/null 2>&1; then
    COMPOSE_BIN=(docker-compose)
else
    fail "neither 'docker compose' nor 'docker-compose' works"
fi
command -v python3 >/dev/null || fail "python3 not found (used to parse JSON and to validate)"
log "engine $(docker version -f '{{.Server.Version}}'), compose: ${COMPOSE_BIN[*]} \
$("${COMPOSE_BIN[@]}" version --short 2>/dev/null || true), project $PROJECT"

compose() { "${COMPOSE_BIN[@]}" -p "$PROJECT" -f "$DEPLOY/docker-compose.yml" "$@"; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/ckf-compose-test.XXXXXX")"
UP=0
cleanup() {
    local rc=$?
    if [[ $rc -ne 0 && $UP -eq 1 ]]; then
        log "--- last logs of the stack (failure) ---"
        compose logs --no-color --tail=40 2>&1 | sed 's/^/    /' || true
        if [[ "${CKF_KEEP:-0}" == 1 ]]; then
            log "CKF_KEEP=1: stack left up; tear down with: ${COMPOSE_BIN[*]} -p $PROJECT -f $DEPLOY/docker-compose.yml down -v"
            rm -rf "$WORK"
            exit $rc
        fi
    fi
    if [[ $UP -eq 1 ]]; then
        compose --profile prometheus down -v --remove-orphans -t 10 >/dev/null 2>&1 || true
    fi
    rm -rf "$WORK"
    [[ $rc -eq 0 ]] && log "PASS in $((SECONDS - START)) s" || log "FAILED (exit $rc) after $((SECONDS - START)) s"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- 0b. static checks: Kubernetes manifests and the compose file --------------------------------
VENV="$ROOT/target/deploy-venv"
if [[ ! -x "$VENV/bin/kubernetes-validate" ]] \
    || [[ "$("$VENV/bin/kubernetes-validate" --version 2>/dev/null)" != *"$K8S_VALIDATE_VERSION"* ]]; then
    log "installing kubernetes-validate==$K8S_VALIDATE_VERSION into $VENV"
    python3 -m venv "$VENV" || fail "python3 -m venv failed (Debian: apt-get install python3-venv)"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$K8S_VALIDATE_VERSION" \
        || fail "pip install kubernetes-validate==$K8S_VALIDATE_VERSION failed"
fi
mapfile -t MANIFESTS < <(find "$DEPLOY/k8s" -name '*.yaml' ! -name kustomization.yaml | sort)
[[ ${#MANIFESTS[@]} -gt 0 ]] || fail "no manifests found under deploy/k8s"
"$VENV/bin/kubernetes-validate" --strict -k "$K8S_SCHEMA_VERSION" "${MANIFESTS[@]}" >"$WORK/k8s.txt" 2>&1 \
    || { cat "$WORK/k8s.txt" >&2; fail "Kubernetes manifests failed schema validation"; }
grep -q . "$WORK/k8s.txt" || fail "kubernetes-validate printed nothing"
log "k8s: ${#MANIFESTS[@]} files valid against Kubernetes $K8S_SCHEMA_VERSION (strict)"
python3 "$DEPLOY/k8s/check-configs.py" "$DEPLOY/k8s" || fail "k8s ConfigMaps disagree"

compose config -q || fail "docker-compose.yml does not parse"
compose --profile prometheus config -q || fail "docker-compose.yml (profile prometheus) does not parse"
grep -Eq "^heartbeat_deadline_ms *= *$((HEARTBEAT_DEADLINE_S * 1000))\$" "$DEPLOY/compose/indexer.toml" \
    || fail "compose/indexer.toml heartbeat deadline is not ${HEARTBEAT_DEADLINE_S}s as this script assumes"

# --- 1. image ----------------------------------------------------------------------------------
if [[ "${CKF_SKIP_BUILD:-0}" == 1 ]]; then
    docker image inspect "$CKF_IMAGE" >/dev/null 2>&1 || fail "CKF_SKIP_BUILD=1 but no image $CKF_IMAGE"
else
    t=$SECONDS
    "$DEPLOY/build-image.sh" || fail "image build failed"
    log "image $CKF_IMAGE built in $((SECONDS - t)) s"
fi

# --- 2. up, health, replay, queries -------------------------------------------------------------
# Ephemeral host ports: parallel projects never collide with each other or with a user's stack.
export CKF_INDEXER_GRPC_PORT="" CKF_INDEXER_METRICS_PORT="" \
    CKF_DC_A_GRPC_PORT="" CKF_DC_A_METRICS_PORT="" CKF_DC_B_GRPC_PORT="" \
    CKF_DC_B_METRICS_PORT="" CKF_DC_C_GRPC_PORT="" CKF_DC_C_METRICS_PORT="" \
    CKF_PROMETHEUS_PORT=""
# The generated trace (see gen_trace) is mounted at /data in the replay container.
export CKF_TRACE_DIR="$WORK/traces"
mkdir -p "$CKF_TRACE_DIR"
chmod 755 "$WORK" "$CKF_TRACE_DIR"

SERVICES=(indexer producer-dc-a producer-dc-b producer-dc-c)
DCS=(dc-a dc-b dc-c)

cid() { compose ps -q "$1" | head -n1; }

# wait_until <seconds> <what> <command...>: polls every 0.5 s.
wait_until() {
    local limit=$1 what=$2 t0=$SECONDS
    shift 2
    until "$@" >/dev/null 2>&1; do
        ((SECONDS - t0 < limit)) || fail "timed out after ${limit}s waiting for: $what"
        sleep 0.5
    done
    log "ok: $what ($((SECONDS - t0)) s)"
}

healthy() { [[ "$(docker inspect -f '{{.State.Health.Status}}' "$(cid "$1")")" == healthy ]]; }
all_healthy() { for s in "${SERVICES[@]}"; do healthy "$s" || return 1; done; }

# ckf inside the indexer's container: reaches the indexer on loopback, no extra container.
ckf_in_indexer() { docker exec "$(cid indexer)" ckf "$@"; }

log "compose up -d (project $PROJECT)"
UP=1
compose up -d --quiet-pull >/dev/null 2>"$WORK/up.err" || { cat "$WORK/up.err" >&2; fail "compose up failed"; }
wait_until 90 "all services healthy (ckf health)" all_healthy
