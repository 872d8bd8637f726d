"""A private uopd for one Client (``uopd.connect(embedded=True)``) or a test, as `uop
--embedded` starts one (client/embedded_server.h): the uopd binary with
``--listen=127.0.0.1:0 --metrics-listen=`` (an ephemeral port, no metrics endpoint), ready
once it prints ``LISTENING host:port`` on stdout; its stderr goes to an unlinked temporary
file, kept for messages when it fails (log_tail). It runs in its own process group, so
stop() also ends the workers it started: SIGTERM, a grace period, SIGKILL; then the group.

Unlike the C++ launcher it does not ask for SIGTERM when this process dies (that needs
code between fork and exec, unsafe with gRPC's threads): close the Client, or use it as
a context manager; an interpreter that exits normally stops it too (weakref.finalize).
"""
from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import weakref
from pathlib import Path
from typing import List, Optional, Sequence

from uopd import errors


def find_uopd(path: Optional[str] = None) -> str:
    """The uopd to start: `path` when given; else $UOPD_BINARY; else server/uopd of the
    build tree this package runs from (build/<preset>/client/python/uopd ->
    build/<preset>/server/uopd; a source checkout's client/python -> build/release);
    else the first uopd on PATH. NotFound saying where it looked otherwise."""
    if path:
        if _executable(path):
            return path
        raise errors.NotFound(f"uopd={path} is not an executable file")
    env = os.environ.get("UOPD_BINARY")
    if env:
        if _executable(env):
            return env
        raise errors.NotFound(f"$UOPD_BINARY={env} is not an executable file")
    here = Path(__file__).resolve().parent
    candidates = [here.parents[2] / "server" / "uopd", here.parents[2] / "build" / "release" / "server" / "uopd"]
    for c in candidates:
        if _executable(str(c)):
            return str(c)
    on_path = shutil.which("uopd")
    if on_path:
        return on_path
    looked = ", ".join(str(c) for c in candidates)
    raise errors.NotFound(f"no uopd found (looked at $UOPD_BINARY, {looked}, PATH); pass uopd=PATH")


def _executable(p: str) -> bool:
    return os.path.isfile(p) and os.access(p, os.X_OK)


def parse_listening_line(line: str, prefix: str = "LISTENING ") -> Optional[str]:
    """"LISTENING 127.0.0.1:4242" -> "127.0.0.1:4242"; None for any other line."""
    line = line.rstrip("\r\n ")
    if not line.startswith(prefix):
        return None
    addr = line[len(prefix):]
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit() or " " in addr:
        return None
    return addr


class EmbeddedServer:
    """A uopd child process; see the module's docstring."""

    def __init__(self, uopd: Optional[str] = None, args: Sequence[str] = (), timeout: float = 30.0):
        """Starts it and waits up to `timeout` seconds for its LISTENING line; Unavailable
        with the end of its log if it exits or stays silent."""
        self.path = find_uopd(uopd)
        self.address = ""
        self._log = tempfile.TemporaryFile(prefix="uopd-log-")
        argv: List[str] = [self.path, "--listen=127.0.0.1:0", "--metrics-listen=", *args]
        self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._log,
                                      start_new_session=True, close_fds=True)
        self.pid = self._proc.pid
        self._stopped = False
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._drain_stdout, name=f"uopd-{self.pid}-stdout", daemon=True)
        self._reader.start()
        self._finalizer = weakref.finalize(self, EmbeddedServer._kill, self._proc)
        if not self._ready.wait(timeout) or not self.address:
            why = "exited before it was listening" if self._proc.poll() is not None else \
                f"printed no LISTENING line within {timeout:g} s"
            self.stop(grace=1.0)
            log = self.log_tail()
            raise errors.Unavailable(f"uopd ({self.path}) {why}" + (f"; its log ends:\n{log}" if log else ""))

    def _drain_stdout(self) -> None:
        # Finds LISTENING, then keeps reading, so a chatty server never blocks on a full pipe.
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            if not self._ready.is_set():
                addr = parse_listening_line(raw.decode("utf-8", "replace"))
                if addr:
                    self.address = addr
                    self._ready.set()
        self._ready.set()  # EOF: it exited (or closed stdout) without LISTENING

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, up to `grace` seconds for it to exit, then SIGKILL; then SIGKILL to what
        is left of its process group. Internal if it did not exit cleanly (status 0 or on
        SIGTERM). Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._finalizer.detach()
        killed = False
        if not self._exited_unreaped():
            self._proc.send_signal(signal.SIGTERM)
            if not self._wait_exit(grace):
                self._proc.kill()
                killed = True
        # While uopd is an unreaped zombie its pid (so its group id) cannot be reused: this
        # reaches only what it started and left behind.
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        status = self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        if killed:
            raise errors.Internal(f"uopd (pid {self.pid}) did not stop within {grace:g} s of SIGTERM; killed")
        if status not in (0, -signal.SIGTERM):
            why = f"killed by signal {-status}" if status < 0 else f"exited with status {status}"
            log = self.log_tail()
            raise errors.Internal(f"uopd (pid {self.pid}) {why}" + (f"; its log ends:\n{log}" if log else ""))

    def _exited_unreaped(self) -> bool:
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def _wait_exit(self, timeout: float) -> bool:
        """Waits for the child's exit without reaping it (a pidfd becomes readable)."""
        try:
            fd = os.pidfd_open(self.pid)
        except OSError:
            return self._exited_unreaped()
        try:
            select.select([fd], [], [], timeout)
        finally:
            os.close(fd)
        return self._exited_unreaped()

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:  # at exit, or when forgotten unstopped
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass

    def log_tail(self, max_bytes: int = 4096) -> str:
        """The last `max_bytes` of its stderr, from a whole line on."""
        size = os.fstat(self._log.fileno()).st_size
        n = min(size, max_bytes)
        out = os.pread(self._log.fileno(), n, size - n).decode("utf-8", "replace")
        if n < size and "\n" in out:
            out = out[out.index("\n") + 1:]
        return out.rstrip("\n")

    def __enter__(self) -> "EmbeddedServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
