"""Errors as exceptions: one class per gRPC status code, all under :class:`Error`.

Every failed call raises the subclass for the status uopd (or gRPC) answered, carrying
the code and uopd's message unchanged, e.g. ``InvalidArgument("binding 'a': an inline
tensor of 12 bytes of float32; the graph wants 12 x float32 (48 bytes)")``. Checks the
client makes itself raise the same classes (a dtype it cannot send: InvalidArgument; a
server's answer that does not add up: DataLoss or Internal), as the C++ client does.
"""
from __future__ import annotations

from typing import Optional

import grpc


class Error(Exception):
    """A failed uopd call: ``code`` (a grpc.StatusCode) and ``message`` (uopd's words)."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


def _kind(name: str, code: grpc.StatusCode, doc: str) -> type[Error]:
    return type(name, (Error,), {"code": code, "__doc__": doc, "__module__": __name__})


Cancelled: type[Error] = _kind("Cancelled", grpc.StatusCode.CANCELLED, "The call was cancelled by this client.")
Unknown: type[Error] = _kind("Unknown", grpc.StatusCode.UNKNOWN, "A status gRPC does not know.")
InvalidArgument: type[Error] = _kind("InvalidArgument", grpc.StatusCode.INVALID_ARGUMENT,
                        "The graph, a binding, a model or an option was wrong; the message names it.")
DeadlineExceeded: type[Error] = _kind("DeadlineExceeded", grpc.StatusCode.DEADLINE_EXCEEDED, "The request ran out of time.")
NotFound: type[Error] = _kind("NotFound", grpc.StatusCode.NOT_FOUND, "An unknown session, buffer or model (or a file).")
AlreadyExists: type[Error] = _kind("AlreadyExists", grpc.StatusCode.ALREADY_EXISTS, "It exists already.")
PermissionDenied: type[Error] = _kind("PermissionDenied", grpc.StatusCode.PERMISSION_DENIED, "The tenant may not do this.")
ResourceExhausted: type[Error] = _kind("ResourceExhausted", grpc.StatusCode.RESOURCE_EXHAUSTED,
                          "A quota or limit was reached; the message names the limit.")
FailedPrecondition: type[Error] = _kind("FailedPrecondition", grpc.StatusCode.FAILED_PRECONDITION,
                           "The call does not fit the state (e.g. downloading an output that was not kept).")
Aborted: type[Error] = _kind("Aborted", grpc.StatusCode.ABORTED, "Aborted.")
OutOfRange: type[Error] = _kind("OutOfRange", grpc.StatusCode.OUT_OF_RANGE, "Past the end (of a buffer).")
Unimplemented: type[Error] = _kind("Unimplemented", grpc.StatusCode.UNIMPLEMENTED, "Not implemented by this uopd.")
Internal: type[Error] = _kind("Internal", grpc.StatusCode.INTERNAL, "A bug, or an answer from uopd that makes no sense.")
Unavailable: type[Error] = _kind("Unavailable", grpc.StatusCode.UNAVAILABLE,
                    "uopd or a worker is unreachable or went away; retrying may help.")
DataLoss: type[Error] = _kind("DataLoss", grpc.StatusCode.DATA_LOSS, "Data came back short or out of order.")
Unauthenticated: type[Error] = _kind("Unauthenticated", grpc.StatusCode.UNAUTHENTICATED, "No token, or a token uopd does not know.")

_BY_CODE = {cls.code: cls for cls in (
    Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists, PermissionDenied,
    ResourceExhausted, FailedPrecondition, Aborted, OutOfRange, Unimplemented, Internal, Unavailable,
    DataLoss, Unauthenticated)}


def from_status(code: grpc.StatusCode, message: str) -> Error:
    """The exception for a gRPC status. A CANCELLED this client did not ask for is the
    server's or the connection's doing (a scheduler shutting down), as retryable as
    UNAVAILABLE and reported so, like the C++ client."""
    if code == grpc.StatusCode.CANCELLED:
        why = message or "no reason given"
        return Unavailable(f"uopd or the connection cancelled the call ({why}); the server may be shutting down: retry")
    return _BY_CODE.get(code, Unknown)(message, code)


def from_rpc_error(e: grpc.RpcError) -> Error:
    """The exception for a failed gRPC call (sync or asyncio)."""
    code = e.code() if callable(getattr(e, "code", None)) else grpc.StatusCode.UNKNOWN
    details = e.details() if callable(getattr(e, "details", None)) else str(e)
    return from_status(code or grpc.StatusCode.UNKNOWN, details or "")
