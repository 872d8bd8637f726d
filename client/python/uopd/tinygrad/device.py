"""The UOPD device of tinygrad: a Compiled device whose buffers live in a uopd session and
whose kernels run on uopd (uopd.tinygrad's docstring says how tinygrad finds it).

* Renderer: UopdRenderer. tinygrad lowers a kernel by ``tinygrad.codegen.to_program``,
  which for this renderer (and only for it) is routed to :func:`program_of` before any of
  tinygrad's optimizer (opts, BEAM, upcasts) or lowering runs: the kernel's AST becomes a
  uopd graph (uopd.tinygrad.translate), serialized as the program's "binary". Nothing is
  rendered, and no compiler runs, here.
* Program: UopdProgram runs that graph with uopd's Run, each PARAM bound to the session
  buffer of the tinygrad buffer in its slot (written in place by uopd, kept there:
  keep_outputs). uopd plans, optimizes, compiles (or finds the kernel in its cache) and runs.
* Allocator: a tinygrad buffer is bytes; a uopd buffer has a dtype and an element count, so
  the uopd buffer is made when a kernel first binds it, with the dtype and size that kernel
  reads it as (bytes copied in before stay here until then), and remade if a later kernel
  reads the same bytes as another dtype. A buffer nothing has written yet (a kernel's new
  output) is left unbound in that kernel's Run, which makes it zeroed and keeps it: no
  round trip of its own.
  A view (a shrink of a realized buffer, a bitcast) is a byte range of its base: copied in
  and out by range, bound to a kernel as a copy written back when the kernel stores to it.
  UOPD's buffers stay out of tinygrad's memory planner (which would make every
  intermediate such a view).

Device names: ``UOPD`` (``UOPD:0``) is uopd's ``CPU:0``, ``UOPD:n`` its ``CPU:n``. All of a
process's UOPD devices share one uopd session on one connection to ``$UOPD_ADDRESS`` (else
uopd's default address), each device's buffers and kernels on its own uopd device (a
session grows onto the devices it is asked to use): so one Run can bind buffers of several,
which is how ``Tensor.shard``'s allreduce runs as uopd's ALLREDUCE on uopd's workers
(uopd.tinygrad.collectives). ``$UOPD_TOKEN`` is the tenant's token, as for every uopd client.
"""
from __future__ import annotations

import functools
import queue
import threading
import time
from typing import Any, Dict, Optional, Tuple

import numpy as np

import tinygrad.codegen as _codegen
import tinygrad.schedule.memory as _memory
from tinygrad.device import Allocator, BufferSpec, Compiled, Program, TinyELF
from tinygrad.codegen.opt.postrange import Scheduler
from tinygrad.helpers import PARALLEL, to_function_name
from tinygrad.renderer import Renderer
from tinygrad.uop.ops import AddrSpace, Ops, ProgramInfo, UOp

import uopd
from uopd import dtypes as udt
from uopd._stubs import ir
from uopd.tinygrad import collectives
from uopd.tinygrad.graph import UopdGraph
from uopd.tinygrad.translate import ALU, SUPPORTED_DTYPES, kernel_graph


class UopdRenderer(Renderer):
    """Names the device's target for tinygrad; never renders (program_of replaces lowering)."""

    suffix = "UOPD"
    supports_float4 = False
    has_local = False
    has_shared = False
    global_max = None
    local_max = None
    # The ops uopd takes as they are: tinygrad's scheduler asks a renderer's code_for_op
    # what it may leave undecomposed.
    code_for_op = {op: (lambda *a, **k: "") for op in ALU}

    def render(self, uops: Any) -> str:
        raise RuntimeError("the UOPD device renders nothing: its kernels go to uopd as graphs (uopd.tinygrad.device)")

    def supported_dtypes(self) -> set:
        return set(SUPPORTED_DTYPES)


