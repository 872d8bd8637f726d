#!/usr/bin/python3
"""tinygrad on uopd against tinygrad's own CPU device, measured in the same run (by hand,
never in CI): a 1024 x 1024 float32 matmul, a conv forward (1 x 64 x 56 x 56, 64 3x3
filters, padding 1), an MLP train step (784 -> 256 -> 10, batch 64, SGD) as it is and under
TinyJit (`mlp_train_step_jit`: its kernels captured once and replayed, which on UOPD is one
Run per batch of kernels, uopd.tinygrad.graph), and the first
run of a fresh kernel (`fresh_kernel`: (a * c + b).relu().sum(1) over 256 x 256, c a constant
never used before, so each timed call schedules, compiles and runs a kernel neither
tinygrad's clang path nor uopd's caches have seen: tinygrad renders C and runs clang in
the process, uopd compiles on the server; warmup calls use fresh kernels too, to take
the process's own start out of the figure).

    PYTHONPATH=client/python:build/release/client/python:../shared/peers/tinygrad \\
        tests/bench/tinygrad/bench_tinygrad.py [--iterations 10 --warmup 3 --rounds 2] [--json]

It starts one uopd (build/release/server/uopd or $UOPD_BINARY, two CPU workers), then per
case alternates rounds of a DEV=CPU and a DEV=UOPD child process running the same tinygrad
code, and prints each device's p50 and min, ``ratio_vs_tinygrad_cpu`` (CPU's p50 / uopd's
p50: above 1, uopd is faster; the goal is at least 2) and the geometric mean of the ratios. A timed iteration is
the tinygrad call and its realize, synchronized; the warmup iterations take the compiles
(tinygrad's clang, uopd's cache misses) out of the figures.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CASES = ("matmul_1024", "conv2d_64x56x56", "mlp_train_step", "mlp_train_step_jit", "fresh_kernel")


def case(name):
    """A function running one iteration of the case, realized."""
    import numpy as np
    from tinygrad import Context, Tensor, TinyJit, nn
    rng = np.random.default_rng(0)
    f32 = lambda *s: Tensor(rng.standard_normal(s).astype(np.float32)).realize()
    if name == "matmul_1024":
        a, b = f32(1024, 1024), f32(1024, 1024)
        return lambda: (a @ b).realize()
    if name == "conv2d_64x56x56":
        x, w = f32(1, 64, 56, 56), f32(64, 64, 3, 3)
        return lambda: x.conv2d(w, padding=1).realize()
    if name in ("mlp_train_step", "mlp_train_step_jit"):
        x, y = f32(64, 784), Tensor(rng.integers(0, 10, 64).astype(np.int32)).realize()
        w1, w2 = f32(784, 256) * 0.05, f32(256, 10) * 0.05
        w1, w2 = w1.realize(), w2.realize()
        opt = nn.optim.SGD([w1, w2], lr=0.01)

        def step():
            with Context(TRAINING=1):
                opt.zero_grad()
                loss = (x @ w1).relu().matmul(w2).sparse_categorical_crossentropy(y)
                loss.backward()
                opt.step()
                return loss.realize()
        # As tinygrad's training scripts run a step: under TinyJit, which captures the step's
        # kernels on its second call and replays them from the third (the warmup covers both).
        return TinyJit(step) if name.endswith("_jit") else step
    if name == "fresh_kernel":
        a, b = f32(256, 256), f32(256, 256)
        seen = [time.time_ns() % 1000003]

        def fresh():
            seen[0] += 1  # a constant no earlier call (nor an earlier run, in all likelihood) used
            return (a * (1.0 + seen[0] * 1e-7) + b).relu().sum(1).realize()
        return fresh
    raise SystemExit(f"unknown case {name}")


def worker(name, warmup, iterations):
    from tinygrad import Device
    run = case(name)
    dev = Device[Device.DEFAULT]
    for _ in range(warmup):
        run()
    dev.synchronize()
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        run()
        dev.synchronize()
        times.append(time.perf_counter() - t0)
    print(json.dumps(times))


def child(env, dev, name, args):
    cmd = [sys.executable] + (["-m", "uopd.tinygrad"] if dev == "UOPD" else []) + \
        [__file__, "--worker", name, "--warmup", str(args.warmup), "--iterations", str(args.iterations)]
    r = subprocess.run(cmd, env=dict(env, DEV=dev), capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
    return json.loads(r.stdout.strip().splitlines()[-1]), None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker, args.warmup, args.iterations)
    import uopd
    binary = os.environ.get("UOPD_BINARY") or str(REPO / "build/release/server/uopd")
    with uopd.EmbeddedServer(binary, ["--workers=2"]) as srv:
        env = dict(os.environ, UOPD_ADDRESS=srv.address)
        rows = []
        for name in args.cases.split(","):
            times = {"CPU": [], "UOPD": []}
            error = None
            for _ in range(args.rounds):
                for dev in ("CPU", "UOPD"):
                    t, err = child(env, dev, name, args)
                    if err:
                        error = f"{dev}: {err}"
                    else:
                        times[dev] += t
            if error:
                rows.append({"case": name, "error": error})
                continue
            cpu, uo = statistics.median(times["CPU"]), statistics.median(times["UOPD"])
            rows.append({"case": name, "cpu_p50_ms": cpu * 1e3, "cpu_min_ms": min(times["CPU"]) * 1e3,
                         "uopd_p50_ms": uo * 1e3, "uopd_min_ms": min(times["UOPD"]) * 1e3,
                         "ratio_vs_tinygrad_cpu": cpu / uo})
    ratios = [r["ratio_vs_tinygrad_cpu"] for r in rows if "error" not in r]
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    if args.json:
        print(json.dumps({"rows": rows, "geomean_ratio": geomean}))
        return
    print(f"{'case':<18} {'cpu p50 ms':>11} {'cpu min':>9} {'uopd p50 ms':>12} {'uopd min':>9} {'ratio_vs_tinygrad_cpu':>22}")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:<18} refused/failed: {r['error']}")
        else:
            print(f"{r['case']:<18} {r['cpu_p50_ms']:>11.2f} {r['cpu_min_ms']:>9.2f} {r['uopd_p50_ms']:>12.2f} "
                  f"{r['uopd_min_ms']:>9.2f} {r['ratio_vs_tinygrad_cpu']:>22.3f}")
    if geomean:
        print(f"geometric mean ratio_vs_tinygrad_cpu: {geomean:.3f}")


if __name__ == "__main__":
    main()
