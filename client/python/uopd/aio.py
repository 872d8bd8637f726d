"""The asyncio flavour of the client, over grpc.aio, with the same surface as the blocking
one: every call that talks to uopd is awaited.

    async with await uopd.aio.connect() as client:
        async with client.session() as s:
            x = await s.put(np.arange(12, dtype=np.float32))
            out = await s.run("examples/elementwise.json", a=x, b=x)
            model = await s.load_model("net.onnx")
            y = (await model(x=batch))["y"]

The operations are uopd.calls' flows, the ones the blocking client runs, here driven with
awaits; the classes are the blocking ones with their calls awaited.
"""
from __future__ import annotations

import asyncio
from typing import Any, Dict, Generator, List, Optional, Sequence

import grpc
import numpy as np

from uopd import calls, client as _client, errors, models, results, session as _session, transfers
from uopd.embedded import EmbeddedServer


class Buffer(_session.Buffer):
    """A buffer of a session (uopd.Buffer), its calls awaited."""

    async def numpy(self, progress: transfers.ProgressArg = None) -> np.ndarray:  # type: ignore[override]
        return await super().numpy(progress)

    async def write(self, array: Any, progress: transfers.ProgressArg = None) -> None:  # type: ignore[override]
        await super().write(array, progress)

    async def read_bytes(self, offset: int = 0, nbytes: Optional[int] = None) -> np.ndarray:  # type: ignore[override]
        return await super().read_bytes(offset, nbytes)

    async def write_bytes(self, data: Any, offset: int = 0) -> None:  # type: ignore[override]
        await super().write_bytes(data, offset)

    async def free(self) -> None:  # type: ignore[override]
        await super().free()


class Model(models.Model):
    """A held model (uopd.Model): ``await model(x=array)``."""

    async def __call__(self, *args: Any, **named: Any) -> Dict[str, np.ndarray]:  # type: ignore[override]
        return await super().__call__(*args, **named)

    async def execute(self, *args: Any, **kw: Any) -> results.RunResult:  # type: ignore[override]
        return await super().execute(*args, **kw)

    async def profile(self, *args: Any, **named: Any) -> List[results.KernelProfile]:  # type: ignore[override]
        return await super().profile(*args, **named)


class Session(_session.Session):
    """A session (uopd.Session), its calls awaited; ``async with`` closes it."""

    _buffer_class = Buffer
    _model_class = Model  # type: ignore[assignment]

    async def put(self, *args: Any, **kw: Any) -> Buffer:  # type: ignore[override]
        return await super().put(*args, **kw)

    async def empty(self, *args: Any, **kw: Any) -> Buffer:  # type: ignore[override]
        return await super().empty(*args, **kw)

    async def execute(self, *args: Any, **kw: Any) -> results.RunResult:  # type: ignore[override]
        return await super().execute(*args, **kw)

    async def run(self, *args: Any, **kw: Any) -> Dict[str, Any]:  # type: ignore[override]
        return await super().run(*args, **kw)

    async def profile(self, *args: Any, **kw: Any) -> List[results.KernelProfile]:  # type: ignore[override]
        return await super().profile(*args, **kw)

    async def compile(self, *args: Any, **kw: Any) -> results.CompileResult:  # type: ignore[override]
        return await super().compile(*args, **kw)

    async def explain(self, *args: Any, **kw: Any) -> str:  # type: ignore[override]
        return await super().explain(*args, **kw)

    async def stats(self) -> results.Stats:  # type: ignore[override]
        return await super().stats()

    async def load_model(self, *args: Any, **kw: Any) -> Model:  # type: ignore[override]
        return await super().load_model(*args, **kw)

    async def close(self) -> None:  # type: ignore[override]
        if self._open:
            await super().close()

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        try:
            await self.close()
        except errors.Error:
            if exc_type is None:
                raise  # else the error that ended the block says more than closing's


