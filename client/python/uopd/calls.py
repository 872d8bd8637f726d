"""What each operation asks of uopd, written once for both flavours of the client.

An operation is a generator that yields the RPCs it needs (Unary, Upload, Download
below) and gets each one's answer back (or its error thrown in); drive() runs it, over
blocking calls for uopd.Client and with awaits for uopd.aio.Client. Requests are built and
answers checked here, so the two flavours cannot drift apart.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import (Any, Awaitable, Callable, Coroutine, Dict, Generator, Iterable, List, Mapping, Optional, Sequence,
                    Tuple, Union)

import numpy as np

from uopd import dtypes, errors, graphs, results, transfers, wire
from uopd._stubs import pb


@dataclass
class Unary:
    method: str
    request: Any
    limit: Optional[float] = None  # seconds, if shorter than the connection's deadline


@dataclass
class Upload:  # a client stream (Upload, LoadModel): its messages, one answer
    method: str
    requests: Iterable[Any]


@dataclass
class Download:  # a server stream: every message goes to `sink`, which may raise
    request: Any
    sink: Callable[[Any], None]


Call = Union[Unary, Upload, Download]
Flow = Generator[Call, Any, Any]


async def drive(flow: Flow, execute: Callable[[Call], Awaitable[Any]]) -> Any:
    """Runs `flow`: each yielded call's answer is sent back into it, a uopd.Error thrown
    into it (so its try / finally blocks clean up). uopd.aio awaits this; the blocking
    client's `execute` never suspends, so run_now finishes it in one step."""
    try:
        call = next(flow)
        while True:
            try:
                answer = await execute(call)
            except errors.Error as e:
                call = flow.throw(e)
            else:
                call = flow.send(answer)
    except StopIteration as done:
        return done.value


def run_now(coro: Coroutine[Any, Any, Any]) -> Any:
    """The value of a coroutine that never waits (drive over blocking calls)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a blocking uopd call suspended (was an asyncio call passed to the blocking client?)")


# ---------------------------------------------------------------------------------------
# Targets, sessions, buffers


def target(text: str) -> "pb.Target":
    """"cpu", "cuda" or "cuda:sm_NN"; InvalidArgument naming the text otherwise."""
    if text in ("cpu", "cuda"):
        return pb.Target(backend=text)
    if text.startswith("cuda:sm_") and text[8:].isdigit():
        return pb.Target(backend="cuda", arch=text[5:])
    raise errors.InvalidArgument(f"unknown target '{text}' (cpu, cuda or cuda:sm_NN, e.g. cuda:sm_90)")


def create_session(devices: Sequence[str], idle_timeout_s: Optional[float]) -> Flow:
    req = pb.CreateSessionRequest(devices=list(devices), idle_timeout_ms=int((idle_timeout_s or 0) * 1000))
    resp = yield Unary("CreateSession", req)
    if not resp.session_id:
        raise errors.Internal("uopd created a session without an id")
    return resp.session_id, list(resp.devices)


def close_session(session_id: str) -> Flow:
    # Closing should not hold a finishing program for a full request deadline.
    yield Unary("CloseSession", pb.CloseSessionRequest(session_id=session_id), limit=5.0)


def create_buffer(session_id: str, scalar: int, elements: int, device: Optional[str]) -> Flow:
    req = pb.CreateBufferRequest(session_id=session_id, device=device or "", dtype=scalar, elements=elements)
    resp = yield Unary("CreateBuffer", req)
    if not resp.buffer_id:
        raise errors.Internal("uopd created a buffer without an id")
    return resp.buffer_id


def upload(session_id: str, buffer_id: str, data: memoryview, chunk_bytes: int,
           progress: transfers.ProgressArg = None, offset: int = 0) -> Flow:
    """Streams `data` into the buffer at byte `offset`."""
    p = transfers.Progress(len(data), progress, f"upload {buffer_id[:8]}")
    first = pb.UploadChunk(session_id=session_id, buffer_id=buffer_id).SerializeToString()
    resp = yield Upload("Upload", transfers.chunks(first, data, chunk_bytes, p, pb.UploadChunk.DATA_FIELD_NUMBER,
                                                   (pb.UploadChunk.OFFSET_FIELD_NUMBER, offset)))
    if resp.bytes != len(data):
        raise errors.DataLoss(f"uopd took {resp.bytes} of {len(data)} bytes uploaded to {buffer_id}")


def download(session_id: str, buffer_id: str, nbytes: int, chunk_bytes: int,
             progress: transfers.ProgressArg = None, offset: int = 0) -> Flow:
    """`nbytes` bytes of the buffer from `offset`, as a uint8 array."""
    asm = transfers.Assembler(buffer_id, offset, nbytes, transfers.Progress(nbytes, progress, f"download {buffer_id[:8]}"))
    if nbytes == 0:
        return asm.result()
    req = pb.DownloadRequest(session_id=session_id, buffer_id=buffer_id, offset=offset, length=nbytes,
                             chunk_bytes=transfers.effective_chunk_bytes(chunk_bytes))
    yield Download(req, asm.add)
    return asm.result()


def free_buffer(session_id: str, buffer_id: str) -> Flow:
    yield Unary("FreeBuffer", pb.FreeBufferRequest(session_id=session_id, buffer_id=buffer_id))


def put(session_id: str, array: Any, device: Optional[str], dtype: dtypes.DTypeLike, chunk_bytes: int,
        progress: transfers.ProgressArg) -> Flow:
    """A new buffer holding `array` (made C-order first): its id, dtype number and shape."""
    arr, scalar = dtypes.host_array(array, dtype)
    buffer_id = yield from create_buffer(session_id, scalar, arr.size, device)
    try:
        yield from upload(session_id, buffer_id, transfers.byte_view(arr), chunk_bytes, progress)
    except errors.Error:
        yield from _free_quietly(session_id, buffer_id)
        raise
    return buffer_id, scalar, arr.shape


def buffer_array(session_id: str, buffer_id: str, scalar: int, shape: Tuple[int, ...], chunk_bytes: int,
                 progress: transfers.ProgressArg = None) -> Flow:
    """A kept buffer's data as an array of its dtype and shape."""
    dt, dims, nbytes = dtypes.header(f"buffer {buffer_id}", scalar, shape)
    raw = yield from download(session_id, buffer_id, nbytes, chunk_bytes, progress)
    return raw.view(dt).reshape(dims)


