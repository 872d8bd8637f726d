"""Runs of the examples/ graphs: the same outputs as the C++ client (`uop run ... --out`)
on the same server, and as numpy where the graph is small enough to restate; inputs
inline, as buffers, and uploaded for being large; outputs inline, kept, and streamed down
for being over the server's inline limit; compile, explain, profile and stats."""
import numpy as np
import pytest

import uopd
from conftest import rng_array, uop
from uopd import graphs

EXAMPLES = {  # graph: its inputs (flat, as the graph's BUFFERs / PARAMs hold them)
    "elementwise.json": {"a": 12, "b": 12},
    "matmul.json": {"A": 12, "B": 15},
    "reduction.json": {"x": 32},
    "kernel_sink.json": {"in": 16},
}


def uop_outputs(uop_binary, server, graph, inputs, names, tmp_path):
    """What `uop run` writes for the outputs `names`, given the same inputs."""
    args = ["run", str(graph), f"--server={server.address}"]
    for name, a in inputs.items():
        np.save(tmp_path / f"in_{name}.npy", a)
        args.append(f"--in={name}={tmp_path / f'in_{name}.npy'}")
    for name in names:
        args.append(f"--out={name}={tmp_path / f'out_{name}.npy'}")
    uop(uop_binary, *args)
    return {name: np.load(tmp_path / f"out_{name}.npy") for name in names}


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_examples_match_the_cpp_client(session, server, uop_binary, examples, tmp_path, example):
    inputs = {n: rng_array((k,), seed=i) for i, (n, k) in enumerate(EXAMPLES[example].items())}
    got = session.run(examples / example, inputs)
    assert got, "no outputs"
    want = uop_outputs(uop_binary, server, examples / example, inputs, list(got), tmp_path)
    for name, arr in got.items():
        assert arr.dtype == want[name].dtype and arr.shape == want[name].shape, name
        np.testing.assert_array_equal(arr, want[name], err_msg=name)


def test_elementwise_against_numpy(session, examples):
    a, b = rng_array((12,), seed=5), rng_array((12,), seed=6)
    out = session.run(examples / "elementwise.json", a=a, b=b)["out"]
    np.testing.assert_allclose(out, np.maximum(a.reshape(3, 4) + b.reshape(3, 4) * 1.5, 0), rtol=1e-6)
    # Bound by wire index (the BUFFER nodes' places in the graph: a is node 2, b node 4).
    np.testing.assert_array_equal(session.run(examples / "elementwise.json", {2: a, 4: b})["out"], out)


def test_graph_forms(session, examples, tmp_path):
    """A path (.json, .uopb, neither), the file's bytes, the JSON text, the message, its
    binary encoding, and a uopd.Graph of each."""
    path = examples / "elementwise.json"
    msg = graphs.read_file(path)
    (tmp_path / "g.uopb").write_bytes(msg.SerializeToString())
    (tmp_path / "g.bin").write_bytes(msg.SerializeToString())
    (tmp_path / "g.txt").write_text(path.read_text())
    a, b = rng_array((12,), seed=7), rng_array((12,), seed=8)
    want = session.run(path, a=a, b=b)["out"]
    forms = [str(path), path.read_bytes(), path.read_text(), msg, msg.SerializeToString(), tmp_path / "g.uopb",
             tmp_path / "g.bin", tmp_path / "g.txt"]
    for g in forms + [uopd.Graph(f) for f in forms]:
        np.testing.assert_array_equal(session.run(g, a=a, b=b)["out"], want)


def big_graph(examples, tmp_path):
    """elementwise.json over 300,000 floats a tensor (1.2 MB: over the 1 MiB inline input
    limit and the fixture's 64 KiB inline output limit), as uop_cli_test.sh makes it."""
    text = (examples / "elementwise.json").read_text()
    text = text.replace('"size": "12"', '"size": "300000"').replace('{"i": "3"}, {"i": "4"}', '{"i": "600"}, {"i": "500"}')
    p = tmp_path / "big.json"
    p.write_text(text)
    return p


def test_large_inputs_and_outputs_stream(session, client, server, uop_binary, examples, tmp_path):
    g = big_graph(examples, tmp_path)
    a, b = rng_array((300000,), seed=9), rng_array((300000,), seed=10)
    before = client.stats()
    got = session.run(g, a=a, b=b)["out"]
    assert got.shape == (600, 500)
    np.testing.assert_array_equal(got, uop_outputs(uop_binary, server, g, {"a": a, "b": b}, ["out"], tmp_path)["out"])
    # The client freed what it uploaded for the inputs and what the server kept of the output.
    after = client.stats()
    assert after.buffers == before.buffers