class _Opening:
    """What Client.session answers: await it for the Session, or ``async with`` it."""

    def __init__(self, opening: Any):
        self._opening = opening
        self._session: Optional[Session] = None

    def __await__(self) -> Generator[Any, None, Session]:
        return self._opening.__await__()

    async def __aenter__(self) -> Session:
        self._session = await self._opening
        return self._session

    async def __aexit__(self, *exc: Any) -> None:
        if self._session is not None:
            await self._session.__aexit__(*exc)


class Client(_client.Client):
    """A connection to uopd over grpc.aio (uopd.Client); make one with :func:`connect`."""

    _session_class = Session

    def __init__(self, conn: _client.Connection, embedded: Optional[EmbeddedServer] = None):  # noqa: super not called
        self.connection = conn
        self.embedded = embedded
        creds = conn.credentials()
        options = conn.channel_options()
        self._channel = grpc.aio.secure_channel(conn.address, creds, options) if creds else \
            grpc.aio.insecure_channel(conn.address, options)
        self._methods = _client.methods(self._channel)

    async def _ready(self) -> None:
        conn = self.connection
        try:
            await asyncio.wait_for(self._channel.channel_ready(), min(conn.connect_timeout, conn.deadline))
        except asyncio.TimeoutError:
            await self.close()
            raise conn.unreachable() from None

    @staticmethod
    async def _answer(response: Any) -> Any:  # the base class's _execute, awaiting
        return await response

    @staticmethod
    def _stream(responses: Any) -> Any:
        return responses

    def _drive(self, flow: calls.Flow) -> Any:  # a coroutine: the callers await it
        return calls.drive(flow, self._execute)

    def session(self, devices: Sequence[str] = (), idle_timeout: Optional[float] = None) -> _Opening:  # type: ignore[override]
        """A new session: ``s = await client.session()`` or ``async with client.session() as s``."""
        return _Opening(super().session(devices, idle_timeout))

    async def compile(self, *args: Any, **kw: Any) -> results.CompileResult:  # type: ignore[override]
        return await super().compile(*args, **kw)

    async def explain_stages(self, *args: Any, **kw: Any) -> List[results.ExplainStage]:  # type: ignore[override]
        return await super().explain_stages(*args, **kw)

    async def explain(self, *args: Any, **kw: Any) -> str:  # type: ignore[override]
        return await super().explain(*args, **kw)

    async def stats(self) -> results.Stats:  # type: ignore[override]
        return await super().stats()

    async def close(self) -> None:  # type: ignore[override]
        """Closes the channel, then stops the embedded uopd, if any."""
        await self._channel.close()
        if self.embedded is not None:
            server, self.embedded = self.embedded, None
            await asyncio.to_thread(server.stop)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def connect(address: Optional[str] = None, *, token: Optional[str] = None, tls: _client.TLSArg = None,
                  embedded: bool = False, uopd: Optional[str] = None, uopd_args: Sequence[str] = (),
                  deadline: float = 60.0, connect_timeout: float = 10.0, chunk_bytes: int = 0,
                  tune_malloc: bool = True) -> Client:
    """As uopd.connect, awaited (an embedded uopd starts in a thread)."""
    conn = _client.connection(address, token, tls, deadline, connect_timeout, chunk_bytes, embedded, tune_malloc)
    server = await asyncio.to_thread(EmbeddedServer, uopd, uopd_args) if embedded else None
    if server is not None:
        conn.address = server.address
    c = Client(conn, server)
    try:
        await c._ready()
    except BaseException:
        if server is not None:
            await asyncio.to_thread(server.stop)
        raise
    return c


async def from_torch(module: Any, *example_inputs: Any, session: Session, **kw: Any) -> Model:
    """As uopd.from_torch, into an asyncio session (the export runs in a thread)."""
    onnx = await asyncio.to_thread(models.torch_onnx, module, example_inputs, **kw)
    return await session.load_model(onnx)