def _free_quietly(session_id: str, buffer_id: str) -> Flow:
    try:
        yield from free_buffer(session_id, buffer_id)
    except errors.Error:
        pass  # the session's close frees it all the same


# ---------------------------------------------------------------------------------------
# Runs


class BufferRef:
    """What a binding needs of a Buffer (uopd.Buffer and uopd.aio.Buffer are ones)."""

    id: str
    session_id: str


Inputs = Mapping[Union[str, int], Any]


# RunRequest and RunModelRequest number their fields alike (1 session_id, 2 what runs: the
# graph's encoding or the model's id, 3 inputs, 4 keep_outputs, 5 profile), so one
# encoding by hand (uopd.wire) makes both: no message objects, the graph and each input's
# data copied once, into the request.
_RUN_FIELDS = ("SESSION_ID", "INPUTS", "KEEP_OUTPUTS", "PROFILE")
_SESSION_ID, _INPUTS, _KEEP_OUTPUTS, _PROFILE = (getattr(pb.RunRequest, f"{n}_FIELD_NUMBER") for n in _RUN_FIELDS)
_SUBJECT = pb.RunRequest.GRAPH_FIELD_NUMBER
_DEVICE = pb.RunRequest.DEVICE_FIELD_NUMBER  # RunRequest's alone
_GRAPH_DIGEST, _HOLD_GRAPH = pb.RunRequest.GRAPH_DIGEST_FIELD_NUMBER, pb.RunRequest.HOLD_GRAPH_FIELD_NUMBER
if not (all(getattr(pb.RunModelRequest, f"{n}_FIELD_NUMBER") == getattr(pb.RunRequest, f"{n}_FIELD_NUMBER")
            for n in _RUN_FIELDS) and pb.RunModelRequest.MODEL_ID_FIELD_NUMBER == _SUBJECT):
    raise ImportError("uopd.v1.RunRequest and RunModelRequest no longer number their fields alike (uopd.calls.run)")
