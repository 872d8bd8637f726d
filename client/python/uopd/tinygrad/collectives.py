"""tinygrad's allreduce over UOPD devices as one uopd ALLREDUCE, run on uopd's workers.

tinygrad lowers ``Tensor.shard``'s cross-device reductions (a sum over the shard axis, the
gradient of a replicated weight) to an ALLREDUCE UOp, which its scheduler replaces by a
function of copies between the devices and additions (tinygrad.schedule.allreduce: naive,
ring or all-to-all). Over UOPD devices that function would move every partial through
this client. Here the ALLREDUCE of partials that all live on UOPD devices, replicated back
onto the same devices, becomes instead one CALL of a CUSTOM_FUNCTION ``uopd_allreduce``
(an opaque call body, as tinygrad's own ``encdec`` is): its arguments are the output and
the partials, each a multi-device buffer. Executing it is one uopd Run of the tensor-level
graph

    SINK(ALLREDUCE(MULTI(BUFFER@CPU:0, BUFFER@CPU:1, ...), DEVICE(CPU:0, CPU:1, ...)))

with each BUFFER bound to the session buffer of that device's partial: uopd runs it as a
collective between its workers (a shared-memory ring on one host, Gloo across hosts, NCCL
between CUDA workers) and keeps one output per device, which becomes that device's shard
of tinygrad's output. The partials never leave uopd. (All UOPD devices of a process share
one session, uopd.tinygrad.device, which is what lets one Run bind buffers on several.)

An ALLREDUCE this does not take (a device that is not UOPD, a result on one device only,
an op uopd's ALLREDUCE lacks, uneven or symbolic shards) falls through to tinygrad's own.

Hooks, each idempotent: a pattern ahead of tinygrad's in
``tinygrad.schedule.rangeify.earliest_rewrites`` (looked up by name at each schedule), a
rule in ``tinygrad.engine.realize.pm_exec`` (likewise), and ``get_call_outs_ins`` /
``get_call_name`` knowing the call (output 0, input 1: what the JIT and DEBUG read).
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import tinygrad.engine.jit as _jit
import tinygrad.engine.realize as _realize
import tinygrad.schedule.rangeify as _rangeify
from tinygrad.device import Buffer, MultiBuffer
from tinygrad.helpers import all_int, colored, prod
from tinygrad.uop.ops import Ops, PatternMatcher, UOp, UPat

import uopd
from uopd._stubs import ir
from uopd.tinygrad.translate import GraphBuilder, scalar_of

NAME = "uopd_allreduce"
_OPS = {Ops.ADD: ir.ReduceOpArg.ADD, Ops.MUL: ir.ReduceOpArg.MUL, Ops.MAX: ir.ReduceOpArg.MAX}


def _uopd_devices(devices: Any) -> bool:
    return isinstance(devices, tuple) and len(devices) > 1 and all(d.split(":")[0] == "UOPD" for d in devices)


def _allreduce_call(buf: UOp, red: UOp) -> Optional[UOp]:
    """tinygrad's ALLREDUCE(buf) as the uopd_allreduce CALL, or None: tinygrad's own."""
    op, device = red.arg
    if not (_uopd_devices(buf.device) and device == buf.device and op in _OPS):
        return None
    if not all_int(buf.shape) or buf.shape != buf.max_shape or len(set(buf.device)) != len(buf.device):
        return None
    try:
        scalar_of(buf.dtype)
    except NotImplementedError:
        return None
    output = UOp.invalids(red.shape, dtype=red.dtype, device=red.device)
    fn = UOp(Ops.CUSTOM_FUNCTION, arg=(NAME, op))
    return output.after(fn.call(output, buf.contiguous()))


def _is_ours(call: UOp) -> bool:
    ast = call.src[0]
    return ast.op is Ops.CUSTOM_FUNCTION and isinstance(ast.arg, tuple) and ast.arg[0] == NAME


def allreduce_graph(op: Any, scalar: int, elements: int, devices: Sequence[str]) -> ir.Graph:
    """The tensor-level graph of one ALLREDUCE of `elements` x `scalar` over uopd `devices`:
    BUFFER i (wire index 3 * i + 2) is device i's partial; the output is one per device."""
    b = GraphBuilder("allreduce")
    g, add = b.g, b.add
    void = ir.DType.VOID
    parts = []
    for i, d in enumerate(devices):
        unique = add(ir.UNIQUE, void, [], int_value=i)
        dev = add(ir.DEVICE, void, [], device=ir.DeviceArg(devices=[d]))
        parts.append(add(ir.BUFFER, scalar, [unique, dev], buffer=ir.BufferArg(size=elements)))
        g.names.add(name=f"partial{i}", node=parts[-1])
    multi = add(ir.MULTI, scalar, parts, int_value=-1)
    all_devices = add(ir.DEVICE, void, [], device=ir.DeviceArg(devices=list(devices)))
    reduced = add(ir.ALLREDUCE, scalar, [multi, all_devices], reduce_op=ir.ReduceOpArg(op=_OPS[op]))
    g.names.add(name="reduced", node=reduced)
    add(ir.SINK, void, [reduced])
    return g