def kernel_name(ast: UOp, renderer: UopdRenderer) -> str:
    """tinygrad's name of the kernel (r_64_56_56_64_3_3, E_4_4: its kind and loop sizes,
    colored for tinygrad's DEBUG output), as its own lowering names it: the AST's name
    unless that is the default "test", else the one tinygrad's Scheduler gives the kernel
    with no opts applied (uopd's optimizer, not tinygrad's, chooses the kernel's schedule)."""
    if ast.arg is not None and ast.arg.name != "test":
        return ast.arg.name
    return Scheduler(ast, renderer).get_optimized_ast().arg.name


def program_of(ast: UOp, renderer: UopdRenderer) -> UOp:
    """A tinygrad PROGRAM for one kernel AST: its sink, its buffers' PARAMs (what tinygrad
    binds), a one-line description as the SOURCE, and the uopd graph's bytes as the BINARY."""
    if ast.op is not Ops.SINK:
        raise RuntimeError(f"the UOPD device lowers kernel SINKs, not {ast.op.name}")
    name = kernel_name(ast, renderer)
    graph, params = kernel_graph(ast, to_function_name(name))
    topo = ast.toposort()
    buffers = sorted({u.arg.slot: u for u in topo if u.op is Ops.PARAM and u.arg.addrspace != AddrSpace.ALU}.values(),
                     key=lambda u: u.arg.slot)
    outs, ins = set(), set()
    for u in topo:
        if u.op is Ops.INDEX and (b := u.src[0].buf_uop).op is Ops.PARAM:
            (outs if any(s.op is Ops.STORE and s.src[0] is u for s in topo) else ins).add(b.arg.slot)
    variables = tuple(sorted({u for u in topo if u.op is Ops.PARAM and u.arg.addrspace == AddrSpace.ALU},
                             key=lambda u: u.arg.name))
    info = ProgramInfo(name, (1, 1, 1), None, variables, tuple(b.arg.slot for b in buffers), tuple(sorted(outs)),
                       tuple(sorted(ins)), renderer.target)
    desc = f"uopd graph of kernel {to_function_name(name)}: {len(graph.nodes)} nodes, params {sorted(params)}"
    # The PROGRAM's sink is the AST tagged: tinygrad substitutes the AST by the PROGRAM in its
    # schedule, which must not find the AST again inside it.
    return UOp(Ops.PROGRAM, src=(ast.replace(tag="uopd"), UOp(Ops.LINEAR, src=tuple(buffers)), UOp(Ops.SOURCE, arg=desc),
                                 UOp(Ops.BINARY, arg=graph.SerializeToString())), arg=info)


# The one place tinygrad is hooked: its to_program looks do_to_program up in its module at
# each call, so the UOPD renderer's kernels come here and every other device's go on to
# tinygrad's own lowering untouched. Idempotent (a re-import keeps the first original).
_tinygrad_do_to_program = getattr(_codegen.do_to_program, "__uopd_original__", _codegen.do_to_program)


def _do_to_program(ast: UOp, renderer: Renderer) -> UOp:
    if isinstance(renderer, UopdRenderer):
        return program_of(ast, renderer)
    return _tinygrad_do_to_program(ast, renderer)


_do_to_program.__uopd_original__ = _tinygrad_do_to_program  # type: ignore[attr-defined]
_codegen.do_to_program = _do_to_program

# The second hook: tinygrad's memory planner packs a schedule's intermediate buffers into
# one int8 arena per device, each buffer a view of it. A uopd buffer is typed and
# addressed whole, so each such view would be bound by a copy: UOPD's buffers stay out of
# the plan (as tinygrad keeps DISK's and CL's out), every other device's are planned.
_tinygrad_can_plan = getattr(_memory._can_plan, "__uopd_original__", _memory._can_plan)


def _can_plan(b: UOp, held_bufs: set) -> bool:
    devs = (b.device,) if isinstance(b.device, str) else b.device
    return not any(d.startswith("UOPD") for d in devs) and _tinygrad_can_plan(b, held_bufs)


