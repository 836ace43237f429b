"""Adversarial: many connections to the agent's socket.

An agent in a plain Python child (no JAX: these checks are about sockets and
memory, and start in a fraction of a second). A same-uid peer opens far more
connections than any dashboard would, in a process near its fd limit, or
never reads a large backfill.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

PY = sys.executable

# The program under attack: starts the agent, then answers the test's
# questions on stdin (so the test can see what the program itself sees).
TARGET = r"""
import json, os, resource, sys
opts = json.loads(sys.argv[1])
nofile = opts.pop("nofile", None)
if nofile:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))
pad = opts.pop("pad", 0)
import jaxtop
h = jaxtop.instrument(capture_stderr=False, nvml=False, **opts)
if pad:
    h.agent.register_sample_field("pad", lambda: "x" * pad)
held = []
print("socket", h.socket_path, flush=True)
for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    if cmd == "hold":  # keep files open until the process has int(arg) fds
        while len(os.listdir("/proc/self/fd")) - 1 < int(arg):
            held.append(open(os.devnull))
        print("held", len(os.listdir("/proc/self/fd")) - 1, flush=True)
    elif cmd == "open":  # what the training program does: open a few files
        try:
            files = [open(os.devnull) for _ in range(10)]
            for f in files:
                f.close()
            print("open ok", flush=True)
        except OSError as exc:
            print("open failed", exc.errno, flush=True)
    elif cmd == "fds":
        try:
            print(len(os.listdir("/proc/self/fd")) - 1, flush=True)
        except OSError as exc:
            print("fds failed", exc.errno, flush=True)
    elif cmd == "quit":
        break
"""


class Child:
    def __init__(self, tmp_path, env, **opts):
        script = tmp_path / "target.py"
        script.write_text(TARGET)
        self.proc = subprocess.Popen([PY, str(script), json.dumps(opts)], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = self.proc.stdout.readline().decode()
        assert first.startswith("socket "), (first, self.proc.stderr.read())
        self.path = first.split()[1]

    def ask(self, cmd: str) -> str:
        self.proc.stdin.write(cmd.encode() + b"\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().decode().strip()

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=10)


@pytest.fixture
def child(tmp_path, child_env):
    made = []

    def start(**opts):
        c = Child(tmp_path, child_env, **opts)
        made.append(c)
        return c

    yield start
    for c in made:
        c.close()


def connect(path: str, timeout: float = 10.0) -> socket.socket | None:
    """Connect, retrying while the listen backlog is full (a Unix socket
    with a timeout says EAGAIN at once instead of waiting)."""
    deadline = time.monotonic() + timeout
    while True:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(timeout)
        try:
            s.connect(path)
            return s
        except BlockingIOError:
            s.close()
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)
        except OSError:
            s.close()
            return None


def first_record(sock: socket.socket, timeout: float = 10.0) -> dict | None:
    """The first line the agent sends, or None (nothing within timeout / EOF)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return None
            data += chunk
    except OSError:
        return None
    return json.loads(data.split(b"\n", 1)[0])


def closed_by_peer(sock: socket.socket, timeout: float = 5.0) -> bool:
    sock.settimeout(timeout)
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True
    except OSError:
        return False


def test_clients_are_capped_and_extra_ones_refused_with_an_error(child):
    target = child(interval_s=0.05)
    fds_before = int(target.ask("fds"))
    socks = []
    firsts = []
    try:
        for _ in range(150):
            s = connect(target.path)
            assert s is not None
            socks.append(s)
            firsts.append(first_record(s))
        kinds = [r["type"] if r else None for r in firsts]
        accepted = kinds.count("hello")
        refused = [(s, r) for s, r in zip(socks, firsts) if r and r["type"] == "error"]
        assert 1 <= accepted <= 64, kinds
        assert accepted + len(refused) == 150, kinds
        for s, r in refused:
            assert r.get("fatal") is True and "refused" in r["message"], r
            assert closed_by_peer(s)
        # The agent holds an fd per accepted client, never one per attempt.
        assert int(target.ask("fds")) <= fds_before + accepted + 4
        assert target.ask("open") == "open ok"
    finally:
        for s in socks:
            s.close()
    # Freed slots are usable again.
    time.sleep(0.5)
    s = connect(target.path)
    assert first_record(s)["type"] == "hello"
    s.close()


def test_fd_reserve_keeps_the_programs_own_open_working(child):
    """The program sits 100 fds under its limit; 150 connections must not
    take them (today the agent accepts until EMFILE and the program's own
    open() fails)."""
    target = child(interval_s=0.05, nofile=512)
    assert target.ask("hold 412").startswith("held")
    socks = []
    try:
        for _ in range(150):
            s = connect(target.path, timeout=1.0)
            if s is not None:
                socks.append(s)
        assert socks
        assert target.ask("open") == "open ok"
        firsts = [first_record(s, timeout=2.0) for s in socks[:20]]
        refused = [r is not None and r["type"] == "error" and "file descriptors" in r["message"] for r in firsts]
        assert all(refused), firsts
        assert target.ask("open") == "open ok"
    finally:
        for s in socks:
            s.close()


def test_backfill_is_shared_not_copied_per_client(child):
    """40 idle clients of an agent with ~5 MB of backfill: today each gets
    its own copy (~200 MB); shared, the program's RSS barely moves."""
    target = child(interval_s=0.01, backfill_s=3600.0, pad=20_000)
    probe = connect(target.path)
    # Wait until the ring holds ~250 samples of ~20 KB.
    deadline = time.monotonic() + 30
    seq = 0
    buf = b""
    probe.settimeout(5)
    while seq < 250 and time.monotonic() < deadline:
        buf += probe.recv(1 << 20)
        *lines, buf = buf.split(b"\n")
        for line in lines:
            rec = json.loads(line)
            if rec.get("type") == "sample":
                seq = rec["seq"]
    probe.close()
    assert seq >= 250
    time.sleep(0.3)
    before = target.rss_mb()
    socks = []
    try:
        for _ in range(40):
            s = connect(target.path)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            socks.append(s)  # and never read
        time.sleep(1.5)
        grown = target.rss_mb() - before
        assert grown < 25, f"RSS grew {grown:.1f} MB for 40 idle clients"
        assert target.ask("open") == "open ok"
    finally:
        for s in socks:
            s.close()
