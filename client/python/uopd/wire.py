"""The few messages of the hot path, encoded and decoded by hand: protobuf's Python
encoding of a 1 MiB chunk copies it three times, and building a Run request as messages
(a Binding and a Tensor per input, the graph copied in) costs more than uopd takes to run
it cached. A protobuf message is its fields concatenated (in any order), each a key
(field number and wire type) and a value; only what uopd.proto needs is here.
"""
from __future__ import annotations

from typing import Sequence, Tuple, Union

from uopd import errors

Part = Union[bytes, memoryview]  # a piece of an encoding, joined with the others once

def varint(n: int) -> bytes:
    """An unsigned varint; a negative number (protobuf's 10-byte two's complement) is
    never needed here, so it is refused."""
    if 0 <= n < 0x80:
        return _ONE_BYTE[n]
    if n < 0:
        raise ValueError(f"a negative varint ({n})")
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


_ONE_BYTE = tuple(bytes((i,)) for i in range(0x80))


def key(field: int, wire_type: int) -> bytes:
    k = field << 3 | wire_type
    return _ONE_BYTE[k] if k < 0x80 else varint(k)


def length_prefix(field: int, length: int) -> bytes:
    """The key and length of a length-delimited field (bytes, string, message) whose
    `length` bytes follow."""
    return key(field, 2) + (_ONE_BYTE[length] if 0 <= length < 0x80 else varint(length))


def uint_field(field: int, value: int) -> bytes:
    return key(field, 0) + (_ONE_BYTE[value] if 0 <= value < 0x80 else varint(value))


def bytes_field(field: int, data: Part) -> bytes:
    """A length-delimited field (bytes, string or an encoded message), copied once."""
    return b"".join((length_prefix(field, len(data)), data))


def packed_field(field: int, values: Sequence[int]) -> bytes:
    """A packed repeated varint field (e.g. a shape, int64 >= 0); none: nothing, as
    protobuf writes an empty repeated field."""
    if not values:
        return b""
    return bytes_field(field, b"".join(varint(v) for v in values))


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
