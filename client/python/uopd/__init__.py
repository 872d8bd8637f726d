"""uopd's Python client: sessions, buffers and runs of UOp graphs, and ONNX / PyTorch
models held by the server, over uopd's gRPC API (proto/uopd.proto). Pure Python: grpcio,
protobuf and numpy; no compiler, LLVM or CUDA here. uopd.aio is the asyncio flavour.

    import uopd
    with uopd.connect() as client, client.session() as s:
        out = s.run("examples/elementwise.json", a=a, b=b)["out"]
"""
import pkgutil

# The generated stubs (uopd._proto) live in the build tree (client/python/CMakeLists.txt);
# with both client/python and build/<preset>/client/python on sys.path, this package
# spans the two directories. An installed package has them inside.
__path__ = pkgutil.extend_path(__path__, __name__)

from uopd.client import DEFAULT_ADDRESS, TLS, Client, connect  # noqa: E402
from uopd.embedded import EmbeddedServer, find_uopd  # noqa: E402
from uopd.errors import (  # noqa: E402
    Aborted, AlreadyExists, Cancelled, DataLoss, DeadlineExceeded, Error, FailedPrecondition, Internal,
    InvalidArgument, NotFound, OutOfRange, PermissionDenied, ResourceExhausted, Unauthenticated, Unavailable,
    Unimplemented, Unknown)
from uopd.graphs import Graph  # noqa: E402
from uopd.models import Model, from_torch  # noqa: E402
from uopd.results import (  # noqa: E402
    CompileResult, ExplainStage, Kernel, KernelProfile, RunResult, Stats, TensorInfo, WorkerStatus, profile_table)
from uopd.session import Buffer, Session  # noqa: E402

__all__ = [
    "DEFAULT_ADDRESS", "TLS", "Client", "connect", "EmbeddedServer", "find_uopd", "Graph", "Session", "Buffer", "Model",
    "from_torch", "CompileResult", "ExplainStage", "Kernel", "KernelProfile", "RunResult", "Stats", "TensorInfo",
    "WorkerStatus", "profile_table", "Error", "Aborted", "AlreadyExists", "Cancelled", "DataLoss",
    "DeadlineExceeded", "FailedPrecondition", "Internal", "InvalidArgument", "NotFound", "OutOfRange",
    "PermissionDenied", "ResourceExhausted", "Unauthenticated", "Unavailable", "Unimplemented", "Unknown",
]
