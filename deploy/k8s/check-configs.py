#!/usr/bin/env python3
"""Checks that the shipped configurations agree with each other (run by compose-test.sh).

The schema validator checks each Kubernetes object alone; this checks what only holds across
files, for the Kubernetes manifests (ConfigMaps in deploy/k8s/**/*.yaml) and the compose stacks
(deploy/compose/*.toml + deploy/docker-compose.yml, deploy/compose/models/*.toml +
deploy/docker-compose.models.yml):

- each deployable variant is checked whole: the default kustomization, the default plus each
  optional kustomize Component under deploy/k8s (e.g. standby-dc-a/, whose `$patch: delete`
  patches remove the producer it replaces), and each other kustomization under it (a layout of
  its own, e.g. sharded/); every manifest file belongs to one;
- an indexer config serves one or more domains: `[manifest]` (the primary) and each
  `[[domains]]` entry (its own lanes and `[domains.table]`, else the top-level `[table]`); each
  domain is served by exactly one indexer config of a layout; every lane of a domain has exactly
  one producer of that domain, every producer's pool (domain, dc) is a lane of its domain, and
  it attaches to a Service (or compose service) of the indexer serving its domain;
- `[[auth.producers]] pools` entries name served lanes (a bare DC id: the primary domain's;
  `domain/dc`: that domain's), and every producer's pool is granted to some principal;
- with domains spread over several indexers, the router's map (a ConfigMap with
  `domains.toml`) names every domain, each with an https:// endpoint of a Service of the
  indexer serving it;
- every producer's table format (bucket_count, seed) equals its domain's; bucket_count is
  explicit (nonzero) so the comparison needs no sizing rule;
- every producer's `indexers` endpoint names a Service (Kubernetes) or compose service that
  exists, on the indexer's gRPC port;
- services listen on 0.0.0.0 at the ports the containers, probes and Services use;
- they run secure: no `insecure` (key, `--insecure`, `CKF_*_INSECURE`); the indexer has
  `auth.required = true` (Relay) and a Query token or required client certificates (Query);
  every producer has `ingest_auth.required = true` (the services refuse a non-loopback listener
  without these, unless `insecure = true`);
- every ConfigMap a workload (Deployment, StatefulSet) mounts exists; each mounts a Secret made by
  kustomization.yaml's secretGenerator at /etc/ckf/tls holding every TLS file its config and
  its probes (`ckf health` over TLS) name;
- every producer's durability.data_dir lies on a PersistentVolumeClaim (or a StatefulSet's
  volumeClaimTemplate); a single producer is a Recreate Deployment;
- a producer with several replicas is a hot standby (README "Hot standby"): a StatefulSet,
  every replica `start_mode = "if-vacant"`, fed by `[[engines]]`, `reconnect.max_backoff_ms`
  lowered, Parallel pod management, a required anti-affinity on the node, a
  PodDisruptionBudget with maxUnavailable 1, a headless governing Service, and no Service that
  spreads connections over the replicas (one per pod, or headless without ports).

Usage: check-configs.py DEPLOY_DIR   (needs PyYAML; Python >= 3.11 for tomllib)
"""

import glob
import os
import re
import sys
import tomllib
from urllib.parse import urlsplit

import yaml

errors = []


def err(where, msg):
    errors.append(f"{where}: {msg}")


def served_domains(where, indexer):
    """The domains an indexer config serves, the primary first: {domain: {"at", "lanes",
    "table"}} from `[manifest]` + the top-level `[table]`, and each `[[domains]]` entry (its own
    `[domains.table]`, else the top-level one)."""
    man, top = indexer.get("manifest", {}), indexer.get("table", {})
    entries = [("manifest", man.get("domain"), man.get("lanes", []), top)]
    for i, d in enumerate(indexer.get("domains", [])):
        entries.append((f"domains[{i}]", d.get("domain"), d.get("lanes", []), d.get("table", top)))
    out = {}
    for at, domain, lanes, table in entries:
        if not domain:
            err(where, f"{at}.domain is missing")
        elif domain in out:
            err(where, f"{at}.domain {domain!r} is configured twice (also {out[domain]['at']}.domain)")
            continue
        if not table.get("bucket_count"):
            err(where, f"domain {domain!r}: indexer table bucket_count must be explicit (nonzero)")
        if len(set(lanes)) != len(lanes) or not lanes:
            err(where, f"{at}.lanes {lanes} must list distinct DC ids")
        out[domain] = {"at": at, "lanes": lanes, "table": table}
    return out


