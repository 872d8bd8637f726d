#!/usr/bin/env python3
"""A real Prometheus scrapes a real uopd, and the test reads uopd's metrics back through
Prometheus' HTTP query API.

  prometheus_scrape_test.py REPO_ROOT UOPD UOP_WORKER

uopd starts with one embedded CPU worker, its client API and /metrics on free loopback
ports. Prometheus starts on a free loopback port with a generated config: one job scraping
that /metrics every second, and deploy/prometheus/alerts.yml as its rules. The test waits
(bounded) until
  - the target is up (up{job="uopd"} == 1),
  - uopd_workers_up reads 1 through /api/v1/query (the worker's state, sampled by uopd at
    scrape time, stored and queried by Prometheus),
  - every uopd_* metric the alert rules use has been stored at least once (so that the
    rules watch series that exist; uopd_requests_total appears once a request has ended),
  - every alert rule has been evaluated against the scraped data without an error.
Exits 77 (skipped) when prometheus is not installed. Both processes are stopped by their pid.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

SKIP = 77
WAIT_S = 90  # bound on each wait below; a healthy run needs a few seconds


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, fn, procs, bound=WAIT_S):
    """Polls fn until it returns something truthy; fails naming `what` after `bound` s."""
    deadline = time.monotonic() + bound
    last = None
    while time.monotonic() < deadline:
        for name, p, log in procs:
            if p.poll() is not None:
                raise SystemExit(f"FAIL: {name} exited with status {p.returncode} while waiting for {what}\n"
                                 f"--- {name} log:\n{tail(log)}")
        try:
            v = fn()
            if v:
                return v
            last = v
        except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
            last = e
        time.sleep(0.25)
    logs = "".join(f"--- {name} log:\n{tail(log)}\n" for name, _, log in procs)
    raise SystemExit(f"FAIL: {what}: not within {bound} s (last: {last!r})\n{logs}")


def tail(paths, n=40):
    """The last n lines of each log file (a path or a list of paths)."""
    out = []
    for path in [paths] if isinstance(paths, str) else paths:
        try:
            with open(path, errors="replace") as f:
                out.append(f"[{os.path.basename(path)}]\n" + ("".join(f.readlines()[-n:]) or "(empty)\n"))
        except OSError:
            out.append(f"[{os.path.basename(path)}] (unreadable)\n")
    return "".join(out)


def stop(p, name):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            print(f"{name} (pid {p.pid}) ignored SIGTERM for 30 s; killing it")
            p.kill()
            p.wait()


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    root, uopd, worker = sys.argv[1:]
    prometheus = shutil.which("prometheus")
    if not prometheus:
        print("SKIP: prometheus not found (apt-get install prometheus, or run deploy/setup.sh)")
        return SKIP
    # Absolute: Prometheus reads rule_files relative to its config file, in a temp dir.
    # Loopback only: an http_proxy in the environment must not see these requests.
    urllib.request.install_opener(urllib.request.build_opener(urllib.request.ProxyHandler({})))
    rules = os.path.abspath(os.path.join(root, "deploy", "prometheus", "alerts.yml"))
    work = tempfile.mkdtemp(prefix="uopd-prom-")
    procs = []
    try:
        # --- uopd ---------------------------------------------------------------------------
        uopd_out, uopd_log = os.path.join(work, "uopd.out"), os.path.join(work, "uopd.log")
        u = subprocess.Popen(
            [uopd, "--listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0", "--workers=1",
             f"--worker-binary={worker}", "--worker-threads=1", f"--cache-dir={work}/cache"],
            stdout=open(uopd_out, "w"), stderr=open(uopd_log, "w"), stdin=subprocess.DEVNULL)
        procs.append(("uopd", u, [uopd_out, uopd_log]))

        def metrics_address():
            with open(uopd_log) as f:
                m = re.search(r"metrics on http://([^/\s]+)/metrics", f.read())
            return m and m.group(1)
        metrics = wait_for("uopd's 'metrics on http://HOST:PORT/metrics' line", metrics_address, procs)
        print(f"uopd pid {u.pid}, metrics on {metrics}")

        # --- Prometheus ---------------------------------------------------------------------
        # Prometheus cannot listen on port 0 and report the port, so take a free one and,
        # if another process grabbed it in between, try again with another.
        prom_log = os.path.join(work, "prometheus.log")
        for attempt in range(3):
            port = free_port()
            config = os.path.join(work, "prometheus.yml")
            with open(config, "w") as f:
                f.write(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - {json.dumps(rules)}
scrape_configs:
  - job_name: uopd
    static_configs:
      - targets: ["{metrics}"]
""")
            p = subprocess.Popen(
                [prometheus, f"--config.file={config}", f"--storage.tsdb.path={work}/tsdb-{attempt}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=info"],
                stdout=subprocess.DEVNULL, stderr=open(prom_log, "w"), stdin=subprocess.DEVNULL)
            entry = ("prometheus", p, prom_log)
            procs.append(entry)
            api = f"http://127.0.0.1:{port}/api/v1"

            def ready():
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as r:
                    return r.status == 200
            try:
                wait_for(f"prometheus ready on 127.0.0.1:{port}", ready, procs)
                break
            except SystemExit as e:
                if p.poll() is not None and "address already in use" in tail(prom_log) and attempt < 2:
                    procs.remove(entry)
                    continue
                raise e
        print(f"prometheus pid {p.pid} on 127.0.0.1:{port}")

        def query(q):
            url = f"{api}/query?" + urllib.parse.urlencode({"query": q})
            with urllib.request.urlopen(url, timeout=5) as r:
                body = json.load(r)
            if body.get("status") != "success":
                raise ValueError(f"query {q!r}: {body}")
            return body["data"]["result"]

        def value_is(q, want):
            res = query(q)
            return res if res and all(float(s["value"][1]) == want for s in res) else None

        wait_for("up{job=\"uopd\"} == 1 through /api/v1/query", lambda: value_is('up{job="uopd"}', 1), procs)
        res = wait_for("uopd_workers_up == 1 through /api/v1/query",
                       lambda: value_is('uopd_workers_up{job="uopd"}', 1), procs)
        print("queried through Prometheus:", json.dumps(res))

        # Every rule evaluated against the scraped series, none with an error.
        def rules_evaluated():
            with urllib.request.urlopen(f"{api}/rules", timeout=5) as r:
                groups = json.load(r)["data"]["groups"]
            rs = [x for g in groups for x in g["rules"]]
            if not rs:
                raise SystemExit(f"FAIL: prometheus loaded no rules from {rules}\n{tail(prom_log)}")
            return None if any(x.get("health") == "unknown" for x in rs) else rs
        rs = wait_for(f"every alert rule of {rules} evaluated", rules_evaluated, procs)
        bad = [f"{x['name']}: {x.get('health')} {x.get('lastError', '')}" for x in rs if x.get("health") != "ok"]
        if bad:
            raise SystemExit("FAIL: alert rules failing on real data:\n  " + "\n  ".join(bad))
        print(f"{len(rs)} alert rules evaluated: ok")

        # The metrics those rules use are series Prometheus has stored from uopd.
        used = {re.sub(r"_(bucket|sum|count)$", "", m)
                for x in rs for m in re.findall(r"\b(uopd_[a-z0-9_]+)\b", x["query"])}
        lazy = {"uopd_requests_total"}  # a labelled family: series appear once a request has ended

        def all_stored():
            with urllib.request.urlopen(f"{api}/label/__name__/values", timeout=5) as r:
                stored = {re.sub(r"_(bucket|sum|count)$", "", n) for n in json.load(r)["data"]}
            missing = sorted(used - stored - lazy)
            if missing:  # wait_for reports the last error
                raise ValueError(f"not stored: {', '.join(missing)}")
            return True
        wait_for(f"the metrics the alert rules use ({', '.join(sorted(used))}) stored by Prometheus",
                 all_stored, procs)
        print("metrics the alert rules use, all stored:", ", ".join(sorted(used)))

        # With its worker up, uopd is neither down nor workerless: an alert pending from a
        # scrape before the worker came up must clear.
        healthy = ("UopdDown", "UopdNoWorkers", "UopdWorkersDown")
        wait_for(f"no {'/'.join(healthy)} alert pending or firing for a healthy uopd",
                 lambda: not {a["labels"]["alertname"] for a in query("ALERTS")} & set(healthy), procs)
        print("PASS")
        return 0
    finally:
        for name, proc, _ in reversed(procs):
            stop(proc, name)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
