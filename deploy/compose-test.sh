#!/usr/bin/env bash
# End-to-end test of the shipped deployment, run by CI (.ci/run):
#   0. the Kubernetes manifests pass a real schema validator (kubernetes-validate, from PyPI)
#      and the compose file parses (with and without the prometheus profile); the alerting
#      rules pass `promtool check rules` and their tests (check-alerts.sh); `ckf certs` makes
#      the stack's certificates (every gRPC connection of the stack is mutual TLS);
#   1. build the image (deploy/build-image.sh, reusing the workspace's release build);
#   2. `up -d` the compose stack under a unique project, wait for every healthcheck, let the
#      stack's own replay client finish, replay a generated trace and check query results
#      through the indexer (`ckf lanes`, `ckf query`);
#   2b. credentials: a plaintext client is refused; a real ckf-producer presenting dc-b's (valid)
#      certificate while attaching for dc-a is refused with PERMISSION_DENIED (counted by the
#      indexer) and dc-a's producer keeps its lease and every answer;
#   3. WAN partition: disconnect producer-dc-b from `wan`; its lane is retired within the
#      indexer's heartbeat deadline while dc-a and dc-c keep answering unchanged; reconnect:
#      the lane is ready again with the same content, plus what dc-b ingested meanwhile;
#   4. restart the indexer container: all lanes recover, content intact, no manual step;
#   4b. kill -9 producer-dc-a's container and start it again: its durable state (the named
#      volume at durability.data_dir) comes back, so every probe answers as before;
#   5. `down -v` leaves no container, network or volume of the project;
#   6. two models (docker-compose.models.yml): ONE indexer serving domains llama (the primary)
#      and qwen, producers dc-a and dc-b for each: every lane of each domain active in that one
#      indexer (`ckf lanes --domain`) with its model's content (`ckf query --domain`), each
#      domain its own table; a query naming no domain answered as llama; a domain not served
#      (mistral) refused with NOT_FOUND naming llama, qwen; the lane metrics labelled by domain;
#      qwen's dc-a credential attaching as llama's dc-a refused (llama keeps its lease); qwen's
#      dc-a producer killed and restarted while llama's answers and leases stay unchanged;
#      `down -v` leaves nothing.
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
# The interpreter itself, not a version-manager shim (a shim costs ~0.4 s per call).
PY="$(python3 -c 'import sys; print(sys.executable)')"
log "engine $(docker version -f '{{.Server.Version}}'), compose: ${COMPOSE_BIN[*]} \
$("${COMPOSE_BIN[@]}" version --short 2>/dev/null || true), project $PROJECT"

