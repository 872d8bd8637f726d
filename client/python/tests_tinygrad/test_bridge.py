"""uopd.tinygrad against a real uopd: tinygrad's ops on the UOPD device against numpy,
buffer views, refusals naming the op, a program with no C compiler on PATH, a training
loop equal to tinygrad's own CPU device, and a second run of a program that is all cache
hits. (conftest.py: the server, and the skip when tinygrad is absent.)"""
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import uopd

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "mlp_train.py"


def rng(seed=0):
    return np.random.default_rng(seed)


@contextlib.contextmanager
def programs_run():
    """The UopdPrograms run inside the block, in order (each after its Run answered)."""
    from uopd.tinygrad import device
    seen = []
    run = device.UopdProgram.__call__

    def spy(self, *bufs, **kw):
        r = run(self, *bufs, **kw)
        seen.append(self)
        return r

    device.UopdProgram.__call__ = spy
    try:
        yield seen
    finally:
        device.UopdProgram.__call__ = run


@contextlib.contextmanager
def calls_made():
    """The client's calls made by this thread inside the block, counted by method (the
    device's freeing thread left out)."""
    import collections
    import uopd.client as uc
    calls = collections.Counter()
    execute = uc.Client._execute

    async def counting(self, call):
        if threading.current_thread() is threading.main_thread():
            calls[getattr(call, "method", type(call).__name__)] += 1
        return await execute(self, call)

    uc.Client._execute = counting
    try:
        yield calls
    finally:
        uc.Client._execute = execute


