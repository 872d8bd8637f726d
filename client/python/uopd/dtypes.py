"""uopd's scalar types and numpy's, and host arrays on the wire (uopd.v1.Tensor:
row-major, little-endian bytes; bool one byte 0/1; float16 / bfloat16 as their bits).

Every dtype uopd has maps to a numpy dtype: bool, int8..int64, uint8..uint64, float16,
float32, float64, and bfloat16 as ``ml_dtypes.bfloat16`` when ml_dtypes is installed. Without
ml_dtypes there is no numpy bfloat16: a bfloat16 result comes back as its bits, a uint16
array (``Buffer.dtype`` still says "bfloat16"), and a uint16 array is sent as bfloat16 with
``dtype="bfloat16"``.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import numpy as np

from uopd import errors
from uopd._stubs import ir

try:  # optional: numpy has no bfloat16 of its own
    import ml_dtypes as _ml_dtypes

    BFLOAT16: Optional[np.dtype] = np.dtype(_ml_dtypes.bfloat16)
except ImportError:
    BFLOAT16 = None

Scalar = int  # a uop.v1.DType.Scalar number
DTypeLike = Union[str, np.dtype, type, None]

# uopd's name (the IR's, lower case) -> numpy's dtype; index is an int64 on the wire.
_NUMPY = {
    "bool": np.dtype(np.bool_), "int8": np.dtype(np.int8), "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32), "int64": np.dtype(np.int64), "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16), "uint32": np.dtype(np.uint32), "uint64": np.dtype(np.uint64),
    "float16": np.dtype(np.float16), "float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
    "index": np.dtype(np.int64),
}
NAMES = tuple(n for n in ir.DType.Scalar.keys() if n != "VOID")  # wire names, e.g. "FLOAT32"


def name(scalar: Scalar) -> str:
    """uopd's name of a wire scalar number: "float32"; InvalidArgument for one it has not."""
    try:
        return ir.DType.Scalar.Name(scalar).lower()
    except ValueError:
        raise errors.InvalidArgument(f"no uopd dtype has the number {scalar}") from None


# numpy's dtypes (either byte order) -> wire scalars, and bfloat16 when ml_dtypes has it.
_SCALAR_OF = {dt.newbyteorder(order): ir.DType.Scalar.Value(n.upper())
              for n, dt in _NUMPY.items() if n != "index" for order in "<>="}
if BFLOAT16 is not None:
    _SCALAR_OF[BFLOAT16] = ir.DType.BFLOAT16


def scalar(dtype: DTypeLike) -> Scalar:
    """The wire scalar for a numpy dtype or a uopd name ("bfloat16", "float32")."""
    if isinstance(dtype, str) and dtype.upper() in NAMES:
        return ir.DType.Scalar.Value(dtype.upper())
    try:
        dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
    except TypeError:
        raise errors.InvalidArgument(f"uopd has no dtype {dtype!r}") from None
    s = _SCALAR_OF.get(dt)
    if s is None:
        known = ", ".join(n.lower() for n in NAMES if n != "INDEX")
        raise errors.InvalidArgument(f"uopd has no dtype for numpy's {dt} (it has {known})")
    return s


def itemsize(s: Scalar) -> int:
    return numpy_dtype(s).itemsize


def numpy_dtype(s: Scalar) -> np.dtype:
    """numpy's dtype for a wire scalar; bfloat16 without ml_dtypes: uint16 (its bits)."""
    n = name(s)
    if n == "bfloat16":
        return BFLOAT16 if BFLOAT16 is not None else np.dtype(np.uint16)
    if n not in _NUMPY:
        raise errors.InvalidArgument(f"a tensor cannot hold {n}")
    return _NUMPY[n]


def host_array(a: object, dtype: DTypeLike = None) -> Tuple[np.ndarray, Scalar]:
    """`a` as a C-order, little-endian array ready to send, and its wire scalar. A strided
    (non-contiguous) or big-endian array is copied into that form. `dtype` sends it as
    another uopd dtype: values converted as numpy's astype does, except that a uint16
    array sent as "bfloat16" is taken as the bits of bfloat16 values."""
    arr = np.asarray(a)
    s = scalar(arr.dtype) if dtype is None else scalar(dtype)
    if dtype is None and arr.flags.c_contiguous and arr.dtype.isnative and (np.little_endian or arr.itemsize == 1):
        return arr, s  # the common case: sent as it is
    want = numpy_dtype(s)
    native = arr.dtype.newbyteorder("=") if arr.dtype.byteorder in "<>" else arr.dtype
    if native != want:
        if s == ir.DType.BFLOAT16 and native == np.dtype(np.uint16):
            arr = arr.astype("<u2", copy=False).view(want)
        elif arr.dtype.kind in "biuf" or (BFLOAT16 is not None and arr.dtype == BFLOAT16):
            arr = arr.astype(want)
        else:
            raise errors.InvalidArgument(f"a {arr.dtype} array cannot be sent as {name(s)}")
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and not np.little_endian):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return np.ascontiguousarray(arr), s


def from_bytes(s: Scalar, shape: Sequence[int], data: Union[bytes, memoryview]) -> np.ndarray:
    """A writable array of `shape` from wire bytes, checked against the dtype's size."""
    dt, dims, want = header("a tensor", s, shape)
    if len(data) != want:
        raise errors.DataLoss(f"uopd sent {len(data)} bytes for {name(s)}{list(dims)} ({want} bytes)")
    return np.frombuffer(data, dtype=dt).reshape(dims).copy()


def header(what: str, s: Scalar, shape: Sequence[int], limit: int = 1 << 62) -> Tuple[np.dtype, Tuple[int, ...], int]:
    """numpy dtype, shape and byte size of what uopd says it sent, checked before anything
    is allocated from its numbers (a buggy or hostile server must not make us misread)."""
    try:
        dt = numpy_dtype(s)
    except errors.Error:
        raise errors.Internal(f"uopd sent {what} with dtype number {s}") from None
    dims = tuple(int(d) for d in shape)
    n = 1
    for d in dims:
        if d < 0:
            raise errors.Internal(f"uopd sent {what} with shape {list(dims)}")
        n *= d
    if n * dt.itemsize > limit:
        raise errors.Internal(f"uopd sent {what} with shape {list(dims)}")
    return dt, dims, n * dt.itemsize
