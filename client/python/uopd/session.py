"""Sessions and their buffers. A Session holds devices and buffers on the server; closing
it (close(), leaving its ``with`` block) frees them all there. A Buffer is a handle on one
buffer of a session: flat on the server, its dtype and shape kept here.

The methods build their RPCs with uopd.calls and run them through ``_drive``: blocking
here; uopd.aio's subclasses drive the same calls with awaits.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from uopd import calls, dtypes, errors, graphs, results, transfers
from uopd.graphs import GraphLike
from uopd.models import Model


class Buffer(calls.BufferRef):
    """A buffer of a session: ``numpy()`` downloads it, ``free()`` frees it on the server.
    Pass it as a run's input to bind it without sending its data again."""

    def __init__(self, session: "Session", buffer_id: str, scalar: int, shape: Tuple[int, ...], device: str):
        self.session = session
        self.id = buffer_id
        self.session_id = session.id
        self.scalar = scalar
        self.shape = tuple(shape)
        self.device = device

    @property
    def dtype(self) -> str:
        """uopd's name of its dtype ("float32", "bfloat16")."""
        return dtypes.name(self.scalar)

    @property
    def nbytes(self) -> int:
        return dtypes.header(f"buffer {self.id}", self.scalar, self.shape)[2]

    def numpy(self, progress: transfers.ProgressArg = None) -> np.ndarray:
        """Its data, streamed down in chunks, as an array of its dtype and shape (bfloat16
        without ml_dtypes: uint16 bits)."""
        s = self.session
        return s._drive(calls.buffer_array(s.id, self.id, self.scalar, self.shape, s._chunk_bytes, progress))

    def write(self, array: Any, progress: transfers.ProgressArg = None) -> None:
        """Overwrites its data with `array`, which must have its dtype and size."""
        s = self.session
        arr, scalar = dtypes.host_array(array, self.dtype)
        return s._drive(calls.upload(s.id, self.id, transfers.byte_view(arr), s._chunk_bytes, progress))

    def read_bytes(self, offset: int = 0, nbytes: Optional[int] = None) -> np.ndarray:
        """`nbytes` of its bytes from byte `offset` (default: to the end), as uint8."""
        s = self.session
        n = self.nbytes - offset if nbytes is None else nbytes
        return s._drive(calls.download(s.id, self.id, n, s._chunk_bytes, None, offset))

    def write_bytes(self, data: Any, offset: int = 0) -> None:
        """Overwrites its bytes from byte `offset` with `data` (bytes or any array's bytes)."""
        s = self.session
        return s._drive(calls.upload(s.id, self.id, transfers.byte_view(data), s._chunk_bytes, None, offset))

    def free(self) -> None:
        """Frees it on the server; using it afterwards is NotFound."""
        return self.session._drive(calls.free_buffer(self.session.id, self.id))

    def __repr__(self) -> str:
        return f"uopd.Buffer({self.id[:12]}, {self.dtype}{list(self.shape)} on {self.device})"


# RunRequest.graph_digest: the server holds a session's last 8 graphs (uopd.proto).
_SERVER_HOLDS = 8


