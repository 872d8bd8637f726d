"""put / numpy round trips: every dtype uopd has, strided and odd layouts, chunked
transfers with progress, the bfloat16 bits, buffers bound as inputs."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import uopd
from uopd import dtypes, transfers

INT_AND_FLOAT = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
                 "float64"]


def values(dtype, shape, seed=1):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)


@pytest.mark.parametrize("dtype", INT_AND_FLOAT)
def test_every_dtype_round_trips(session, dtype):
    a = values(dtype, (3, 5, 7))
    buf = session.put(a)
    assert buf.dtype == dtype and buf.shape == (3, 5, 7) and buf.nbytes == a.nbytes
    back = buf.numpy()
    assert back.dtype == a.dtype and back.shape == a.shape
    np.testing.assert_array_equal(back, a)
    assert back.flags.writeable


def test_bool_round_trips(session):
    a = np.random.default_rng(2).random((4, 9)) > 0.5
    buf = session.put(a)
    assert buf.dtype == "bool"
    np.testing.assert_array_equal(buf.numpy(), a)


def test_bfloat16_as_bits(session):
    # bfloat16 of 1.0, -2.0, 0.5, inf: the upper halves of their float32 bits.
    f32 = np.array([1.0, -2.0, 0.5, np.inf], dtype=np.float32)
    bits = (f32.view(np.uint32) >> 16).astype(np.uint16)
    buf = session.put(bits, dtype="bfloat16")
    assert buf.dtype == "bfloat16"
    back = buf.numpy()
    if dtypes.BFLOAT16 is None:
        assert back.dtype == np.uint16
        np.testing.assert_array_equal(back, bits)
    else:
        np.testing.assert_array_equal(back.astype(np.float32), f32)


@pytest.mark.parametrize("layout", ["strided", "transposed", "fortran", "big-endian", "negative-stride"])
def test_non_contiguous_arrays_are_sent_as_c_order(session, layout):
    base = values("float32", (6, 8), seed=3)
    a = {"strided": base[::2, 1::3], "transposed": base.T, "fortran": np.asfortranarray(base),
         "big-endian": base.astype(">f4"), "negative-stride": base[::-1, ::-2]}[layout]
    back = session.put(a).numpy()
    np.testing.assert_array_equal(back, a)
    assert back.dtype == np.float32 and back.flags["C_CONTIGUOUS"]


def test_large_transfer_is_chunked_with_progress(session):
    a = values("uint8", (3 * transfers.DEFAULT_CHUNK_BYTES + 12345,), seed=4)
    up, down = [], []
    buf = session.put(a, progress=lambda done, total: up.append((done, total)))
    back = buf.numpy(progress=lambda done, total: down.append((done, total)))
    np.testing.assert_array_equal(back, a)
    for seen in (up, down):
        assert len(seen) == 4  # three full chunks and the rest
        assert [d for d, _ in seen] == sorted(d for d, _ in seen) and seen[-1] == (a.nbytes, a.nbytes)


def test_download_into_populated_pages_keeps_every_byte(session):
    # Past POPULATE_BYTES a download's destination is populated by a thread of its own
    # while the chunks are copied in: every byte must still be the one uploaded.
    a = values("uint8", (transfers.POPULATE_BYTES + 3 * transfers.DEFAULT_CHUNK_BYTES + 777,), seed=5)
    buf = session.put(a)
    for _ in range(2):
        np.testing.assert_array_equal(buf.numpy(), a)


def test_populating_pages_never_changes_what_is_in_them():
    # Filled front to back while the populating thread runs over it: nothing written
    # before, during or after is lost (MADV_POPULATE_WRITE maps pages, never writes).
    out = np.empty(transfers.POPULATE_BYTES * 4, dtype=np.uint8)
    pattern = np.arange(1 << 20, dtype=np.uint32).view(np.uint8)
    t = transfers.populate_ahead(out)
    for at in range(0, out.nbytes, pattern.nbytes):
        out[at:at + pattern.nbytes] = pattern
    if t is not None:
        t.join()
    assert (out.reshape(-1, pattern.nbytes) == pattern).all()


MALLOC_CHILD = r"""
import ctypes, json, sys
import uopd
from uopd import transfers
with uopd.connect(sys.argv[1], tune_malloc=sys.argv[2] == "1") as client:
    block = bytearray(4 << 20)  # a transfer's block
    at = ctypes.addressof((ctypes.c_char * len(block)).from_buffer(block))
    heap = [tuple(int(x, 16) for x in line.split()[0].split("-"))
            for line in open("/proc/self/maps") if line.rstrip().endswith("[heap]")]
    print(json.dumps({"tuned": transfers._malloc_tuned, "on_heap": any(lo <= at < hi for lo, hi in heap)}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
@pytest.mark.parametrize("how", ["default", "refused", "tunables"])
def test_connect_raises_the_malloc_thresholds_unless_told_not_to(server, how):
    # As the C++ client: a 4 MiB block comes from the heap (reused) once connect() has
    # raised glibc's mmap threshold, which glibc otherwise serves as a fresh mapping.
    env = dict(os.environ)
    if how == "tunables":
        env["GLIBC_TUNABLES"] = "glibc.malloc.check=0"
    r = subprocess.run([sys.executable, "-c", MALLOC_CHILD, server.address, "0" if how == "refused" else "1"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if how == "default":
        assert got == {"tuned": True, "on_heap": True}
    else:
        assert got["tuned"] is (None if how == "refused" else False)
        assert not got["on_heap"]


def test_put_on_a_device_of_the_session(client):
    with client.session(["CPU:0", "CPU:1"]) as s:
        a = values("int32", (7,), seed=5)
        buf = s.put(a, device="CPU:1")
        assert buf.device == "CPU:1"
        np.testing.assert_array_equal(buf.numpy(), a)
        # A device the server has no worker for (as CreateSession answers it); uopd's
        # message names the device and the ones it has.
        with pytest.raises(uopd.Unavailable, match="CPU:7.*devices: CPU:0, CPU:1"):
            s.put(a, device="CPU:7")


def test_write_and_empty(session):
    buf = session.empty("int32", (2, 3))
    assert buf.shape == (2, 3) and buf.dtype == "int32"
    buf.write(np.arange(6, dtype=np.int32).reshape(2, 3))
    np.testing.assert_array_equal(buf.numpy(), np.arange(6).reshape(2, 3))


def test_byte_ranges(session):
    buf = session.put(np.arange(8, dtype=np.int32))
    np.testing.assert_array_equal(buf.read_bytes(8, 12).view(np.int32), [2, 3, 4])
    buf.write_bytes(np.array([-1, -2], np.int32), offset=20)
    np.testing.assert_array_equal(buf.numpy(), [0, 1, 2, 3, 4, -1, -2, 7])
    assert buf.read_bytes(28).view(np.int32).tolist() == [7]
    with pytest.raises(uopd.Error):
        buf.write_bytes(b"12345678", offset=28)  # past its end


def test_freed_buffer_is_not_found(session):
    buf = session.put(np.zeros(4, np.float32))
    buf.free()
    with pytest.raises(uopd.NotFound) as e:
        buf.numpy()
    assert buf.id in e.value.message or "buffer" in e.value.message


def test_unsupported_dtype_is_refused_here(session):
    with pytest.raises(uopd.InvalidArgument, match="complex"):
        session.put(np.zeros(3, np.complex64))