def _exec(ctx: Any, call: UOp, ast: UOp) -> List[Optional[float]]:
    """Runs the CALL: one uopd Run of the ALLREDUCE over the partials' session buffers; each
    device's output becomes that device's shard of the CALL's output."""
    out_uop, in_uop = _realize.resolve_params(call, ctx.input_uops)
    out, partials = out_uop.buffer, in_uop.buffer
    if not (isinstance(out, MultiBuffer) and isinstance(partials, MultiBuffer)):
        raise RuntimeError(f"UOPD: {NAME} takes multi-device buffers, got {type(out).__name__}, {type(partials).__name__}")
    outs: List[Buffer] = [b.ensure_allocated() for b in out.bufs]
    ins: List[Buffer] = [b.ensure_allocated() for b in partials.bufs]
    scalar, elements = scalar_of(partials.dtype), partials.size
    devs = [b.allocator.dev for b in ins]
    session = devs[0].session
    graph = _graphs(ast.arg[1], scalar, elements, tuple(d.uopd_device for d in devs))
    bound = {}
    for i, b in enumerate(ins):
        opaque = b._buf
        if not hasattr(opaque, "bound"):  # a view: a copy of its range, as a kernel binds one
            raise RuntimeError(f"UOPD: {NAME} of a buffer view ({b.nbytes} bytes of {b._base}) is not supported")
        bound[3 * i + 2] = opaque.bound(scalar, elements)
    result = session.execute(graph, bound, keep_outputs=True)
    by_device = {o.device: o for o in result.outputs.values()}
    for d, b in zip(devs, outs):
        b._buf.replace(by_device[d.uopd_device])
    return []


_graph_memo: dict = {}


def _graphs(op: Any, scalar: int, elements: int, devices: tuple) -> uopd.Graph:
    """The encoded graph of one allreduce shape (a step allreduces the same shapes each time)."""
    key = (op, scalar, elements, devices)
    if (g := _graph_memo.get(key)) is None:
        if len(_graph_memo) >= 256:
            _graph_memo.pop(next(iter(_graph_memo)))
        g = _graph_memo[key] = uopd.Graph(allreduce_graph(op, scalar, elements, devices))
    return g


def _outs_ins(call: UOp) -> tuple:
    return ((0,), (1,)) if _is_ours(call) else _tinygrad_outs_ins(call)


def _call_name(call: UOp, *a: Any, **kw: Any) -> str:
    if _is_ours(call):
        return colored(f"uopd allreduce {call.src[0].arg[1].name} x{prod(call.src[2].shape)}", "green")
    return _tinygrad_call_name(call, *a, **kw)


_tinygrad_outs_ins = getattr(_realize.get_call_outs_ins, "__uopd_original__", _realize.get_call_outs_ins)
_tinygrad_call_name = getattr(_realize.get_call_name, "__uopd_original__", _realize.get_call_name)
_outs_ins.__uopd_original__ = _tinygrad_outs_ins  # type: ignore[attr-defined]
_call_name.__uopd_original__ = _tinygrad_call_name  # type: ignore[attr-defined]


def install() -> None:
    """The hooks (the module docstring); idempotent."""
    if not getattr(_rangeify.earliest_rewrites, "__uopd__", False):
        pm = PatternMatcher([(UPat(Ops.ALLREDUCE, src=(UPat.var("buf"),), name="red"), _allreduce_call)]) + \
            _rangeify.earliest_rewrites
        pm.__uopd__ = True  # type: ignore[attr-defined]
        _rangeify.earliest_rewrites = pm
    if not getattr(_realize.pm_exec, "__uopd__", False):
        pm = PatternMatcher([(UPat(Ops.CALL, src=(UPat(Ops.CUSTOM_FUNCTION, name="ast"),), name="call", allow_any_len=True),
                              lambda ctx, call, ast: _exec(ctx, call, ast) if _is_ours(call) else None)]) + _realize.pm_exec
        pm.__uopd__ = True  # type: ignore[attr-defined]
        _realize.pm_exec = pm
    _realize.get_call_outs_ins = _jit.get_call_outs_ins = _outs_ins
    _realize.get_call_name = _call_name