_can_plan.__uopd_original__ = _tinygrad_can_plan  # type: ignore[attr-defined]
_memory._can_plan = _can_plan


# The third hook: ALLREDUCEs over UOPD devices become uopd's (uopd.tinygrad.collectives).
# This module is imported, and so every hook made, as soon as tinygrad is
# (uopd.tinygrad.install): tinygrad schedules, memory plan included, before it opens the
# devices that run the schedule.
collectives.install()


@functools.lru_cache(maxsize=None)
def client() -> uopd.Client:
    """The process's connection to uopd ($UOPD_ADDRESS), made when a UOPD device opens."""
    return uopd.connect()


class _SharedSession:
    """The one session of the process's UOPD devices: opened on the first device's uopd
    device when that device opens, closed when the last one finalizes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.session: Optional[uopd.Session] = None
        self.users = 0

    def open(self, device: str) -> uopd.Session:
        with self.lock:
            if self.session is None:
                self.session = client().session([device])
            self.users += 1
            return self.session

    def close(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users > 0 or self.session is None:
                return
            s, self.session = self.session, None
        try:
            s.close()
        except uopd.Error:
            pass


_shared = _SharedSession()


class UopdBuffer:
    """One tinygrad buffer: `nbytes` bytes, held by a uopd buffer once a kernel has bound it
    (`remote`), before that by the bytes copied in (`pending`), else unwritten (zeros)."""

    def __init__(self, dev: "UopdDevice", nbytes: int):
        self.dev, self.nbytes = dev, nbytes
        self.remote: Optional[uopd.Buffer] = None
        self.pending: Optional[bytearray] = None

    def unwritten(self) -> bool:
        return self.remote is None and self.pending is None

    def read(self, offset: int, nbytes: int) -> bytes:
        if self.remote is not None:
            return self.remote.read_bytes(offset, nbytes).tobytes()
        if self.pending is not None:
            return bytes(self.pending[offset:offset + nbytes])
        return bytes(nbytes)

    def write(self, offset: int, data: memoryview) -> None:
        if self.remote is not None:
            self.remote.write_bytes(data, offset)
            return
        if self.pending is None:
            if offset == 0 and len(data) == self.nbytes:
                self.pending = bytearray(data)
                return
            self.pending = bytearray(self.nbytes)
        self.pending[offset:offset + len(data)] = data

    def bound(self, scalar: int, elements: int) -> uopd.Buffer:
        """The uopd buffer holding these bytes as `elements` x `scalar`, made (or remade
        from the old one's bytes) when it is not that already."""
        r = self.remote
        if r is not None and r.scalar == scalar and r.shape == (elements,):
            return r
        if elements * udt.itemsize(scalar) != self.nbytes:
            raise RuntimeError(f"UOPD: a kernel reads a buffer of {self.nbytes} bytes as {elements} x {udt.name(scalar)}")
        s = self.dev.session
        if r is not None:
            data: Optional[bytes] = self.read(0, self.nbytes)
            self.dev.free_later(r)
            self.remote = None
        else:
            data = self.pending
        if data is None:
            self.remote = s.empty(udt.name(scalar), (elements,), device=self.dev.uopd_device)
        else:
            self.remote = s.put(np.frombuffer(data, dtype=udt.numpy_dtype(scalar)), dtype=udt.name(scalar), progress=False,
                                device=self.dev.uopd_device)
        self.pending = None
        return self.remote

    def replace(self, remote: uopd.Buffer) -> None:
        """These bytes are now `remote` (a Run's kept output on this device): the old ones go."""
        if remote.device != self.dev.uopd_device or remote.nbytes != self.nbytes:
            raise RuntimeError(f"UOPD: {remote} cannot hold {self.dev.device}'s buffer of {self.nbytes} bytes")
        self.free()
        self.remote = remote

    def free(self) -> None:
        if self.remote is not None:
            self.dev.free_later(self.remote)
            self.remote = None
        self.pending = None


class UopdView:
    """`nbytes` bytes of a UopdBuffer from byte `offset` (tinygrad's buffer views: a shrink
    of a realized buffer, a bitcast). A kernel binds a copy of the range, written back to
    the base if the kernel writes it: a uopd session buffer is addressed whole."""

    def __init__(self, base: UopdBuffer, offset: int, nbytes: int):
        self.base, self.offset, self.nbytes = base, offset, nbytes

    def read(self, offset: int, nbytes: int) -> bytes:
        return self.base.read(self.offset + offset, nbytes)

    def write(self, offset: int, data: memoryview) -> None:
        self.base.write(self.offset + offset, data)


class UopdAllocator(Allocator["UopdDevice"]):
    def _alloc(self, size: int, options: BufferSpec) -> UopdBuffer:
        if options.external_ptr is not None:
            raise RuntimeError("UOPD buffers live in uopd: no external pointers")
        return UopdBuffer(self.dev, size)

    def _free(self, opaque: UopdBuffer, options: BufferSpec) -> None:
        opaque.free()

    def _copyin(self, dest: Any, src: memoryview) -> None:
        dest.write(0, src.cast("B"))

    def _copyout(self, dest: memoryview, src: Any) -> None:
        flat = dest.cast("B")
        flat[:] = src.read(0, len(flat))

    def _offset(self, buf: UopdBuffer, size: int, offset: int) -> UopdView:
        return UopdView(buf, offset, size)


class UopdProgram(Program["UopdDevice"]):
    """One kernel: its uopd graph, run with the PARAM of each slot bound to that slot's buffer."""

    def __init__(self, dev: "UopdDevice", obj: TinyELF):
        self.dev, self.name = dev, obj.name
        self.graph = ir.Graph.FromString(obj.lib)
        self.params: Dict[int, Tuple[int, int, int]] = {}  # slot -> (wire index, scalar, elements)
        for i, n in enumerate(self.graph.nodes):
            if n.op == ir.PARAM:
                self.params[n.param.slot] = (i, n.dtype.scalar, n.param.size)
        self.slots = sorted(self.params)
        self.outs = set()  # the slots a STORE writes through
        nodes = self.graph.nodes
        for n in nodes:
            if n.op == ir.STORE:
                b = nodes[nodes[n.src[0]].src[0]]
                while b.op == ir.AFTER:
                    b = nodes[b.src[0]]
                if b.op == ir.PARAM:
                    self.outs.add(b.param.slot)
        self.encoded = uopd.Graph(self.graph)  # encoded once: each call sends these bytes
        # The variables (symbolic shapes), in tinygrad's order of `vals`: their DEFINE_VAR nodes.
        self.variables = sorted({n.define_var.name for n in self.graph.nodes if n.op == ir.DEFINE_VAR})
        self.by_vals: Dict[Tuple[int, ...], uopd.Graph] = {}
        self.last: Optional[uopd.RunResult] = None

    def __call__(self, *bufs: UopdBuffer, global_size: Tuple[int, ...] = (1, 1, 1), local_size: Any = None,
                 vals: Tuple[int, ...] = (), wait: bool = False, **kw: Any) -> Optional[float]:
        if len(bufs) != len(self.slots):
            raise RuntimeError(f"UOPD: kernel {self.name} takes {len(self.slots)} buffers, got {len(bufs)}")
        inputs, views, fresh = {}, [], {}
        for i, (slot, b) in enumerate(zip(self.slots, bufs)):
            wire, scalar, elements = self.params[slot]
            if isinstance(b, UopdView):  # a copy of the range, in a buffer of its own
                tmp = UopdBuffer(self.dev, b.nbytes)
                tmp.pending = bytearray(b.read(0, b.nbytes))
                views.append((slot, b, tmp))
                b = tmp
            if b.unwritten() and elements * udt.itemsize(scalar) == b.nbytes and sum(x is b for x in bufs) == 1:
                # Left unbound: the Run makes it (zeroed, as an unwritten buffer reads) and
                # keeps it, one CreateBuffer round trip fewer (a new output each call).
                fresh[slot] = b
                continue
            inputs[wire] = b.bound(scalar, elements)
        graph = self._bound(tuple(vals)) if self.variables else self.encoded
        try:
            t0 = time.perf_counter()
            self.last = self.dev.session.execute(graph, inputs, keep_outputs=True, device=self.dev.uopd_device)
            elapsed = time.perf_counter() - t0
            for slot, b in fresh.items():  # the PARAMs by slot are the outputs, in order
                b.remote = self.last.outputs[f"out{self.slots.index(slot)}"]
            for slot, view, tmp in views:
                if slot in self.outs:
                    view.write(0, memoryview(tmp.read(0, tmp.nbytes)))
        finally:
            for _, _, tmp in views:
                tmp.free()
        return elapsed if wait else None


    def _bound(self, vals: Tuple[int, ...]) -> uopd.Graph:
        """The graph with each variable's DEFINE_VAR replaced by the CONST of its value."""
        if len(vals) != len(self.variables) or any(v is None for v in vals):
            raise NotImplementedError(f"UOPD: kernel {self.name} takes variables {self.variables}, got values {vals}")
        if (g := self.by_vals.get(vals)) is None:
            value = dict(zip(self.variables, vals))
            m = ir.Graph()
            m.CopyFrom(self.graph)
            for n in m.nodes:
                if n.op == ir.DEFINE_VAR:
                    v = value[n.define_var.name]
                    if not n.define_var.min <= v <= n.define_var.max:
                        raise RuntimeError(f"UOPD: variable {n.define_var.name}={v} outside [{n.define_var.min}, {n.define_var.max}]")
                    n.ClearField("define_var")
                    n.op = ir.CONST
                    if udt.name(n.dtype.scalar).startswith("uint"):
                        n.const_value.u = v
                    else:
                        n.const_value.i = v
            if len(self.by_vals) >= 64:  # a bounded memo: one graph per value seen recently
                self.by_vals.pop(next(iter(self.by_vals)))
            g = self.by_vals[vals] = uopd.Graph(m)
        return g


class UopdDevice(Compiled):
    def __init__(self, device: str):
        # Lowering a kernel here is a translation, cheap: no compile workers to spawn.
        PARALLEL.value = 0
        super().__init__(device, UopdAllocator(self), [UopdRenderer], UopdProgram, graph=UopdGraph)
        self.uopd_device = f"CPU:{self.device_id}"
        self.session = _shared.open(self.uopd_device)
        # Buffers tinygrad frees are freed in uopd by a thread of their own, beside the next
        # Runs: nothing waits on a FreeBuffer (a train step frees about as many buffers as it
        # runs kernels, each a round trip). A freed buffer is never bound again, so the order
        # of frees and Runs does not matter.
        self._frees: "queue.SimpleQueue[Optional[uopd.Buffer]]" = queue.SimpleQueue()
        self._freer = threading.Thread(target=self._free_loop, name=f"uopd-free-{device}", daemon=True)
        self._freer.start()

    def free_later(self, b: uopd.Buffer) -> None:
        self._frees.put(b)

    def _free_loop(self) -> None:
        while (b := self._frees.get()) is not None:
            try:
                b.free()
            except uopd.Error:
                pass  # the session is gone (closed at exit, or timed out): so is the buffer

    def synchronize(self) -> None:
        pass  # every Run has finished when it answers

    def finalize(self) -> None:
        self._frees.put(None)  # the frees asked for so far, then the session (its last user)
        self._freer.join()
        _shared.close()


__all__ = ["UopdDevice", "UopdRenderer", "UopdProgram", "UopdAllocator", "program_of", "client"]