def test_kept_outputs_are_buffers(session, examples):
    a, b = rng_array((12,), seed=11), rng_array((12,), seed=12)
    want = session.run(examples / "elementwise.json", a=a, b=b)["out"]
    kept = session.run(examples / "elementwise.json", a=a, b=b, keep_outputs=True)["out"]
    assert isinstance(kept, uopd.Buffer) and kept.shape == (3, 4) and kept.dtype == "float32"
    np.testing.assert_array_equal(kept.numpy(), want)
    # A kept output (3x4) feeds the next run as its 12-element input, without a round trip.
    again = session.run(examples / "elementwise.json", a=kept, b=session.put(b))["out"]
    np.testing.assert_allclose(again, np.maximum(want + b.reshape(3, 4) * 1.5, 0), rtol=1e-6)


def test_execute_reports_kernels_and_timings(session, examples):
    a, b = rng_array((12,), seed=13), rng_array((12,), seed=14)
    session.run(examples / "elementwise.json", a=a, b=b)
    r = session.execute(examples / "elementwise.json", a=a, b=b)
    assert r.kernels and all(k.status in ("hit", "coalesced") for k in r.kernels)
    assert r.kernels[0].describe_cache().startswith(("hit", "coalesced"))
    assert r.device == "CPU:0" and r.run_ms >= 0 and set(r.outputs) == {"out"}


def test_compile_explain_profile_stats(session, client, examples):
    g = examples / "matmul.json"
    c = session.compile(g)
    assert c.kernels and len(c.graph_digest) == 64
    again = client.compile(g, include_source=True)
    assert [k.digest for k in again.kernels] == [k.digest for k in c.kernels]
    assert all(k.status == "hit" for k in again.kernels) and "define" in again.kernels[0].source
    text = session.explain(g, stage="linearize")
    assert text.startswith("=== linearize")
    assert "=== " in client.explain(g)
    with pytest.raises(uopd.InvalidArgument):
        session.explain(g, stage="no-such-stage")
    prof = session.profile(g, A=rng_array((12,)), B=rng_array((15,)))
    assert prof and all(p.launches >= 1 and p.total_ms >= 0 for p in prof)
    assert uopd.profile_table(prof).splitlines()[0].split()[:2] == ["kernel", "launches"]
    st = client.stats()
    assert session.stats().sessions == st.sessions
    assert st.kernels_run > 0 and st.launches_timed >= 1 and st.sessions >= 1
    assert {w.device for w in st.workers} >= {"CPU:0", "CPU:1"}
    assert st.search == "heuristic"  # the fixture's uopd runs with the default --search


def test_stats_has_every_counter_uopd_sends():
    # A field StatsResponse gains must reach Python's Stats too (the schedule search's were
    # missing for a while): every one of the message's fields is one of the dataclass's.
    import dataclasses
    from uopd._stubs import pb
    have = {f.name for f in dataclasses.fields(uopd.Stats)}
    assert [f.name for f in pb.StatsResponse.DESCRIPTOR.fields if f.name not in have] == []


def test_session_on_another_device(client, examples):
    with client.session(["CPU:1"]) as s:
        assert s.devices == ["CPU:1"]
        r = s.execute(examples / "reduction.json", x=np.ones(32, np.float32))
        assert r.device == "CPU:1"
        assert np.asarray(r.outputs["sumsq"]).sum() == pytest.approx(32.0)


def test_a_session_grows_onto_the_devices_it_is_asked_to_use(client, examples):
    """One session, buffers and runs on two devices: a Run names the device a single-device
    graph runs on; its bound buffers must live there, and a device the server lacks is
    refused naming it."""
    with client.session(["CPU:0"]) as s:
        x = np.arange(32, dtype=np.float32)
        on1 = s.put(x, device="CPU:1")
        assert on1.device == "CPU:1"
        r = s.execute(examples / "reduction.json", x=on1, device="CPU:1", keep_outputs=True)
        assert r.device == "CPU:1"
        out = r.outputs["sumsq"]
        assert out.device == "CPU:1"
        assert np.asarray(out.numpy()).sum() == pytest.approx(float((x * x).sum()))
        # A CPU:1 buffer bound to a Run on the session's first device is refused by name.
        with pytest.raises(uopd.InvalidArgument, match="on CPU:1; the graph wants .* on CPU:0"):
            s.execute(examples / "reduction.json", x=on1)
        with pytest.raises(uopd.Unavailable, match="device CPU:9"):
            s.execute(examples / "reduction.json", x=x, device="CPU:9")
        with pytest.raises(uopd.Unavailable, match="device CPU:9"):
            s.put(x, device="CPU:9")
        # The buffers on both devices stay usable.
        on0 = s.put(x)
        assert np.array_equal(on0.numpy(), x) and np.array_equal(on1.numpy(), x)


