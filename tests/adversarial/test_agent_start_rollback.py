"""Adversarial: ``instrument()`` fails part-way.

``Agent.start()`` binds the Prometheus port, then the socket, then opens the
log, starts the stderr relay and NVML. When a late step fails, every earlier
one must be undone before the error reaches the caller, so that a retry in
the same process works (it used to fail with "Address already in use").
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

PY = sys.executable

SCRIPT = r"""
import os, sys
import jaxtop

port = int(sys.argv[1])
sockdir = os.environ["JAXTOP_SOCKET_DIR"]
fds = lambda: sorted(os.listdir("/proc/self/fd"))
before = fds()
try:
    jaxtop.instrument(interval_s=0.05, log_path=sys.argv[2], prometheus_port=port, nvml=False,
                      capture_stderr=sys.argv[3] == "capture")
except OSError as exc:
    print("first failed:", type(exc).__name__, flush=True)
else:
    print("first started", flush=True)
print("left behind:", os.listdir(sockdir), "fds leaked:", len(fds()) - len(before), flush=True)
print("stderr is fd 2:", os.readlink("/proc/self/fd/2") == os.readlink("/proc/self/fd/1"), flush=True)
h = jaxtop.instrument(interval_s=0.05, prometheus_port=port, nvml=False)
print("second started:", h.running, os.path.exists(h.socket_path), flush=True)
import urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
print("metrics served:", len(text) >= 0, flush=True)
h.stop()
print("stopped:", os.listdir(sockdir), flush=True)
"""


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("capture", ["capture", "no-capture"])
def test_failed_start_undoes_everything_and_a_retry_works(child_env, sockdir, tmp_path, capture):
    script = tmp_path / "prog.py"
    script.write_text(SCRIPT)
    bad_log = tmp_path / "no-such-dir" / "run.jsonl"
    res = subprocess.run([PY, str(script), str(free_port()), str(bad_log), capture], env=child_env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    out = res.stdout.decode()
    assert res.returncode == 0, out
    lines = out.splitlines()
    assert lines[0] == "first failed: FileNotFoundError", out
    assert lines[1] == "left behind: [] fds leaked: 0", out
    assert lines[2] == "stderr is fd 2: True", out
    assert lines[3] == "second started: True True", out
    assert lines[4] == "metrics served: True", out
    assert lines[5] == "stopped: []", out
