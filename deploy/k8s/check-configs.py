#!/usr/bin/env python3
"""Checks that the shipped configurations agree with each other (run by compose-test.sh).

The schema validator checks each Kubernetes object alone; this checks what only holds across
files, for the Kubernetes manifests (ConfigMaps in deploy/k8s/*.yaml) and the compose stack
(deploy/compose/*.toml + deploy/docker-compose.yml):

- one indexer manifest: every lane has exactly one producer, every producer's pool
  (domain, dc) is a lane of it;
- every producer's table format (bucket_count, seed) equals the indexer's; bucket_count is
  explicit (nonzero) so the comparison needs no sizing rule;
- every producer's `indexers` endpoint names a Service (Kubernetes) or compose service that
  exists, on the indexer's gRPC port;
- services listen on 0.0.0.0 at the ports the containers, probes and Services use;
- every ConfigMap a Deployment mounts exists; every Deployment mounts a Secret made by
  kustomization.yaml's secretGenerator at /etc/ckf/tls holding every TLS file its config and
  its probes (`ckf health` over TLS) name.

Usage: check-configs.py DEPLOY_DIR   (needs PyYAML; Python >= 3.11 for tomllib)
"""

import glob
import os
import sys
import tomllib
from urllib.parse import urlsplit

import yaml

errors = []


def err(where, msg):
    errors.append(f"{where}: {msg}")


def check_set(where, indexer, producers, service_ports):
    """indexer: parsed indexer TOML; producers: {name: parsed producer TOML};
    service_ports: {host: set of ports} reachable as indexer endpoints."""
    man = indexer.get("manifest", {})
    domain, lanes = man.get("domain"), man.get("lanes", [])
    itab = indexer.get("table", {})
    if not itab.get("bucket_count"):
        err(where, "indexer [table] bucket_count must be explicit (nonzero)")
    if not str(indexer.get("listen", "")).startswith("0.0.0.0:"):
        err(where, f"indexer listen {indexer.get('listen')!r} must bind 0.0.0.0 in a container")
    seen = {}
    for name, p in producers.items():
        pool, ptab = p.get("pool", {}), p.get("table", {})
        w = f"{where} {name}"
        if pool.get("domain") != domain:
            err(w, f"pool.domain {pool.get('domain')!r} != indexer manifest.domain {domain!r}")
        dc = pool.get("dc")
        if dc not in lanes:
            err(w, f"pool.dc {dc!r} is not a lane of the indexer manifest {lanes}")
        if dc in seen:
            err(w, f"pool.dc {dc!r} also used by {seen[dc]}")
        seen[dc] = name
        for key in ("bucket_count", "seed"):
            if ptab.get(key, 0) != itab.get(key, 0):
                err(w, f"table.{key} {ptab.get(key, 0)} != indexer table.{key} {itab.get(key, 0)}")
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


def check_k8s(k8s_dir):
    docs = []
    for path in sorted(glob.glob(os.path.join(k8s_dir, "*.yaml"))):
        if os.path.basename(path) == "kustomization.yaml":
            continue
        with open(path) as f:
            docs += [(os.path.basename(path), d) for d in yaml.safe_load_all(f) if d]
    cms = {d["metadata"]["name"]: d for _, d in docs if d["kind"] == "ConfigMap"}
    services = {d["metadata"]["name"]: d for _, d in docs if d["kind"] == "Service"}
    deployments = [(f, d) for f, d in docs if d["kind"] == "Deployment"]
    indexers = [tomllib.loads(c["data"]["indexer.toml"]) for c in cms.values() if "indexer.toml" in c["data"]]
    producers = {n: tomllib.loads(c["data"]["producer.toml"]) for n, c in cms.items() if "producer.toml" in c["data"]}
    if len(indexers) != 1:
        err("k8s", f"expected one indexer ConfigMap, found {len(indexers)}")
        return
    indexer = indexers[0]
    igrpc = port_of(indexer["listen"])
    # Per-replica Services (selecting one indexer replica) exposing the indexer's gRPC port: a
    # producer must attach to each replica, not to the load-balanced query Service.
    svc_ports = {}
    for name, s in services.items():
        sel = s["spec"]["selector"]
        if sel.get("app.kubernetes.io/component") == "indexer" and "ckf-relay/replica" in sel:
            svc_ports[name] = {p["port"] for p in s["spec"]["ports"] if p.get("targetPort") in ("grpc", igrpc)}
    check_set("k8s", indexer, producers, svc_ports)
    with open(os.path.join(k8s_dir, "kustomization.yaml")) as f:
        kustomization = yaml.safe_load(f)
    secrets = {g["name"]: {os.path.basename(x) for x in g.get("files", [])}
               for g in kustomization.get("secretGenerator", [])}
    tls_paths = []
    for f, d in deployments:
        spec = d["spec"]["template"]["spec"]
        w = f"k8s {f} deployment/{d['metadata']['name']}"
        if spec.get("enableServiceLinks") is not False:
            err(w, "enableServiceLinks must be false (service env vars collide with CKF_* config)")
        for v in spec.get("volumes", []):
            if "configMap" in v and v["configMap"]["name"] not in cms:
                err(w, f"mounts missing ConfigMap {v['configMap']['name']}")
        for c in spec["containers"]:
            cfg_name = next(v["configMap"]["name"] for v in spec["volumes"] if "configMap" in v)
            data = cms.get(cfg_name, {}).get("data", {})
            cfg = tomllib.loads(next(iter(data.values()), ""))
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
            for where, key, path in tls_paths:
                if path.startswith("/etc/ckf/tls/") and path[len("/etc/ckf/tls/"):] not in secrets[name]:
                    err(where, f"{key} = {path}: not a file of Secret {name} {sorted(secrets[name])}")
            tls_paths.clear()


def check_compose(deploy_dir):
    with open(os.path.join(deploy_dir, "docker-compose.yml")) as f:
        compose = yaml.safe_load(f)
    services = compose["services"]
    cdir = os.path.join(deploy_dir, "compose")
    with open(os.path.join(cdir, "indexer.toml"), "rb") as f:
        indexer = tomllib.load(f)
    producers = {}
    for path in sorted(glob.glob(os.path.join(cdir, "producer-*.toml"))):
        with open(path, "rb") as f:
            producers[os.path.basename(path)] = tomllib.load(f)
        svc = "producer-" + producers[os.path.basename(path)]["pool"]["dc"]
        if svc not in services:
            err("compose", f"{os.path.basename(path)}: no compose service {svc}")
        elif not any(os.path.basename(path) in v for v in services[svc].get("volumes", [])):
            err("compose", f"service {svc} does not mount {os.path.basename(path)}")
        elif "wan" not in services[svc].get("networks", []):
            err("compose", f"service {svc} is not on the wan network")
    check_set("compose", indexer, producers, {"indexer": {port_of(indexer["listen"])}})


def main():
    deploy_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    check_k8s(os.path.join(deploy_dir, "k8s"))
    check_compose(deploy_dir)
    for e in errors:
        print(f"check-configs: {e}", file=sys.stderr)
    if errors:
        sys.exit(1)
    print("check-configs: k8s and compose configs agree (pools, lanes, table format, endpoints, ports)")


if __name__ == "__main__":
    main()
