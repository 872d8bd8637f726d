#!/usr/bin/python3
"""bench_python: the Python client (client/python) against the C++ client, measured in the
same run on the same machine. Run by hand (not part of ctest: speed is measured, never
asserted), e.g. `cmake --build --preset release --target bench_python`, or

    PYTHONPATH=client/python:build/release/client/python /usr/bin/python3 tests/bench/bench_python.py \
        --build build/release

Figures (one JSON object on stdout, a summary on stderr):
  cached Run    p50 latency of a Run whose plan and kernel are cached (examples/elementwise.json,
                inputs inline), Python's Session.run vs `uop bench --json` (the C++ client
                library): ratio_vs_cpp_client (goal <= 1.3), the best round's p50 of each, and
                the median of the rounds' own ratios
  upload / download
                256 MiB between a numpy array and a session buffer, best of 5, vs
                bench_service's BM_Upload/256MiB and BM_Download/256MiB: ratio_vs_cpp_client
                (goal >= 0.8); grpcio_stream_GB_per_s is the same download through a bare
                grpcio stub with the chunks thrown away, the most grpcio gives Python

Like with like: both clients talk to a uopd started with the same flags (--workers=1, a
cache dir of its own); the cached Runs go to the very same uopd, whose plan and kernel
caches both hit. Each client opens one session and runs the same graph file in it every
time, with inputs of the same names, dtype and shapes sent inline (the C++ client's are
random values of its --random seed; an elementwise kernel's time does not depend on
them); each times one Run call from the caller's side, request encoding and answer
decoding included, and both read the graph file once (a uopd.Graph here, as `uop bench`
parses it once; the C++ client still encodes its graph into every request). Transfers
move the same 256 MiB in 1 MiB chunks (the default of both), to a buffer of one session
created once, downloads into a destination allocated inside the timing (a numpy array,
a std::string), after one untimed warm-up. Rounds alternate between the two clients (Python, then
C++, --rounds times), so a busy moment of a shared machine weighs on both alike; each
figure is the best round's.
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
    bare = grpcio_download_gbps(session.client.address, session, buf)
    buf.free()
    return BULK / min(up) * 1e-9, BULK / min(down) * 1e-9, bare


def grpcio_download_gbps(address, session, buf):
    """The same download through a bare grpcio stub on a channel of its own (the one
    option the client sets for downloads: read on the calling thread), the chunks
    discarded: what grpcio itself delivers to Python, the ceiling of any client on it."""
    import grpc
    import grpc.experimental
    from uopd._proto import uopd_pb2, uopd_pb2_grpc

    with grpc.insecure_channel(address, [(grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)]) as ch:
        stub = uopd_pb2_grpc.UopdStub(ch)
        req = uopd_pb2.DownloadRequest(session_id=session.id, buffer_id=buf.id, length=BULK)
        best = float("inf")
        for _ in range(6):  # the first a warm-up
            t0 = time.perf_counter()
            got = sum(len(c.data) for c in stub.Download(req, timeout=60))
            best = min(best, time.perf_counter() - t0) if got == BULK else best
        return BULK / best * 1e-9


def cpp_transfers_gbps(bench_service):
    out = subprocess.run([bench_service, "--benchmark_filter=BM_(Upload|Download)/256MiB/", "--benchmark_format=json"],
                         check=True, capture_output=True, text=True).stdout
    rates = {b["name"].split("/")[0]: b["GB_per_s"] for b in json.loads(out)["benchmarks"]}
    return rates["BM_Upload"], rates["BM_Download"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(REPO / "build/release"), help="the build tree (uopd, uop, bench_service)")
    ap.add_argument("--iterations", type=int, default=300, help="timed Runs per round")
    ap.add_argument("--rounds", type=int, default=5, help="alternating Python / C++ rounds of cached Runs")
    ap.add_argument("--transfer-rounds", type=int, default=2, help="alternating Python / C++ rounds of transfers")
    a = ap.parse_args()
    build = Path(a.build)
    uopd_bin, uop_bin = build / "server/uopd", build / "client/uop"
    bench_service = build / "tests/bench/bench_service"
    graph_path = REPO / "examples/elementwise.json"
    graph = uopd.Graph(graph_path)  # read and encoded once, as `uop bench` reads it once
    rng = np.random.default_rng(1)
    inputs = {"a": rng.standard_normal(12).astype(np.float32), "b": rng.standard_normal(12).astype(np.float32)}

    report = {}
    py, cpp, up, down, bare, cpp_up, cpp_down = [], [], [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-python-") as cache:
        server = uopd.EmbeddedServer(str(uopd_bin), ["--workers=1", f"--cache-dir={cache}"])
        try:
            with uopd.connect(server.address) as client, client.session() as s:
                for _ in range(a.rounds):  # alternating: a busy moment weighs on both alike
                    py.append(python_cached_run_p50_ms(s, graph, inputs, a.iterations))
                    cpp.append(cpp_cached_run_p50_ms(str(uop_bin), server.address, graph_path, a.iterations))
                for _ in range(a.transfer_rounds):
                    u, d, g = python_transfers_gbps(s)
                    up.append(u)
                    down.append(d)
                    bare.append(g)
                    if bench_service.exists():
                        u, d = cpp_transfers_gbps(str(bench_service))
                        cpp_up.append(u)
                        cpp_down.append(d)
        finally:
            server.stop()
    report["cached_run"] = {"python_p50_ms": min(py), "cpp_p50_ms": min(cpp), "ratio_vs_cpp_client": min(py) / min(cpp),
                            "median_round_ratio": statistics.median(p / c for p, c in zip(py, cpp))}
    for name, mine, peer in (("upload_256MiB", up, cpp_up), ("download_256MiB", down, cpp_down)):
        report[name] = {"python_GB_per_s": max(mine), "cpp_GB_per_s": max(peer) if peer else None}
        if peer:
            report[name]["ratio_vs_cpp_client"] = max(mine) / max(peer)
    report["download_256MiB"]["grpcio_stream_GB_per_s"] = max(bare)
    if not bench_service.exists():
        print(f"bench_python: {bench_service} is not built: no C++ transfer peer", file=sys.stderr)
    for name, r in report.items():
        print(f"{name}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()),
              file=sys.stderr)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
