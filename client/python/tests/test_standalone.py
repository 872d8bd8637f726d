"""The package on its own: in a child Python with no compiler, LLVM or CUDA reachable (an
empty PATH, no LD_LIBRARY_PATH, nothing else in its environment) it imports, connects to
the fixture's uopd and runs a graph, and has loaded no LLVM / CUDA library; --embedded
starts and stops its own uopd; the README's Python example runs as written."""
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

import uopd
from conftest import REPO, rng_array

CHILD = r"""
import json, shutil, sys
import numpy as np
import uopd
assert all(shutil.which(t) is None for t in ("cc", "gcc", "clang", "llc", "nvcc", "uopd")), "a toolchain is reachable"
with uopd.connect() as client, client.session() as s:
    out = s.run(sys.argv[1], a=np.arange(12, dtype=np.float32), b=np.ones(12, np.float32))["out"]
maps = open("/proc/self/maps").read().lower()
print(json.dumps({"out": out.tolist(), "loaded": [k for k in ("llvm", "libcuda", "nvrtc", "libclang") if k in maps]}))
"""


def test_works_without_llvm_cuda_or_a_compiler(server, examples, tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {"PATH": str(empty), "LD_LIBRARY_PATH": "", "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
           "UOPD_ADDRESS": server.address, "HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", CHILD, str(examples / "elementwise.json")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    import json
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["loaded"] == []
    a, b = np.arange(12, dtype=np.float32).reshape(3, 4), np.ones((3, 4), np.float32)
    np.testing.assert_allclose(got["out"], np.maximum(a + b * 1.5, 0))


def test_embedded_starts_and_stops_a_private_uopd(uopd_binary, examples, tmp_path):
    with uopd.connect(embedded=True, uopd=uopd_binary, uopd_args=["--workers=1", f"--cache-dir={tmp_path}"]) as c:
        pid = c.embedded.pid
        assert c.address == c.embedded.address and c.address.startswith("127.0.0.1:")
        with c.session() as s:
            out = s.run(examples / "reduction.json", x=np.full(32, 2, np.float32))["sumsq"]
            assert float(np.sum(out)) == 128.0
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive, f"uopd (pid {pid}) is still running"


def test_find_uopd(monkeypatch, uopd_binary, tmp_path):
    monkeypatch.setenv("UOPD_BINARY", uopd_binary)
    assert uopd.find_uopd() == uopd_binary
    monkeypatch.setenv("UOPD_BINARY", str(tmp_path / "none"))
    try:
        uopd.find_uopd()
        raise AssertionError("a missing $UOPD_BINARY was accepted")
    except uopd.NotFound as e:
        assert "none" in e.message


def readme_example() -> str:
    text = (REPO / "README.md").read_text() if not os.environ.get("UOPD_README") else \
        open(os.environ["UOPD_README"]).read()
    section = text.split("\n## Python client\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_example_runs_as_written(server, tmp_path):
    code = readme_example()
    assert 5 <= len(code.strip().splitlines()) <= 14
    env = dict(os.environ, UOPD_ADDRESS=server.address)
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip(), "the example printed nothing"


def test_strided_input_runs_like_its_copy(session, examples):
    a = rng_array((24,), seed=1)[::2]
    b = rng_array((12,), seed=2)
    np.testing.assert_array_equal(session.run(examples / "elementwise.json", a=a, b=b)["out"],
                                  session.run(examples / "elementwise.json", a=a.copy(), b=b)["out"])


def test_pip_installs_it_offline_with_the_builds_stubs(server, examples, tmp_path):
    """`pip install --no-build-isolation` of a copy of client/python into a fresh venv (with
    Debian's packages), the stubs taken from this build ($UOPD_PROTO_DIR), no index: the
    installed package runs a graph, imported from the venv, not from this checkout, and has
    uopd.tinygrad (which imports no tinygrad until its device opens)."""
    import shutil
    import uopd._proto

    src = tmp_path / "src"
    shutil.copytree(REPO / "client/python", src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["UOPD_PROTO_DIR"] = os.path.dirname(uopd._proto.__file__)
    r = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-build-isolation", "--no-index",
                        str(src)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    env["UOPD_ADDRESS"] = server.address
    code = ("import sys, numpy as np, uopd, uopd.tinygrad; assert uopd.tinygrad.__file__.startswith(sys.prefix); "
            "print(uopd.__file__); "
            f"print(uopd.connect().session().run({str(examples / 'reduction.json')!r}, x=np.ones(32, np.float32))['sumsq'].sum())")
    r = subprocess.run([str(venv / "bin/python"), "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    where, total = r.stdout.split()
    assert where.startswith(str(venv)) and float(total) == 32.0
    assert (Path(where).parent / "py.typed").is_file()  # typed (PEP 561) for the installed package's users


def test_from_torch_without_torch_says_so():
    code = ("import sys; sys.modules['torch'] = None\nimport uopd\n"
            "try:\n    uopd.from_torch(object(), 1, session=None)\nexcept ImportError as e:\n    print(e)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "uopd.from_torch needs PyTorch" in r.stdout