_B_NAME, _B_INDEX, _B_BUFFER, _B_TENSOR = (pb.Binding.NAME_FIELD_NUMBER, pb.Binding.INDEX_FIELD_NUMBER,
                                           pb.Binding.BUFFER_ID_FIELD_NUMBER, pb.Binding.TENSOR_FIELD_NUMBER)
_T_DTYPE, _T_SHAPE, _T_DATA = (pb.Tensor.DTYPE_FIELD_NUMBER, pb.Tensor.SHAPE_FIELD_NUMBER, pb.Tensor.DATA_FIELD_NUMBER)


def _node(name: Union[str, int]) -> bytes:
    """A Binding's node: the input's name, or its wire index (a uint32: a larger number
    would reach uopd cut to 32 bits, naming another input)."""
    if not isinstance(name, int):
        return wire.bytes_field(_B_NAME, name.encode())
    if not 0 <= name < 1 << 32:
        raise errors.InvalidArgument(f"input index {name} is not a wire index (0 to 2^32 - 1)")
    return wire.uint_field(_B_INDEX, name)


def _buffer_binding(name: Union[str, int], buffer_id: str) -> bytes:
    """RunRequest.inputs binding `name` to a buffer of the session, encoded."""
    return wire.bytes_field(_INPUTS, _node(name) + wire.bytes_field(_B_BUFFER, buffer_id.encode()))


_HEADS: Dict[Tuple[Union[str, int], int, Tuple[int, ...]], bytes] = {}


def _inline_head(name: Union[str, int], scalar: int, shape: Tuple[int, ...], nbytes: int) -> bytes:
    """RunRequest.inputs binding `name` to an inline tensor, encoded up to the tensor's
    data, which follows it. It depends on the name, dtype and shape only, so it is made
    once for each (a program running a graph again and again sends the same ones)."""
    k = (name, scalar, shape)
    head = _HEADS.get(k)
    if head is None:
        tensor = wire.uint_field(_T_DTYPE, scalar) + wire.packed_field(_T_SHAPE, shape) + \
            wire.length_prefix(_T_DATA, nbytes)
        binding = _node(name) + wire.length_prefix(_B_TENSOR, len(tensor) + nbytes) + tensor
        head = wire.length_prefix(_INPUTS, len(binding) + nbytes) + binding
        if len(_HEADS) >= 4096:  # bounded: a program with ever new shapes does not grow it
            _HEADS.clear()
        _HEADS[k] = head
    return head


def _bindings(inputs: Inputs) -> Tuple[List[wire.Part], List[Tuple[Union[str, int], np.ndarray]]]:
    """RunRequest.inputs (RunModelRequest's alike) for `inputs`, encoded: Buffers by id,
    arrays inline, except those over INLINE_INPUT_BYTES, which come back (name, array) to
    be uploaded as buffers of the session first."""
    out: List[wire.Part] = []
    large = []
    for name, value in inputs.items():
        if isinstance(value, BufferRef):
            out.append(_buffer_binding(name, value.id))
            continue
        arr, scalar = dtypes.host_array(value)
        if arr.nbytes > transfers.INLINE_INPUT_BYTES:
            large.append((name, arr))
            continue
        # The array itself goes into the request's join (numpy's dtypes export their bytes).
        data = arr if arr.dtype.isbuiltin == 1 else transfers.byte_view(arr)
        out += (_inline_head(name, scalar, arr.shape, arr.nbytes), data)
    return out, large


def _outputs(resp: "pb.RunResponse", keep_outputs: bool,
             make_buffer: Callable[[str, int, Tuple[int, ...], str], Any]) -> Tuple[Dict[str, Any], List[Any]]:
    """A Run's outputs by name, in the answer's order: inline ones as arrays, kept ones as
    Buffers with keep_outputs; outputs over the server's inline limit that were kept all
    the same come back (name, output, shape) to be downloaded, then freed (their places
    held by None)."""
    outputs: Dict[str, Any] = {}
    kept = []
    for o in resp.outputs:
        name = o.name
        if o.WhichOneof("value") != "buffer_id":
            outputs[name] = dtypes.from_bytes(name, o.dtype, o.shape, o.data)
            continue
        _, shape, _ = dtypes.header(f"output {name}", o.dtype, o.shape)
        if keep_outputs:
            outputs[name] = make_buffer(o.buffer_id, o.dtype, shape, o.device or resp.device)
        else:
            outputs[name] = None
            kept.append((name, o, shape))
    return outputs, kept


