"""Failures as exceptions with the gRPC code and uopd's message: a malformed graph, an
unknown buffer or session, a wrong dtype, a dead server, bad files here."""
import numpy as np
import pytest

import uopd
from conftest import rng_array
from uopd import graphs


def test_malformed_graph_is_invalid_argument_with_uopds_message(session, examples):
    g = graphs.read_file(examples / "elementwise.json")
    add = next(n for n in g.nodes if n.op == uopd._stubs.ir.ADD)
    del add.src[1:]  # ADD with one source
    with pytest.raises(uopd.InvalidArgument) as e:
        session.run(g, a=rng_array((12,)), b=rng_array((12,)))
    assert e.value.code.name == "INVALID_ARGUMENT"
    assert "ADD" in e.value.message and "source" in e.value.message, e.value.message
    # The server keeps serving.
    assert session.run(examples / "elementwise.json", a=rng_array((12,)), b=rng_array((12,)))["out"].shape == (3, 4)


def test_a_source_index_ahead_is_refused(session, examples):
    g = graphs.read_file(examples / "elementwise.json")
    g.nodes[2].src[0] = 99
    with pytest.raises(uopd.InvalidArgument, match="node"):
        session.run(g, a=rng_array((12,)), b=rng_array((12,)))


def test_unknown_buffer_is_not_found(session, examples):
    buf = session.put(rng_array((12,)))
    buf.id = "0" * 32
    with pytest.raises(uopd.NotFound) as e:
        session.run(examples / "elementwise.json", a=buf, b=rng_array((12,)))
    assert e.value.code.name == "NOT_FOUND" and buf.id in e.value.message, e.value.message


def test_unknown_session_is_not_found(client):
    s = uopd.Session(client, "f" * 32, ["CPU:0"])
    with pytest.raises(uopd.NotFound):
        s.put(np.zeros(1, np.float32))


def test_wrong_dtype_is_invalid_argument(session, examples):
    with pytest.raises(uopd.InvalidArgument) as e:
        session.run(examples / "elementwise.json", a=np.arange(12, dtype=np.int32), b=rng_array((12,)))
    assert "int32" in e.value.message and "float32" in e.value.message, e.value.message


def test_wrong_size_and_unknown_input(session, examples):
    with pytest.raises(uopd.InvalidArgument, match="12 x float32"):
        session.run(examples / "elementwise.json", a=rng_array((13,)), b=rng_array((12,)))
    with pytest.raises(uopd.InvalidArgument, match="nope"):
        session.run(examples / "elementwise.json", a=rng_array((12,)), b=rng_array((12,)), nope=rng_array((12,)))
    with pytest.raises(uopd.InvalidArgument, match="not bound"):
        session.run(examples / "elementwise.json", a=rng_array((12,)))
    # Inputs by wire index: one past uint32 is refused here, not sent cut to 32 bits.
    for index in (-1, 1 << 32):
        with pytest.raises(uopd.InvalidArgument, match="wire index"):
            session.run(examples / "elementwise.json", {index: rng_array((12,))})


def test_dead_server_is_unavailable(uopd_binary, examples):
    srv = uopd.EmbeddedServer(uopd_binary, ["--workers=1", "--cache-dir="])
    c = uopd.connect(srv.address, deadline=20)
    s = c.session()
    srv.stop()
    with pytest.raises(uopd.Unavailable):
        s.run(examples / "elementwise.json", a=rng_array((12,)), b=rng_array((12,)))
    with pytest.raises(uopd.Unavailable, match=srv.address):
        uopd.connect(srv.address, connect_timeout=0.5)
    c.close()


def test_files_and_options_checked_here(session, examples, tmp_path):
    with pytest.raises(uopd.NotFound, match="missing.json"):
        session.run(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"nodes": [{"op": "NO_SUCH_OP"}]}')
    with pytest.raises(uopd.InvalidArgument, match="bad.json: the text is not uop.v1.Graph JSON"):
        session.run(bad)
    with pytest.raises(uopd.InvalidArgument, match="unknown target"):
        session.compile(examples / "matmul.json", target="tpu")
    with pytest.raises(uopd.InvalidArgument, match="exclude"):
        uopd.connect("127.0.0.1:1", embedded=True)
    with pytest.raises(uopd.NotFound, match="cannot open"):
        uopd.connect("127.0.0.1:1", tls={"ca": str(tmp_path / "none.pem")})
    assert issubclass(uopd.InvalidArgument, uopd.Error) and issubclass(uopd.Unavailable, uopd.Error)
