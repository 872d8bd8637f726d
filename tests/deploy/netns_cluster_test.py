#!/usr/bin/env python3
"""uopd across real hosts: each "host" a Linux network namespace, made and torn down by
deploy/cluster.sh --netns (veth pairs on a bridge, 10.77.0.0/24 inside the namespaces).

  netns_cluster_test.py REPO_ROOT BUILD_DIR [gloo|redis ...]

gloo: uopd on host s0 and a uop-worker on each of hosts w0, w1 (then w0, w1, w2: four
  hosts); uop-train-demo trains the spirals MLP data-parallel over CPU:0, CPU:1 (, CPU:2).
  The workers' addresses are on different hosts, so every allreduce runs over Gloo
  (uopd_collective_transport_total{transport} says so, and no shared-memory one ran). The
  same training (same seed, same steps) on one host, deploy/cluster.sh start (workers on
  127.0.0.1), runs over the shared-memory ring. Every step's loss must be the same double
  in both: with two members an allreduce adds two operands, and IEEE addition is
  commutative, so either order gives the same bits; with three, every buffer of the step
  is under 16 KiB, which Gloo's path reduces in the shm ring's own order
  (worker/collectives/gloo_allreduce.h), and the kernels are the same compiles.
redis: a redis-server on host redis, uopd on s0 (its workers on w0 and w1) and a second
  uopd on s1 (two embedded workers), both with the Redis tier. Each example graph runs on
  s0 first (every kernel compiled) then on s1: every kernel there is a hit from Redis,
  with s0's outputs. Then the training: on s0 (Gloo), then on s1 (shared memory), whose
  every kernel, from the first step on, is a Redis hit, with s0's losses.

Every process is a real one in its namespace (`ip netns identify` checks where each
runs). The namespaces' names are unique per run (the pid and a random tag), so parallel
runs do not clash, and they are deleted at the end whatever happened. Exits 77 (skipped)
when not root or when this machine cannot make network namespaces or a bridge in one.
"""
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile

SKIP = 77
STEPS = 12


class Skip(Exception):
    pass


def run(cmd, env=None, check=True, timeout=300):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}\n--- stdout:\n{p.stdout}\n--- stderr:\n{p.stderr}")
    return p


class Cluster:
    """One deploy/cluster.sh cluster (namespaced or on loopback) in its own state dir."""

    def __init__(self, repo, build, scratch, name, netns):
        self.script = os.path.join(repo, "deploy", "cluster.sh")
        self.build = build
        self.state = os.path.join(scratch, name)
        self.netns = netns
        self.prefix = f"uopt{os.getpid()}{secrets.token_hex(2)}{name[0]}"
        self.up = False

    def args(self, *cmd):
        return [self.script, *(["--netns"] if self.netns else []), *cmd, "--state", self.state]

    def start(self, *opts):
        cmd = (["up", "--prefix", self.prefix] if self.netns else ["start"]) + ["--bin", self.build, *opts]
        p = run(self.args(*cmd), check=False)
        self.up = True  # a failed start tears itself down; down() again is harmless
        if self.netns and p.returncode == 3:
            raise Skip(p.stderr.strip())
        if p.returncode != 0:
            raise AssertionError(f"cluster.sh {' '.join(cmd)} exited {p.returncode}\n{p.stdout}{p.stderr}{self.logs()}")
        self.env = dict(line.split("=", 1) for line in open(os.path.join(self.state, "cluster.env")).read().split("\n")
                        if "=" in line)
        self.env = {k: v.strip('"') for k, v in self.env.items()}

    def down(self):
        if self.up:
            run(self.args("down" if self.netns else "stop"), check=False)
            self.up = False

    def on(self, host, *cmd):
        """cmd on `host` (netns), or here (loopback), with UOPD_ADDRESS of its scheduler."""
        if self.netns:
            return run(self.args("exec", host) + ["--", *cmd])
        return run(list(cmd), env={**os.environ, "UOPD_ADDRESS": self.env["UOPD_ADDRESS"]})

    def metrics(self, host="s0", key="UOPD_METRICS"):
        code = ("import sys, urllib.request; "
                f"sys.stdout.write(urllib.request.urlopen('http://{self.env[key]}/metrics', timeout=30).read().decode())")
        return self.on(host, "/usr/bin/python3", "-c", code).stdout

    def namespace_of(self, pid):
        return run(["ip", "netns", "identify", pid]).stdout.strip()

    def namespaces(self):
        return [line.split()[0] for line in run(["ip", "netns", "list"]).stdout.splitlines()
                if line.startswith(self.prefix + "-")]

    def logs(self):
        out = []
        for f in sorted(os.listdir(self.state)) if os.path.isdir(self.state) else []:
            if f.endswith((".log", ".out")):
                with open(os.path.join(self.state, f), errors="replace") as fh:
                    out.append(f"--- {f}:\n" + "".join(fh.readlines()[-30:]))
        return "\n".join(out)