def test_elementwise_reduce_and_matmul_match_numpy(uopd_device):
    from tinygrad import Tensor
    a_np, b_np = rng(1).standard_normal((8, 16)).astype(np.float32), rng(2).standard_normal((8, 16)).astype(np.float32)
    w_np = rng(3).standard_normal((16, 4)).astype(np.float32)
    a, b, w = (Tensor(x, device="UOPD") for x in (a_np, b_np, w_np))
    close = lambda t, want, tol=1e-5: np.testing.assert_allclose(t.numpy(), want, rtol=tol, atol=tol)
    close(a + b * 2 - 1, a_np + b_np * 2 - 1)
    close(a / (b.abs() + 1), a_np / (np.abs(b_np) + 1))
    close(a.relu().sqrt(), np.sqrt(np.maximum(a_np, 0)))
    close(a.exp(), np.exp(a_np), 1e-4)
    close((a.abs() + 1).log(), np.log(np.abs(a_np) + 1), 1e-5)
    close(a.sin(), np.sin(a_np), 1e-5)
    close((a < b).where(a, b), np.where(a_np < b_np, a_np, b_np))
    close(a.sum(axis=1), a_np.sum(axis=1), 1e-4)
    close(a.max(axis=0), a_np.max(axis=0))
    close(a.mean(), a_np.mean(), 1e-5)
    close(a @ w, a_np @ w_np, 1e-4)
    i_np = rng(4).integers(-50, 50, (6, 5)).astype(np.int32)
    i = Tensor(i_np, device="UOPD")
    np.testing.assert_array_equal((i * 3 + 7).numpy(), i_np * 3 + 7)
    np.testing.assert_array_equal((i // 4).numpy(), i_np // 4)  # floor division: tinygrad's, decomposed
    np.testing.assert_array_equal((i % 7).numpy(), i_np % 7)
    np.testing.assert_array_equal((i > 0).any(axis=1).numpy(), (i_np > 0).any(axis=1))
    np.testing.assert_array_equal((i > -40).all(axis=0).numpy(), (i_np > -40).all(axis=0))
    np.testing.assert_array_equal(i.cast("float32").numpy(), i_np.astype(np.float32))


def test_views_of_a_realized_buffer_are_read_and_written(uopd_device):
    from tinygrad import Tensor
    t = Tensor(np.arange(12, dtype=np.float32), device="UOPD").realize()
    np.testing.assert_array_equal((t[3:9] + 1).numpy(), np.arange(3, 9) + 1)
    t[2:5] = Tensor(np.array([-1, -2, -3], np.float32), device="UOPD")  # a kernel storing into a view
    want = np.arange(12, dtype=np.float32)
    want[2:5] = [-1, -2, -3]
    np.testing.assert_array_equal(t.numpy(), want)
    np.testing.assert_array_equal(t.bitcast("int32").numpy(), want.view(np.int32))


def test_tinyjit_replays_its_captured_kernels_on_new_inputs(uopd_device):
    from tinygrad import Tensor, TinyJit

    @TinyJit
    def f(a, b):
        return (a @ b + 1).relu().realize()

    for i in range(4):  # the first runs capture, the later ones replay
        a_np, b_np = rng(10 + i).standard_normal((8, 8)).astype(np.float32), rng(20 + i).standard_normal((8, 8)).astype(np.float32)
        out = f(Tensor(a_np, device="UOPD"), Tensor(b_np, device="UOPD"))
        np.testing.assert_allclose(out.numpy(), np.maximum(a_np @ b_np + 1, 0), rtol=1e-5, atol=1e-5)


def test_a_jitted_training_step_replays_as_one_run(uopd_device):
    """A TinyJit SGD step (linear regression, its gradient by tinygrad's autograd) replays
    its kernels as one uopd Run each step (UopdGraph: one graph of CALLs), and its weights
    follow numpy's own SGD on the same data."""
    from tinygrad import Context, Tensor, TinyJit, nn
    from uopd.tinygrad import graph
    x_np = rng(30).standard_normal((32, 8)).astype(np.float32)
    y_np = (x_np @ rng(31).standard_normal((8, 1)) + 0.5).astype(np.float32)
    w_np = rng(32).standard_normal((8, 1)).astype(np.float32) * 0.1
    b_np = np.zeros(1, np.float32)
    x, y = Tensor(x_np, device="UOPD").realize(), Tensor(y_np, device="UOPD").realize()
    w, b = Tensor(w_np.copy(), device="UOPD"), Tensor(b_np.copy(), device="UOPD")
    lr = 0.1
    opt = nn.optim.SGD([w, b], lr=lr)

    @TinyJit
    def step(x, y):
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = ((x @ w + b - y) ** 2).mean()
            loss.backward()
            opt.step()
            return loss.realize()

    batches = []
    made = graph.UopdGraph.__init__

    def remember(self, *a, **k):
        made(self, *a, **k)
        batches.append(self)

    graph.UopdGraph.__init__ = remember
    try:
        for i in range(6):
            err = x_np @ w_np + b_np - y_np  # numpy's step, from the same weights
            w_np = w_np - lr * (2 / err.size) * (x_np.T @ err)
            b_np = b_np - lr * (2 / err.size) * err.sum(axis=0)
            with calls_made() as calls:
                step(x, y)
            np.testing.assert_allclose(w.numpy(), w_np, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(b.numpy(), b_np, rtol=1e-4, atol=1e-5)
    finally:
        graph.UopdGraph.__init__ = made
    assert batches and sum(g.batched for g in batches) >= 3, "the replays did not go as batches"
    assert sum(len(g.calls) for g in batches) >= 3, [len(g.calls) for g in batches]
    assert calls["Run"] == len(batches), dict(calls)  # one Run per batch in a replayed step


def test_kernels_travel_as_uopd_graphs(uopd_device):
    from tinygrad import Tensor
    from uopd._stubs import ir
    with programs_run() as seen:
        x = Tensor(np.arange(4, dtype=np.float32), device="UOPD")
        np.testing.assert_array_equal((x * x + 5).numpy(), [5, 6, 9, 14])
    assert seen, "no kernel ran on uopd"
    prg = seen[-1]
    sink = prg.graph.nodes[-1]
    assert sink.op == ir.SINK and sink.kernel_info.kernel  # a kernel-level graph, not source
    assert [k.status for k in prg.last.kernels] and all(k.status in ("hit", "miss", "coalesced") for k in prg.last.kernels)


def test_kernels_carry_tinygrads_kernel_names(uopd_device):
    """Each kernel is named in uopd (its graph's SINK, the kernels of the Run's answer) by
    tinygrad's name of it: its kind (E elementwise, r reduction) and loop sizes, in the
    characters of a function name; the default name "test" is none of them."""
    import re
    from tinygrad import Tensor
    with programs_run() as seen:
        a = Tensor(rng(5).standard_normal((12, 20)).astype(np.float32), device="UOPD")
        b = Tensor(rng(6).standard_normal((20, 7)).astype(np.float32), device="UOPD")
        (a * 3 + 1).realize()
        (a @ b).realize()
    names = [p.graph.nodes[-1].kernel_info.name for p in seen]
    assert len(names) == 2, names
    assert re.fullmatch(r"E_[0-9_]+", names[0]) and sorted(map(int, names[0].split("_")[1:])) in ([240], [12, 20]), names
    assert re.fullmatch(r"r_[0-9_]+", names[1]) and sorted(map(int, names[1].split("_")[1:])) == [7, 12, 20], names
    for p, name in zip(seen, names):
        assert [k.name for k in p.last.kernels] == [name]  # what uopd's profiles and stats show


def test_a_kernel_with_a_new_output_is_one_round_trip(uopd_device):
    """A realize whose output is a new buffer waits on its one Run alone: the Run makes the
    output (no CreateBuffer), and the buffer it replaces is freed off the caller's path."""
    from tinygrad import Tensor
    a = Tensor(rng(7).standard_normal((16, 16)).astype(np.float32), device="UOPD").realize()
    (a * 2).realize()  # compiled, and a's buffer made, before counting
    with calls_made() as calls:
        outs = [(a * 2).realize() for _ in range(3)]
    assert calls == {"Run": 3}, dict(calls)
    for o in outs:
        np.testing.assert_array_equal(o.numpy(), a.numpy() * 2)


def test_an_op_with_no_translation_is_refused_naming_it(uopd_device):
    from tinygrad import Tensor
    from tinygrad.uop.ops import Ops
    from uopd.tinygrad import device, translate
    asts = []
    orig = device.kernel_graph
    device.kernel_graph = lambda sink, *a: (asts.append(sink), orig(sink, *a))[1]
    try:
        (Tensor(np.ones(4, np.float32), device="UOPD") + 3).numpy()
    finally:
        device.kernel_graph = orig
    ast = asts[-1]
    add = next(u for u in ast.toposort() if u.op is Ops.ADD)
    bad = ast.substitute({add: add.replace(op=Ops.CUSTOMI, arg="{0}+{1}")})
    with pytest.raises(NotImplementedError, match="CUSTOMI"):
        translate.kernel_graph(bad)


def collectives_run(server) -> float:
    """uopd_collectives_total from the server's /metrics."""
    with urllib.request.urlopen(f"http://{server.metrics}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("uopd_collectives_total"):
                return float(line.split()[-1])
    raise AssertionError("uopd's /metrics has no uopd_collectives_total")


def test_a_tensor_sharded_over_two_uopd_devices(uopd_device, server):
    """UOPD and UOPD:1 are uopd's CPU:0 and CPU:1 in one session; a reduce over the shard
    axis is tinygrad's ALLREDUCE, run as uopd's: one collective between uopd's workers,
    no tinygrad copies between the devices."""
    from tinygrad import Device, Tensor
    a_np = rng(5).standard_normal((8, 6)).astype(np.float32)
    w_np = rng(6).standard_normal((6, 3)).astype(np.float32)
    a = Tensor(a_np).shard(("UOPD:0", "UOPD:1"), axis=0)
    w = Tensor(w_np).shard(("UOPD:0", "UOPD:1"))
    assert Device["UOPD:0"].session is Device["UOPD:1"].session
    assert [Device[d].uopd_device for d in a.device] == ["CPU:0", "CPU:1"]
    np.testing.assert_allclose((a * 2 + 1).numpy(), a_np * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose((a @ w).numpy(), a_np @ w_np, rtol=1e-5, atol=1e-5)
    for reduce, want in ((lambda t: t.sum(axis=0), a_np.sum(axis=0)), (lambda t: t.max(axis=0), a_np.max(axis=0))):
        before = collectives_run(server)
        with programs_run() as seen:
            got = reduce(a)
            got.realize()
        assert collectives_run(server) == before + 1
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
        # Each device's shard of the result: the whole reduction, replicated.
        for shard in got.uop.buffer.bufs:
            np.testing.assert_allclose(np.frombuffer(shard.as_memoryview(force_zero_copy=False), np.float32), want,
                                       rtol=1e-5, atol=1e-5)
        assert seen, "the partials are uopd kernels"


def test_a_dtype_with_no_translation_is_refused_naming_it(uopd_device):
    from tinygrad import Tensor, dtypes
    with pytest.raises(NotImplementedError, match="fp8e4m3"):
        Tensor([1.0, 2.0], device="UOPD").cast(dtypes.fp8e4m3).cast(dtypes.float32).numpy()
    np.testing.assert_array_equal((Tensor.ones(3, device="UOPD") + 1).numpy(), np.full(3, 2.0))  # it goes on serving


def test_a_variable_is_bound_to_each_value_it_takes(uopd_device):
    """A symbolic shape: one tinygrad kernel, run with the variable as the CONST of each value."""
    from tinygrad import Tensor, Variable
    x_np = np.arange(10, dtype=np.float32)
    t = Tensor(x_np, device="UOPD").realize()
    n = Variable("n", 1, 10)
    for v in (4, 7, 4, 10):
        assert t[:n.bind(v)].sum().item() == x_np[:v].sum()


PROGRAM = """
import json, shutil
import numpy as np
from tinygrad import Tensor
assert shutil.which("clang") is None and shutil.which("cc") is None and shutil.which("gcc") is None
a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
b = Tensor(np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2))
print(json.dumps({"mm": (a @ b).relu().tolist(), "sum": a.sum().item()}))
"""


def test_a_program_runs_with_no_c_compiler_on_path(uopd_env, tmp_path):
    prog, empty = tmp_path / "prog.py", tmp_path / "bin"
    prog.write_text(PROGRAM)
    empty.mkdir()
    env = dict(uopd_env, PATH=str(empty))  # no clang, cc, gcc, llvm: tinygrad renders and compiles nothing here
    r = subprocess.run([sys.executable, "-m", "uopd.tinygrad", str(prog)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    a, b = np.arange(12, dtype=np.float32).reshape(3, 4), np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2)
    np.testing.assert_allclose(got["mm"], np.maximum(a @ b, 0), rtol=1e-5, atol=1e-5)
    assert got["sum"] == 66.0


def train(env, dev, steps, shards=1):
    cmd = [sys.executable] + (["-m", "uopd.tinygrad"] if dev == "UOPD" else []) + [str(TRAIN), str(steps), str(shards)]
    r = subprocess.run(cmd, env=dict(env, DEV=dev), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"DEV={dev}: {r.stderr[-4000:]}"
    return np.array(json.loads(r.stdout.strip().splitlines()[-1])["losses"])


def test_training_loop_reaches_the_loss_of_tinygrads_cpu_device(uopd_env):
    if shutil.which("clang") is None:
        pytest.skip("tinygrad's CPU device needs clang (deploy/setup.sh installs it)")
    steps = 200
    on_uopd, on_cpu = train(uopd_env, "UOPD", steps), train(uopd_env, "CPU", steps)
    assert len(on_uopd) == len(on_cpu) == steps
    assert on_cpu[-1] < 0.5 * on_cpu[0]  # it learns: the comparison is not of two flat lines
    np.testing.assert_allclose(on_uopd, on_cpu, rtol=1e-4, atol=1e-6)


def test_sharded_training_reduces_its_gradients_on_uopds_workers(uopd_env, server):
    """The same loop data-parallel over UOPD and UOPD:1 (batch split, weights replicated):
    the losses of tinygrad's own CPU device sharded the same way, every weight gradient's
    allreduce a collective between uopd's workers."""
    if shutil.which("clang") is None:
        pytest.skip("tinygrad's CPU device needs clang (deploy/setup.sh installs it)")
    steps = 100
    before = collectives_run(server)
    on_uopd = train(uopd_env, "UOPD", steps, shards=2)
    collectives = collectives_run(server) - before
    on_cpu = train(uopd_env, "CPU", steps, shards=2)
    assert on_cpu[-1] < 0.5 * on_cpu[0]
    np.testing.assert_allclose(on_uopd, on_cpu, rtol=1e-4, atol=1e-6)
    # Four weights, each gradient one allreduce a step (the mean's sum over the batch rows
    # is a fifth): uopd ran them, not tinygrad's copies through the client.
    assert collectives >= 4 * steps, collectives


def test_a_second_run_of_a_program_is_all_cache_hits(uopd_env, server):
    with uopd.connect(server.address) as c, c.session() as s:
        train(uopd_env, "UOPD", 3)
        before = s.stats()
        train(uopd_env, "UOPD", 3)
        after = s.stats()
    hits = lambda s: s.cache_hits_memory + s.cache_hits_disk + s.cache_hits_redis
    assert after.kernels_run > before.kernels_run
    assert hits(after) > hits(before)
    assert (after.compiles, after.cache_misses) == (before.compiles, before.cache_misses)
