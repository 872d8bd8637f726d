"""tinygrad's kernel AST -> a uopd kernel-level graph (uop.v1.Graph, proto/uop.proto).

The AST is the SINK tinygrad's scheduler hands a Compiled device to lower: one kernel,
after rangeify, before any of tinygrad's optimization or lowering. Its ops are the UOp IR's
kernel level (compiler/ir/README.md, "Kernel level") nearly one for one; what differs:

* tinygrad's INDEX is a value where it is read: the reading INDEX becomes
  LOAD(buf, INDEX(buf, idx)), the one a STORE writes through stays an INDEX.
* A gated access is INDEX(buf, WHERE(gate, idx, Invalid)) in tinygrad, uopd's
  INDEX(buf, idx', gate) (a read of it is 0 where the gate is off) with idx' the index
  clamped into the buffer, min(max(idx, 0), last): uopd's bounds proof cannot always follow
  tinygrad's gates (floor divisions and mods of padded windows), and the clamp keeps every
  access provable. uopd's expand stage looks through the clamp where it can prove the
  unclamped index under the gate (a convolution's padded window becomes masked vector
  loads), and else reads each lane clamped, without a branch.
* tinygrad's weak dtypes: `weakint` (the index type of RANGEs and address arithmetic) is
  uopd's `index`; a weak constant or expression feeding an op of a concrete dtype takes
  that dtype (weakfloat with no concrete neighbour: float32, tinygrad's default float).
* PARAM(slot) of a buffer becomes PARAM(slot, size) of dtype ptr<T, global, size>; a
  PARAM with more than one dim is indexed by the row-major linear index.
* CDIV / CMOD are uopd's IDIV / MOD (both truncate toward zero). FLOORDIV, FLOORMOD and
  THREEFRY, which uopd has not, are first decomposed by tinygrad's own decomposition rules
  (tinygrad.codegen.decomp.op) into ops it has: a rewrite of the AST's math, not an
  optimization of its schedule.
* A variable (PARAM in the ALU address space: a symbolic shape) is a DEFINE_VAR, which
  each run replaces by the CONST of its value (uopd's Run binds buffers, not variables).
* END(STORE, ranges) is uopd's STORE(index, value, ranges), the form uopd schedules.
* RANGE axis types: REDUCE stays REDUCE, every other kind (WEAK, LOOP, GLOBAL, ...) is LOOP;
  uopd's optimize stage chooses how each loop runs.

What cannot be translated is refused with NotImplementedError naming the op (or dtype),
as tinygrad's renderers refuse an op they have no code for.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import numpy as np

from tinygrad.codegen.decomp.op import floordiv_to_idiv, floormod_to_mod, threefry2x32
from tinygrad.dtype import AddrSpace, ConstFloat, DType, InvalidType, dtypes
from tinygrad.uop.ops import AxisType, Ops, PatternMatcher, UOp, UPat, graph_rewrite
from tinygrad.schedule.multi import multi_pm
from tinygrad.schedule.rangeify import pm_mops
from tinygrad.uop.symbolic import sym

from uopd._stubs import ir

S = ir.DType

# tinygrad's scalar dtypes -> uopd's (weakint is the index type; weakfloat is resolved).
_SCALARS: Dict[DType, int] = {
    dtypes.bool: S.BOOL, dtypes.int8: S.INT8, dtypes.int16: S.INT16, dtypes.int32: S.INT32, dtypes.int64: S.INT64,
    dtypes.uint8: S.UINT8, dtypes.uint16: S.UINT16, dtypes.uint32: S.UINT32, dtypes.uint64: S.UINT64,
    dtypes.float16: S.FLOAT16, dtypes.bfloat16: S.BFLOAT16, dtypes.float32: S.FLOAT32, dtypes.float64: S.FLOAT64,
    dtypes.weakint: S.INDEX,
}
SUPPORTED_DTYPES = frozenset(d for d in _SCALARS if d is not dtypes.weakint)

# Ops with the same name and meaning on both sides (the ALU ops, CAST, BITCAST).
_SAME = {op: ir.Op.Value(op.name) for op in (
    Ops.NEG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.TRUNC, Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV,
    Ops.MAX, Ops.POW, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.WHERE,
    Ops.MULACC, Ops.CAST, Ops.BITCAST)}
_RENAMED = {Ops.CDIV: ir.IDIV, Ops.CMOD: ir.MOD}
ALU = {**_SAME, **_RENAMED}
_COMPARISONS = {Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ}
_REDUCE_OPS = {Ops.ADD: ir.ReduceOpArg.ADD, Ops.MUL: ir.ReduceOpArg.MUL, Ops.MAX: ir.ReduceOpArg.MAX}

# tinygrad's decompositions of the ops uopd has not, applied before translating.
_decompose = PatternMatcher([
    (UPat(Ops.THREEFRY, dtype=dtypes.uint64, src=(UPat.var("x"), UPat.var("key"))), threefry2x32),
    (UPat(Ops.FLOORDIV, src=(UPat.var("a"), UPat.var("b"))), floordiv_to_idiv),
    (UPat(Ops.FLOORMOD, src=(UPat.var("a"), UPat.var("b"))), floormod_to_mod),
])


def _refuse(what: str, kernel: str) -> NotImplementedError:
    return NotImplementedError(f"uopd: tinygrad's {what} has no translation to uopd's IR (kernel {kernel})")


def _is_weak(dt: DType) -> bool:
    return dt in (dtypes.weakint, dtypes.weakfloat)


def _is_invalid(u: UOp) -> bool:
    return u.op is Ops.CONST and isinstance(u.arg, InvalidType)


class GraphBuilder:
    """The uop.v1.Graph under construction: nodes appended sources first."""

    def __init__(self, kernel: str):
        self.kernel = kernel
        self.g = ir.Graph(format_version=ir.FORMAT_VERSION_1)
        self.scalar: List[int] = []  # each node's scalar dtype (VOID for effects)
        self.memo: Dict[Tuple[UOp, Optional[int]], int] = {}
        self.consts: Dict[Tuple[int, object], int] = {}
        self.params: Dict[int, int] = {}  # tinygrad slot -> wire index of its PARAM

    def add(self, op: int, scalar: int, src: List[int] = (), ptr_size: Optional[int] = None, **arg: object) -> int:
        n = self.g.nodes.add(op=op, src=list(src))
        n.dtype.scalar = scalar
        if ptr_size is not None:
            n.dtype.ptr = True
            n.dtype.size = ptr_size
        for k, v in arg.items():
            field = getattr(n, k)
            if hasattr(field, "CopyFrom"):
                field.CopyFrom(v)
            else:
                setattr(n, k, v)
        self.scalar.append(scalar)
        return len(self.g.nodes) - 1

    def const(self, value: object, scalar: int) -> int:
        key = (scalar, (type(value).__name__, repr(value)))
        if key in self.consts:
            return self.consts[key]
        if scalar == S.BOOL:
            cv = ir.ConstValue(b=bool(value))
        elif scalar in _UNSIGNED_BITS:
            bits = _UNSIGNED_BITS[scalar]
            cv = ir.ConstValue(u=int(value) & ((1 << bits) - 1))  # tinygrad's values wrap as C's do
        elif scalar in (S.FLOAT16, S.BFLOAT16, S.FLOAT32, S.FLOAT64):
            cv = ir.ConstValue(f=_round_float(float(value), scalar))
        else:  # signed integers and index
            v = value
            if isinstance(v, float):
                if not math.isfinite(v) or v != int(v):
                    raise _refuse(f"constant {v!r} of an integer dtype", self.kernel)
            v = int(v)
            if scalar in _SIGNED_BITS:  # wrapped to the dtype's two's complement, as C's conversion does
                bits = _SIGNED_BITS[scalar]
                v = (v + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))
            cv = ir.ConstValue(i=v)
        self.consts[key] = i = self.add(ir.CONST, scalar, const_value=cv)
        return i


_SIGNED_BITS = {S.INT8: 8, S.INT16: 16, S.INT32: 32, S.INT64: 64}
_UNSIGNED_BITS = {S.UINT8: 8, S.UINT16: 16, S.UINT32: 32, S.UINT64: 64}


def _round_float(v: float, scalar: int) -> float:
    """v as the nearest value of the float dtype (uopd takes only exact constants; tinygrad
    rounds a constant to its dtype when it renders it)."""
    with np.errstate(over="ignore"):
        if scalar == S.FLOAT32:
            return float(np.float32(v))
        if scalar == S.FLOAT16:
            return float(np.float16(v))
        if scalar == S.BFLOAT16:  # round to nearest even on float32's bits
            if math.isnan(v):
                return v
            bits = int(np.array(v, dtype=np.float32).view(np.uint32))
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            return float(np.array(bits, dtype=np.uint32).view(np.float32))
    return v


def _scalar_of(dt: DType, kernel: str, want: Optional[int] = None) -> int:
    if dt == dtypes.weakfloat:
        return want if want in (S.FLOAT16, S.BFLOAT16, S.FLOAT32, S.FLOAT64) else S.FLOAT32
    if dt == dtypes.weakint and want is not None and want != S.BOOL:
        return want
    s = _SCALARS.get(dt)
    if s is None:
        raise _refuse(f"dtype {dt}", kernel)
    return s


def scalar_of(dt: DType) -> int:
    """uopd's scalar of a concrete tinygrad dtype; NotImplementedError naming one it lacks."""
    if dt not in SUPPORTED_DTYPES:
        raise NotImplementedError(f"uopd: tinygrad's dtype {dt} has no translation to uopd's IR")
    return _SCALARS[dt]


