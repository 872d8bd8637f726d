"""A pytest plugin (``-p uopd_tinygrad_plugin``) that runs tinygrad's own tests on the UOPD
device: tinygrad's test_ops.py runs with ``--noconftest``, so this is a plugin, not a conftest.

* The device: importing uopd.tinygrad registers it; DEV=UOPD (set by the caller) picks it.
* The server: without $UOPD_ADDRESS, a real uopd ($UOPD_BINARY) with two CPU workers and a
  cache directory of its own, on a free loopback port, for the whole session.
* ``--uopd-shard=I/N``: only the I-th of N shards of the collected tests (every N-th test
  in collection order from the I-th), so that each ctest entry stays short.
* ``--uopd-record=FILE``: each test's outcome, ``Class::test pass|fail|skip`` a line (to
  write the expectations file from, or to compare DEV=CPU's outcomes with).
* ``--uopd-expect=FILE``: the tests that fail or are skipped on UOPD, one a line,
  ``Class::test  fail|skip  why``. The session passes exactly when the shard's outcomes are
  what the file says: a test not listed fails, a listed one passes, a skip appears or goes:
  each is reported, and the session fails, so the list stays true. Entries of tests this
  shard did not run are not judged by it.
"""
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

import uopd
import uopd.tinygrad  # noqa: F401  (registers the UOPD device with tinygrad)

_server = None

# The tinygrad snapshot: $UOPD_TINYGRAD_DIR (tests/CMakeLists.txt passes it), else
# ../shared/peers/tinygrad beside the repository.
TINYGRAD = Path(os.environ.get("UOPD_TINYGRAD_DIR") or Path(__file__).resolve().parents[4] / "shared/peers/tinygrad")
SKIP = 77  # the exit status ctest reports as skipped (SKIP_RETURN_CODE)


def require_tinygrad() -> None:
    """Puts the snapshot on sys.path (else a tinygrad importable already will do), or ends
    the run as skipped, saying why."""
    if (TINYGRAD / "tinygrad" / "__init__.py").exists():
        if str(TINYGRAD) not in sys.path:
            sys.path.insert(0, str(TINYGRAD))
    elif importlib.util.find_spec("tinygrad") is None:
        pytest.exit(f"skipped: no tinygrad snapshot at {TINYGRAD} (set $UOPD_TINYGRAD_DIR)", returncode=SKIP)


def pytest_addoption(parser):
    g = parser.getgroup("uopd")
    g.addoption("--uopd-shard", default="", help="I/N: run the I-th of N shards (0-based)")
    g.addoption("--uopd-expect", default="", help="the expectations file: tests that fail or skip on UOPD")
    g.addoption("--uopd-record", default="", help="writes each test's outcome (pass|fail|skip) to this file, a line each")


def pytest_configure(config):
    global _server
    require_tinygrad()
    if importlib.util.find_spec("torch") is None:
        # test_ops.py checks every op against torch: without it there is no oracle, and
        # torch is a benchmark-only package here (deploy/setup.sh --bench installs it).
        pytest.exit("skipped: tinygrad's test_ops.py compares against torch, which is not installed "
                    "(deploy/setup.sh --bench installs python3-torch)", returncode=SKIP)
    if not os.environ.get("UOPD_ADDRESS"):
        config._uopd_cache = tempfile.mkdtemp(prefix="uopd-tinygrad-cache-")
        _server = uopd.EmbeddedServer(os.environ.get("UOPD_BINARY") or None,
                                      ["--workers=2", f"--cache-dir={config._uopd_cache}"])
        os.environ["UOPD_ADDRESS"] = _server.address
    config._uopd_outcomes = {}


def pytest_unconfigure(config):
    global _server
    if _server is not None:
        _server.stop()
        _server = None
        shutil.rmtree(config._uopd_cache, ignore_errors=True)


def _key(nodeid: str) -> str:
    return nodeid.split("::", 1)[1] if "::" in nodeid else nodeid


def pytest_collection_modifyitems(config, items):
    shard = config.getoption("--uopd-shard")
    if not shard:
        return
    i, n = (int(x) for x in shard.split("/"))
    if not 0 <= i < n:
        raise pytest.UsageError(f"--uopd-shard={shard}: I must be in [0, N)")
    keep = [t for j, t in enumerate(items) if j % n == i]
    config.hook.pytest_deselected(items=[t for j, t in enumerate(items) if j % n != i])
    items[:] = keep


def pytest_runtest_logreport(report):
    outcomes = report.config._uopd_outcomes if hasattr(report, "config") else None
    if outcomes is None:
        return
    key = _key(report.nodeid)
    if report.failed:
        outcomes[key] = "fail"
    elif report.skipped and outcomes.get(key) != "fail":
        outcomes[key] = "skip"
    elif report.when == "call" and report.passed and key not in outcomes:
        outcomes[key] = "pass"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    out = yield
    out.get_result().config = item.config


def read_expectations(path: str) -> Dict[str, Tuple[str, str]]:
    """Class::test -> (fail|skip, why), from the file's non-comment lines."""
    want: Dict[str, Tuple[str, str]] = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(None, 2)
            if len(parts) < 2 or parts[1] not in ("fail", "skip"):
                raise pytest.UsageError(f"{path}:{n}: want 'Class::test fail|skip why', got {line!r}")
            want[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "")
    return want


def pytest_sessionfinish(session, exitstatus):
    if record := session.config.getoption("--uopd-record"):
        with open(record, "w") as f:
            f.writelines(f"{key} {outcome}\n" for key, outcome in sorted(session.config._uopd_outcomes.items()))
    path = session.config.getoption("--uopd-expect")
    if not path or exitstatus not in (0, 1):  # 2..: interrupted, usage error, nothing collected
        return
    want = read_expectations(path)
    got: Dict[str, str] = session.config._uopd_outcomes
    wrong: List[str] = []
    for key, outcome in sorted(got.items()):
        expected = want.get(key, ("pass", ""))[0]
        if outcome != expected:
            wrong.append(f"{key}: {outcome} on UOPD, the expectations say {expected}")
    counts = {k: sum(1 for v in got.values() if v == k) for k in ("pass", "fail", "skip")}
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write("\n")  # after the progress line
        tr.write_line(f"uopd: on UOPD {counts['pass']} pass, {counts['fail']} fail, {counts['skip']} skip; "
                      f"{len(wrong)} not as {os.path.basename(path)} says")
        for w in wrong:
            tr.write_line(f"uopd: {w}")
    session.exitstatus = 1 if wrong else 0