def granted_pools(where, indexer, domains):
    """{(domain, dc): [principal names]} of `[[auth.producers]] pools`: a bare DC id is a lane of
    the primary domain (`[manifest]`), `domain/dc` a lane of that domain."""
    primary = indexer.get("manifest", {}).get("domain")
    grants = {}
    for i, p in enumerate(indexer.get("auth", {}).get("producers", [])):
        if not p.get("pools"):
            err(where, f"auth.producers[{i}] ({p.get('name')}) grants no pool")
        for j, entry in enumerate(p.get("pools", [])):
            domain, dc = entry.split("/", 1) if "/" in entry else (primary, entry)
            if domain not in domains:
                err(where, f"auth.producers[{i}].pools[{j}] = {entry!r}: domain {domain!r} is not served {sorted(domains)}")
            elif dc not in domains[domain]["lanes"]:
                err(where, f"auth.producers[{i}].pools[{j}] = {entry!r}: {dc!r} is not a lane of domain "
                           f"{domain!r} {domains[domain]['lanes']}")
            else:
                grants.setdefault((domain, dc), []).append(p.get("name"))
    return grants


def domains_served(where, indexers, what):
    """Each domain -> (indexer name, its config, the domain's spec, the indexer's grants), every
    indexer checked (check_indexer); a domain two indexers serve is an error (`what` names
    them: "indexer ConfigMaps", "services")."""
    by_domain = {}
    for name, cfg in indexers.items():
        domains, grants = check_indexer(f"{where} {name}", cfg)
        for domain, spec in domains.items():
            if domain in by_domain:
                err(where, f"{what} {by_domain[domain][0]} and {name} both serve domain {domain!r}")
            by_domain[domain] = (name, cfg, spec, grants)
    return by_domain


def check_indexer(where, indexer):
    """What holds for an indexer config whatever its domains: it binds 0.0.0.0 and runs secure.
    Returns its domains (served_domains) and pool grants (granted_pools)."""
    if not str(indexer.get("listen", "")).startswith("0.0.0.0:"):
        err(where, f"indexer listen {indexer.get('listen')!r} must bind 0.0.0.0 in a container")
    check_secure(where, "indexer", indexer)
    domains = served_domains(where, indexer)
    return domains, granted_pools(where, indexer, domains)


def check_set(where, domain, spec, grants, producers, service_ports):
    """One domain of an indexer: spec is its served_domains entry, grants the indexer's
    granted_pools; producers: {name: parsed producer TOML} of this domain; service_ports:
    {host: set of ports} reachable as endpoints of the indexer serving it."""
    lanes, itab = spec["lanes"], spec["table"]
    seen = {}
    for name, p in producers.items():
        pool, ptab = p.get("pool", {}), p.get("table", {})
        w = f"{where} {name}"
        check_secure(w, "producer", p)
        if pool.get("domain") != domain:
            err(w, f"pool.domain {pool.get('domain')!r} != the indexer's domain {domain!r}")
        dc = pool.get("dc")
        if dc not in lanes:
            err(w, f"pool.dc {dc!r} is not a lane of domain {domain!r} ({spec['at']}.lanes {lanes})")
        elif (domain, dc) not in grants:
            err(w, f"pool {domain}/{dc} is granted to no [[auth.producers]] entry of the indexer")
        if dc in seen:
            err(w, f"pool.dc {dc!r} also used by {seen[dc]}")
        seen[dc] = name
        for key in ("bucket_count", "seed"):
            if ptab.get(key, 0) != itab.get(key, 0):
                err(w, f"table.{key} {ptab.get(key, 0)} != domain {domain}'s table.{key} {itab.get(key, 0)}")
        if not str(p.get("listen", "")).startswith("0.0.0.0:"):
            err(w, f"listen {p.get('listen')!r} must bind 0.0.0.0 in a container")
        if not p.get("indexers"):
            err(w, "no indexers")
        for url in p.get("indexers", []):
            u = urlsplit(url)
            if u.hostname not in service_ports or u.port not in service_ports[u.hostname]:
                err(w, f"indexer endpoint {url} is not a known indexer service:port {service_ports}")
    for dc in lanes:
        if dc not in seen:
            err(where, f"lane {dc!r} has no producer")