def test_closed_session_frees_its_buffers(client):
    before = client.stats().buffers
    s = client.session()
    s.put(np.zeros(100, np.float32))
    assert client.stats().buffers == before + 1
    s.close()
    assert client.stats().buffers == before
    with pytest.raises(uopd.NotFound):
        s.put(np.zeros(1, np.float32))


def test_json_graph_format_is_protobuf_json(examples):
    msg = graphs.read_file(examples / "matmul.json")
    assert '"op": "BUFFER"' in graphs.to_json(msg).replace("\n", "")
    assert graphs.from_bytes(graphs.to_json(msg).encode()) == msg


def test_a_kept_output_bound_to_a_session_buffer_is_that_buffer(session, examples):
    """A kernel-level graph writes its output PARAM in place: kept, the output is answered
    as the bound buffer itself, not a second id for the same memory (whose free would free
    the caller's buffer); the tinygrad bridge relies on this."""
    x = rng_array((16,), seed=7)
    out, inp = session.empty("float32", (16,)), session.put(x)
    got = session.execute(examples / "kernel_sink.json", {0: out, 1: inp}, keep_outputs=True)
    kept = got.outputs["out"]
    assert isinstance(kept, uopd.Buffer) and kept.id == out.id
    assert got.outputs["in"].id == inp.id  # every PARAM is a bound buffer: none gets a second id
    np.testing.assert_allclose(out.numpy(), (x + 1) ** 2, rtol=1e-6)
    again = session.execute(examples / "kernel_sink.json", {0: out, 1: session.put(x * 2)}, keep_outputs=True)
    assert again.outputs["out"].id == out.id
    np.testing.assert_allclose(out.numpy(), (x * 2 + 1) ** 2, rtol=1e-6)
    out.free()
    with pytest.raises(uopd.NotFound):
        kept.numpy()


def test_a_held_graph_is_named_by_its_digest_and_sent_again_when_let_go(session, examples):
    """execute(hold=True): the first Run sends the graph and the session keeps it; later
    Runs send only the digest and the bindings (the request shrinks by the graph's size)
    and answer the same; a digest the server no longer holds is answered by sending the
    graph again."""
    graph = uopd.Graph(examples / "elementwise.json")
    a, b = rng_array((12,), seed=40), rng_array((12,), seed=41)
    want = np.maximum(a.reshape(3, 4) + b.reshape(3, 4) * 1.5, 0)
    sizes = []
    execute = session.client._execute

    async def measuring(call):
        sizes.append((getattr(call, "method", ""), len(getattr(call, "request", b"") or b"")))
        return await execute(call)

    session.client._execute = measuring
    try:
        first = session.execute(graph, a=a, b=b, hold=True)
        second = session.execute(graph, a=a, b=b, hold=True)
        session._held[graph.data] = "0" * 64  # as if the server had let it go
        third = session.execute(graph, a=a, b=b, hold=True)
    finally:
        session.client._execute = execute
    for r in (first, second, third):
        np.testing.assert_allclose(r.outputs["out"], want, rtol=1e-6)
    assert len(first.graph_digest) == 64 and second.graph_digest == first.graph_digest == third.graph_digest
    runs = [n for m, n in sizes if m == "Run"]
    assert len(runs) == 4, sizes  # the third: its digest refused, then the graph again
    assert runs[1] <= runs[0] - len(graph.data) + 70, runs  # the digest (64 hex digits) for the graph
    assert runs[3] == runs[0]
    assert session._held[graph.data] == first.graph_digest
    # Nine graphs taking turns: the record keeps the server's last 8, so the first is sent
    # whole again, and never named by a digest the server has dropped.
    others = [uopd.Graph(_scaled(graph, 2.0 + i)) for i in range(8)]
    sizes.clear()
    session.client._execute = measuring
    try:
        for g in others + [graph]:
            session.execute(g, a=a, b=b, hold=True)
    finally:
        session.client._execute = execute
    assert graph.data in session._held and others[0].data not in session._held and len(session._held) == 8
    assert [m for m, _ in sizes].count("Run") == 9, sizes  # no refused digest among them


def _scaled(graph, k):
    """The graph with its first float constant replaced by k (another graph, another digest)."""
    from uopd._stubs import ir
    m = graph.message
    for n in m.nodes:
        if n.op == ir.CONST and n.dtype.scalar == ir.DType.FLOAT32:
            n.const_value.f = k
            return m
    raise AssertionError("no float constant")
