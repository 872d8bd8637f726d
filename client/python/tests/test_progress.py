"""Progress of long transfers: a tqdm bar on stderr when tqdm is installed and stderr is a
terminal (here a real pseudo-terminal, os.openpty, as the child's stderr), nothing when
stderr is not a terminal, when progress=False, or when tqdm is missing (callbacks:
test_buffers). The transfers are real, against the fixture's uopd."""
import fcntl
import os
import select
import struct
import subprocess
import sys
import termios

import pytest

from uopd import transfers

CHILD = r"""
import sys
import numpy as np
import uopd
if sys.argv[1] == "no-tqdm":
    sys.modules["tqdm"] = None  # `import tqdm` fails, as where it is not installed
a = np.arange({n}, dtype=np.uint8)
with uopd.connect() as client, client.session() as s:
    buf = s.put(a, progress=False if sys.argv[1] == "off" else None)
    back = buf.numpy(progress=False if sys.argv[1] == "off" else None)
    assert np.array_equal(back, a)
    print(buf.id[:8], flush=True)
""".format(n=transfers.BAR_BYTES)


def run_child(server, mode, tty):
    """The child's stdout (the buffer's id prefix) and what it wrote to stderr, read from
    the pseudo-terminal's master side (tty) or a pipe."""
    env = dict(os.environ, UOPD_ADDRESS=server.address, TERM="xterm")
    if not tty:
        r = subprocess.run([sys.executable, "-c", CHILD, mode], env=env, capture_output=True, timeout=300)
        assert r.returncode == 0, r.stderr.decode()
        return r.stdout.decode().strip(), r.stderr.decode()
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 100-column terminal
    try:
        p = subprocess.Popen([sys.executable, "-c", CHILD, mode], env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=slave)
    finally:
        os.close(slave)
    seen = bytearray()
    while True:  # until the child has closed its end (EIO on Linux)
        if not select.select([master], [], [], 300)[0]:
            p.kill()
            raise AssertionError(f"the child wrote nothing for 300 s: {seen.decode(errors='replace')}")
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        seen += data
    os.close(master)
    out = p.stdout.read().decode().strip()
    p.stdout.close()
    assert p.wait(timeout=300) == 0, seen.decode(errors="replace")
    return out, seen.decode(errors="replace")


def test_a_terminal_gets_a_tqdm_bar(server):
    pytest.importorskip("tqdm", reason="tqdm is not installed (deploy/setup.sh installs python3-tqdm)")
    buffer_id, err = run_child(server, "default", tty=True)
    # tqdm's bars, each with its description, percentage, bar and bytes: "upload 1a2b3c4d:
    # 100%|█████| 67.1M/67.1M [...]", cleared when done (leave=False).
    for what in ("upload", "download"):
        assert f"{what} {buffer_id}:" in err, err
    assert "%|" in err and f"{transfers.BAR_BYTES / 1e6:.1f}M" in err, err


@pytest.mark.parametrize("mode,tty", [("default", False), ("off", True), ("no-tqdm", True)],
                         ids=["not-a-terminal", "progress-false", "tqdm-missing"])
def test_no_bar(server, mode, tty):
    buffer_id, err = run_child(server, mode, tty)
    assert len(buffer_id) == 8
    assert "upload" not in err and "download" not in err and "%|" not in err, err