def check_secure(where, role, cfg):
    """A shipped config runs secure: callers of every gRPC service are authorized, and
    `insecure` is not set."""
    if cfg.get("insecure"):
        err(where, "insecure = true: shipped configs authorize their callers instead")
    tls = cfg.get("tls", {})
    if role == "indexer":
        if not cfg.get("auth", {}).get("required"):
            err(where, "indexer auth.required must be true (Relay attachments authorized)")
        certs = tls.get("client_ca_file") and tls.get("client_auth", "required") == "required"
        if not (certs or cfg.get("auth", {}).get("query_token_file")):
            err(where, "indexer Query needs auth.query_token_file or required client certificates")
    elif not cfg.get("ingest_auth", {}).get("required"):
        err(where, "producer ingest_auth.required must be true (Ingest callers authorized)")


def check_no_insecure_switch(where, text):
    """The `insecure` switch in its flag and environment forms."""
    for switch in ("--insecure", "CKF_INDEXER_INSECURE", "CKF_PRODUCER_INSECURE"):
        if switch in text:
            err(where, f"sets {switch}: shipped deployments run secure")


def tls_files(cfg):
    """(key, path) of every file a parsed service config names in [tls] / [indexer_tls]."""
    out = []
    for section in ("tls", "indexer_tls"):
        for key, value in cfg.get(section, {}).items():
            if key.endswith("_file"):
                out.append((f"{section}.{key}", value))
    return out


def port_of(addr):
    return int(str(addr).rsplit(":", 1)[1])