def counter(metrics, name, **labels):
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{re.escape(name)}{{{re.escape(want)}}} (\S+)$", metrics, re.M)
    assert m, f"{name}{{{want}}} is not on /metrics (" + " ".join(re.findall(r"^(uopd_\S+) ", metrics, re.M)) + ")"
    return float(m.group(1))


def losses(out):
    """Step -> loss as printed by uop-train-demo --exact (every digit of the double)."""
    got = {int(m.group(1)): m.group(2) for m in re.finditer(r"^\s*(\d+) (\S+) ", out, re.M)}
    assert sorted(got) == list(range(1, STEPS + 1)), f"not {STEPS} steps in:\n{out}"
    return got


def train_args(build, workers):
    return [os.path.join(build, "client", "uop-train-demo"), "--devices=" + ",".join(f"CPU:{i}" for i in range(workers)),
            f"--steps={STEPS}", "--seed=7", "--exact"]


def transports(cluster):
    m = cluster.metrics()
    return (counter(m, "uopd_collective_transport_total", transport="gloo"),
            counter(m, "uopd_collective_transport_total", transport="shm"))


def test_gloo(repo, build, scratch, clusters):
    for workers in (2, 3):
        hosts = Cluster(repo, build, scratch, f"gloo{workers}", netns=True)
        clusters.append(hosts)
        hosts.start("--workers", str(workers))
        # The scheduler on s0, one worker on each of w0, w1, ...
        assert hosts.namespace_of(hosts.env["UOPD_PID"]) == f"{hosts.prefix}-s0"
        pids = hosts.env["WORKER_PIDS"].split()
        assert [hosts.namespace_of(p) for p in pids] == [f"{hosts.prefix}-w{i}" for i in range(workers)], pids
        across = hosts.on("s0", *train_args(build, workers))
        assert "bit-identical" in across.stdout, across.stdout
        gloo, shm = transports(hosts)
        assert gloo >= STEPS and shm == 0, f"across hosts: {gloo} gloo and {shm} shm collectives"
        hosts.down()

        one = Cluster(repo, build, scratch, f"onehost{workers}", netns=False)
        clusters.append(one)
        one.start("--workers", str(workers))
        here = one.on(None, *train_args(build, workers))
        gloo, shm = transports(one)
        assert shm >= STEPS and gloo == 0, f"one host: {gloo} gloo and {shm} shm collectives"
        one.down()

        a, b = losses(across.stdout), losses(here.stdout)
        differ = [s for s in a if a[s] != b[s]]
        assert not differ, f"{workers} workers: losses differ at steps " + ", ".join(
            f"{s}: gloo {a[s]} vs shm {b[s]}" for s in differ)
        print(f"gloo: {STEPS} steps on {workers} worker hosts, losses {a[1]} -> {a[STEPS]}, "
              "the same bits as on one host's shm")


