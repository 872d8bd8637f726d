"""Connecting to uopd: where (``address``, $UOPD_ADDRESS, 127.0.0.1:7070, as `uop`), with
which credentials (a tenant's bearer token, $UOPD_TOKEN; TLS), and the Client that holds the
channel: sessions, Compile, Explain, Stats. Channel settings match the C++ client's
(client/client.cc): no limit on received messages (outputs and binaries come back inline),
reconnects within 100 ms - 2 s after a server restart, a deadline on every request.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import grpc
import grpc.experimental

from uopd import calls, errors, results, transfers
from uopd._stubs import pb
from uopd.embedded import EmbeddedServer
from uopd.graphs import GraphLike
from uopd.session import Session
from uopd.transfers import effective_chunk_bytes
from uopd.wire import parse_chunk

# Where uopd listens by default (its --listen default).
DEFAULT_ADDRESS = "127.0.0.1:7070"


@dataclass(frozen=True)
class TLS:
    """TLS to a uopd started with --tls-cert. `ca` (PEM) checks the server's certificate
    (None: the system's roots); `cert` and `key` are this client's, for a server that
    requires one (--tls-client-ca); `server_name` is the name to expect in the server's
    certificate instead of the address's host."""

    ca: Optional[str] = None
    cert: Optional[str] = None
    key: Optional[str] = None
    server_name: Optional[str] = None


TLSArg = Union[None, bool, str, "os.PathLike[str]", TLS, Mapping[str, str]]


def _tls(tls: TLSArg) -> Optional[TLS]:
    """None / False: plaintext; True: TLS with the system's roots; a path: that CA; a TLS
    or a mapping with its fields."""
    if tls is None or tls is False:
        return None
    if tls is True:
        return TLS()
    if isinstance(tls, TLS):
        return tls
    if isinstance(tls, Mapping):
        unknown = set(tls) - {"ca", "cert", "key", "server_name"}
        if unknown:
            raise errors.InvalidArgument(f"tls takes ca, cert, key and server_name, not {', '.join(sorted(unknown))}")
        return TLS(**tls)
    return TLS(ca=os.fspath(tls))


def _read_pem(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        raise errors.NotFound(f"{what} {path}: cannot open it") from None
    if b"-----BEGIN " not in data:
        raise errors.InvalidArgument(f"{what} {path}: not a PEM file")
    return data


@dataclass
class Connection:
    """The options of a connection and what every request carries; both flavours' clients
    (uopd.Client, uopd.aio.Client) make their channels from it."""

    address: str
    token: Optional[str] = None
    tls: Optional[TLS] = None
    deadline: float = 60.0  # seconds, each request
    connect_timeout: float = 10.0  # connect() waiting for the channel
    chunk_bytes: int = 0  # upload / download chunks; 0: 1 MiB
    metadata: Tuple[Tuple[str, str], ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        self.chunk_bytes = effective_chunk_bytes(self.chunk_bytes)
        # Over TLS the token is the channel's call credentials; on a plaintext channel
        # (loopback) plain metadata, since gRPC sends call credentials over TLS only.
        if self.token and self.tls is None:
            self.metadata = (("authorization", f"Bearer {self.token}"),)

    def channel_options(self) -> List[Tuple[str, Any]]:
        opts: List[Tuple[str, Any]] = [
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]
        if self.tls is not None and self.tls.server_name:
            opts.append(("grpc.ssl_target_name_override", self.tls.server_name))
        return opts

    def credentials(self) -> Optional[grpc.ChannelCredentials]:
        """TLS channel credentials with the token as call credentials; None: plaintext."""
        t = self.tls
        if t is None:
            return None
        if bool(t.cert) != bool(t.key):
            raise errors.InvalidArgument("a TLS client certificate needs its key, and a key its certificate")
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read_pem(t.ca, "TLS CA") if t.ca else None,
            private_key=_read_pem(t.key, "TLS key") if t.key else None,
            certificate_chain=_read_pem(t.cert, "TLS certificate") if t.cert else None)
        if self.token:
            creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(self.token))
        return creds

    def call_options(self, call: "calls.Call") -> Dict[str, Any]:
        """What every request carries: its deadline (shorter where the call asks) and the
        token's metadata."""
        limit = call.limit if isinstance(call, calls.Unary) else None
        return {"timeout": self.deadline if limit is None else min(self.deadline, limit), "metadata": self.metadata}

    def unreachable(self) -> errors.Error:
        wait = min(self.connect_timeout, self.deadline)
        return errors.Unavailable(f"cannot reach uopd at {self.address} (not ready after {wait:g}s)")


def _serialize(request: Any) -> bytes:
    """A request as sent: already encoded (calls.with_graph), or a message."""
    return request if isinstance(request, bytes) else request.SerializeToString()


def methods(channel: Any) -> Dict[str, Any]:
    """The Uopd service's methods on a grpc or grpc.aio channel, made from its descriptor
    rather than the generated stub's: requests may arrive encoded already, and download
    chunks are read without protobuf's copies (wire.parse_chunk)."""
    service = pb.DESCRIPTOR.services_by_name["Uopd"]
    out = {}
    for m in service.methods:
        kind = ("stream_" if m.client_streaming else "unary_") + ("stream" if m.server_streaming else "unary")
        answer = parse_chunk if m.name == "Download" else getattr(pb, m.output_type.name).FromString
        out[m.name] = getattr(channel, kind)(f"/{service.full_name}/{m.name}", request_serializer=_serialize,
                                             response_deserializer=answer)
    return out


def connection(address: Optional[str], token: Optional[str], tls: TLSArg, deadline: float, connect_timeout: float,
               chunk_bytes: int, embedded: bool, tune_malloc: bool = True) -> Connection:
    """The options as `uop` resolves them: address, else $UOPD_ADDRESS, else the default;
    token, else $UOPD_TOKEN. With tune_malloc, the process's malloc thresholds are raised
    for transfers (transfers.tune_malloc) on the first connect."""
    if tune_malloc:
        transfers.tune_malloc()
    if embedded and address:
        raise errors.InvalidArgument("embedded=True and an address exclude each other")
    if not (deadline > 0):
        raise errors.InvalidArgument(f"deadline takes a positive number of seconds, got {deadline}")
    addr = address or os.environ.get("UOPD_ADDRESS") or DEFAULT_ADDRESS
    return Connection(addr, token if token is not None else os.environ.get("UOPD_TOKEN") or None, _tls(tls),
                      deadline, connect_timeout, chunk_bytes)


class Client:
    """A connection to uopd. Make one with :func:`uopd.connect`; close it (or use it as a
    context manager) to close its channel and stop its embedded uopd, if any. Thread-safe
    like gRPC's channels; a Session is for one thread at a time."""

    _session_class: type = Session

    def __init__(self, conn: Connection, embedded: Optional[EmbeddedServer] = None):
        self.connection = conn
        self.embedded = embedded
        creds = conn.credentials()
        # A download (a server stream) read on the calling thread: without it, gRPC's
        # polling thread takes each chunk and hands it over, a thread switch per chunk.
        options = conn.channel_options() + [(grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)]
        self._channel = grpc.secure_channel(conn.address, creds, options) if creds else \
            grpc.insecure_channel(conn.address, options)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=min(conn.connect_timeout, conn.deadline))
        except grpc.FutureTimeoutError:
            self.close()
            raise conn.unreachable() from None
        self._methods = methods(self._channel)

    @property
    def address(self) -> str:
        return self.connection.address

    async def _execute(self, call: calls.Call) -> Any:
        """One RPC of a flow (uopd.calls); gRPC errors become uopd.Error. Written once for
        both flavours: here the calls block and _answer / _stream only wrap what they
        return (nothing suspends); uopd.aio's await them."""
        kw = self.connection.call_options(call)
        try:
            if isinstance(call, calls.Download):
                stream = self._methods["Download"](call.request, **kw)
                try:
                    async for chunk in self._stream(stream):
                        call.sink(chunk)
                except errors.Error:
                    stream.cancel()
                    raise
                return None
            return await self._answer(self._methods[call.method](calls.request_of(call), **kw))
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None

    @staticmethod
    async def _answer(response: Any) -> Any:
        return response

    @staticmethod
    async def _stream(responses: Any) -> Any:
        for r in responses:
            yield r

    def _drive(self, flow: calls.Flow) -> Any:
        return calls.run_now(calls.drive(flow, self._execute))

    def session(self, devices: Sequence[str] = (), idle_timeout: Optional[float] = None) -> Session:
        """A new session on `devices` (e.g. ["CPU:0"]; empty: the server's first CPU),
        closed after `idle_timeout` seconds without a request (None: the server's default)."""
        flow = calls.create_session(devices, idle_timeout)
        return self._drive(calls.then(flow, lambda r: self._session_class(self, *r)))

    def compile(self, graph: GraphLike, target: str = "cpu", include_binary: bool = False,
                include_source: bool = False) -> results.CompileResult:
        """The graph's kernels, compiled for `target` ("cpu", "cuda", "cuda:sm_90") or
        found in the cache, with their cache status."""
        return self._drive(calls.compile_graph(graph, target, include_binary, include_source))

    def explain_stages(self, graph: GraphLike, stage: Optional[str] = None,
                       target: str = "cpu") -> List[results.ExplainStage]:
        """The IR after each stage of uopd's pipeline (only `stage` when given)."""
        return self._drive(calls.explain(graph, stage, target))

    def explain(self, graph: GraphLike, stage: Optional[str] = None, target: str = "cpu") -> str:
        """explain_stages as `uop explain` prints it."""
        return self._drive(calls.then(calls.explain(graph, stage, target), results.explain_text))

    def stats(self) -> results.Stats:
        """The server's counters: workers, caches, plans, sessions, model weights."""
        return self._drive(calls.stats())

    def close(self) -> None:
        """Closes the channel, then stops the embedded uopd (if this client started one)."""
        self._channel.close()
        if self.embedded is not None:
            server, self.embedded = self.embedded, None
            server.stop()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(address: Optional[str] = None, *, token: Optional[str] = None, tls: TLSArg = None,
            embedded: bool = False, uopd: Optional[str] = None, uopd_args: Sequence[str] = (),
            deadline: float = 60.0, connect_timeout: float = 10.0, chunk_bytes: int = 0,
            tune_malloc: bool = True) -> Client:
    """Connects to uopd and waits (at most connect_timeout) for the channel to be ready;
    Unavailable naming the address otherwise.

    address: HOST:PORT; default $UOPD_ADDRESS, else 127.0.0.1:7070.
    token: the tenant's bearer token for a uopd started with --tokens-file; default $UOPD_TOKEN.
    tls: None (plaintext), True (the system's roots), a CA file, or uopd.TLS(ca, cert, key, server_name).
    embedded: start a private uopd (uopd=PATH, else $UOPD_BINARY, the build tree's, PATH) on a
        free loopback port with `uopd_args`, stopped when the client closes.
    deadline: seconds for each request. chunk_bytes: transfer chunk size (0: 1 MiB).
    tune_malloc: raise glibc's malloc thresholds once per process so that transfers reuse
        their blocks (as the C++ client does; process-wide, skipped under GLIBC_TUNABLES).
    """
    conn = connection(address, token, tls, deadline, connect_timeout, chunk_bytes, embedded, tune_malloc)
    if not embedded:
        return Client(conn)
    server = EmbeddedServer(uopd, uopd_args)
    conn.address = server.address
    try:
        return Client(conn, server)
    except BaseException:
        server.stop()
        raise