def load_kustomization(k8s_dir, path, docs, secrets):
    """Adds the objects and generated Secrets of the kustomization (or Component) at `path` to
    `docs` [(file, object)] and `secrets` {name: set of file names}: `resources` (files, or
    directories holding a kustomization), `components`, `secretGenerator`, and `patches` of the
    form `$patch: delete` (the only kind the shipped manifests use; any other is an error, so a
    new one is not silently ignored). Returns the files it read."""
    with open(os.path.join(path, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    read = set()
    for r in k.get("resources", []):
        full = os.path.normpath(os.path.join(path, r))
        if os.path.isdir(full):
            read |= load_kustomization(k8s_dir, full, docs, secrets)
        else:
            with open(full) as f:
                docs += [(os.path.relpath(full, k8s_dir), d) for d in yaml.safe_load_all(f) if d]
            read.add(full)
    for g in k.get("secretGenerator", []):
        secrets[g["name"]] = {os.path.basename(x) for x in g.get("files", [])}
    for c in k.get("components", []):
        read |= load_kustomization(k8s_dir, os.path.normpath(os.path.join(path, c)), docs, secrets)
    where = os.path.relpath(os.path.join(path, "kustomization.yaml"), k8s_dir)
    for p in k.get("patches", []):
        patch = yaml.safe_load(p.get("patch", "")) if "patch" in p else None
        if not isinstance(patch, dict) or patch.get("$patch") != "delete":
            err(f"k8s {where}", f"only inline `$patch: delete` patches are checked, not {p}")
            continue
        key = (patch["kind"], patch["metadata"]["name"])
        kept = [(f, d) for f, d in docs if (d["kind"], d["metadata"]["name"]) != key]
        if len(kept) == len(docs):
            err(f"k8s {where}", f"deletes {key[0]}/{key[1]}, which is not in its resources")
        docs[:] = kept
    return read


def selects(selector, labels):
    """A Service / PodDisruptionBudget selector (a flat map) matches these pod labels."""
    return all(labels.get(k) == v for k, v in selector.items())


def data_dir_volume(cfg, container, spec, claim_templates, pvcs):
    """Checks that a producer's durability.data_dir lies on a persistent volume. Returns an
    error message or None."""
    data_dir = cfg.get("durability", {}).get("data_dir")
    if not data_dir:
        return "durability.data_dir is unset: a restart would start empty (README \"Operations\")"
    mounts = [m for m in container.get("volumeMounts", [])
              if data_dir == m["mountPath"] or data_dir.startswith(m["mountPath"].rstrip("/") + "/")]
    if not mounts:
        return f"durability.data_dir {data_dir} is on no volume mount (the root filesystem is read-only)"
    name = max(mounts, key=lambda m: len(m["mountPath"]))["name"]
    vol = next((v for v in spec.get("volumes", []) if v["name"] == name), None)
    if vol is None and name in claim_templates:
        return None
    if vol is not None and "persistentVolumeClaim" in vol:
        claim = vol["persistentVolumeClaim"]["claimName"]
        return None if claim in pvcs else f"mounts missing PersistentVolumeClaim {claim}"
    return f"durability.data_dir {data_dir} is on volume {name!r}, not a PersistentVolumeClaim"


def check_standby(w, d, cfg, docs, indexer):
    """A producer workload with more than one replica: a hot standby (README "Hot standby")."""
    spec, pod = d["spec"], d["spec"]["template"]
    labels = pod["metadata"]["labels"]
    replicas = spec.get("replicas", 1)
    name = d["metadata"]["name"]
    if d["kind"] != "StatefulSet":
        err(w, f"{replicas} replicas of one producer need a StatefulSet (one PVC and data_dir each)")
        return
    if cfg.get("publication", {}).get("start_mode") != "if-vacant":
        err(w, "publication.start_mode must be \"if-vacant\" on every replica: a takeover replica fences "
               "the live holder whenever it restarts")
    backoff = cfg.get("reconnect", {}).get("max_backoff_ms", 5000)
    deadline = indexer.get("lag", {}).get("heartbeat_deadline_ms", 10000)
    if backoff >= 5000 or backoff >= deadline:
        err(w, f"reconnect.max_backoff_ms {backoff} must be lowered below the default 5000 and the "
               f"indexer's heartbeat deadline {deadline} (failover waits up to it once the lane is vacant)")
    if not cfg.get("engines"):
        err(w, "no [[engines]]: the replicas must be fed the same events by subscribing to the same "
               "engine publishers")
    if spec.get("podManagementPolicy") != "Parallel":
        err(w, "podManagementPolicy must be Parallel: a replica holds only what it was fed since it started")
    anti = pod["spec"].get("affinity", {}).get("podAntiAffinity", {})
    if not any(t.get("topologyKey") == "kubernetes.io/hostname"
               and selects(t.get("labelSelector", {}).get("matchLabels", {}), labels)
               for t in anti.get("requiredDuringSchedulingIgnoredDuringExecution", [])):
        err(w, "needs a required pod anti-affinity on kubernetes.io/hostname selecting its own pods")
    pdbs = [p for _, p in docs if p["kind"] == "PodDisruptionBudget"
            and selects(p["spec"]["selector"].get("matchLabels", {}), labels)]
    if [p["spec"].get("maxUnavailable") for p in pdbs] != [1]:
        found = [{k: v for k, v in p["spec"].items() if k != "selector"} for p in pdbs]
        err(w, f"needs exactly one PodDisruptionBudget with maxUnavailable: 1 selecting its pods, found {found}")
    pods = {f"{name}-{i}" for i in range(replicas)}
    governing = None
    for _, s in docs:
        if s["kind"] != "Service" or not selects(
                {k: v for k, v in s["spec"].get("selector", {}).items()
                 if k != "statefulset.kubernetes.io/pod-name"}, labels):
            continue
        sname, sel = s["metadata"]["name"], s["spec"]["selector"]
        if s["metadata"]["name"] == spec.get("serviceName"):
            governing = s
        pod_name = sel.get("statefulset.kubernetes.io/pod-name")
        if s["spec"].get("clusterIP") == "None" and not s["spec"].get("ports"):
            continue
        if pod_name is None:
            err(w, f"Service {sname} spreads connections over its {replicas} replicas: "
                   "select one pod (statefulset.kubernetes.io/pod-name) per Service")
        elif pod_name not in pods:
            err(w, f"Service {sname} selects pod {pod_name}, not one of {sorted(pods)}")
    if governing is None or governing["spec"].get("clusterIP") != "None":
        err(w, f"serviceName {spec.get('serviceName')!r} must be a headless Service selecting its pods")


def check_k8s(where, docs, secrets):
    """docs: [(file, object)] of one deployable kustomization; secrets: its generated Secrets."""
    cms = {d["metadata"]["name"]: d for _, d in docs if d["kind"] == "ConfigMap"}
    services = {d["metadata"]["name"]: d for _, d in docs if d["kind"] == "Service"}
    pvcs = {d["metadata"]["name"] for _, d in docs if d["kind"] == "PersistentVolumeClaim"}
    workloads = [(f, d) for f, d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    indexers = {n: tomllib.loads(c["data"]["indexer.toml"]) for n, c in cms.items() if "indexer.toml" in c["data"]}
    producers = {n: tomllib.loads(c["data"]["producer.toml"]) for n, c in cms.items() if "producer.toml" in c["data"]}
    if not indexers:
        err(where, "no indexer ConfigMap")
        return
    # Each domain is served by one indexer ConfigMap (one Deployment per replica), which may
    # serve several; producers are grouped by their pool.domain.
    by_domain = domains_served(where, indexers, "indexer ConfigMaps")
    # Per indexer ConfigMap: the Services a producer may attach to (each selects the pods of
    # exactly one single-replica workload mounting it: a producer attaches to each replica, not
    # to a Service spreading over several), and the Services a router may query (all selected
    # pods mount it).
    mounted = []
    for _, d in workloads:
        spec = d["spec"]["template"]["spec"]
        cm = next((v["configMap"]["name"] for v in spec.get("volumes", []) if "configMap" in v), None)
        mounted.append((cm, d["spec"]["template"]["metadata"]["labels"], d["spec"].get("replicas", 1)))
    attach, query = {n: {} for n in indexers}, {n: {} for n in indexers}
    for name, s in services.items():
        hits = [(cm, r) for cm, labels, r in mounted if selects(s["spec"].get("selector", {}), labels)]
        cm = hits[0][0] if hits else None
        if cm not in indexers or any(h[0] != cm for h in hits):
            continue
        igrpc = port_of(indexers[cm]["listen"])
        ports = {p["port"] for p in s["spec"]["ports"] if p.get("targetPort") in ("grpc", igrpc)}
        query[cm][name] = ports
        if len(hits) == 1 and hits[0][1] == 1:
            attach[cm][name] = ports
    for domain, (name, cfg, spec, grants) in by_domain.items():
        mine = {n: p for n, p in producers.items() if p.get("pool", {}).get("domain") == domain}
        check_set(where if len(by_domain) == 1 else f"{where} domain {domain}", domain, spec, grants, mine,
                  attach[name])
    for n, p in producers.items():
        if p.get("pool", {}).get("domain") not in by_domain:
            err(where, f"{n}: pool.domain {p.get('pool', {}).get('domain')!r} is served by no indexer {sorted(by_domain)}")
    # The router's model -> indexer map (a ConfigMap with domains.toml): every domain, each
    # pointing at a Service of the indexer serving it. Needed as soon as the domains are spread
    # over several indexers (one indexer serving them all is one endpoint, `ckf-domain` picks).
    maps = {n: c for n, c in cms.items() if "domains.toml" in c["data"]}
    if len(indexers) > 1 and not maps:
        err(where, f"{len(by_domain)} domains on {len(indexers)} indexers but no router map "
                   "(a ConfigMap with domains.toml)")
    for n, c in maps.items():
        routes = tomllib.loads(c["data"]["domains.toml"]).get("domains", {})
        if set(routes) != set(by_domain):
            err(f"{where} {n}", f"[domains] {sorted(routes)} != the indexers' domains {sorted(by_domain)}")
        for domain, url in routes.items():
            u = urlsplit(url)
            svcs = query[by_domain[domain][0]] if domain in by_domain else {}
            if u.scheme != "https" or u.port not in svcs.get(u.hostname, ()):
                err(f"{where} {n}", f"{domain} = {url}: not https:// to a Service of {domain}'s indexer {svcs}")
    tls_paths = []
    for f, d in workloads:
        spec = d["spec"]["template"]["spec"]
        w = f"{where} {f} {d['kind'].lower()}/{d['metadata']['name']}"
        if spec.get("enableServiceLinks") is not False:
            err(w, "enableServiceLinks must be false (service env vars collide with CKF_* config)")
        for v in spec.get("volumes", []):
            if "configMap" in v and v["configMap"]["name"] not in cms:
                err(w, f"mounts missing ConfigMap {v['configMap']['name']}")
        claim_templates = {t["metadata"]["name"] for t in d["spec"].get("volumeClaimTemplates", [])}
        for c in spec["containers"]:
            cfg_name = next(v["configMap"]["name"] for v in spec["volumes"] if "configMap" in v)
            data = cms.get(cfg_name, {}).get("data", {})
            cfg = tomllib.loads(next(iter(data.values()), ""))
            if "producer.toml" in data:
                msg = data_dir_volume(cfg, c, spec, claim_templates, pvcs)
                if msg:
                    err(w, msg)
                replicas = d["spec"].get("replicas", 1)
                if replicas > 1:
                    check_standby(w, d, cfg, docs, by_domain.get(cfg.get("pool", {}).get("domain"), (None, {}))[1])
                elif d["kind"] == "Deployment" and d["spec"].get("strategy", {}).get("type") != "Recreate":
                    err(w, "a single producer's Deployment must use strategy Recreate (two pods of one "
                           "pool would fence each other, and share one ReadWriteOnce volume)")
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            if ports.get("grpc") != port_of(cfg.get("listen", ":0")):
                err(w, f"containerPort grpc {ports.get('grpc')} != config listen {cfg.get('listen')}")
            if ports.get("metrics") != port_of(cfg.get("metrics_listen", ":0")):
                err(w, f"containerPort metrics {ports.get('metrics')} != metrics_listen {cfg.get('metrics_listen')}")
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                cmd = c.get(probe, {}).get("exec", {}).get("command", [])
                want = f"https://127.0.0.1:{ports.get('grpc')}"
                if cmd[:2] != ["ckf", "health"] or want not in cmd:
                    err(w, f"{probe} must run `ckf health --endpoint {want}` (TLS health check)")
                for flag in ("--ca", "--cert", "--key"):
                    if flag in cmd:
                        tls_paths.append((w, f"{probe} {flag}", cmd[cmd.index(flag) + 1]))
            # Every TLS file the config or the probes name is in the Secret mounted at /etc/ckf/tls.
            tls_paths += [(w, key, path) for key, path in tls_files(cfg)]
            mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
            secret_vol = next((v for v in spec["volumes"] if "secret" in v and mounts.get(v["name"]) == "/etc/ckf/tls"), None)
            if secret_vol is None:
                err(w, "no Secret mounted at /etc/ckf/tls")
                continue
            name = secret_vol["secret"]["secretName"]
            if name not in secrets:
                err(w, f"mounts Secret {name}, which kustomization.yaml's secretGenerator does not make")
                continue
            for at, key, path in tls_paths:
                if path.startswith("/etc/ckf/tls/") and path[len("/etc/ckf/tls/"):] not in secrets[name]:
                    err(at, f"{key} = {path}: not a file of Secret {name} {sorted(secrets[name])}")
            tls_paths.clear()


def check_k8s_variants(k8s_dir):
    """Checks the default kustomization, the default plus each optional Component under it
    (e.g. standby-dc-a/), and each other kustomization under it (a layout of its own, e.g.
    sharded/), each as one deployment; every manifest file must be part of one."""
    variants = [("k8s", [k8s_dir])]
    with open(os.path.join(k8s_dir, "kustomization.yaml")) as f:
        enabled = {os.path.normpath(os.path.join(k8s_dir, c)) for c in yaml.safe_load(f).get("components", [])}
    for path in sorted(glob.glob(os.path.join(k8s_dir, "*", "kustomization.yaml"))):
        sub = os.path.dirname(path)
        with open(path) as f:
            kind = yaml.safe_load(f).get("kind")
        # A Component the default already enables is checked as part of the default.
        if kind == "Component" and sub not in enabled:
            variants.append((f"k8s+{os.path.basename(sub)}", [k8s_dir, sub]))
        elif kind != "Component":
            variants.append((f"k8s/{os.path.basename(sub)}", [sub]))
    used = set()
    for where, roots in variants:
        docs, secrets = [], {}
        for r in roots:
            used |= load_kustomization(k8s_dir, r, docs, secrets)
        check_k8s(where, docs, secrets)
    for path in glob.glob(os.path.join(k8s_dir, "**", "*.yaml"), recursive=True):
        with open(path) as f:
            check_no_insecure_switch(os.path.relpath(path, k8s_dir), f.read())
        if os.path.basename(path) != "kustomization.yaml" and os.path.normpath(path) not in used:
            err("k8s", f"{os.path.relpath(path, k8s_dir)} is in no kustomization or component (unchecked)")


def check_compose(deploy_dir, file, configs):
    """One compose file: the service configs it mounts (./compose/...toml at
    /etc/ckf/{indexer,producer}.toml) grouped by domain, each indexer's producers checked as a
    set; every TOML file matching `configs` (a glob under deploy_dir) is mounted."""
    with open(os.path.join(deploy_dir, file)) as f:
        text = f.read()
    check_no_insecure_switch(file, text)
    services = yaml.safe_load(text)["services"]
    indexers, producers, mounted = {}, {}, set()
    for svc, s in services.items():
        for v in s.get("volumes", []):
            # `${VAR:-default}` (a path the user may override): the default is what ships.
            v = re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}", r"\1", v)
            src, dst = (v.split(":") + [""])[:2]
            if not (src.startswith("./compose/") and dst in ("/etc/ckf/indexer.toml", "/etc/ckf/producer.toml")):
                continue
            mounted.add(os.path.normpath(os.path.join(deploy_dir, src)))
            with open(os.path.join(deploy_dir, src), "rb") as f:
                (indexers if dst == "/etc/ckf/indexer.toml" else producers)[svc] = tomllib.load(f)
            if "wan" not in s.get("networks", []):
                err(file, f"service {svc} is not on the wan network")
    for path in sorted(glob.glob(os.path.join(deploy_dir, configs))):
        if os.path.normpath(path) not in mounted:
            err(file, f"{os.path.relpath(path, deploy_dir)} is mounted by no service")
    by_domain = domains_served(file, indexers, "services")
    for domain, (svc, cfg, spec, grants) in by_domain.items():
        mine = {p: c for p, c in producers.items() if c.get("pool", {}).get("domain") == domain}
        check_set(f"{file} domain {domain}", domain, spec, grants, mine, {svc: {port_of(cfg["listen"])}})
    for p, c in producers.items():
        if c.get("pool", {}).get("domain") not in by_domain:
            err(file, f"{p}: pool.domain {c.get('pool', {}).get('domain')!r} is indexed by no service {sorted(by_domain)}")


def main():
    deploy_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    check_k8s_variants(os.path.join(deploy_dir, "k8s"))
    check_compose(deploy_dir, "docker-compose.yml", "compose/*.toml")
    check_compose(deploy_dir, "docker-compose.models.yml", "compose/models/*.toml")
    for e in errors:
        print(f"check-configs: {e}", file=sys.stderr)
    if errors:
        sys.exit(1)
    print("check-configs: k8s and compose configs agree (pools, lanes, table format, endpoints, ports) and run secure")


if __name__ == "__main__":
    main()
