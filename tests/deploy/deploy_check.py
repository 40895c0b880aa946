#!/usr/bin/python3
"""Checks every file of deploy/ against the code: run by CTest as deploy_check.

  deploy_check.py --source DIR --prefill BIN --decode BIN [--node-dir DIR]

- YAML: yamllint (deploy/.yamllint) on all of deploy/.
- Kubernetes: each kustomize overlay rendered (kubectl kustomize, offline) and validated against
  the Kubernetes OpenAPI schemas (tests/deploy/k8s_validate.js, npm's kubernetes-models); then the
  objects against each other and the daemons: every config key is a flag of the daemon's --help;
  the ports of listen/health_listen/http are the containers' named ports, the probes' and the
  Services'; probes on the gRPC health service with the daemon's service name; the config,
  token and checkpoint paths lie in the volumes mounted there; the decode's peers are the prefill
  StatefulSet's pods behind its headless Service; terminationGracePeriodSeconds covers the drain;
  a GPU backend asks for a GPU; each workload has a PodDisruptionBudget.
- deploy/configs: keys are flags, the decode's peer port is the prefill's listen port.
- systemd units: `systemd-analyze verify` (ExecStart pointed at the built binary), the same
  daemon and a stop timeout that covers the drain.
- The container file: the ports it exposes are those of the configs it copies, its default
  config exists, nothing hides a failure (`|| true`).
Prints one line per problem and a closing "N passed, N failed" line; exit 1 on any problem.
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

ROLES = {"kvstream-prefill": "prefill", "kvstream-decode": "decode"}
SERVICE = {"prefill": "kvstream.v1.Prefill", "decode": "kvstream.v1.Decode"}
SERVER_SHUTDOWN_S = 5  # the daemons give the gRPC server this long after the drain

passed, failed = 0, 0


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("FAIL: " + what)
    return ok


def flags_of(binary):
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, check=True).stdout
    return {m.replace("-", "_") for m in re.findall(r"--([a-z][a-z0-9_-]*)", out)}


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def drain_s(cfg):
    return (cfg.get("drain_delay_ms", 3000) + cfg.get("drain_grace_ms", 25000)) / 1000.0


def check_config(cfg, role, flags, where):
    for key in cfg:
        check(key.replace("-", "_") in flags[role], f"{where}: '{key}' is not a flag of kvstream-{role}")


def check_workloads(objs, flags, where):
    by_kind = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
    cms = {o["metadata"]["name"]: o for o in by_kind.get("ConfigMap", [])}
    services = {o["metadata"]["name"]: o for o in by_kind.get("Service", [])}
    pdbs = by_kind.get("PodDisruptionBudget", [])
    workloads = by_kind.get("Deployment", []) + by_kind.get("StatefulSet", [])
    check(len(workloads) == 2, f"{where}: a prefill and a decode workload")
    prefill_sts, decode_cfg = None, {}
    for w in workloads:
        name = w["metadata"]["name"]
        spec = w["spec"]["template"]["spec"]
        labels = w["spec"]["template"]["metadata"]["labels"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        c = spec["containers"][0]
        cmd = c.get("command", []) + c.get("args", [])
        role = ROLES.get(os.path.basename(cmd[0]))
        if not check(role is not None, f"{where}: {name} runs {cmd[0]}, not a daemon"):
            continue
        if role == "prefill" and w["kind"] == "StatefulSet":
            prefill_sts = w
        mounts = {m["mountPath"]: volumes.get(m["name"]) for m in c.get("volumeMounts", [])}
        check(all(v is not None for v in mounts.values()), f"{where}: {name} mounts a volume it lacks")
        # The config: --config PATH in a mounted ConfigMap that has that key.
        if not check("--config" in cmd, f"{where}: {name} has no --config"):
            continue
        path = cmd[cmd.index("--config") + 1]
        vol = mounts.get(os.path.dirname(path)) or {}
        cm = cms.get(vol.get("configMap", {}).get("name"))
        key = os.path.basename(path)
        if not check(cm is not None and key in cm.get("data", {}),
                     f"{where}: {name}'s config {path} is in no mounted ConfigMap"):
            continue
        cfg = json.loads(cm["data"][key])
        check_config(cfg, role, flags, f"{where}: ConfigMap {cm['metadata']['name']} {key}")
        # Ports: listen = the container's "grpc" port, health_listen = "health" = every probe's.
        ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
        check(port_of(cfg["listen"]) == ports.get("grpc"),
              f"{where}: {name}: listen {cfg['listen']} is not its grpc containerPort {ports.get('grpc')}")
        health = port_of(cfg.get("health_listen", ":0"))
        check(health == ports.get("health"), f"{where}: {name}: health_listen is not its health port")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            p = c.get(probe, {}).get("grpc")
            if not check(p is not None, f"{where}: {name} has no gRPC {probe}"):
                continue
            check(p["port"] == health, f"{where}: {name}: {probe} is not on the health port {health}")
            want = SERVICE[role] if probe == "readinessProbe" else ""
            check(p.get("service", "") == want, f"{where}: {name}: {probe} asks for '{p.get('service', '')}', not '{want}'")
        # Files: tokens in a mounted Secret, a checkpoint directory in a mounted volume.
        for k in ("peer_token_file", "client_token_file", "tls_cert", "tls_key", "tls_ca"):
            if k in cfg:
                v = mounts.get(os.path.dirname(cfg[k])) or {}
                check("secret" in v, f"{where}: {name}: {k} {cfg[k]} is not in a mounted Secret")
        if cfg.get("model", "").startswith("/"):
            check(any(cfg["model"].startswith(m.rstrip("/") + "/") and "persistentVolumeClaim" in (v or {})
                      for m, v in mounts.items()),
                  f"{where}: {name}: model {cfg['model']} is not on a mounted volume")
        # The stop: the drain and the server's shutdown fit in the grace period.
        grace = spec.get("terminationGracePeriodSeconds", 30)
        need = math.ceil(drain_s(cfg) + SERVER_SHUTDOWN_S)
        check(need <= grace <= need + 10,
              f"{where}: {name}: terminationGracePeriodSeconds {grace}, the drain needs {need} (at most {need + 10})")
        if cfg.get("backend") == "cuda":
            limits = c.get("resources", {}).get("limits", {})
            check(str(limits.get("nvidia.com/gpu")) == "1", f"{where}: {name}: cuda backend without a GPU limit")
        # A Service that points at this workload's grpc port; a PodDisruptionBudget.
        svc = [s for s in services.values()
               if all(labels.get(k) == v for k, v in s["spec"]["selector"].items())]
        check(len(svc) == 1 and svc[0]["spec"]["ports"][0]["targetPort"] in ("grpc", ports.get("grpc")),
              f"{where}: {name}: no Service on its grpc port")
        # The HTTP endpoint (decode's "http"): a container port named http, a Service port on it.
        if "http" in cfg:
            check(port_of(cfg["http"]) == ports.get("http"),
                  f"{where}: {name}: http {cfg['http']} is not its http containerPort {ports.get('http')}")
            check(any(sp["targetPort"] in ("http", ports.get("http")) for s in svc for sp in s["spec"]["ports"]),
                  f"{where}: {name}: no Service port on its http port")
        check(any(all(labels.get(k) == v for k, v in p["spec"]["selector"]["matchLabels"].items()) for p in pdbs),
              f"{where}: {name}: no PodDisruptionBudget")
        if role == "decode":
            decode_cfg = cfg
    # The decode's peers: every pod of the prefill StatefulSet, by its name behind the headless
    # Service, on the Service's port.
    if check(prefill_sts is not None, f"{where}: the prefill is a StatefulSet"):
        svc = services.get(prefill_sts["spec"]["serviceName"])
        check(svc is not None and svc["spec"].get("clusterIP") == "None",
              f"{where}: the prefill StatefulSet's Service is not headless")
        sts, n = prefill_sts["metadata"]["name"], prefill_sts["spec"].get("replicas", 1)
        want = [f"{sts}-{i}.{prefill_sts['spec']['serviceName']}:{svc['spec']['ports'][0]['port']}"
                for i in range(n)] if svc else []
        peers = decode_cfg.get("peer", "")
        peers = peers if isinstance(peers, list) else peers.split(",")
        check(peers == want, f"{where}: decode peer {peers}, the prefill pods are {want}")


def render(path):
    r = subprocess.run(["kubectl", "kustomize", path], capture_output=True, text=True)
    if not check(r.returncode == 0, f"kubectl kustomize {path}: {r.stderr.strip()}"):
        return []
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def check_kubernetes(src, flags, node_dir):
    k8s = os.path.join(src, "deploy", "k8s")
    overlays = sorted(os.path.join(k8s, "overlays", d) for d in os.listdir(os.path.join(k8s, "overlays")))
    check(len(overlays) >= 2, "deploy/k8s/overlays: a CPU and a GPU overlay")
    if shutil.which("kubectl") is None:
        print("skipped: no kubectl here, the overlays are not rendered")
        return
    models = os.path.join(node_dir, "node_modules", "kubernetes-models")
    for path in [os.path.join(k8s, "base")] + overlays:
        where = os.path.relpath(path, src)
        objs = render(path)
        if not objs:
            continue
        if shutil.which("node") and os.path.isdir(models):
            r = subprocess.run(["node", os.path.join(src, "tests", "deploy", "k8s_validate.js"), node_dir],
                               input=json.dumps(objs), capture_output=True, text=True)
            check(r.returncode == 0, f"{where}: schema: {r.stdout.strip()} {r.stderr.strip()}")
        else:
            print(f"skipped: {where}: no node or no {models}: the schema check (scripts/install-deps.sh)")
        check_workloads(objs, flags, where)


def check_configs(src, flags):
    d = os.path.join(src, "deploy", "configs")
    cfgs = {}
    for f in sorted(os.listdir(d)):
        role = "prefill" if f.startswith("prefill") else "decode"
        with open(os.path.join(d, f)) as fh:
            cfgs[f] = json.load(fh)
        check_config(cfgs[f], role, flags, f"deploy/configs/{f}")
    for f, cfg in cfgs.items():
        if f.startswith("decode"):
            pf = "prefill" + f[len("decode"):]
            if check(pf in cfgs, f"deploy/configs/{f} has no {pf}"):
                for peer in cfg["peer"].split(","):
                    check(port_of(peer) == port_of(cfgs[pf]["listen"]),
                          f"deploy/configs/{f}: peer {peer} is not {pf}'s listen port")
    return cfgs


def check_units(src, binaries, cfgs):
    d = os.path.join(src, "deploy", "systemd")
    units = sorted(f for f in os.listdir(d) if f.endswith(".service"))
    check(len(units) == 2, "deploy/systemd: a prefill and a decode unit")
    tmp = tempfile.mkdtemp()
    try:
        for u in units:
            text = open(os.path.join(d, u)).read()
            m = re.search(r"^ExecStart=(\S+)(.*)$", text, re.M)
            if not check(m is not None, f"{u}: no ExecStart"):
                continue
            role = ROLES.get(os.path.basename(m.group(1)))
            if not check(role is not None and u == f"kvstream-{role}.service", f"{u}: runs {m.group(1)}"):
                continue
            stop = re.search(r"^TimeoutStopSec=(\d+)$", text, re.M)
            need = math.ceil(drain_s({}) + SERVER_SHUTDOWN_S)
            check(stop is not None and need <= int(stop.group(1)) <= need + 10,
                  f"{u}: TimeoutStopSec must cover the drain ({need} s)")
            with open(os.path.join(tmp, u), "w") as fh:
                fh.write(text.replace(m.group(1), binaries[role], 1))
        r = subprocess.run(["systemd-analyze", "verify"] + [os.path.join(tmp, u) for u in units],
                           capture_output=True, text=True)
        check(r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(),
              f"systemd-analyze verify: {r.stdout.strip()} {r.stderr.strip()}")
    finally:
        shutil.rmtree(tmp)


def check_container(src, cfgs):
    path = os.path.join(src, "deploy", "docker", "Dockerfile")
    text = open(path).read()
    code = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#"))
    check("|| true" not in code, "Dockerfile: '|| true' hides a failure")
    check(re.search(r"^COPY deploy/configs /etc/kvstream$", code, re.M) is not None,
          "Dockerfile: the configs go to /etc/kvstream")
    exposed = {int(p) for m in re.findall(r"^EXPOSE (.*)$", code, re.M) for p in m.split()}
    used = {port_of(c[k]) for c in cfgs.values() for k in ("listen", "health_listen") if c.get(k)}
    check(exposed == used, f"Dockerfile: EXPOSE {sorted(exposed)}, the configs listen on {sorted(used)}")
    cmd = re.search(r'^CMD \["--config", "/etc/kvstream/([^"]+)"\]$', code, re.M)
    check(cmd is not None and cmd.group(1) in cfgs, "Dockerfile: CMD names a config of deploy/configs")
    check(os.path.exists(os.path.join(src, ".dockerignore")), ".dockerignore: missing")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--prefill", required=True)
    ap.add_argument("--decode", required=True)
    ap.add_argument("--node-dir", default=os.environ.get("KVSTREAM_NODE_DIR", "/usr/local/lib/kvstream-node"))
    a = ap.parse_args()
    binaries = {"prefill": os.path.abspath(a.prefill), "decode": os.path.abspath(a.decode)}
    flags = {role: flags_of(b) | {"config"} for role, b in binaries.items()}
    r = subprocess.run(["yamllint", "-f", "parsable", "-c", os.path.join(a.source, "deploy", ".yamllint"),
                        os.path.join(a.source, "deploy")], capture_output=True, text=True)
    check(r.returncode == 0, "yamllint: " + r.stdout.strip() + r.stderr.strip())
    cfgs = check_configs(a.source, flags)
    check_kubernetes(a.source, flags, a.node_dir)
    check_units(a.source, binaries, cfgs)
    check_container(a.source, cfgs)
    print(f"deploy_check: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
