"""Bulk data in chunks, as the C++ client moves it (client/client.h): uploads are streams of
UploadChunk (the first names the session and buffer, each carries its byte offset),
downloads streams of DownloadChunk checked to follow each other. Chunks are 1 MiB unless
asked otherwise, at most 4 MiB less 4 KiB (the server takes up to 4 MiB a message and
gRPC's limit counts the whole message). A model's bytes go up the same way.

Progress: ``progress=`` takes a callback(bytes_done, bytes_total), called after each
chunk; without one, a tqdm bar is shown on stderr for transfers of 64 MiB or more when
tqdm is installed and stderr is a terminal; ``progress=False`` shows nothing.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Any, Callable, Iterator, Optional, Tuple, Union

import numpy as np

from uopd import errors, wire

DEFAULT_CHUNK_BYTES = 1 << 20
MAX_CHUNK_BYTES = (4 << 20) - (4 << 10)
# Inputs larger than this go to uopd as buffers of the session, streamed in chunks;
# smaller ones travel inside the Run request (as `uop` does).
INLINE_INPUT_BYTES = 1 << 20
# Transfers this large get a progress bar by default (tqdm on a terminal).
BAR_BYTES = 64 << 20
# Downloads this large have their destination's pages populated ahead of the data by a
# thread of their own (populate_ahead).
POPULATE_BYTES = 16 << 20

ProgressFn = Callable[[int, int], None]
ProgressArg = Union[ProgressFn, bool, None]


def effective_chunk_bytes(requested: int) -> int:
    """0: the default; else clamped to [1, MAX_CHUNK_BYTES]."""
    if requested <= 0:
        return DEFAULT_CHUNK_BYTES
    return min(requested, MAX_CHUNK_BYTES)


class Progress:
    """Reports bytes done to a callback or a tqdm bar (see the module's docstring)."""

    def __init__(self, total: int, progress: ProgressArg, what: str):
        self.total, self.done = total, 0
        self._fn: Optional[ProgressFn] = progress if callable(progress) else None
        self._bar: Any = None
        if progress is None and total >= BAR_BYTES and sys.stderr is not None and sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=total, unit="B", unit_scale=True, desc=what, leave=False)

    def add(self, n: int) -> None:
        self.done += n
        if self._fn is not None:
            self._fn(self.done, self.total)
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def byte_view(data: Union[np.ndarray, bytes, bytearray, memoryview]) -> memoryview:
    """A flat byte view of contiguous data, without a copy."""
    if isinstance(data, np.ndarray):
        if not data.flags["C_CONTIGUOUS"]:
            raise errors.InvalidArgument("a strided array is made contiguous before it is sent (dtypes.host_array)")
        if data.dtype.isbuiltin != 1 or data.size == 0:  # ml_dtypes' bfloat16 exports no buffer format
            data = data.reshape(-1).view(np.uint8)
    return memoryview(data).cast("B")


def chunks(first: bytes, data: memoryview, chunk_bytes: int, progress: Progress, data_field: int,
           offset_field: Optional[Tuple[int, int]] = None) -> Iterator[bytes]:
    """The messages of an upload stream, encoded: `first` (the encoded fields naming the
    session and buffer or model) goes with the first chunk; an empty upload is one empty
    chunk. Each message is one chunk of `data` as field `data_field` and, with
    offset_field = (field, offset), its byte offset: `offset` plus the bytes before it.
    Each chunk is copied once, into its message."""
    chunk = effective_chunk_bytes(chunk_bytes)
    done = 0
    head = first
    while True:
        n = min(chunk, len(data) - done)
        if offset_field is not None:
            head += wire.uint_field(offset_field[0], offset_field[1] + done)
        yield b"".join((head, wire.length_prefix(data_field, n), data[done:done + n]))
        done += n
        progress.add(n)
        if done >= len(data):
            break
        head = b""
    progress.close()


_MADV_POPULATE_WRITE = 23  # Linux 5.14 and later
_PAGE = 4096


