#!/usr/bin/env python3
"""Static checks of deploy/: the compose file, the Kubernetes manifests, the Prometheus and
Grafana files and the Dockerfile parse, and agree with each other and with the code.

  check_manifests.py REPO_ROOT UOPD UOP_WORKER

- every YAML file loads (yaml.safe_load_all) and every JSON file loads;
- every uopd_* metric the alert rules and the dashboard use is one server/ defines;
- every flag given to uopd or uop-worker in compose.yaml and deploy/k8s/ is one that the
  built binary's --help lists;
- Kubernetes objects: apiVersion / kind / name, selectors that match their pod templates,
  Services that select some workload, probes on declared ports, resource requests;
- compose: the files it mounts and builds from exist; workers point at the scheduler;
- the dashboard's data source is the provisioned one;
- the Dockerfile is multi-stage, runs as a non-root user and builds the four binaries
  (hadolint too, when installed); `kubectl kustomize deploy/k8s` renders, when installed.
Exit status 0 when all hold; otherwise every failure is printed and the status is 1.
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

try:
    import yaml
except ImportError:
    print("check_manifests: python3 cannot import yaml: install python3-yaml (deploy/setup.sh does)")
    sys.exit(1)

failures = []


def fail(where, msg):
    failures.append(f"{where}: {msg}")


def load_yaml(path):
    try:
        with open(path) as f:
            return [d for d in yaml.safe_load_all(f) if d is not None]
    except (OSError, yaml.YAMLError) as e:
        fail(path, f"not valid YAML: {e}")
        return []


def defined_metrics(root):
    """uopd_* names in server/'s string literals: the metrics the server can export."""
    names = set()
    for d, _, files in os.walk(os.path.join(root, "server")):
        for f in files:
            if f.endswith((".cc", ".h")):
                with open(os.path.join(d, f), errors="replace") as src:
                    names |= set(re.findall(r'"(uopd_[a-z0-9_]+)"', src.read()))
    return names


def used_metrics(text):
    # A histogram is used through its _bucket / _sum / _count series.
    return {re.sub(r"_(bucket|sum|count)$", "", m) for m in re.findall(r"\b(uopd_[a-z0-9_]+)\b", text)}


def help_flags(binary):
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    return set(re.findall(r"--([a-z][a-z0-9-]*)", out.stdout + out.stderr))


def command_flags(argv):
    """(program, [flag names]) of a command line given as a list or a shell string."""
    if isinstance(argv, str):
        argv = shlex.split(argv)
    words = []
    for a in argv:  # `sh -c "exec uop-worker ..."`: look inside the script
        words += shlex.split(a) if " " in a else [a]
    prog, flags = None, []
    for w in words:
        base = os.path.basename(w)
        if base in ("uopd", "uop-worker"):
            prog = base
        elif prog and w.startswith("--"):
            flags.append(w[2:].split("=", 1)[0])
    return prog, flags


