"""Adversarial: the program forks.

A child made with ``os.fork()`` inherits the agent's objects but not its
thread. If it exits normally, its copy of the agent must do nothing: no
wait for a final sample that never comes, and above all no unlinking of the
parent's socket (which left the parent unreachable).
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import time

import pytest

PY = sys.executable

SCRIPT = r"""
import os, sys, time
import jax
import jax.numpy as jnp

# Fork before the JAX backend exists (as a program that starts its worker
# processes first does): JAX itself is fork-safe until then.
sys.stdout.flush()
t0 = time.monotonic()
pid = os.fork()
if pid == 0:
    print("child says hi", flush=True)
    sys.exit(0)  # a normal exit: atexit handlers run in the child
_, status = os.waitpid(pid, 0)
took = time.monotonic() - t0
print("child exit code", os.waitstatus_to_exitcode(status), flush=True)
print("child fast" if took < 0.5 else f"child slow {took:.2f} s", flush=True)
print("sum", float((jnp.ones(3) + 1).sum()), flush=True)
sys.stdin.readline()  # the test checks the parent's socket meanwhile
print("parent done", flush=True)
"""


def read_line(proc, timeout=60.0) -> bytes:
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        assert left > 0 and select.select([proc.stdout], [], [], left)[0], line
        ch = proc.stdout.read(1)
        assert ch, line
        line += ch
    return line


@pytest.mark.slow
def test_forked_child_leaves_the_parents_agent_alone(child_env, sockdir, tmp_path):
    script = tmp_path / "forks.py"
    script.write_text(SCRIPT)
    plain = subprocess.run([PY, str(script)], env=child_env, input=b"\n", capture_output=True, timeout=60)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert b"child fast" in plain.stdout

    # Unbuffered: read_line selects on the fd, so nothing may wait in a buffer.
    proc = subprocess.Popen([PY, "-m", "jaxtop", "run", str(script)], env=child_env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    try:
        out = b""
        while b"child fast" not in out and b"child slow" not in out:
            out += read_line(proc)
        assert b"child fast" in out, out
        # The parent is still reachable on its socket, and still sampling.
        path = sockdir / f"{proc.pid}.sock"
        assert path.exists()
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(10)
        s.connect(str(path))
        stream = s.makefile("rb")
        first = json.loads(stream.readline())
        assert first["type"] == "hello" and first["pid"] == proc.pid
        seqs = []
        while len(seqs) < 3:
            rec = json.loads(stream.readline())
            if rec["type"] == "sample":
                seqs.append(rec["seq"])
        s.close()
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == plain.returncode == 0, err[-2000:]
    assert out + rest == plain.stdout
    assert not path.exists()  # the parent removed it at its own exit