class _Translator:
    def __init__(self, sink: UOp, name: str):
        self.kernel = name
        self.out = GraphBuilder(self.kernel)
        self.store_index: set = set()  # INDEX nodes a STORE writes through

    # A value of dtype `want` where the consumer needs it (None: its own dtype).
    def value(self, u: UOp, want: Optional[int] = None) -> int:
        # A weak node takes the consumer's dtype, except where that is its own default (weakint
        # as index): then it is the one node every consumer shares (a RANGE read by an
        # index and closed by an END or REDUCE must be one node).
        default = want == S.INDEX and u.dtype == dtypes.weakint
        i = self.node(u, want if _is_weak(u.dtype) and not default else None)
        have = self.out.scalar[i]
        if want is not None and have != want:
            i = self.out.add(ir.CAST, want, [i])
        return i

    def node(self, u: UOp, want: Optional[int]) -> int:
        key = (u, want)
        if key in self.out.memo:
            return self.out.memo[key]
        i = self._emit(u, want)
        self.out.memo[key] = i
        return i

    def _buffer(self, u: UOp) -> int:
        """The PARAM (through AFTERs) an INDEX addresses."""
        if u.op is Ops.PARAM:
            return self.node(u, None)
        if u.op is Ops.AFTER:
            return self.node(u, None)
        raise _refuse(f"INDEX into {u.op.name}", self.kernel)

    def _param_shape(self, u: UOp) -> Tuple[int, ...]:
        b = u
        while b.op is Ops.AFTER:
            b = b.src[0]
        shape = tuple(b.shape)
        if not all(isinstance(d, int) for d in shape):
            raise _refuse(f"buffer of symbolic shape {shape}", self.kernel)
        return shape

    def _address(self, idx: UOp) -> Tuple[int, Optional[int]]:
        """(index node, gate node or None) for tinygrad's index operand(s) of an INDEX."""
        buf, idxs = idx.src[0], list(idx.src[1:])
        gate = None
        if len(idxs) == 1 and idxs[0].op is Ops.WHERE and _is_invalid(idxs[0].src[2]):
            gate = self.value(idxs[0].src[0], S.BOOL)
            idxs = [idxs[0].src[1]]
        if any(_is_invalid(x) or (x.op is Ops.WHERE and any(_is_invalid(s) for s in x.src)) for x in idxs):
            raise _refuse("INDEX with an Invalid index in more than one dim", self.kernel)
        if len(idxs) == 1:
            return self.value(idxs[0], S.INDEX), gate
        shape = self._param_shape(buf)
        if len(shape) != len(idxs):
            raise _refuse(f"INDEX with {len(idxs)} indices into a buffer of shape {shape}", self.kernel)
        lin = None
        for d, x in zip(shape, idxs):
            xi = self.value(x, S.INDEX)
            lin = xi if lin is None else self.out.add(ir.ADD, S.INDEX, [self.out.add(ir.MUL, S.INDEX, [lin, self.out.const(d, S.INDEX)]), xi])
        return lin, gate

    def _index(self, u: UOp, scalar: int) -> Tuple[int, int]:
        """(buffer, INDEX node): a gated one with its index clamped into the buffer."""
        buf = self._buffer(u.src[0])
        idx, gate = self._address(u)
        if gate is not None:
            # tinygrad's gate keeps the index in the buffer where it is on, but in terms
            # (floor divisions and mods of padded windows) uopd's bounds proof cannot always
            # follow, and uopd refuses an access it cannot prove: the index is clamped into
            # the buffer, which changes nothing where the gate is on.
            g, last = self.out, math.prod(self._param_shape(u.src[0])) - 1
            idx = g.add(ir.MIN, S.INDEX, [g.add(ir.MAX, S.INDEX, [idx, g.const(0, S.INDEX)]), g.const(last, S.INDEX)])
        src = [buf, idx] + ([gate] if gate is not None else [])
        return buf, self.out.add(ir.INDEX, scalar, src)

    def _emit(self, u: UOp, want: Optional[int]) -> int:
        g, op = self.out, u.op
        if op is Ops.SINK:
            effects = [self.effect(s) for s in u.src]
            return g.add(ir.SINK, S.VOID, effects, kernel_info=ir.KernelInfo(kernel=True, name=self.kernel))
        if op is Ops.CONST:
            if isinstance(u.arg, InvalidType):
                raise _refuse("Invalid outside an INDEX", self.kernel)
            v = u.arg
            if isinstance(v, ConstFloat):
                v = float(v)
            return g.const(v, _scalar_of(u.dtype, self.kernel, want))
        if op is Ops.PARAM and u.arg.addrspace == AddrSpace.ALU and u.arg.name:
            # A variable (symbolic shape): a DEFINE_VAR here, which the run replaces by the
            # CONST of its value (uopd.tinygrad.device.UopdProgram): uopd's Run binds buffers,
            # not variables, so each value is a graph (and a kernel in uopd's cache) of its own.
            lo, hi = u.arg.vmin_vmax
            return g.add(ir.DEFINE_VAR, _scalar_of(u.dtype, self.kernel, want),
                         define_var=ir.DefineVarArg(name=u.arg.name, min=int(lo), max=int(hi)))
        if op is Ops.PARAM:
            if u.arg.addrspace != AddrSpace.GLOBAL:
                raise _refuse(f"PARAM in {u.arg.addrspace}", self.kernel)
            size = math.prod(self._param_shape(u))
            s = _scalar_of(u.dtype, self.kernel)
            i = g.add(ir.PARAM, s, ptr_size=size, param=ir.ParamArg(slot=u.arg.slot, size=size))
            g.params[u.arg.slot] = i
            return i
        if op is Ops.AFTER:
            return g.add(ir.AFTER, g.scalar[self._buffer(u.src[0])], [self._buffer(u.src[0])] + [self.effect(s) for s in u.src[1:]],
                         ptr_size=math.prod(self._param_shape(u)))
        if op is Ops.RANGE:
            if u.dtype != dtypes.weakint:
                raise _refuse(f"RANGE of dtype {u.dtype}", self.kernel)
            axis, kind = u.arg[0], u.arg[1]
            t = ir.RangeArg.REDUCE if kind is AxisType.REDUCE else ir.RangeArg.LOOP
            return g.add(ir.RANGE, S.INDEX, [self.value(u.src[0], S.INDEX)] + [self.node(s, None) for s in u.src[1:]],
                         range=ir.RangeArg(axis_id=int(axis), type=t))
        if op is Ops.INDEX:  # read: LOAD(buf, INDEX(buf, idx [, gate])), 0 where the gate is off
            s = _scalar_of(u.dtype, self.kernel)
            buf, index = self._index(u, s)
            return g.add(ir.LOAD, s, [buf, index])
        if op is Ops.REDUCE:
            if not isinstance(u.arg, tuple) or u.arg[0] not in _REDUCE_OPS or u.arg[1] != 0:
                raise _refuse(f"REDUCE {u.arg}", self.kernel)
            s = _scalar_of(u.dtype, self.kernel, want)
            ranges = [self.node(r, None) for r in u.src[1:]]
            if any(r.op is not Ops.RANGE for r in u.src[1:]):
                raise _refuse("REDUCE over something other than RANGEs", self.kernel)
            rop = _REDUCE_OPS[u.arg[0]]
            if s == S.BOOL:  # tinygrad's any / all: OR / AND, uopd's MAX / MIN on bool
                rop = {ir.ReduceOpArg.ADD: ir.ReduceOpArg.MAX, ir.ReduceOpArg.MUL: ir.ReduceOpArg.MIN}.get(rop, rop)
            return g.add(ir.REDUCE, s, [self.value(u.src[0], s)] + ranges, reduce_op=ir.ReduceOpArg(op=rop))
        if op in ALU:
            return self._alu(u, want)
        if op in (Ops.STORE, Ops.END, Ops.GROUP):
            return self.effect(u)
        raise _refuse(f"op {op.name}", self.kernel)

    def _alu(self, u: UOp, want: Optional[int]) -> int:
        g, op = self.out, u.op
        if op in (Ops.CAST, Ops.BITCAST):
            s = _scalar_of(u.dtype, self.kernel, want)
            return g.add(ALU[op], s, [self.value(u.src[0])])
        if op in _COMPARISONS:
            # Operands in one dtype: the concrete one of the two, else their weak default.
            concrete = [x.dtype for x in u.src if not _is_weak(x.dtype)]
            s = _scalar_of(concrete[0] if concrete else u.src[0].dtype, self.kernel)
            return g.add(ALU[op], S.BOOL, [self.value(x, s) for x in u.src])
        s = _scalar_of(u.dtype, self.kernel, want)
        if op is Ops.WHERE:  # an Invalid branch is a value no one reads: 0, as tinygrad's lowering makes it
            branches = [g.const(0, s) if _is_invalid(x) else self.value(x, s) for x in u.src[1:]]
            return g.add(ir.WHERE, s, [self.value(u.src[0], S.BOOL)] + branches)
        if op in (Ops.SHL, Ops.SHR):  # the shift count in the shifted value's dtype
            return g.add(ALU[op], s, [self.value(u.src[0], s), self.value(u.src[1], s)])
        return g.add(ALU[op], s, [self.value(x, s) for x in u.src])

    def _store(self, u: UOp, ranges: List[int]) -> int:
        if len(u.src) != 2 or u.src[0].op is not Ops.INDEX:
            raise _refuse(f"STORE with sources {[s.op.name for s in u.src]}", self.kernel)
        s = _scalar_of(u.src[0].dtype, self.kernel)
        _, index = self._index(u.src[0], s)
        return self.out.add(ir.STORE, S.VOID, [index, self.value(u.src[1], s)] + ranges)

    def effect(self, u: UOp) -> int:
        g = self.out
        key = (u, None)
        if key in g.memo:
            return g.memo[key]
        if u.op is Ops.STORE:
            i = self._store(u, [])
        elif u.op is Ops.END:
            if any(r.op is not Ops.RANGE for r in u.src[1:]):
                raise _refuse("END of something other than RANGEs", self.kernel)
            ranges = [self.node(r, None) for r in u.src[1:]]
            if u.src[0].op is Ops.STORE and (u.src[0], None) not in g.memo:
                # END(STORE, ranges) is uopd's STORE(index, value, ranges): the form its
                # optimizer schedules (a kernel of one such STORE gets tiled and vectorized).
                i = g.memo[(u.src[0], None)] = self._store(u.src[0], ranges)
            else:
                i = g.add(ir.END, S.VOID, [self.effect(u.src[0])] + ranges)
        elif u.op is Ops.GROUP:
            i = g.add(ir.GROUP, S.VOID, [self.effect(s) for s in u.src])
        elif u.op is Ops.SINK:
            i = self.node(u, None)
        else:
            raise _refuse(f"{u.op.name} where a STORE, END or GROUP belongs", self.kernel)
        g.memo[key] = i
        return i


def kernel_graph(sink: UOp, name: str = "kernel") -> Tuple["ir.Graph", Dict[int, int]]:
    """The uopd graph of one tinygrad kernel AST, named `name` (its SINK's kernel name, what
    uopd's profiles and explain show), and the wire index of each buffer's PARAM by
    tinygrad's slot (what a run binds the kernel's buffers to)."""
    if sink.op is not Ops.SINK:
        raise _refuse(f"kernel rooted at {sink.op.name}", "?")
    # What tinygrad's lowering does first, before any optimization: in-kernel UNSHARDs
    # resolved, movement ops on a buffer folded into its indices, then the algebra.
    sink = graph_rewrite(sink, multi_pm, name="uopd: multi_pm")
    sink = graph_rewrite(sink, pm_mops, name="uopd: early movement ops", bottom_up=True)
    sink = graph_rewrite(sink, sym, name="uopd: tinygrad's algebraic simplification")
    sink = graph_rewrite(sink, _decompose, name="uopd: decompose ops uopd has not")
    t = _Translator(sink, name)
    t.node(sink, None)
    return t.out.g, dict(t.out.params)