def run(session_id: str, method: str, subject: bytes, inputs: Inputs, keep_outputs: bool, profile: bool,
        chunk_bytes: int, make_buffer: Callable[[str, int, Tuple[int, ...], str], Any],
        device: Optional[str] = None, held: bool = False, hold: bool = False) -> Flow:
    """Run (`subject`: a graph's encoding, graphs.encode; with `held`, the digest of a
    graph the session holds) or RunModel (a held model's id): binds `inputs`, runs,
    answers; the buffers made here for large inputs and outputs are freed whatever
    happens. `device` (Run only): the session's device the graph runs on, where its large
    inputs are uploaded; `hold` (Run only): the session keeps the graph, to be named by its
    digest (RunResult.graph_digest) from then on. (Plain functions do the work of a Run
    that needs no upload or download, generators only what does: each layer costs a cached
    Run's time.)"""
    temporaries: List[str] = []
    try:
        parts: List[wire.Part] = [wire.bytes_field(_SESSION_ID, session_id.encode()),
                                  wire.length_prefix(_GRAPH_DIGEST if held else _SUBJECT, len(subject)), subject]
        if hold:
            parts.append(wire.uint_field(_HOLD_GRAPH, 1))
        bindings, large = _bindings(inputs)
        parts += bindings
        for name, arr in large:
            buffer_id, _, _ = yield from put(session_id, arr, device, None, chunk_bytes, None)
            temporaries.append(buffer_id)
            parts.append(_buffer_binding(name, buffer_id))
        if keep_outputs:
            parts.append(wire.uint_field(_KEEP_OUTPUTS, 1))
        if profile:
            parts.append(wire.uint_field(_PROFILE, 1))
        if device:
            parts.append(wire.bytes_field(_DEVICE, device.encode()))
        resp = yield Unary(method, b"".join(parts))
        outputs, kept = _outputs(resp, keep_outputs, make_buffer)
        for i, (name, o, shape) in enumerate(kept):
            try:
                outputs[name] = yield from buffer_array(session_id, o.buffer_id, o.dtype, shape, chunk_bytes)
            except errors.Error:
                for _, rest, _ in kept[i + 1:]:  # not downloaded: freed all the same
                    yield from _free_quietly(session_id, rest.buffer_id)
                raise
            finally:
                yield from _free_quietly(session_id, o.buffer_id)
        return results.RunResult(outputs, resp)
    finally:
        for buffer_id in temporaries:
            yield from _free_quietly(session_id, buffer_id)


def with_graph(request: Any, field_number: int, data: bytes) -> bytes:
    """`request` serialized with a graph's encoding (graphs.encode) as its field
    `field_number`, since a protobuf message is its fields concatenated in any order: the
    graph is neither copied into the request nor encoded again when it is a uopd.Graph."""
    return b"".join((request.SerializeToString(), wire.length_prefix(field_number, len(data)), data))


def run_graph(session_id: str, graph: graphs.GraphLike, inputs: Inputs, keep_outputs: bool, profile: bool,
              chunk_bytes: int, make_buffer: Callable[[str, int, Tuple[int, ...], str], Any],
              device: Optional[str] = None, hold: bool = False) -> Flow:
    data = graphs.encode(graph)  # now: a bad graph fails before anything is sent
    return run(session_id, "Run", data, inputs, keep_outputs, profile, chunk_bytes, make_buffer, device, hold=hold)


def run_held(session_id: str, digest: str, inputs: Inputs, keep_outputs: bool, profile: bool, chunk_bytes: int,
             make_buffer: Callable[[str, int, Tuple[int, ...], str], Any], device: Optional[str] = None) -> Flow:
    """A Run of the graph the session holds under `digest`: only the bindings travel."""
    return run(session_id, "Run", digest.encode(), inputs, keep_outputs, profile, chunk_bytes, make_buffer, device,
               held=True)


def compile_graph(graph: graphs.GraphLike, target_text: str, include_binary: bool, include_source: bool) -> Flow:
    req = pb.CompileRequest(target=target(target_text), include_binary=include_binary, include_source=include_source)
    resp = yield Unary("Compile", with_graph(req, pb.CompileRequest.GRAPH_FIELD_NUMBER, graphs.encode(graph)))
    return results.compile_result(resp)