# The stack under test: docker-compose.yml, then docker-compose.models.yml (step 6).
COMPOSE_FILE_NAME=docker-compose.yml
compose() { "${COMPOSE_BIN[@]}" -p "$PROJECT" -f "$DEPLOY/$COMPOSE_FILE_NAME" "$@"; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/ckf-compose-test.XXXXXX")"
UP=0
cleanup() {
    local rc=$?
    if [[ $rc -ne 0 && $UP -eq 1 ]]; then
        log "--- last logs of the stack (failure) ---"
        compose logs --no-color --tail=40 2>&1 | sed 's/^/    /' || true
        if [[ "${CKF_KEEP:-0}" == 1 ]]; then
            log "CKF_KEEP=1: stack left up; tear down with: ${COMPOSE_BIN[*]} -p $PROJECT -f $DEPLOY/$COMPOSE_FILE_NAME down -v"
            rm -rf "$WORK"
            exit $rc
        fi
    fi
    if [[ $UP -eq 1 ]]; then
        compose --profile prometheus down -v --remove-orphans -t 10 >/dev/null 2>&1 || true
    fi
    rm -rf "$WORK"
    if [[ $rc -eq 0 ]]; then
        log "PASS in $((SECONDS - START)) s"
    else
        log "FAILED (exit $rc) after $((SECONDS - START)) s"
    fi
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
"$VENV/bin/python" "$DEPLOY/k8s/check-configs.py" "$DEPLOY" || fail "shipped configs disagree (check-configs.py)"
# The alerting rules: promtool check + their unit tests (installs Debian's promtool if missing).
bash "$DEPLOY/check-alerts.sh" >"$WORK/alerts.txt" 2>&1 || { cat "$WORK/alerts.txt" >&2; fail "alerting rules (check-alerts.sh)"; }
log "alerts: promtool check rules, test rules (every alert firing and silent) and check config passed"

compose config -q || fail "docker-compose.yml does not parse"
compose --profile prometheus config -q || fail "docker-compose.yml (profile prometheus) does not parse"
"${COMPOSE_BIN[@]}" -f "$DEPLOY/docker-compose.models.yml" config -q || fail "docker-compose.models.yml does not parse"
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

# The operator's view through the indexer's published gRPC port, with the host-built `ckf`
# (the same build as the image's; a `docker exec` costs about 2 s here, too slow to poll with).
# The image's own `ckf` is exercised by every healthcheck and once below.
if [[ -z "${CKF_BIN_DIR:-}" ]]; then
    CKF_BIN_DIR="$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps \
        | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')/release"
fi
CKF="$CKF_BIN_DIR/ckf"
for b in ckf ckf-indexer ckf-producer; do
    [[ -x "$CKF_BIN_DIR/$b" ]] || fail "no host-built $b in $CKF_BIN_DIR (build-image.sh builds it; or set CKF_BIN_DIR)"
done

# Certificates and tokens: the stack's (domain local) and the Kubernetes manifests' (domain
# prod), made by the host-built `ckf certs` as an operator would.
CERTS="$WORK/certs"
"$CKF" certs --out "$CERTS" --pools dc-a,dc-b,dc-c --domain local >/dev/null \
    || fail "ckf certs failed"
# The two-model stack's: one certificate per (model, DC) pool, and the certificate of its one
# indexer (serving both models).
CERTS_M="$WORK/certs-models"
"$CKF" certs --out "$CERTS_M" --pools llama-dc-a,llama-dc-b,qwen-dc-a,qwen-dc-b --domain local \
    --hosts indexer,localhost,127.0.0.1 >/dev/null || fail "ckf certs (two models) failed"
K8S_CERTS="$WORK/k8s-certs"
"$CKF" certs --out "$K8S_CERTS" --pools dc-a,dc-b,dc-c,llama-dc-a,llama-dc-b,qwen-dc-a,qwen-dc-b \
    --domain prod >/dev/null || fail "ckf certs (k8s) failed"
# The containers run as uid 10001 and the keys are 0600: hand them to that user (root in CI),
# or make this throwaway copy readable.
if [[ $(id -u) -eq 0 ]]; then
    chown -R 10001:10001 "$CERTS" "$CERTS_M"
else
    chmod -R a+rX "$CERTS" "$CERTS_M"
fi
chmod 0755 "$WORK"
export CKF_CERTS_DIR="$CERTS"
# Every host `ckf` call speaks mutual TLS with the query client's certificate.
TLS_ARGS=(--ca "$CERTS/ca.crt" --cert "$CERTS/query.crt" --key "$CERTS/query.key")
log "ok: ckf certs wrote the stack's CA, certificates and tokens"

# The Kubernetes ConfigMaps' TOML files start the real binaries (schema validation cannot see
# inside a ConfigMap): a refused configuration exits at once naming the key, an accepted one
# keeps serving until `timeout` stops it (exit 124). Ephemeral ports, so nothing clashes; gRPC on
# 0.0.0.0 as in the pods, so the start rule for non-loopback listeners (TLS, and authorization
# unless `insecure`) applies to them for real; the Secrets' mount point /etc/ckf/tls is this
# run's `ckf certs` output.
mkdir -p "$WORK/k8s-config"
"$VENV/bin/python" - "$DEPLOY/k8s" "$WORK/k8s-config" "$K8S_CERTS" <<'PY' >"$WORK/k8s-config.count" \
    || fail "could not extract the Kubernetes ConfigMaps' configs"
import glob, os, sys, yaml
docs = []
for path in glob.glob(os.path.join(sys.argv[1], "**", "*.yaml"), recursive=True):
    if os.path.basename(path) != "kustomization.yaml":
        docs += [d for d in yaml.safe_load_all(open(path)) if d]
# A ConfigMap mounted by a StatefulSet of N replicas (the hot standby) is started N times, each
# with a data_dir of its own, as each pod has its own PersistentVolumeClaim.
replicas = {}
for d in docs:
    if d["kind"] == "StatefulSet":
        for v in d["spec"]["template"]["spec"].get("volumes", []):
            if "configMap" in v:
                replicas[v["configMap"]["name"]] = d["spec"].get("replicas", 1)
n = 0
for doc in docs:
    if doc.get("kind") == "ConfigMap":
        name = doc["metadata"]["name"]
        for key, text in doc["data"].items():
            if key not in ("indexer.toml", "producer.toml"):
                continue   # e.g. the router's map (sharded/router-domains.yaml), not ours to run
            text = text.replace("/etc/ckf/tls/", sys.argv[3] + "/")
            for i in range(replicas.get(name, 1)):
                copy = name if name not in replicas else f"{name}-{i}"
                # Each producer's durability.data_dir (its PersistentVolumeClaim in the
                # cluster): a directory of its own here, never the host's /var/lib/ckf.
                out = text.replace("/var/lib/ckf/", os.path.join(sys.argv[2], copy + "-"))
                open(os.path.join(sys.argv[2], f"{copy}--{key}"), "w").write(out)
                n += 1
print(n)
PY
pids=() cfgs=()
for cfg in "$WORK"/k8s-config/*.toml; do
    case "$cfg" in
        *--indexer.toml) bin=ckf-indexer ;;
        *--producer.toml) bin=ckf-producer ;;
        *) fail "unexpected ConfigMap key: $cfg" ;;
    esac
    timeout 3 "$CKF_BIN_DIR/$bin" --config "$cfg" --listen 0.0.0.0:0 --metrics-listen 127.0.0.1:0 \
        >"$cfg.log" 2>&1 &
    pids+=($!) cfgs+=("$cfg")
done
n=${#pids[@]}
# The indexer, dc-a, dc-b and dc-c, the two replicas of the dc-a standby variant, and the
# sharded layout's two indexers and four producers.
[[ $n -ge 12 && $n -eq "$(cat "$WORK/k8s-config.count")" ]] \
    || fail "expected the default layout's 4, the standby pair's 2 and the sharded layout's 6 configs, started $n of $(cat "$WORK/k8s-config.count")"
for i in "${!pids[@]}"; do
    rc=0
    wait "${pids[$i]}" || rc=$?
    [[ $rc -eq 124 ]] || { cat "${cfgs[$i]}.log" >&2; fail "refused k8s config $(basename "${cfgs[$i]}") (exit $rc)"; }
done
log "ok: the $n Kubernetes ConfigMap configs are accepted by the real ckf-indexer / ckf-producer"

# --- 2. up, health, replay, queries -------------------------------------------------------------
# Ephemeral host ports: parallel projects never collide with each other or with a user's stack.
export CKF_PORT_INDEXER_GRPC="" CKF_PORT_INDEXER_METRICS="" \
    CKF_PORT_DC_A_GRPC="" CKF_PORT_DC_A_METRICS="" CKF_PORT_DC_B_GRPC="" \
    CKF_PORT_DC_B_METRICS="" CKF_PORT_DC_C_GRPC="" CKF_PORT_DC_C_METRICS="" \
    CKF_PORT_PROMETHEUS=""
# The replay client replays compose/traces/sample.jsonl (the compose file's default).
unset CKF_TRACE_DIR
TRACE="$DEPLOY/compose/traces/sample.jsonl"
[[ -r "$TRACE" ]] || fail "missing $TRACE"

SERVICES=(indexer producer-dc-a producer-dc-b producer-dc-c)

cid() { compose ps -a -q "$1" | head -n1; }

# wait_until <seconds> <what> <command...>: polls every 0.5 s.
# Sets WAITED to the elapsed seconds (0.1 s resolution).
now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }
wait_until() {
    local limit=$1 what=$2 t0
    t0=$(now_ms)
    shift 2
    until "$@" >/dev/null 2>&1; do
        (($(now_ms) - t0 < limit * 1000)) || fail "timed out after ${limit}s waiting for: $what"
        sleep 0.25
    done
    local ms=$(($(now_ms) - t0))
    WAITED="$((ms / 1000)).$((ms % 1000 / 100))"
    log "ok: $what (${WAITED} s)"
}

healthy() { [[ "$(docker inspect -f '{{.State.Health.Status}}' "$(cid "$1")")" == healthy ]]; }
all_healthy() { for s in "${SERVICES[@]}"; do healthy "$s" || return 1; done; }

INDEXER_URL=""   # set after up, from the published port
ckf_cli() { "$CKF" "$@" "${TLS_ARGS[@]}"; }

log "compose up -d (project $PROJECT)"
UP=1
compose up -d --quiet-pull >/dev/null 2>"$WORK/up.err" || { cat "$WORK/up.err" >&2; fail "compose up failed"; }
wait_until 90 "all services healthy (ckf health)" all_healthy
INDEXER_URL="https://$(compose port indexer 7400 | tail -n1)"
log "indexer published at $INDEXER_URL"

# replay_done <service>: the stack's replay client <service> runs once on `up`; it must finish
# with exit 0 and a report without unexplained under-estimates (kept in $WORK/<service>.out).
replay_done() {
    local svc=$1 id out="$WORK/$1.out" t=$SECONDS rc
    id="$(cid "$svc")"
    [[ -n "$id" ]] || fail "no $svc container was created by up"
    until [[ "$(docker inspect -f '{{.State.Status}}' "$id")" == exited ]]; do
        ((SECONDS - t < 240)) || fail "$svc still running after 240 s"
        sleep 1
    done
    docker logs "$id" >"$out" 2>&1
    rc="$(docker inspect -f '{{.State.ExitCode}}' "$id")"
    [[ "$rc" == 0 ]] || { tail -n 40 "$out" >&2; fail "$svc exited with $rc"; }
    grep -Eq '[0-9]+ unexplained' "$out" || { cat "$out" >&2; fail "$svc printed no report"; }
    if grep -Eq '(^|[^0-9])[1-9][0-9]* unexplained' "$out"; then
        cat "$out" >&2
        fail "$svc report has unexplained under-estimates"
    fi
    log "ok: $svc finished with exit 0 and a report; best-DC agreement during/settled:" \
        "$(grep -E 'best-DC agreement' "$out" | awk '{print $3}' | paste -sd/ -)," \
        "deepest-prefix hit rate $(grep -E '^ *deepest-prefix .*index: indexer' "$out" | awk '{print $2}' | head -n1)"
}
replay_done replay

# lanes_json > file: the indexer's lane table as JSON.
# LANES_DOMAIN set: that domain's lanes (`--domain`, step 6); unset: the primary domain's.
LANES_DOMAIN=""
lanes_json() { ckf_cli lanes --indexer "$INDEXER_URL" ${LANES_DOMAIN:+--domain "$LANES_DOMAIN"} --json; }
# lane_field <json file> <dc> <field>
lane_field() {
    "$PY" -c 'import json,sys; l=[x for x in json.load(open(sys.argv[1]))["lanes"] if x["dc"]==sys.argv[2]]; print(l[0][sys.argv[3]] if l else "missing")' "$@"
}
# lanes_are <dc=state...>: e.g. lanes_are dc-a=active dc-b=retired; succeeds when all hold.
lanes_are() {
    lanes_json >"$WORK/lanes.json" 2>/dev/null || return 1
    "$PY" -c 'import json,sys
state = {x["dc"]: x["state"] for x in json.load(open(sys.argv[1]))["lanes"]}
sys.exit(0 if all(state.get(s.split("=")[0]) == s.split("=")[1] for s in sys.argv[2:]) else 1)' \
        "$WORK/lanes.json" "$@"
}
show_lanes() { ckf_cli lanes --indexer "$INDEXER_URL" ${LANES_DOMAIN:+--domain "$LANES_DOMAIN"} 2>&1 | sed 's/^/    /'; }

# make_probes <trace> <out>: the final request of every session of the trace (a request no
# later request extends), one line of block ids each.
make_probes() {
    "$PY" - "$1" >"$2" <<'PY'
import json, sys
reqs = [json.loads(l)["hash_ids"] for l in open(sys.argv[1]) if l.strip()]
for i, r in enumerate(reqs):
    if not any(later[:len(r)] == r for later in reqs[i + 1:]):
        print(" ".join(map(str, r)))
PY
    PROBES=$(wc -l <"$2")
    [[ $PROBES -ge 10 ]] || fail "only $PROBES probe requests in $1"
}
PROBE_FILE="$WORK/probes.txt"   # the probes query_probes and compare_probes use
make_probes "$TRACE" "$PROBE_FILE"

# query_probes <out> [ckf query flags...]: per probe line of $PROBE_FILE, {"dc": depth} of every
# ready lane of $INDEXER_URL, one JSON object a line.
query_probes() {
    local out=$1 ids n=0
    shift
    rm -rf "$WORK/q" && mkdir "$WORK/q"
    while read -r ids; do
        n=$((n + 1))
        # shellcheck disable=SC2086
        ckf_cli query --indexer "$INDEXER_URL" "$@" --ids --json $ids >"$WORK/q/$n.json" \
            || fail "ckf query $* failed for ids: $ids"
    done <"$PROBE_FILE"
    "$PY" -c 'import json,sys
for i in range(1, int(sys.argv[2]) + 1):
    q = json.load(open(f"{sys.argv[1]}/{i}.json"))
    print(json.dumps({m["dc"]: m["depth"] for m in q["matches"]}, sort_keys=True))' "$WORK/q" "$n" >"$out"
}
# compare_probes <baseline> <now> <mode>: mode `same` = identical answers; `without:DC` = DC
# absent from every answer, every other DC's depth unchanged.
compare_probes() {
    "$PY" - "$PROBE_FILE" "$@" <<'PY'
import json, sys
probes = [l.split() for l in open(sys.argv[1])]
base = [json.loads(l) for l in open(sys.argv[2])]
now = [json.loads(l) for l in open(sys.argv[3])]
mode = sys.argv[4]
bad = []
for p, b, n in zip(probes, base, now):
    if mode.startswith("without:"):
        dc = mode.split(":", 1)[1]
        b = {k: v for k, v in b.items() if k != dc}
        if dc in n:
            bad.append(f"{dc} still answers ({n[dc]}) for a {len(p)}-block probe")
    if b != n:
        bad.append(f"{len(p)}-block probe: expected {b}, got {n}")
if len(base) != len(now) or bad:
    print("\n".join(bad[:10]), file=sys.stderr)
    sys.exit(1)
PY
}

wait_until 30 "lanes dc-a, dc-b, dc-c active" lanes_are dc-a=active dc-b=active dc-c=active
show_lanes
# Route: every active DC ranked with the round trips of [route] rtt_ms (no load reports: these
# producers have no engines), the router's own round trip winning where it gives one.
# shellcheck disable=SC2046
ckf_cli route --indexer "$INDEXER_URL" --json --ids $(head -n1 "$PROBE_FILE") >"$WORK/route.json" \
    || fail "ckf route failed"
# shellcheck disable=SC2046
ckf_cli route --indexer "$INDEXER_URL" --json --rtt-ms dc-c=5 --ids $(head -n1 "$PROBE_FILE") \
    >"$WORK/route-own.json" || fail "ckf route --rtt-ms failed"
"$PY" - "$WORK/route.json" "$WORK/route-own.json" <<'PY' || fail "Route answers disagree with [route]"
import json, sys
r, own = (json.load(open(p)) for p in sys.argv[1:])
rtt = {d["dc"]: d["rtt_ms"] for d in r["ranked"]}
assert rtt == {"dc-a": 1.0, "dc-b": 40.0, "dc-c": 280.0}, rtt
assert r["chosen"] in rtt and r["reason"] != "ROUTE_REASON_NO_READY_DC", r
assert all(d["load"] == "LOAD_STATE_UNKNOWN" for d in r["ranked"]), r
c = [d for d in own["ranked"] if d["dc"] == "dc-c"][0]
assert c["rtt_ms"] == 5.0 and c["rtt_from_request"], c
PY
log "ok: ckf route ranks dc-a, dc-b, dc-c with [route] rtt_ms (the request's own wins); chose $("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["chosen"])' "$WORK/route.json")"
# The image's ckf over the wan network, as an operator would from inside the stack.
docker exec "$(cid producer-dc-a)" ckf lanes --indexer https://indexer:7400 --json \
    --ca /etc/ckf/tls/ca.crt --cert /etc/ckf/tls/query.crt --key /etc/ckf/tls/query.key >"$WORK/lanes-in.json" \
    || fail "ckf lanes inside the producer-dc-a container (over wan) failed"
[[ "$(lane_field "$WORK/lanes-in.json" dc-c state)" == active ]] || fail "ckf lanes over wan disagrees"
query_probes "$WORK/base.jsonl"
# The DC that served a session's last request holds all of it (capacity is far above the
# trace's blocks, so nothing was evicted): the deepest answer is the full length.
"$PY" - "$PROBE_FILE" "$WORK/base.jsonl" <<'PY' || fail "query results through the indexer are wrong"
import json, sys
probes = [l.split() for l in open(sys.argv[1])]
answers = [json.loads(l) for l in open(sys.argv[2])]
bad = []
per_dc = {}
for p, a in zip(probes, answers):
    if sorted(a) != ["dc-a", "dc-b", "dc-c"]:
        bad.append(f"answer does not list the 3 ready lanes: {a}")
    if max(a.values(), default=0) != len(p):
        bad.append(f"{len(p)}-block probe: deepest DC has {max(a.values(), default=0)} ({a})")
    if any(d > len(p) for d in a.values()):
        bad.append(f"depth beyond the probe: {a}")
    for dc, d in a.items():
        if d == len(p):
            per_dc[dc] = per_dc.get(dc, 0) + 1
print(f"    full-depth probes per DC: {per_dc}")
if per_dc.get("dc-b", 0) == 0:
    bad.append("no session ended on dc-b: the partition test would prove nothing")
if bad:
    print("\n".join(bad[:10]), file=sys.stderr)
    sys.exit(1)
PY
log "ok: $PROBES probe queries: the deepest DC holds each session's full request"

# Metrics on the published ports.
metrics_port() { compose port "$1" "$2" | tail -n1 | sed 's/.*://'; }
for svc in indexer:9400 producer-dc-a:9500 producer-dc-b:9500 producer-dc-c:9500; do
    port="$(metrics_port "${svc%%:*}" "${svc#*:}")"
    [[ -n "$port" ]] || fail "${svc%%:*}: metrics port ${svc#*:} not published"
    curl -fsS --max-time 5 "http://127.0.0.1:$port/metrics" >"$WORK/metrics.txt" \
        || fail "${svc%%:*}: GET http://127.0.0.1:$port/metrics failed"
    n="$(grep -c '^ckf_' "$WORK/metrics.txt" || true)"
    [[ "$n" -gt 0 ]] || fail "${svc%%:*}: /metrics has no ckf_ series"
done
log "ok: /metrics of the indexer and the 3 producers answer on their published ports"

# --- 2b. credentials: another pool's certificate is refused, the real producers stay -----------
# A plaintext client gets nothing from the TLS indexer.
if "$CKF" lanes --indexer "http://$(compose port indexer 7400 | tail -n1)" >/dev/null 2>&1; then
    fail "a plaintext client was answered by the TLS indexer"
fi
# An impostor for dc-a, from the host: a real ckf-producer presenting dc-b's certificate (valid,
# same CA) while dc-a's producer is attached.
epoch_before="$(lane_field "$WORK/lanes.json" dc-a lease_epoch)"
"$CKF_BIN_DIR/ckf-producer" --dc dc-a --domain local --bucket-count 131072 \
    --indexer "$INDEXER_URL" --indexer-ca "$CERTS/ca.crt" \
    --indexer-cert "$CERTS/producer-dc-b.crt" --indexer-key "$CERTS/producer-dc-b.key" \
    --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --log-format json \
    >"$WORK/impostor.log" 2>&1 &
IMPOSTOR=$!
refused() { grep -qi 'permission.denied' "$WORK/impostor.log"; }
wait_until 30 "the impostor's Attach for dc-a is refused with PERMISSION_DENIED" refused
kill "$IMPOSTOR" 2>/dev/null || true
wait "$IMPOSTOR" 2>/dev/null || true
grep -Eq 'lease granted|sending barrier snapshot' "$WORK/impostor.log" && fail "the impostor was granted a lease"
lanes_are dc-a=active dc-b=active dc-c=active || { show_lanes; fail "a lane left ACTIVE during the impostor's attempts"; }
[[ "$(lane_field "$WORK/lanes.json" dc-a lease_epoch)" == "$epoch_before" ]] \
    || fail "dc-a's lease changed (epoch $epoch_before -> $(lane_field "$WORK/lanes.json" dc-a lease_epoch)): the impostor superseded it"
port="$(compose port indexer 9400 | tail -n1 | sed 's/.*://')"
# Read the whole page first: `curl | grep -q` fails under pipefail once grep exits at its match
# before curl has written everything (curl: (23) Failed writing body).
metrics_text="$(curl -fsS --max-time 5 "http://127.0.0.1:$port/metrics")" \
    || fail "the indexer's /metrics did not answer"
grep -Eq '^ckf_indexer_auth_refused_total\{[^}]*permission_denied[^}]*\} [1-9]' <<<"$metrics_text" \
    || fail "ckf_indexer_auth_refused_total counted no PERMISSION_DENIED"
query_probes "$WORK/after-impostor.jsonl"
compare_probes "$WORK/base.jsonl" "$WORK/after-impostor.jsonl" same \
    || fail "answers changed after the impostor's attempts"
log "ok: another pool's certificate is refused (PERMISSION_DENIED, counted); dc-a keeps its lease and every answer"

# --- 3. WAN partition of dc-b -------------------------------------------------------------------
WAN="$(docker network ls -q --filter "label=com.docker.compose.project=$PROJECT" \
    --filter label=com.docker.compose.network=wan)"
[[ -n "$WAN" ]] || fail "no wan network for project $PROJECT"
DCB="$(cid producer-dc-b)"
retired_before="$(lane_field "$WORK/lanes.json" dc-b retirements)"
log "partition: docker network disconnect wan producer-dc-b"
t_cut=$(now_ms)
docker network disconnect "$WAN" "$DCB"
wait_until $((HEARTBEAT_DEADLINE_S + RETIRE_SLACK_S)) \
    "dc-b retired, dc-a and dc-c active (deadline ${HEARTBEAT_DEADLINE_S}s + ${RETIRE_SLACK_S}s polling slack)" \
    lanes_are dc-b=retired dc-a=active dc-c=active
ms=$(($(now_ms) - t_cut))
log "dc-b retired $((ms / 1000)).$((ms % 1000 / 100)) s after the cut (heartbeat deadline ${HEARTBEAT_DEADLINE_S} s; the last heartbeat precedes the cut by up to 0.5 s)"
reason="$(lane_field "$WORK/lanes.json" dc-b last_retire_reason)"
[[ "$reason" == heartbeat_timeout ]] || fail "dc-b retired for '$reason', expected heartbeat_timeout"
[[ "$(lane_field "$WORK/lanes.json" dc-b retirements)" -gt "$retired_before" ]] || fail "dc-b retirement count did not grow"
show_lanes
query_probes "$WORK/partitioned.jsonl"
compare_probes "$WORK/base.jsonl" "$WORK/partitioned.jsonl" without:dc-b \
    || fail "during the partition dc-a/dc-c answers changed or dc-b still answered"
log "ok: during the partition dc-a and dc-c answer every probe unchanged, dc-b not at all"

log "heal: docker network connect wan producer-dc-b"
docker network connect --alias producer-dc-b "$WAN" "$DCB"
wait_until 60 "dc-b active again after the partition healed" lanes_are dc-a=active dc-b=active dc-c=active
show_lanes
query_probes "$WORK/healed.jsonl"
compare_probes "$WORK/base.jsonl" "$WORK/healed.jsonl" same \
    || fail "after the heal dc-b's content did not converge to what it held before"
log "ok: after the heal every probe answers as before the partition (dc-b converged)"

# --- 4. restart the indexer ---------------------------------------------------------------------
instance_before="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["consumer_instance"])' "$WORK/lanes.json")"
log "docker restart indexer"
docker restart -t 10 "$(cid indexer)" >/dev/null
wait_until 60 "indexer healthy again" healthy indexer
INDEXER_URL="https://$(compose port indexer 7400 | tail -n1)"   # an ephemeral port may change
wait_until 60 "all lanes active again after the indexer restart" lanes_are dc-a=active dc-b=active dc-c=active
instance_after="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["consumer_instance"])' "$WORK/lanes.json")"
[[ "$instance_after" != "$instance_before" ]] || fail "consumer instance unchanged: the indexer did not restart"
show_lanes
query_probes "$WORK/restarted.jsonl"
compare_probes "$WORK/base.jsonl" "$WORK/restarted.jsonl" same \
    || fail "after the indexer restart the answers differ from before"
log "ok: after the indexer restart all lanes recovered with the same content, no manual step"

# --- 4b. kill -9 a producer: its durable state comes back -------------------------------------
log "docker kill -s KILL producer-dc-a, then docker start"
docker kill -s KILL "$(cid producer-dc-a)" >/dev/null
docker start "$(cid producer-dc-a)" >/dev/null
wait_until 60 "producer-dc-a healthy again" healthy producer-dc-a
wait_until 60 "dc-a active again after its producer's kill -9" lanes_are dc-a=active dc-b=active dc-c=active
# The log goes to a file first: `docker logs | grep -q` fails under pipefail when grep exits at
# its match before docker has written the whole log (the CI failure of 2026-12-02).
docker logs "$(cid producer-dc-a)" >"$WORK/producer-dc-a.log" 2>&1 \
    || fail "docker logs producer-dc-a failed"
grep -q "state recovered from the journal" "$WORK/producer-dc-a.log" \
    || fail "producer-dc-a did not log a recovery from its journal"
query_probes "$WORK/producer-restarted.jsonl"
compare_probes "$WORK/base.jsonl" "$WORK/producer-restarted.jsonl" same \
    || fail "after producer-dc-a's kill -9 and restart the answers differ: its state was not recovered"
log "ok: after kill -9 and restart producer-dc-a recovered its exact state from its volume"

# --- 5. down -v leaves nothing ------------------------------------------------------------------
compose --profile prometheus down -v --remove-orphans -t 10 >/dev/null 2>&1 || fail "compose down -v failed"
UP=0
label="label=com.docker.compose.project=$PROJECT"
left_c="$(docker ps -aq --filter "$label")"
left_n="$(docker network ls -q --filter "$label")"
left_v="$(docker volume ls -q --filter "$label")"
[[ -z "$left_c$left_n$left_v" ]] || fail "down -v left containers [$left_c] networks [$left_n] volumes [$left_v]"
log "ok: down -v left no container, network or volume of project $PROJECT"

# --- 6. two models in one indexer (docker-compose.models.yml) --------------------------------
PROJECT="${PROJECT}m" COMPOSE_FILE_NAME=docker-compose.models.yml
export CKF_CERTS_DIR="$CERTS_M" CKF_PORT_MODELS_GRPC="" CKF_PORT_MODELS_METRICS=""
# A copy of the indexer's configuration, rewritten in place by the catalog reload below (a
# bind-mounted file keeps its inode: a rename would not reach the container).
export CKF_MODELS_INDEXER_CONFIG="$WORK/models-indexer.toml"
cp "$DEPLOY/compose/models/indexer.toml" "$CKF_MODELS_INDEXER_CONFIG"
chmod 0644 "$CKF_MODELS_INDEXER_CONFIG"
TLS_ARGS=(--ca "$CERTS_M/ca.crt" --cert "$CERTS_M/query.crt" --key "$CERTS_M/query.key")
MODELS=(llama qwen)
declare -A MODEL_TRACE=([llama]=sample.jsonl [qwen]=sample-qwen.jsonl)
SERVICES=(indexer producer-llama-dc-a producer-llama-dc-b producer-qwen-dc-a producer-qwen-dc-b)
log "two models: compose -f $COMPOSE_FILE_NAME up -d (project $PROJECT)"
UP=1
compose up -d --quiet-pull >/dev/null 2>"$WORK/up.err" || { cat "$WORK/up.err" >&2; fail "compose up (two models) failed"; }
wait_until 90 "all services of the two-model stack healthy (ckf health)" all_healthy
INDEXER_URL="https://$(compose port indexer 7400 | tail -n1)"
log "the two models' indexer published at $INDEXER_URL"
replay_done replay-llama
replay_done replay-qwen
# model <m>: point lanes_are / show_lanes / query_probes / compare_probes at domain m's lanes and
# probes (`ckf lanes --domain m`; query_probes callers pass `--domain m` themselves).
model() { LANES_DOMAIN=$1 PROBE_FILE="$WORK/probes-$1.txt"; }
json_field() { "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$@"; }
for m in "${MODELS[@]}"; do
    model "$m"
    wait_until 30 "$m: lanes dc-a, dc-b active (ckf lanes --domain $m)" lanes_are dc-a=active dc-b=active
    domain="$(json_field "$WORK/lanes.json" domain)"
    [[ "$domain" == "$m" ]] || fail "ckf lanes --domain $m answered for domain '$domain'"
    [[ "$("$PY" -c 'import json,sys; print(sorted(x["dc"] for x in json.load(open(sys.argv[1]))["lanes"]))' "$WORK/lanes.json")" \
        == "['dc-a', 'dc-b']" ]] || { show_lanes; fail "domain $m does not have exactly its own lanes dc-a, dc-b"; }
    cp "$WORK/lanes.json" "$WORK/lanes-$m.json"
    make_probes "$DEPLOY/compose/traces/${MODEL_TRACE[$m]}" "$PROBE_FILE"
    query_probes "$WORK/base-$m.jsonl" --domain "$m"
    # As in step 2: the DC that served a session's last request holds all of it.
    "$PY" - "$PROBE_FILE" "$WORK/base-$m.jsonl" <<'PY' || fail "$m: query results with --domain $m are wrong"
import json, sys
probes = [l.split() for l in open(sys.argv[1])]
answers = [json.loads(l) for l in open(sys.argv[2])]
bad = [f"{len(p)}-block probe: {a}" for p, a in zip(probes, answers)
       if sorted(a) != ["dc-a", "dc-b"] or max(a.values()) != len(p) or max(a.values()) > len(p)]
if len(probes) != len(answers) or bad:
    print("\n".join(bad[:10]), file=sys.stderr)
    sys.exit(1)
PY
    log "ok: $m: $PROBES probe queries with --domain $m: the deepest DC holds each session's full request"
done
cmp -s "$WORK/probes-llama.txt" "$WORK/probes-qwen.txt" && fail "both models have the same probes: step 6 would prove nothing"
# Each domain is a consumer of its own (its own consumer instance in its leases), in the one
# indexer process (the /metrics step below finds both domains' lanes on its one page).
[[ "$(json_field "$WORK/lanes-llama.json" consumer_instance)" != "$(json_field "$WORK/lanes-qwen.json" consumer_instance)" ]] \
    || fail "llama's and qwen's lanes share a consumer instance: one domain's leases would pass for the other's"
# Each domain its own table: qwen's probes asked of llama are answered from llama's content, not
# qwen's (the traces share block ids, the sessions and DCs differ).
model qwen
query_probes "$WORK/qwen-as-llama.jsonl" --domain llama
compare_probes "$WORK/base-qwen.jsonl" "$WORK/qwen-as-llama.jsonl" same 2>/dev/null \
    && fail "qwen's probes get qwen's answers from domain llama: the domains share a table"
# A query naming no domain is for the primary domain, llama ([manifest]).
model llama
query_probes "$WORK/llama-no-domain.jsonl"
compare_probes "$WORK/base-llama.jsonl" "$WORK/llama-no-domain.jsonl" same \
    || fail "a query without --domain is not answered as domain llama (the primary)"
ckf_cli lanes --indexer "$INDEXER_URL" --json >"$WORK/lanes-no-domain.json" || fail "ckf lanes without --domain failed"
[[ "$(json_field "$WORK/lanes-no-domain.json" domain)" == llama ]] || fail "ckf lanes without --domain is not llama's"
log "ok: each domain its own consumer (instances $(json_field "$WORK/lanes-llama.json" consumer_instance), $(json_field "$WORK/lanes-qwen.json" consumer_instance)) and its own content; no --domain = llama (the primary)"
# A domain not served here: NOT_FOUND naming the served ones, nothing answered.
# shellcheck disable=SC2046
if ckf_cli query --indexer "$INDEXER_URL" --domain mistral --json --ids $(head -n1 "$WORK/probes-llama.txt") \
    >"$WORK/refused.out" 2>"$WORK/refused.err"; then
    fail "the indexer answered a query for domain mistral: $(cat "$WORK/refused.out")"
fi
# tonic's text of the code NOT_FOUND, then the indexer's message naming the domains it serves.
if ! grep -q "code: 'Some requested entity was not found'" "$WORK/refused.err" \
    || ! grep -q "domain mistral is not served here: this indexer serves llama, qwen" "$WORK/refused.err"; then
    cat "$WORK/refused.err" >&2
    fail "--domain mistral refused, but not with NOT_FOUND naming llama, qwen"
fi
ckf_cli lanes --indexer "$INDEXER_URL" --domain mistral --json >/dev/null 2>"$WORK/refused-lanes.err" \
    && fail "ckf lanes --domain mistral was answered"
grep -q "domain mistral is not served here" "$WORK/refused-lanes.err" \
    || { cat "$WORK/refused-lanes.err" >&2; fail "ckf lanes --domain mistral refused, but not naming it"; }
log "ok: --domain mistral refused with NOT_FOUND ($(grep -Eo 'message: "[^"]*' "$WORK/refused.err" | head -n1 | cut -c11-))"
# Every lane metric carries its domain: both domains' lanes ready on the one /metrics page.
port="$(compose port indexer 9400 | tail -n1 | sed 's/.*://')"
metrics_text="$(curl -fsS --max-time 5 "http://127.0.0.1:$port/metrics")" || fail "the indexer's /metrics did not answer"
for m in "${MODELS[@]}"; do
    for dc in dc-a dc-b; do
        grep -Eq "^ckf_indexer_lane_ready\{[^}]*domain=\"$m\"[^}]*dc=\"$dc\"[^}]*\} 1\$|^ckf_indexer_lane_ready\{[^}]*dc=\"$dc\"[^}]*domain=\"$m\"[^}]*\} 1\$" \
            <<<"$metrics_text" || fail "no ckf_indexer_lane_ready{domain=\"$m\",dc=\"$dc\"} 1 on the indexer's /metrics"
    done
done
log "ok: /metrics shows ckf_indexer_lane_ready 1 for each domain's dc-a and dc-b"

# A pool's credential is its model's: qwen's dc-a certificate (valid, same CA) attaching for
# llama's dc-a is refused, and llama's dc-a keeps its lease and answers.
"$CKF_BIN_DIR/ckf-producer" --dc dc-a --domain llama --bucket-count 131072 \
    --indexer "$INDEXER_URL" --indexer-ca "$CERTS_M/ca.crt" \
    --indexer-cert "$CERTS_M/producer-qwen-dc-a.crt" --indexer-key "$CERTS_M/producer-qwen-dc-a.key" \
    --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --log-format json >"$WORK/impostor-m.log" 2>&1 &
IMPOSTOR=$!
refused_m() { grep -qi 'permission.denied' "$WORK/impostor-m.log"; }
wait_until 30 "qwen's dc-a certificate attaching for llama's dc-a is refused with PERMISSION_DENIED" refused_m
kill "$IMPOSTOR" 2>/dev/null || true
wait "$IMPOSTOR" 2>/dev/null || true
grep -Eq 'lease granted|sending barrier snapshot' "$WORK/impostor-m.log" && fail "qwen's dc-a certificate was granted llama's lane"
epochs() { "$PY" -c 'import json,sys; print({x["dc"]: x["lease_epoch"] for x in json.load(open(sys.argv[1]))["lanes"]})' "$1"; }
# llama_untouched WHEN TAG: llama's lanes still ACTIVE with their first leases, and every probe
# answered as at the start (WHEN names the event in the failure; TAG names the answers file).
llama_untouched() {
    model llama
    lanes_are dc-a=active dc-b=active || { show_lanes; fail "llama: a lane left ACTIVE $1"; }
    [[ "$(epochs "$WORK/lanes.json")" == "$(epochs "$WORK/lanes-llama.json")" ]] \
        || fail "llama's leases changed $1: $(epochs "$WORK/lanes-llama.json") -> $(epochs "$WORK/lanes.json")"
    query_probes "$WORK/llama-$2.jsonl" --domain llama
    compare_probes "$WORK/base-llama.jsonl" "$WORK/llama-$2.jsonl" same \
        || fail "llama's answers changed $1"
}
llama_untouched "during the impostor's attempts" after-impostor
log "ok: qwen's dc-a certificate is refused for llama's dc-a; llama keeps its leases and every answer"

# One model's producer killed and restarted: the other model's lanes and answers do not move.
log "docker kill -s KILL producer-qwen-dc-a (llama's dc-a producer keeps running)"
docker kill -s KILL "$(cid producer-qwen-dc-a)" >/dev/null
model qwen
wait_until $((HEARTBEAT_DEADLINE_S + RETIRE_SLACK_S)) "qwen: dc-a retired, dc-b active" lanes_are dc-a=retired dc-b=active
query_probes "$WORK/qwen-killed.jsonl" --domain qwen
compare_probes "$WORK/base-qwen.jsonl" "$WORK/qwen-killed.jsonl" without:dc-a \
    || fail "qwen: with its dc-a producer down, dc-a still answers or dc-b's answers changed"
llama_untouched "when qwen's dc-a producer died" qwen-killed
log "ok: qwen's dc-a is out of qwen's answers; llama's dc-a and dc-b answer every probe as before, same leases"
docker start "$(cid producer-qwen-dc-a)" >/dev/null
wait_until 60 "producer-qwen-dc-a healthy again" healthy producer-qwen-dc-a
model qwen
wait_until 60 "qwen: dc-a active again" lanes_are dc-a=active dc-b=active
query_probes "$WORK/qwen-restarted.jsonl" --domain qwen
compare_probes "$WORK/base-qwen.jsonl" "$WORK/qwen-restarted.jsonl" same \
    || fail "qwen: after its dc-a producer's restart the answers differ from before"
model llama
lanes_are dc-a=active dc-b=active || { show_lanes; fail "llama: a lane left ACTIVE during qwen's restart"; }
[[ "$(epochs "$WORK/lanes.json")" == "$(epochs "$WORK/lanes-llama.json")" ]] \
    || fail "llama's leases changed during qwen's dc-a restart"
query_probes "$WORK/llama-qwen-restarted.jsonl" --domain llama
compare_probes "$WORK/base-llama.jsonl" "$WORK/llama-qwen-restarted.jsonl" same \
    || fail "llama's answers changed during qwen's dc-a restart"
log "ok: qwen's dc-a recovered its content from its volume; llama's answers and leases never moved"

# A catalog change without a restart, as after a ConfigMap update: qwen (its [[domains]] entry
# and its producers' grants) removed from the indexer's file, SIGHUP; then put back, SIGHUP.
# llama keeps its leases and answers throughout; qwen is refused while it is gone, leaves no
# metric series behind, and once back its producers re-attach and it answers as before.
reload_indexer() { docker kill -s HUP "$(cid indexer)" >/dev/null || fail "SIGHUP to the indexer failed"; }
"$PY" - "$CKF_MODELS_INDEXER_CONFIG" "$WORK/models-indexer-no-qwen.toml" <<'PY' || fail "could not write the configuration without qwen"
import sys, tomllib
src, dst = sys.argv[1], sys.argv[2]
kept, section, body = [], None, []
def flush():
    text = "".join(body)
    if not (section in ("[[domains]]", "[domains.table]") or (section == "[[auth.producers]]" and "qwen/" in text)):
        kept.append(text)
for line in open(src):
    if line.startswith("["):
        flush()
        section, body = line.strip(), []
    body.append(line)
flush()
out = "".join(kept)
conf = tomllib.loads(out)
assert "domains" not in conf and all("qwen/" not in p for a in conf["auth"]["producers"] for p in a["pools"]), out
open(dst, "w").write(out)
PY
cp "$CKF_MODELS_INDEXER_CONFIG" "$WORK/models-indexer-full.toml"
metrics_page() { curl -fsS --max-time 5 "http://127.0.0.1:$port/metrics"; }
# Each page and log is read whole before grep (as above: a pipe into `grep -q` fails under
# pipefail, or here passes wrongly, when grep exits at its match before the writer is done).
no_qwen_series() {
    local page
    page="$(metrics_page)" || return 1
    ! grep -q 'domain="qwen"' <<<"$page"
}
qwen_refused() {
    # shellcheck disable=SC2046
    ! ckf_cli query --indexer "$INDEXER_URL" --domain qwen --json --ids $(head -n1 "$WORK/probes-qwen.txt") \
        >/dev/null 2>"$WORK/qwen-gone.err" && grep -q "domain qwen is not served here" "$WORK/qwen-gone.err"
}
log "catalog reload: qwen removed from the indexer's configuration, SIGHUP"
cat "$WORK/models-indexer-no-qwen.toml" >"$CKF_MODELS_INDEXER_CONFIG"
reload_indexer
wait_until 30 "qwen is refused with NOT_FOUND after the reload" qwen_refused
wait_until 30 "no metric series of domain qwen left on /metrics" no_qwen_series
llama_untouched "when qwen was removed by a reload" qwen-removed
compose logs --no-color indexer >"$WORK/indexer-models.log" 2>&1 || fail "compose logs indexer failed"
grep -q "catalog reloaded" "$WORK/indexer-models.log" || fail "the indexer did not log 'catalog reloaded'"
log "ok: qwen removed without a restart: refused, no series left; llama's leases and answers never moved"
log "catalog reload: qwen put back, SIGHUP"
cat "$WORK/models-indexer-full.toml" >"$CKF_MODELS_INDEXER_CONFIG"
reload_indexer
model qwen
wait_until 90 "qwen: dc-a, dc-b active again after its producers re-attached" lanes_are dc-a=active dc-b=active
query_probes "$WORK/qwen-readded.jsonl" --domain qwen
compare_probes "$WORK/base-qwen.jsonl" "$WORK/qwen-readded.jsonl" same \
    || fail "qwen: after being removed and added back its answers differ from before"
llama_untouched "when qwen was added back by a reload" qwen-readded
log "ok: qwen added back without a restart: its producers re-attached and it answers as before; llama untouched"

compose down -v --remove-orphans -t 10 >/dev/null 2>&1 || fail "compose down -v (two models) failed"
UP=0
label="label=com.docker.compose.project=$PROJECT"
left="$(docker ps -aq --filter "$label")$(docker network ls -q --filter "$label")$(docker volume ls -q --filter "$label")"
[[ -z "$left" ]] || fail "down -v (two models) left containers, networks or volumes of project $PROJECT: $left"
log "ok: down -v left no container, network or volume of project $PROJECT"
