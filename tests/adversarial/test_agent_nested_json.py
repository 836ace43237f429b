"""Adversarial: input that makes handling one client raise.

One 2 KB line of ``[`` made ``json.loads`` raise RecursionError, which is not
a ValueError: it escaped the agent thread and stopped sampling, the log and
every other client for good. The agent must drop that client only.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from conftest import wait_for
from jaxtop.wire import protocol

PY = sys.executable

TARGET = r"""
import sys
patch = sys.argv[2] == "patch"
if patch:
    # A failure the agent cannot foresee: decoding one client's line raises
    # something that is not a ProtocolError.
    from jaxtop.wire import protocol
    real = protocol.decode
    def decode(line):
        if b"boom" in bytes(line):
            raise RuntimeError("boom while handling a client")
        return real(line)
    protocol.decode = decode
import jaxtop
h = jaxtop.instrument(interval_s=0.05, capture_stderr=False, nvml=False, log_path=sys.argv[1])
print("socket", h.socket_path, flush=True)
sys.stdin.readline()
"""


def start(tmp_path, env, patch):
    script = tmp_path / "target.py"
    script.write_text(TARGET)
    log = tmp_path / "run.jsonl"
    proc = subprocess.Popen([PY, str(script), str(log), "patch" if patch else "plain"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline().decode()
    assert first.startswith("socket "), (first, proc.stderr.read())
    return proc, first.split()[1], log


def records(sock: socket.socket, until, timeout: float = 10.0) -> list[dict]:
    """Records from ``sock`` until ``until(records)`` or the peer closes."""
    sock.settimeout(timeout)
    out: list[dict] = []
    buf = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except OSError:
            break
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        out += [json.loads(line) for line in lines if line.strip()]
        if until(out):
            break
    return out


def samples_after(path: str, n: int) -> list[int]:
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    recs = records(s, lambda rs: sum(r["type"] == "sample" for r in rs) >= n, timeout=10)
    s.close()
    return [r["seq"] for r in recs if r["type"] == "sample"]


def log_samples(path) -> int:
    with open(path, "rb") as f:
        return sum(1 for r in protocol.iter_records(f) if r["type"] == "sample")


@pytest.mark.parametrize("payload,patch", [
    (b"[" * 2000 + b"\n", False),  # RecursionError from json.loads
    (b'{"type": "ping", "boom": 1}\n', True),  # any exception while handling the client
], ids=["deep-nesting", "unforeseen-exception"])
def test_one_client_cannot_stop_the_agent(tmp_path, child_env, payload, patch):
    proc, path, log = start(tmp_path, child_env, patch)
    try:
        bystander = socket.socket(socket.AF_UNIX)
        bystander.connect(path)
        records(bystander, lambda rs: any(r["type"] == "sample" for r in rs))

        bad = socket.socket(socket.AF_UNIX)
        bad.connect(path)
        bad.sendall(payload)
        got = records(bad, lambda rs: False, timeout=5)  # until the agent closes it
        bad.close()
        errors = [r for r in got if r["type"] == "error"]
        assert errors and errors[-1]["fatal"] is True, got[-3:]

        # Sampling, the other client, new clients and the log all go on.
        logged = log_samples(log)
        after = records(bystander, lambda rs: sum(r["type"] == "sample" for r in rs) >= 10, timeout=5)
        assert sum(r["type"] == "sample" for r in after) >= 10
        seqs = samples_after(path, 5)
        assert len(seqs) >= 5 and seqs[-1] > seqs[0]
        # Samples reach the log in one write a second.
        wait_for(lambda: log_samples(log) > logged, timeout=5.0, what="the log to grow")
        if patch:
            # What happened is on the stream, for whoever watches.
            texts = [e.get("text", "") for r in after if r["type"] == "sample" for e in r.get("events", [])]
            with open(log, "rb") as f:
                texts += [e.get("text", "") for r in protocol.iter_records(f) if r["type"] == "sample"
                          for e in r.get("events", [])]
            assert any("boom while handling a client" in t for t in texts), texts
        bystander.close()
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.communicate(timeout=10)
