"""TinyJit's batches on UOPD as one uopd Run each: the device's ``graph`` (tinygrad's
GraphRunner, what CUDA graphs and Metal's indirect command buffers are for the devices that
have them).

When a TinyJit function replays, tinygrad hands each run of consecutive kernels on one
device to its device's graph runner. UopdGraph sends the whole run as one kernel-level
uopd graph, ``SINK(CALL(kernel, PARAM...)...)``: each CALL runs one kernel's graph (the
one its UopdProgram holds) on the graph's PARAMs, one PARAM per distinct buffer of the
batch, bound to that buffer's session buffer. uopd runs the CALLs in order, every kernel
compiled once and found in its cache (the kernels are the same digests as when they ran
one by one), in one round trip and one worker Execute, where a replay kernel by kernel
is a Run each.

What it cannot batch it runs kernel by kernel, as without it: a buffer view (a byte range
of another buffer, bound as a copy), a buffer that two kernels of the batch read as
different dtypes or one kernel binds twice; tinygrad keeps a graph to one device.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

from tinygrad.device import Buffer, Device
from tinygrad.engine.jit import GraphRunner
from tinygrad.uop.ops import UOp

import uopd
from uopd import dtypes as udt
from uopd._stubs import ir

# Built graphs per distinct (variable values, buffer layout) of a batch: a JIT with
# symbolic shapes replays with several values, each its own graph (as each kernel is).
_MAX_GRAPHS = 16


def batch_graph(kernels: List[Tuple[Any, List[int], Tuple[int, ...]]], params: List["ir.Node"]) -> "ir.Graph":
    """One kernel-level graph running `kernels` in order: each (its UopdProgram, the graph
    PARAM bound to each of its slots, its variable values), on `params` (the graph's PARAM
    nodes, slot i at index i)."""
    g = ir.Graph()
    g.format_version = kernels[0][0].graph.format_version
    g.nodes.extend(params)
    calls = []
    for program, slots, vals in kernels:
        body = (program._bound(vals) if program.variables else program.encoded).message
        base = len(g.nodes)
        for n in body.nodes:
            m = g.nodes.add()
            m.CopyFrom(n)
            del m.src[:]
            m.src.extend(s + base for s in n.src)
        call = g.nodes.add()
        call.op = ir.CALL
        call.dtype.scalar = ir.DType.VOID
        call.src.append(len(g.nodes) - 2)  # the kernel's SINK, its last node
        call.src.extend(slots)
        calls.append(len(g.nodes) - 1)
    root = g.nodes.add()
    root.op = ir.SINK
    root.dtype.scalar = ir.DType.VOID
    root.src.extend(calls)
    return g


class UopdGraph(GraphRunner):
    """A TinyJit batch of UOPD kernels, replayed as one uopd Run."""

    def __init__(self, linear: UOp, input_uops: Tuple[UOp, ...] = ()):
        super().__init__(linear, input_uops)
        self.dev = Device[self.calls[0][2][0].device]
        self.graphs: Dict[Tuple, Tuple["uopd.Graph", List[int]]] = {}
        self.batched = 0  # replays that went as one Run (what the tests check)

    def _buffers(self, input_uops: Tuple[UOp, ...]) -> List[List[Buffer]]:
        out = []
        for (_, _, bufs, _), replace in zip(self.calls, self.uop_replace):
            bufs = list(bufs)
            for pos, iidx in replace:
                bufs[pos] = input_uops[iidx].buffer
            out.append(bufs)
        return out

    def __call__(self, input_uops: Tuple[UOp, ...], var_vals: Dict[str, int], wait: bool = False) -> Optional[float]:
        from uopd.tinygrad.device import UopdBuffer  # the device module imports this one
        per_call = [[b.ensure_allocated().get_buf(b.device) for b in bufs] for bufs in self._buffers(input_uops)]
        vals = [prg.arg.vals({**var_vals, **dv}) for (_, prg, _, dv) in self.calls]
        # The graph's PARAMs: each distinct buffer once, in first use, with the dtype and
        # size the kernels read it as (one for all of them, or no batch).
        slot_of: Dict[int, int] = {}
        layout: List[Tuple[int, int]] = []
        held: List[UopdBuffer] = []
        kernels = []
        for program, opaque, v in zip(self.runtimes, per_call, vals):
            if len({id(b) for b in opaque}) != len(opaque):  # one buffer in two slots: not a CALL's binding
                return self._one_by_one(per_call, vals, wait)
            slots = []
            for slot, b in zip(program.slots, opaque):
                if not isinstance(b, UopdBuffer):
                    return self._one_by_one(per_call, vals, wait)
                _, scalar, elements = program.params[slot]
                at = slot_of.setdefault(id(b), len(held))
                if at == len(held):
                    held.append(b)
                    layout.append((scalar, elements))
                elif layout[at] != (scalar, elements):
                    return self._one_by_one(per_call, vals, wait)
                slots.append(at)
            kernels.append((program, slots, tuple(v)))
        key = (tuple(layout), tuple((id(p), tuple(s), v) for p, s, v in kernels))
        if (built := self.graphs.get(key)) is None:
            params = []
            for i, (scalar, elements) in enumerate(layout):
                # The PARAM as the kernels declare it (the same dtype node), numbered here.
                program, slots, _ = next(k for k in kernels if i in k[1])
                wire, _, _ = program.params[program.slots[slots.index(i)]]
                p = ir.Node()
                p.CopyFrom(program.graph.nodes[wire])
                p.param.slot = i
                params.append(p)
            if len(self.graphs) >= _MAX_GRAPHS:
                self.graphs.pop(next(iter(self.graphs)))
            built = self.graphs[key] = (uopd.Graph(batch_graph(kernels, params)), list(range(len(params))))
        graph, wires = built
        inputs, fresh = {}, {}
        for i, b in enumerate(held):
            scalar, elements = layout[i]
            if b.unwritten() and elements * udt.itemsize(scalar) == b.nbytes:
                fresh[i] = b  # made (zeroed) and kept by the Run, as a kernel's new output is
            else:
                inputs[wires[i]] = b.bound(scalar, elements)
        t0 = time.perf_counter()
        # Held by the session after the first replay: later ones send only the bindings.
        result = self.dev.session.execute(graph, inputs, keep_outputs=True, device=self.dev.uopd_device, hold=True)
        elapsed = time.perf_counter() - t0
        for i, b in fresh.items():
            b.remote = result.outputs[f"out{i}"]
        self.batched += 1
        return elapsed if wait else None

    def _one_by_one(self, per_call: List[List[Any]], vals: List[Tuple[int, ...]], wait: bool) -> Optional[float]:
        total = 0.0
        for program, opaque, v in zip(self.runtimes, per_call, vals):
            t = program(*opaque, vals=tuple(v), wait=wait)
            total += t or 0.0
        return total if wait else None