def _madvise() -> Optional[Callable[[int, int, int], int]]:
    """libc's madvise where there is one (Linux; elsewhere None)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _madvise()

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_malloc_tuned: Optional[bool] = None


def tune_malloc() -> bool:
    """Raises glibc's mmap and trim thresholds once per process, as the C++ client does
    (ClientOptions::tune_malloc): the 1-4 MiB blocks gRPC's Python layer builds each
    chunk in are then reused from the heap instead of mapped, page-faulted in and given
    back for every chunk (a 256 MiB download spent about a fifth of its time so). Blocks up
    to 64 MiB stay on the heap and up to 256 MiB of freed heap stays mapped. Process-wide:
    not where the process chose its own malloc settings (GLIBC_TUNABLES), nor off glibc;
    connect(tune_malloc=False) leaves them alone. Whether it changed them."""
    global _malloc_tuned
    if _malloc_tuned is None:
        _malloc_tuned = False
        if sys.platform.startswith("linux") and "GLIBC_TUNABLES" not in os.environ:
            try:
                mallopt = ctypes.CDLL(None).mallopt
            except (OSError, AttributeError):  # musl and others: no mallopt
                return False
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            _malloc_tuned = bool(mallopt(_M_MMAP_THRESHOLD, 64 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 256 << 20))
    return _malloc_tuned


def populate_ahead(out: np.ndarray) -> Optional[threading.Thread]:
    """Populates the pages of a freshly allocated array in a thread of its own, front to
    back, while the caller fills it. A new array's pages are mapped on first write, and
    those page faults (zeroing each page) cost a 256 MiB download about a third of its
    time when they happen inside the copies from gRPC's messages; here they happen while
    the calling thread waits for the next message (ctypes lets go of the GIL).
    MADV_POPULATE_WRITE maps the pages as a write would, without writing: a page the
    caller has filled already keeps its data, so the two threads never race. The thread
    holds `out` until it is done; a kernel without it (EINVAL) just faults as before."""
    if _MADVISE is None or out.nbytes < POPULATE_BYTES:
        return None
    start = out.ctypes.data & ~(_PAGE - 1)
    end = out.ctypes.data + out.nbytes

    def run(keep: np.ndarray = out) -> None:
        step = 8 << 20  # in pieces, so the front is ready first
        for at in range(start, end, step):
            if _MADVISE(at, min(step, end - at), _MADV_POPULATE_WRITE) != 0:
                return

    t = threading.Thread(target=run, name="uopd-populate", daemon=True)
    t.start()
    return t


class Assembler:
    """A download's chunks into one preallocated array of `nbytes`, checked as they come:
    each must start where the last ended and none may overrun what was asked for
    (DATA_LOSS naming what uopd sent otherwise)."""

    def __init__(self, buffer_id: str, offset: int, nbytes: int, progress: Progress):
        self.buffer_id, self.offset = buffer_id, offset
        self.out = np.empty(nbytes, dtype=np.uint8)
        populate_ahead(self.out)
        self._view = memoryview(self.out)
        self.filled = 0
        self.progress = progress

    def add(self, chunk: Tuple[int, memoryview]) -> None:
        offset, data = chunk
        if offset != self.offset + self.filled:
            self._broken(f"chunk at offset {offset} where {self.offset + self.filled} was next")
        if self.filled + len(data) > len(self.out):
            self._broken(f"more than the {len(self.out)} bytes asked for")
        self._view[self.filled:self.filled + len(data)] = data
        self.filled += len(data)
        self.progress.add(len(data))

    def _broken(self, what: str) -> None:
        raise errors.DataLoss(f"download of {self.buffer_id}: uopd sent a {what}")

    def result(self) -> np.ndarray:
        self.progress.close()
        if self.filled != len(self.out):
            raise errors.DataLoss(f"download of {self.buffer_id}: uopd sent {self.filled} of {len(self.out)} bytes")
        return self.out

