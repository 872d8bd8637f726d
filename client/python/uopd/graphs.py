"""Graphs as uopd takes them: a uop.v1.Graph (proto/uop.proto) from a file, bytes or the
message itself, read the way `uop` reads graph files (compiler/ir/codec.h, read_graph_file):
``*.json`` is the protobuf JSON mapping of the message (enum values by name, unknown
fields refused), ``*.uopb`` its binary encoding, any other name binary first, then JSON.
The graph is checked by uopd (which answers INVALID_ARGUMENT naming the node and rule);
here it is only parsed.
"""
from __future__ import annotations

import os
from typing import Union

from google.protobuf import json_format, message

from uopd import errors
from uopd._stubs import ir



class Graph:
    """A graph read and encoded once (``uopd.graph(path)``): pass it to run / compile /
    explain as often as wanted without reading, parsing or encoding it again (protobuf's
    Python encoding of even a small graph costs more than uopd takes to run it cached).
    It holds the binary encoding; ``message`` parses it back."""

    __slots__ = ("data", "where")

    def __init__(self, graph: "GraphLike"):
        g = load(graph)
        self.data: bytes = g.SerializeToString()
        self.where = os.fspath(graph) if isinstance(graph, (str, os.PathLike)) and not _is_json_text(graph) else ""

    @property
    def message(self) -> "ir.Graph":
        return ir.Graph.FromString(self.data)

    def __repr__(self) -> str:
        return f"uopd.Graph({self.where or len(self.data)})"


GraphLike = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, "ir.Graph", Graph]

# What `uop` reads at most (DecodeLimits' max_bytes, uopd's --max-request-bytes default).
MAX_GRAPH_BYTES = 256 << 20


def _from_json(text: Union[str, bytes], where: str) -> "ir.Graph":
    g = ir.Graph()
    try:
        json_format.Parse(text, g, ignore_unknown_fields=False)
    except (json_format.ParseError, ValueError) as e:
        why = str(e)
        raise errors.InvalidArgument(f"{where}the text is not uop.v1.Graph JSON: {why[:200]}") from None
    return g


def _from_binary(data: bytes, where: str) -> "ir.Graph":
    g = ir.Graph()
    try:
        g.ParseFromString(bytes(data))
    except message.DecodeError:
        raise errors.InvalidArgument(f"{where}the bytes are not a uop.v1.Graph protobuf") from None
    return g


def _looks_like_json(data: bytes) -> bool:
    return data.lstrip()[:1] == b"{"


def from_bytes(data: Union[bytes, bytearray, memoryview], where: str = "") -> "ir.Graph":
    """A graph from its encoding: JSON when it starts with '{', else binary."""
    data = bytes(data)
    return _from_json(data, where) if _looks_like_json(data) else _from_binary(data, where)


def read_file(path: Union[str, "os.PathLike[str]"]) -> "ir.Graph":
    """A graph file by its extension, as `uop` reads it; NotFound if it cannot be opened."""
    path = os.fspath(path)
    where = f"{path}: "
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_GRAPH_BYTES + 1)
    except OSError as e:
        raise errors.NotFound(f"{path}: cannot read it ({e.strerror})") from None
    if len(data) > MAX_GRAPH_BYTES:
        raise errors.InvalidArgument(f"{path}: more than {MAX_GRAPH_BYTES} bytes")
    if path.endswith(".json"):
        return _from_json(data, where)
    if path.endswith(".uopb"):
        return _from_binary(data, where)
    try:
        return _from_binary(data, where)
    except errors.InvalidArgument:
        if _looks_like_json(data):
            return _from_json(data, where)
        raise


def load(graph: GraphLike) -> "ir.Graph":
    """The uop.v1.Graph message for what a caller passed: the message itself, the bytes of
    its encoding (JSON or binary), a str starting with '{' (JSON text), or a file path."""
    if isinstance(graph, ir.Graph):
        return graph
    if isinstance(graph, Graph):
        return graph.message
    if isinstance(graph, (bytes, bytearray, memoryview)):
        return from_bytes(graph)
    if _is_json_text(graph):
        return _from_json(graph, "")
    if isinstance(graph, (str, os.PathLike)):
        return read_file(graph)
    raise errors.InvalidArgument(f"a graph is a path, bytes or a uop.v1.Graph, not {type(graph).__name__}")


def _is_json_text(graph: object) -> bool:
    return isinstance(graph, str) and graph.lstrip().startswith("{")


def encode(graph: GraphLike) -> bytes:
    """The binary encoding of a graph, as a request carries it: a Graph's own bytes, a
    message's serialization, any other form parsed first (so a file's errors name it)."""
    if isinstance(graph, Graph):
        return graph.data
    return load(graph).SerializeToString()


def to_json(graph: "ir.Graph") -> str:
    """The JSON form `uopc convert` writes (field names as in the .proto)."""
    return json_format.MessageToJson(graph, preserving_proto_field_name=True)
