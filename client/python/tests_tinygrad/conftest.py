"""The fixtures of the tinygrad bridge's own tests (test_bridge.py): one real uopd with two
CPU workers on a free loopback port, started by uopd.EmbeddedServer ($UOPD_BINARY), and
tinygrad from $UOPD_TINYGRAD_DIR (the snapshot under ../shared/peers/tinygrad, which
tests/CMakeLists.txt passes in). Without tinygrad the run exits 77, which ctest reports
as skipped, saying why. (tinygrad's own test_ops.py runs under uopd_tinygrad_plugin
instead: it needs --noconftest.)"""
import os
import socket
import sys

import pytest

import uopd
from uopd_tinygrad_plugin import require_tinygrad, TINYGRAD


def pytest_configure(config):
    require_tinygrad()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """uopd with two CPU workers; its /metrics at `server.metrics` (what the collectives
    count is read from: the server's own account, not the bridge's)."""
    metrics = f"127.0.0.1:{_free_port()}"
    srv = uopd.EmbeddedServer(os.environ.get("UOPD_BINARY") or None,
                              ["--workers=2", f"--cache-dir={tmp_path_factory.mktemp('cache')}",
                               f"--metrics-listen={metrics}"])
    srv.metrics = metrics
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def uopd_env(server):
    """The environment a tinygrad program runs in on UOPD: DEV=UOPD, this server, tinygrad
    and the uopd package on PYTHONPATH."""
    env = dict(os.environ, DEV="UOPD", UOPD_ADDRESS=server.address)
    env["PYTHONPATH"] = os.pathsep.join([str(TINYGRAD)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


@pytest.fixture(scope="session")
def uopd_device(server):
    """This process's UOPD device, on the server: tinygrad Tensors with device="UOPD"."""
    os.environ["UOPD_ADDRESS"] = server.address
    import uopd.tinygrad  # noqa: F401  (registers the device)
    from tinygrad import Device
    return Device["UOPD"]
