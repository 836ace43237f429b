"""Adversarial: floods of requests.

A client that sends requests as fast as it can and never reads the replies
must not grow the program's memory; thousands of ``memory_profile`` requests
must not write thousands of files (nor cost the program a profile each);
jaxtop keeps only its newest profile files, and deletes nothing else.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

PY = sys.executable
TARGETS = Path(__file__).parent.parent / "targets"

TARGET = r"""
import sys
import jaxtop
h = jaxtop.instrument(interval_s=0.05, capture_stderr=False, nvml=False)
print("socket", h.socket_path, flush=True)
sys.stdin.readline()
"""


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def read_until(sock, until, timeout=10.0):
    sock.settimeout(timeout)
    out, buf = [], b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(1 << 16)
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


@pytest.mark.parametrize("request_line", [
    b'{"type":"ping","id":1}\n',
    b'{"type":"command","name":"no-such-command","id":1}\n',
], ids=["ping", "unknown-command"])
def test_flood_from_a_client_that_never_reads_keeps_memory_bounded(tmp_path, child_env, request_line):
    script = tmp_path / "target.py"
    script.write_text(TARGET)
    proc = subprocess.Popen([PY, str(script)], env=child_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        path = proc.stdout.readline().decode().split()[1]
        time.sleep(0.3)
        before = rss_mb(proc.pid)
        flood = socket.socket(socket.AF_UNIX)
        flood.connect(path)
        flood.setblocking(False)
        chunk = request_line * (65536 // len(request_line))
        sent = 0
        pending = memoryview(b"")
        end = time.monotonic() + 5.0
        while time.monotonic() < end:
            if not pending:
                pending = memoryview(chunk)  # whole lines only: a torn line is bad input
            try:
                n = flood.send(pending)
            except BlockingIOError:
                time.sleep(0.001)  # the agent stopped reading: that is allowed
                continue
            sent += n
            pending = pending[n:]
        grown = rss_mb(proc.pid) - before
        # Sampling goes on for everyone else meanwhile.
        other = socket.socket(socket.AF_UNIX)
        other.connect(path)
        recs = read_until(other, lambda rs: sum(r["type"] == "sample" for r in rs) >= 5)
        assert sum(r["type"] == "sample" for r in recs) >= 5
        other.close()
        flood.close()
        assert grown < 10, f"RSS grew {grown:.1f} MB after {sent / 1e6:.1f} MB of requests nobody read the replies to"
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.communicate(timeout=10)


@pytest.mark.slow
def test_memory_profile_flood_is_rate_limited(targets, sockdir, tmp_path):
    proc = targets.run(TARGETS / "loop.py", "--seconds", "60")
    targets.wait_ready(proc)
    out_dir = tmp_path / "profiles"
    out_dir.mkdir()
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(sockdir / f"{proc.pid}.sock"))
    # Wait for the backend record: profiles need a JAX backend.
    read_until(s, lambda rs: any(r["type"] == "sample" and r["devices"] for r in rs), timeout=30)
    n = 60
    request = {"type": "command", "name": "memory_profile", "args": {"directory": str(out_dir)}}
    s.sendall(b"".join(json.dumps(dict(request, id=i)).encode() + b"\n" for i in range(n)))
    replies = [r for r in read_until(s, lambda rs: sum(r["type"] == "reply" for r in rs) >= n, timeout=30)
               if r["type"] == "reply"]
    s.close()
    assert len(replies) == n
    taken = [r for r in replies if r["ok"] and "path" in (r.get("result") or {})]
    limited = [r for r in replies if not r["ok"]]
    assert 1 <= len(taken) <= 3, [r.get("error") for r in replies[:5]]
    assert len(taken) + len(limited) == n
    for r in limited:
        assert "rate limited" in r["error"] and "retry in" in r["error"], r
        assert 0 < r["retry_after_s"] <= 2.0
    assert len(list(out_dir.iterdir())) == len(taken)
    assert proc.poll() is None


def test_profile_files_are_capped_and_nothing_else_is_deleted(tmp_path):
    jax = pytest.importorskip("jax")
    from jaxtop.probes import memory_profile as mp

    jax.devices("cpu")  # a backend exists
    old = time.time() - 3600
    ours = []
    for i in range(25):
        p = tmp_path / f"jaxtop-memprof-123-20260101-0000{i:02d}.prof"
        p.write_bytes(b"old")
        os.utime(p, (old + i, old + i))
        ours.append(p)
    others = [tmp_path / name for name in (
        "notes.txt", "jaxtop-memprof-123.prof", "jaxtop-memprof-123-20260101-000000.prof.bak",
        "my-jaxtop-memprof-1-20260101-000000.prof", "jaxtop-memprof-1-20260101-000000.prof.tmp",
    )]
    for p in others:
        p.write_bytes(b"keep me")
        os.utime(p, (old - 10, old - 10))
    sub = tmp_path / "jaxtop-memprof-9-20260101-000000-1.prof"
    sub.mkdir()  # a directory with our name: not ours to delete
    link = tmp_path / "jaxtop-memprof-8-20260101-000000.prof"
    link.symlink_to(others[0])
    os.utime(link, (old - 20, old - 20), follow_symlinks=False)

    result = mp.take_profile(tmp_path, backend="cpu")
    assert "error" not in result, result
    new = Path(result["path"])
    assert new.exists()
    kept = sorted(p.name for p in tmp_path.iterdir() if p.is_file() and not p.is_symlink() and p not in others
                  and p.name.startswith("jaxtop-memprof-") and p.name.endswith(".prof"))
    # The newest 20 of jaxtop's own files: the new one and the 19 newest old ones.
    assert kept == sorted([new.name] + [p.name for p in ours[-19:]])
    for p in others:
        assert p.read_bytes() == b"keep me"
    assert sub.is_dir() and link.is_symlink()