def test_redis(repo, build, scratch, clusters):
    c = Cluster(repo, build, scratch, "redis", netns=True)
    clusters.append(c)
    c.start("--workers", "2", "--redis", "--schedulers", "2")
    assert c.namespace_of(c.env["REDIS_PID"]) == f"{c.prefix}-redis"
    assert c.namespace_of(c.env["UOPD_PID"]) == f"{c.prefix}-s0"
    assert c.namespace_of(c.env["UOPD2_PID"]) == f"{c.prefix}-s1"
    uop = os.path.join(build, "client", "uop")
    graphs = sorted(os.path.join(repo, "examples", g) for g in os.listdir(os.path.join(repo, "examples"))
                    if g.endswith(".json"))
    assert graphs
    kernels = 0
    for g in graphs:
        first = c.on("s0", uop, "run", g, "--random", "1")
        second = c.on("s1", uop, "run", g, "--random", "1")
        k0 = re.findall(r"^kernel \S+ \S+: (.*)$", first.stderr, re.M)
        k1 = re.findall(r"^kernel \S+ \S+: (.*)$", second.stderr, re.M)
        assert k0 and all(s.startswith("miss") for s in k0), f"{g} on s0:\n{first.stderr}"
        assert len(k1) == len(k0) and all(s == "hit (redis)" for s in k1), f"{g} on s1:\n{second.stderr}"
        assert first.stdout == second.stdout and first.stdout, f"{g}: s1's outputs differ from s0's"
        kernels += len(k1)
    first = c.on("s0", *train_args(build, 2))
    second = c.on("s1", *train_args(build, 2))
    steps = re.findall(r"^\s*\d+ \S+ +(\d+) +(\d+) +(\d+) \|", second.stdout, re.M)
    assert len(steps) == STEPS and int(steps[0][0]) > 0, second.stdout
    assert all(misses == "0" for _, _, misses in steps), f"s1 compiled training kernels:\n{second.stdout}"
    assert steps[0][1] == steps[0][0], f"s1's first step is not all hits:\n{second.stdout}"
    assert losses(first.stdout) == losses(second.stdout), f"s0:\n{first.stdout}\ns1:\n{second.stdout}"
    m = c.metrics("s1", "UOPD2_METRICS")
    # Each distinct kernel once from Redis (then from s1's memory tier): the examples' and
    # the training's.
    redis_hits = counter(m, "uopd_cache_hits_total", tier="redis")
    assert redis_hits > kernels, f"s1: {redis_hits} Redis hits for {kernels} example kernels and the training's"
    assert re.search(r"^uopd_compiles_total 0$", m, re.M), "s1 compiled kernels: " + \
        " ".join(re.findall(r"^uopd_compiles_total .*$", m, re.M))
    print(f"redis: {len(graphs)} graphs, {kernels} kernels compiled on s0 and all hits from Redis on s1; "
          f"training on s1: its first step's {steps[0][0]} kernels all hits, none compiled, s0's losses")


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    repo, build = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    which = sys.argv[3:] or ["gloo", "redis"]
    if os.geteuid() != 0:
        print("SKIP: network namespaces need root (ip netns add)")
        return SKIP
    if not shutil.which("ip"):
        print("SKIP: ip(8) (iproute2) is not installed")
        return SKIP
    if "redis" in which and not shutil.which("redis-server"):
        print("SKIP: redis-server is not installed (deploy/setup.sh)")
        return SKIP
    # SIGTERM (ctest's timeout, a user) ends the run through the finally below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    scratch = tempfile.mkdtemp(prefix="uopd-netns-")
    clusters = []
    try:
        for t in which:
            {"gloo": test_gloo, "redis": test_redis}[t](repo, build, scratch, clusters)
    except Skip as e:
        print(f"SKIP: {e}")
        return SKIP
    except AssertionError as e:
        print(f"FAIL: {e}")
        for c in clusters:
            print(c.logs())
        return 1
    finally:
        for c in clusters:
            c.down()
        left = [ns for c in clusters if c.netns for ns in c.namespaces()]
        shutil.rmtree(scratch, ignore_errors=True)
        if left:
            print(f"FAIL: namespaces left after down: {left}")
            return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
