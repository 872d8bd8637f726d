#!/usr/bin/python3
"""bench_python: the Python client (client/python) against the C++ client, measured in the
same run on the same machine. Run by hand (not part of ctest: speed is measured, never
asserted), e.g. `cmake --build --preset release --target bench_python`, or

    PYTHONPATH=client/python:build/release/client/python /usr/bin/python3 tests/bench/bench_python.py \
        --build build/release

Figures (one JSON object on stdout, a summary on stderr):
  cached Run    p50 latency of a Run whose plan and kernel are cached (examples/elementwise.json,
                inputs inline), Python's Session.run vs `uop bench --json` (the C++ client
                library) on the same uopd, alternating rounds: ratio_vs_cpp_client (goal <= 1.3)
  upload / download
                256 MiB between a numpy array and a session buffer, best of 5, vs
                bench_service's BM_Upload/256MiB and BM_Download/256MiB (the C++ client,
                1 MiB chunks, its own uopd with the same flags): ratio_vs_cpp_client (goal >= 0.8)
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import uopd

REPO = Path(__file__).resolve().parents[2]
BULK = 256 << 20


def python_cached_run_p50_ms(session, graph, inputs, iterations):
    for _ in range(3):
        session.run(graph, inputs)
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        session.run(graph, inputs)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def cpp_cached_run_p50_ms(uop, address, graph_path, iterations):
    out = subprocess.run([uop, "bench", str(graph_path), f"--server={address}", f"--iterations={iterations}",
                          "--warmup=3", "--json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)["p50_ms"]


def python_transfers_gbps(session):
    data = np.random.default_rng(0).integers(0, 2**32, size=BULK // 4, dtype=np.uint32).view(np.float32)
    buf = session.empty("float32", (BULK // 4,))
    buf.write(data)  # warm-up
    up, down = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        buf.write(data, progress=False)
        up.append(time.perf_counter() - t0)
    back = buf.numpy()
    if not np.array_equal(back.view(np.uint32), data.view(np.uint32)):
        raise SystemExit("bench_python: the buffer reads back different")
    del back
    for _ in range(5):
        t0 = time.perf_counter()
        arr = buf.numpy(progress=False)
        down.append(time.perf_counter() - t0)
        del arr
    buf.free()
    return BULK / min(up) * 1e-9, BULK / min(down) * 1e-9


def cpp_transfers_gbps(bench_service):
    out = subprocess.run([bench_service, "--benchmark_filter=BM_(Upload|Download)/256MiB/", "--benchmark_format=json"],
                         check=True, capture_output=True, text=True).stdout
    rates = {b["name"].split("/")[0]: b["GB_per_s"] for b in json.loads(out)["benchmarks"]}
    return rates["BM_Upload"], rates["BM_Download"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(REPO / "build/release"), help="the build tree (uopd, uop, bench_service)")
    ap.add_argument("--iterations", type=int, default=300, help="timed Runs per round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating Python / C++ rounds of cached Runs")
    a = ap.parse_args()
    build = Path(a.build)
    uopd_bin, uop_bin = build / "server/uopd", build / "client/uop"
    bench_service = build / "tests/bench/bench_service"
    graph_path = REPO / "examples/elementwise.json"
    graph = uopd.Graph(graph_path)  # read and encoded once, as `uop bench` reads it once
    rng = np.random.default_rng(1)
    inputs = {"a": rng.standard_normal(12).astype(np.float32), "b": rng.standard_normal(12).astype(np.float32)}

    report = {}
    with tempfile.TemporaryDirectory(prefix="bench-python-") as cache:
        server = uopd.EmbeddedServer(str(uopd_bin), ["--workers=1", f"--cache-dir={cache}"])
        try:
            with uopd.connect(server.address) as client, client.session() as s:
                py, cpp = [], []
                for _ in range(a.rounds):  # alternating: a busy moment weighs on both alike
                    py.append(python_cached_run_p50_ms(s, graph, inputs, a.iterations))
                    cpp.append(cpp_cached_run_p50_ms(str(uop_bin), server.address, graph_path, a.iterations))
                report["cached_run"] = {"python_p50_ms": min(py), "cpp_p50_ms": min(cpp),
                                        "ratio_vs_cpp_client": min(py) / min(cpp)}
                up, down = python_transfers_gbps(s)
        finally:
            server.stop()
    if bench_service.exists():
        cpp_up, cpp_down = cpp_transfers_gbps(str(bench_service))
        report["upload_256MiB"] = {"python_GB_per_s": up, "cpp_GB_per_s": cpp_up, "ratio_vs_cpp_client": up / cpp_up}
        report["download_256MiB"] = {"python_GB_per_s": down, "cpp_GB_per_s": cpp_down,
                                     "ratio_vs_cpp_client": down / cpp_down}
    else:
        report["upload_256MiB"] = {"python_GB_per_s": up, "cpp_GB_per_s": None}
        report["download_256MiB"] = {"python_GB_per_s": down, "cpp_GB_per_s": None}
        print(f"bench_python: {bench_service} is not built: no C++ transfer peer", file=sys.stderr)
    for name, r in report.items():
        print(f"{name}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()),
              file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