def check_flags(where, argv, known):
    prog, flags = command_flags(argv)
    if prog is None:
        return None
    for fl in flags:
        if fl not in known[prog]:
            fail(where, f"{prog} has no flag --{fl} (not in `{prog} --help`)")
    return prog


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    root, uopd, worker = sys.argv[1:]
    deploy = os.path.join(root, "deploy")
    known = {"uopd": help_flags(uopd), "uop-worker": help_flags(worker)}
    for prog, fl in known.items():
        if "listen" not in fl:
            fail(prog, f"`{prog} --help` lists no --listen; cannot check flags against it")

    # --- Prometheus and Grafana files ---------------------------------------------------
    server_metrics = defined_metrics(root)
    if "uopd_workers_up" not in server_metrics:
        fail("server/", "found no uopd_* metric names in the sources")
    rules = load_yaml(os.path.join(deploy, "prometheus", "alerts.yml"))
    prom = load_yaml(os.path.join(deploy, "prometheus", "prometheus.yml"))
    load_yaml(os.path.join(deploy, "prometheus", "alerts_test.yml"))
    exprs = []
    for doc in rules:
        for g in doc.get("groups", []):
            for r in g.get("rules", []):
                exprs.append(r.get("expr", ""))
                if "alert" in r and "severity" not in r.get("labels", {}):
                    fail("alerts.yml", f"alert {r['alert']} has no severity label")
    if not exprs:
        fail("alerts.yml", "no rules")
    for m in sorted(used_metrics("\n".join(exprs)) - server_metrics):
        fail("alerts.yml", f"uses {m}, which server/ does not export")
    if prom and "alerts.yml" not in prom[0].get("rule_files", []):
        fail("prometheus.yml", "does not load alerts.yml")

    dash_path = os.path.join(deploy, "grafana", "dashboards", "uopd.json")
    try:
        with open(dash_path) as f:
            dash = json.load(f)
    except (OSError, ValueError) as e:
        fail(dash_path, f"not valid JSON: {e}")
        dash = {}
    ds_docs = load_yaml(os.path.join(deploy, "grafana", "provisioning", "datasources", "prometheus.yaml"))
    prov = load_yaml(os.path.join(deploy, "grafana", "provisioning", "dashboards", "uopd.yaml"))
    ds_uids = {d.get("uid") for doc in ds_docs for d in doc.get("datasources", [])}
    panel_exprs, ids = [], set()
    for p in dash.get("panels", []):
        if p.get("id") in ids:
            fail("uopd.json", f"panel id {p.get('id')} used twice")
        ids.add(p.get("id"))
        if p.get("type") == "row":
            continue
        if not p.get("targets"):
            fail("uopd.json", f"panel '{p.get('title')}' has no queries")
        for t in p.get("targets", []):
            panel_exprs.append(t.get("expr", ""))
            uid = (t.get("datasource") or p.get("datasource") or {}).get("uid")
            if uid not in ds_uids:
                fail("uopd.json", f"panel '{p.get('title')}' uses data source {uid!r}, not a provisioned one {sorted(ds_uids)}")
    if dash and not panel_exprs:
        fail("uopd.json", "no panels with queries")
    for m in sorted(used_metrics("\n".join(panel_exprs)) - server_metrics):
        fail("uopd.json", f"uses {m}, which server/ does not export")
    for doc in prov:
        for pr in doc.get("providers", []):
            if not pr.get("options", {}).get("path"):
                fail("grafana dashboards provider", f"{pr.get('name')} has no options.path")

    # --- compose ------------------------------------------------------------------------
    compose_path = os.path.join(deploy, "compose.yaml")
    compose = (load_yaml(compose_path) or [{}])[0]
    services = compose.get("services", {})
    for s in ("uopd", "worker0", "worker1", "redis", "prometheus", "grafana"):
        if s not in services:
            fail("compose.yaml", f"no service {s}")
    sched = services.get("uopd", {}).get("command", [])
    internal = next((a.split("=", 1)[1] for a in sched if a.startswith("--internal-listen=")), "")
    sched_port = internal.rsplit(":", 1)[-1]
    sched_secret = next((a for a in sched if a.startswith("--cluster-secret-file=")), None)
    if not internal:
        fail("compose.yaml uopd", "no --internal-listen: remote workers cannot reach the Registry")
    if not sched_secret:
        fail("compose.yaml uopd", "no --cluster-secret-file: nothing authenticates the workers")
    for name, svc in services.items():
        prog = check_flags(f"compose.yaml {name}", svc.get("command", []), known)
        if prog == "uop-worker":
            args = svc["command"]
            if f"--scheduler=uopd:{sched_port}" not in args:
                fail(f"compose.yaml {name}", f"worker does not register with uopd:{sched_port} (--internal-listen)")
            if sched_secret not in args:
                fail(f"compose.yaml {name}", f"worker does not have the scheduler's {sched_secret}")
            if not any(a.startswith(f"--advertise={name}:") for a in args):
                fail(f"compose.yaml {name}", "worker does not advertise its service name")
        build = svc.get("build")
        if build:
            ctx = os.path.normpath(os.path.join(deploy, build.get("context", ".")))
            if not os.path.isfile(os.path.join(ctx, build.get("dockerfile", "Dockerfile"))):
                fail(f"compose.yaml {name}", f"no Dockerfile {build.get('dockerfile')} under {ctx}")
        for v in svc.get("volumes", []):
            src = v.split(":", 1)[0]
            if src.startswith(".") and not os.path.exists(os.path.join(deploy, src)):
                fail(f"compose.yaml {name}", f"mounts {src}, which does not exist")
    devices = [a for n, s in services.items() for a in s.get("command", []) if str(a).startswith("--device=")]
    if len(devices) != len(set(devices)):
        fail("compose.yaml", f"workers share a device name: {devices}")
    if prom:
        targets = [t for sc in prom[0].get("scrape_configs", []) if sc.get("job_name") == "uopd"
                   for st in sc.get("static_configs", []) for t in st.get("targets", [])]
        metrics_port = next((a.rsplit(":", 1)[1] for a in sched if a.startswith("--metrics-listen=")), None)
        if f"uopd:{metrics_port}" not in targets:
            fail("prometheus.yml", f"job uopd does not scrape uopd:{metrics_port} (has {targets})")

    # --- Kubernetes ---------------------------------------------------------------------
    k8s = os.path.join(deploy, "k8s")
    objects = []
    for f in sorted(os.listdir(k8s)):
        if f.endswith((".yaml", ".yml")):
            objects += [(f, d) for d in load_yaml(os.path.join(k8s, f))]
    kust = [d for f, d in objects if d.get("kind") == "Kustomization"]
    for d in kust:
        for r in d.get("resources", []):
            if not os.path.isfile(os.path.join(k8s, r)):
                fail("kustomization.yaml", f"lists {r}, which does not exist")
        listed = set(d.get("resources", []))
        for f in sorted({f for f, o in objects if o.get("kind") != "Kustomization"} - listed):
            fail("kustomization.yaml", f"does not list {f}")
    workloads, services_k8s = [], []
    for f, d in objects:
        if d.get("kind") == "Kustomization":
            continue
        where = f"{f} {d.get('kind')}/{d.get('metadata', {}).get('name')}"
        for key in ("apiVersion", "kind", "metadata"):
            if key not in d:
                fail(where, f"no {key}")
        if not d.get("metadata", {}).get("name"):
            fail(where, "no metadata.name")
        if d.get("kind") != "Namespace" and d.get("metadata", {}).get("namespace") != "uopd":
            fail(where, "not in namespace uopd")
        if d.get("kind") in ("Deployment", "StatefulSet", "DaemonSet"):
            workloads.append((where, d))
        if d.get("kind") == "Service":
            services_k8s.append((where, d))
    for where, d in workloads:
        spec = d["spec"]
        tmpl = spec["template"]
        labels = tmpl.get("metadata", {}).get("labels", {})
        sel = spec.get("selector", {}).get("matchLabels", {})
        if not sel or any(labels.get(k) != v for k, v in sel.items()):
            fail(where, f"selector {sel} does not match the pod labels {labels}")
        if d["kind"] == "StatefulSet" and not any(
                s["metadata"]["name"] == spec.get("serviceName") for _, s in services_k8s):
            fail(where, f"serviceName {spec.get('serviceName')} is no Service here")
        for c in tmpl["spec"].get("containers", []):
            cw = f"{where} container {c.get('name')}"
            argv = (c.get("command") or []) + (c.get("args") or [])
            check_flags(cw, argv, known)
            ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                pr = c.get(probe)
                if pr is None:
                    continue
                for kind in ("grpc", "tcpSocket", "httpGet"):
                    if kind in pr:
                        port = pr[kind].get("port")
                        if port not in ports and port not in ports.values():
                            fail(cw, f"{probe} probes port {port}, which the container does not declare")
            if "readinessProbe" not in c or "livenessProbe" not in c:
                fail(cw, "needs a readiness and a liveness probe")
            if not c.get("resources", {}).get("requests"):
                fail(cw, "no resource requests")
            if c.get("image") == "uopd" and argv and argv[0] == "uopd":
                for probe in ("readinessProbe", "livenessProbe"):
                    if "grpc" not in c.get(probe, {}):
                        fail(cw, f"uopd serves grpc.health.v1: its {probe} should be a grpc probe")
            if d["kind"] == "DaemonSet" and "gpu" in d["metadata"]["name"]:
                if "nvidia.com/gpu" not in c.get("resources", {}).get("limits", {}):
                    fail(cw, "a GPU worker must request nvidia.com/gpu")
    for where, s in services_k8s:
        sel = s["spec"].get("selector", {})
        if not any(all(w["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items())
                   for _, w in workloads):
            fail(where, f"selector {sel} selects no workload")

    kubectl = shutil.which("kubectl")
    if kubectl:  # the kustomization renders (offline: no cluster needed)
        r = subprocess.run([kubectl, "kustomize", k8s], capture_output=True, text=True, timeout=120)
        rendered = [d for d in yaml.safe_load_all(r.stdout) if d] if r.returncode == 0 else []
        want = len([o for _, o in objects if o.get("kind") != "Kustomization"])
        if r.returncode != 0:
            fail("kubectl kustomize deploy/k8s", r.stderr.strip())
        elif len(rendered) != want:
            fail("kubectl kustomize deploy/k8s", f"rendered {len(rendered)} objects, expected {want}")
    else:
        print("check_manifests: kubectl is not installed; the kustomization was not rendered")

    # --- Dockerfile ---------------------------------------------------------------------
    dockerfile = os.path.join(deploy, "Dockerfile")
    with open(dockerfile) as f:
        text = f.read()
    stages = re.findall(r"^FROM\s+\S+(?:\s+AS\s+(\S+))?", text, re.M | re.I)
    if len(stages) < 2:
        fail("Dockerfile", "not multi-stage")
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    if not users or users[-1].split(":")[0] in ("root", "0"):
        fail("Dockerfile", "the runtime stage does not run as a non-root user")
    for b in ("uopd", "uop-worker", "uop", "uopc"):
        if not re.search(rf"build/release/\S+/{re.escape(b)}\b", text):
            fail("Dockerfile", f"does not install {b}")
    if "deploy/setup.sh" not in text:
        fail("Dockerfile", "the builder does not run deploy/setup.sh")
    hadolint = shutil.which("hadolint")
    if hadolint:
        r = subprocess.run([hadolint, dockerfile], capture_output=True, text=True)
        if r.returncode != 0:
            fail("Dockerfile", "hadolint:\n" + r.stdout + r.stderr)
    else:
        print("check_manifests: hadolint is not installed; the Dockerfile had the structural checks only")

    for f in failures:
        print("FAIL", f)
    n_k8s = len([o for _, o in objects])
    print(f"check_manifests: {len(exprs)} rules, {len(panel_exprs)} dashboard queries, {len(services)} compose "
          f"services, {n_k8s} Kubernetes objects; {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
