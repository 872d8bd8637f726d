"""The fixtures of the Python client's tests: one real uopd with two CPU workers on a free
loopback port for the whole run (started by uopd.EmbeddedServer: ready when it prints its
LISTENING line; stopped by its PID at the end), and the paths the build passes in
(client/python/CMakeLists.txt): $UOPD_BINARY, $UOP_BINARY, $UOPD_EXAMPLES, $UOPD_README."""
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import uopd

REPO = Path(__file__).resolve().parents[3]


def _path(env: str, default: Path) -> Path:
    p = Path(os.environ.get(env) or default)
    if not p.exists():
        pytest.exit(f"{p} is missing (set ${env}, or build it)", returncode=1)
    return p


@pytest.fixture(scope="session")
def uopd_binary() -> str:
    return str(_path("UOPD_BINARY", REPO / "build/release/server/uopd"))


@pytest.fixture(scope="session")
def uop_binary() -> str:
    return str(_path("UOP_BINARY", REPO / "build/release/client/uop"))


@pytest.fixture(scope="session")
def examples() -> Path:
    return _path("UOPD_EXAMPLES", REPO / "examples")


@pytest.fixture(scope="session")
def server(uopd_binary, tmp_path_factory):
    """uopd with two embedded CPU workers and a disk cache of its own. Outputs over 64 KiB
    are not returned inline (--max-inline-output-bytes), so the tests also see outputs kept
    by the server and streamed down by the client."""
    cache = tmp_path_factory.mktemp("cache")
    srv = uopd.EmbeddedServer(uopd_binary, ["--workers=2", f"--cache-dir={cache}", "--max-inline-output-bytes=65536"])
    yield srv
    srv.stop()
    with pytest.raises(ProcessLookupError):  # stopped and reaped: no such process any more
        os.kill(srv.pid, 0)


@pytest.fixture(scope="session")
def client(server):
    c = uopd.connect(server.address)
    yield c
    c.close()


@pytest.fixture
def session(client):
    with client.session() as s:
        yield s


def uop(uop_binary: str, *args: str) -> str:
    """The C++ client's `uop ARGS...`: its stdout; the test fails with its output otherwise."""
    r = subprocess.run([uop_binary, *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"uop {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def rng_array(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def onnx_mlp(w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, rows: object = "rows") -> bytes:
    """An ONNX model y = Relu(x @ w1 + b1) @ w2 (as tests/e2e/models_test.cc's mlp), x of
    shape (rows, w1.shape[0]): rows a number, or a name to be fixed by input_shapes at
    load; the weights are initializers. Its numpy reference is one line. Encoded here
    with uopd.wire, protobuf field by field (onnx.proto: ModelProto, GraphProto,
    NodeProto, TensorProto, ValueInfoProto), so no onnx package is needed."""
    from uopd.wire import bytes_field as msg, packed_field, uint_field

    def tensor(name, a):  # TensorProto: dims 1, data_type 2 (FLOAT = 1), name 8, raw_data 9
        return packed_field(1, a.shape) + uint_field(2, 1) + msg(8, name.encode()) + msg(9, a.astype("<f4").tobytes())

    def value_info(name, dims):  # ValueInfoProto: name 1, type 2 -> tensor_type 1 -> elem_type 1, shape 2
        shape = b"".join(msg(1, uint_field(1, d) if isinstance(d, int) else msg(2, d.encode())) for d in dims)
        return msg(1, name.encode()) + msg(2, msg(1, uint_field(1, 1) + msg(2, shape)))

    def node(op, inputs, output):  # NodeProto: input 1, output 2, op_type 4
        return b"".join(msg(1, i.encode()) for i in inputs) + msg(2, output.encode()) + msg(4, op.encode())

    nodes = [node("MatMul", ["x", "w1"], "h"), node("Add", ["h", "b1"], "hb"), node("Relu", ["hb"], "r"),
             node("MatMul", ["r", "w2"], "y")]
    graph = (b"".join(msg(1, n) for n in nodes) + msg(2, b"mlp") +
             b"".join(msg(5, tensor(n, a)) for n, a in (("w1", w1), ("b1", b1), ("w2", w2))) +
             msg(11, value_info("x", [rows, w1.shape[0]])) + msg(12, value_info("y", [rows, w2.shape[1]])))
    # ModelProto: ir_version 1, graph 7, opset_import 8 (domain "", version 13)
    return uint_field(1, 8) + msg(7, graph) + msg(8, uint_field(2, 13))