def explain(graph: graphs.GraphLike, stage: Optional[str], target_text: str) -> Flow:
    req = pb.ExplainRequest(target=target(target_text), stage=stage or "")
    resp = yield Unary("Explain", with_graph(req, pb.ExplainRequest.GRAPH_FIELD_NUMBER, graphs.encode(graph)))
    # uopc refuses an unknown stage; a server that answers with nothing means the same.
    if stage and not resp.stages:
        raise errors.InvalidArgument(f"uopd showed nothing for stage '{stage}'")
    return [results.ExplainStage(s.name, s.kernel, s.text) for s in resp.stages]


def stats() -> Flow:
    return results.stats((yield Unary("Stats", pb.StatsRequest())))


# ---------------------------------------------------------------------------------------
# Models

ModelLike = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview]


def model_bytes(model: ModelLike) -> memoryview:
    """An ONNX model's bytes: the bytes themselves, or a file's."""
    if isinstance(model, (bytes, bytearray, memoryview)):
        return memoryview(model).cast("B")
    try:
        with open(os.fspath(model), "rb") as f:
            return memoryview(f.read())
    except OSError as e:
        raise errors.NotFound(f"{os.fspath(model)}: cannot read it ({e.strerror})") from None


def load_model(session_id: str, model: ModelLike, input_shapes: Optional[Mapping[str, Sequence[int]]],
               chunk_bytes: int, progress: transfers.ProgressArg) -> Flow:
    """Streams an ONNX model to uopd, which imports it and keeps its weights as buffers of
    the session; the answer (uopd.v1.LoadModelResponse)."""
    data = model_bytes(model)
    first = pb.LoadModelChunk(session_id=session_id)
    for name, shape in (input_shapes or {}).items():
        first.input_shapes.add(name=name, shape=[int(d) for d in shape])
    p = transfers.Progress(len(data), progress, "load model")
    resp = yield Upload("LoadModel", transfers.chunks(first.SerializeToString(), data, chunk_bytes, p,
                                                      pb.LoadModelChunk.DATA_FIELD_NUMBER))
    if not resp.model_id:
        raise errors.Internal("uopd loaded a model without an id")
    return resp


def model_inputs(infos: List[results.TensorInfo], args: Sequence[Any], named: Mapping[str, Any]) -> Dict[str, Any]:
    """A model call's inputs by name: positional ones in the model's input order, then the
    named ones. Values that are not arrays or Buffers (lists, scalars) become arrays of the
    input's declared dtype; arrays are sent as they are (uopd refuses a wrong dtype)."""
    if len(args) == 1 and isinstance(args[0], Mapping):
        args, named = (), {**args[0], **named}
    if len(args) > len(infos):
        raise errors.InvalidArgument(f"{len(args)} positional inputs for a model with {len(infos)} inputs")
    out: Dict[str, Any] = {info.name: a for info, a in zip(infos, args)}
    for name, value in named.items():
        if name in out:
            raise errors.InvalidArgument(f"model input '{name}' given twice")
        out[name] = value
    by_name = {i.name: i for i in infos}
    for name, value in out.items():
        if name in by_name and not isinstance(value, (np.ndarray, np.generic, BufferRef)):
            out[name] = np.asarray(value, dtype=dtypes.numpy_dtype(dtypes.scalar(by_name[name].dtype)))
    return out


def run_model(session_id: str, model_id: str, inputs: Inputs, keep_outputs: bool, profile: bool, chunk_bytes: int,
              make_buffer: Callable[[str, int, Tuple[int, ...], str], Any]) -> Flow:
    return run(session_id, "RunModel", model_id.encode(), inputs, keep_outputs, profile, chunk_bytes, make_buffer)


def then(flow: Flow, fn: Callable[[Any], Any]) -> Flow:
    """`flow`, its answer passed through `fn` (which makes the caller's objects from it)."""
    return fn((yield from flow))


def request_of(call: Call) -> Any:
    """What a unary or client-stream call sends: its request, or its messages."""
    return iter(call.requests) if isinstance(call, Upload) else call.request
