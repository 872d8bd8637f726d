"""The few messages of the hot path, encoded and decoded by hand: protobuf's Python
encoding of a 1 MiB chunk copies it three times and of even a small graph costs more than
uopd takes to run it cached. A protobuf message is its fields concatenated (in any order),
each a key (field number and wire type) and a value; only what uopd.proto needs is here.
"""
from __future__ import annotations

from typing import Tuple

from uopd import errors


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def key(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def length_prefix(field: int, length: int) -> bytes:
    """The key and length of a length-delimited field (bytes, string, message) whose
    `length` bytes follow."""
    return key(field, 2) + varint(length)


def uint_field(field: int, value: int) -> bytes:
    return key(field, 0) + varint(value)


def _read_varint(raw: bytes, i: int) -> Tuple[int, int]:
    value, shift = 0, 0
    while True:
        if i >= len(raw) or shift > 63:
            raise errors.DataLoss("uopd sent a download chunk that is not a DownloadChunk")
        b = raw[i]
        value |= (b & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not b & 0x80:
            return value, i


def parse_chunk(raw: bytes) -> Tuple[int, memoryview]:
    """A uopd.v1.DownloadChunk's offset and data, the data a view into the message's bytes:
    protobuf's parser would copy each chunk twice more. Fields other than offset (1) and
    data (2) are skipped; what does not parse is DATA_LOSS."""
    view = memoryview(raw)
    offset, data, i = 0, view[0:0], 0
    while i < len(raw):
        key, i = _read_varint(raw, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(raw, i)
            if field == 1:
                offset = value
        elif wire == 2:
            n, i = _read_varint(raw, i)
            if i + n > len(raw):
                raise errors.DataLoss("uopd sent a download chunk that is not a DownloadChunk")
            if field == 2:
                data = view[i:i + n]
            i += n
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise errors.DataLoss("uopd sent a download chunk that is not a DownloadChunk")
    if i != len(raw):
        raise errors.DataLoss("uopd sent a download chunk that is not a DownloadChunk")
    return offset, data