class Session:
    """A session on uopd; make one with ``client.session()`` and use it in a ``with`` block."""

    _buffer_class: type = Buffer
    _model_class: type = Model

    def __init__(self, client: Any, session_id: str, devices: List[str]):
        self.client = client
        self.id = session_id
        self.devices = devices
        self._chunk_bytes: int = client.connection.chunk_bytes
        self._open = True
        self._held: Dict[bytes, str] = {}  # a held graph's encoding -> its digest, oldest first (execute's hold)

    def _drive(self, flow: calls.Flow) -> Any:
        return self.client._drive(flow)

    def _make_buffer(self, buffer_id: str, scalar: int, shape: Tuple[int, ...], device: str) -> Buffer:
        return self._buffer_class(self, buffer_id, scalar, shape, device or self.devices[0])

    # -- buffers --------------------------------------------------------------------------

    def put(self, array: Any, device: Optional[str] = None, dtype: dtypes.DTypeLike = None,
            progress: transfers.ProgressArg = None) -> Buffer:
        """A new buffer on `device` (default: the session's first) holding `array`: any
        dtype uopd has, C-order or strided (made contiguous first); `dtype` sends it as
        another ("bfloat16" for a uint16 array of bfloat16 bits). Streamed in chunks."""
        dev = device or self.devices[0]
        flow = calls.put(self.id, array, device, dtype, self._chunk_bytes, progress)
        return self._drive(calls.then(flow, lambda r: self._make_buffer(r[0], r[1], r[2], dev)))

    def empty(self, dtype: dtypes.DTypeLike, shape: Sequence[int], device: Optional[str] = None) -> Buffer:
        """A new buffer of `shape` x `dtype`, uninitialized."""
        s, dims = dtypes.scalar(dtype), tuple(int(d) for d in shape)
        _, _, nbytes = dtypes.header("a buffer", s, dims)
        flow = calls.create_buffer(self.id, s, nbytes // dtypes.itemsize(s), device)
        return self._drive(calls.then(flow, lambda bid: self._make_buffer(bid, s, dims, device or self.devices[0])))

    # -- graphs ---------------------------------------------------------------------------

    def execute(self, graph: GraphLike, inputs: Optional[calls.Inputs] = None, *, keep_outputs: bool = False,
                profile: bool = False, device: Optional[str] = None, hold: bool = False,
                **named: Any) -> results.RunResult:
        """Runs the graph on `device` (default: the session's first; a device of the server
        the session has not used yet joins it) with its inputs bound by name (or wire
        index): arrays (inline up to 1 MiB, larger ones uploaded as buffers and freed
        after) or Buffers on that device. The whole answer: outputs (Buffers with
        keep_outputs), kernels with their cache status, timings, and with profile each
        kernel's launches timed. A multi-device graph names its devices itself.

        With `hold` (for a graph run many times, a uopd.Graph): the session keeps the graph
        on the server the first time, and later Runs of the same graph send only their
        bindings, naming it by its digest; the server holds a session's last 8 such graphs,
        and one it no longer holds is sent again."""
        inputs = {**(inputs or {}), **named}
        data = graphs.encode(graph) if hold else b""
        if hold and (digest := self._held.get(data)) is not None:
            try:
                return self._drive(calls.run_held(self.id, digest, inputs, keep_outputs, profile, self._chunk_bytes,
                                                  self._make_buffer, device))
            except errors.NotFound as e:
                if "holds no graph" not in str(e):
                    raise
                del self._held[data]  # the server let it go: sent again, held again
        flow = calls.run_graph(self.id, data if hold else graph, inputs, keep_outputs, profile, self._chunk_bytes,
                               self._make_buffer, device, hold=hold)
        result = self._drive(flow)
        if hold and result.graph_digest:
            # The server keeps a session's last 8 holds, oldest dropped first: so does this
            # record, so a digest sent is one the server has (a ninth graph taking turns is
            # sent whole, never refused first).
            self._held.pop(data, None)
            while len(self._held) >= _SERVER_HOLDS:
                self._held.pop(next(iter(self._held)))
            self._held[data] = result.graph_digest
        return result

    def run(self, graph: GraphLike, inputs: Optional[calls.Inputs] = None, *, keep_outputs: bool = False,
            **named: Any) -> Dict[str, Union[np.ndarray, Buffer]]:
        """Runs the graph: its outputs by name, as arrays (or Buffers with keep_outputs).
        ``session.run("examples/elementwise.json", a=x, b=y)["out"]``; inputs whose names
        are not identifiers (or clash with these keywords) go in the `inputs` dict."""
        flow = calls.run_graph(self.id, graph, {**(inputs or {}), **named}, keep_outputs, False,
                               self._chunk_bytes, self._make_buffer)
        return self._drive(calls.then(flow, lambda r: r.outputs))

    def profile(self, graph: GraphLike, inputs: Optional[calls.Inputs] = None,
                **named: Any) -> List[results.KernelProfile]:
        """Runs the graph with every launch timed: one row per kernel, slowest first
        (results.profile_table prints them as `uop run --profile`)."""
        flow = calls.run_graph(self.id, graph, {**(inputs or {}), **named}, False, True,
                               self._chunk_bytes, self._make_buffer)
        return self._drive(calls.then(flow, lambda r: r.profile))

    def compile(self, graph: GraphLike, target: str = "cpu", include_binary: bool = False,
                include_source: bool = False) -> results.CompileResult:
        """As Client.compile."""
        return self.client.compile(graph, target, include_binary, include_source)

    def explain(self, graph: GraphLike, stage: Optional[str] = None, target: str = "cpu") -> str:
        """As Client.explain: the IR after each stage (only `stage` when given), as text."""
        return self.client.explain(graph, stage, target)

    def stats(self) -> results.Stats:
        """As Client.stats."""
        return self.client.stats()

    # -- models ---------------------------------------------------------------------------

    def load_model(self, model: calls.ModelLike, input_shapes: Optional[Mapping[str, Sequence[int]]] = None,
                   progress: transfers.ProgressArg = None) -> Model:
        """Streams an ONNX model (a path or its bytes) to uopd, which imports it once and
        keeps its weights as buffers of this session: a uopd.Model to call as often as
        wanted without sending them again. `input_shapes` fixes inputs whose declared
        shapes are symbolic."""
        flow = calls.load_model(self.id, model, input_shapes, self._chunk_bytes, progress)
        return self._drive(calls.then(flow, lambda resp: self._model_class(self, resp)))

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the session on the server, freeing its buffers and models. Idempotent."""
        if not self._open:
            return None
        self._open = False
        return self._drive(calls.close_session(self.id))

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            self.close()
        except errors.Error:
            if exc_type is None:
                raise  # else the error that ended the block says more than closing's

    def __repr__(self) -> str:
        return f"uopd.Session({self.id[:12]}, devices={self.devices})"
