"""Adversarial: another local user attacks the Prometheus endpoint.

The endpoint listens on loopback, where every local user can connect, and
runs inside the user's program: what it does for a peer is done with the
program's GIL. Whatever a peer sends (connections that drip a request a byte
at a time, a flood of requests, huge request heads), a legitimate scrape
must still be answered, and the server must stay cheap: each exchange under
one deadline, the exposition rendered once per interval, not per request.
benchmarks/prometheus_flood.py measures what the same attacks cost a real
training loop's step rate.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from jaxtop.testing import synthetic
from jaxtop.wire import prometheus

pytest.importorskip("prometheus_client")


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def synthetic_state() -> prometheus.StreamState:
    state = prometheus.StreamState()
    state.update(synthetic.hello(4242, 2, 1000.0))
    state.update(next(synthetic.samples(4242, 2, 1000.0, 1)))
    return state


@pytest.fixture
def endpoint():
    port = free_port()
    server = prometheus.serve(synthetic_state(), port)
    yield port
    server.shutdown()
    server.server_close()


def scrape(port: int, timeout: float = 5.0) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout).read().decode()


def scrapes_during(port: int, n: int = 4) -> list[str]:
    """``n`` legitimate scrapes, 0.3 s apart: what each got (or its error)."""
    out = []
    for _ in range(n):
        try:
            text = scrape(port)
            out.append("ok" if "jaxtop_sample_seq" in text else "no metrics")
        except OSError as exc:
            out.append(f"{type(exc).__name__}: {exc}")
        time.sleep(0.3)
    return out


class Attacker:
    """Threads that attack ``port`` until stopped (at most ``limit_s``)."""

    def __init__(self, port: int, threads: int, work, limit_s: float = 20.0) -> None:
        self.port = port
        self.stop = threading.Event()
        self.until = time.monotonic() + limit_s
        self.threads = [threading.Thread(target=work, args=(self,), daemon=True) for _ in range(threads)]

    def running(self) -> bool:
        return not self.stop.is_set() and time.monotonic() < self.until

    def __enter__(self) -> Attacker:
        for t in self.threads:
            t.start()
        time.sleep(0.5)  # under way before the scrapes
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)


def drip(att: Attacker, n: int = 64) -> None:
    """``n`` connections that each send a request line, then one header
    byte every 0.1 s; one closed by the server is opened again."""
    socks: list[socket.socket] = []
    try:
        while att.running():
            while len(socks) < n and att.running():
                try:
                    s = socket.create_connection(("127.0.0.1", att.port), timeout=0.5)
                    s.sendall(b"GET /metrics HTTP/1.1\r\n")
                    s.setblocking(False)
                    socks.append(s)
                except OSError:
                    break
            alive = []
            for s in socks:
                try:
                    s.send(b"X")
                    alive.append(s)
                except OSError:
                    s.close()
            socks = alive
            att.stop.wait(0.1)
    finally:
        for s in socks:
            s.close()


def flood(att: Attacker) -> None:
    """One-request connections, as fast as they are answered."""
    while att.running():
        try:
            with socket.create_connection(("127.0.0.1", att.port), timeout=2) as s:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                while s.recv(65536):
                    pass
        except OSError:
            pass


def huge(att: Attacker) -> None:
    """Request heads of 1 MiB (one endless header)."""
    chunk = b"X-Huge: " + b"a" * 65536
    while att.running():
        try:
            with socket.create_connection(("127.0.0.1", att.port), timeout=2) as s:
                s.sendall(b"GET /metrics HTTP/1.1\r\n")
                for _ in range(16):
                    s.sendall(chunk)
                s.recv(65536)
        except OSError:
            pass


def test_a_scrape_is_answered_while_connections_drip_their_requests(endpoint):
    with Attacker(endpoint, 1, drip):
        got = scrapes_during(endpoint)
    assert got == ["ok"] * len(got), got


def test_a_scrape_is_answered_during_a_flood(endpoint):
    with Attacker(endpoint, 16, flood):
        got = scrapes_during(endpoint)
    assert got == ["ok"] * len(got), got


def test_a_scrape_is_answered_while_peers_send_huge_requests(endpoint):
    with Attacker(endpoint, 4, huge):
        got = scrapes_during(endpoint)
    assert got == ["ok"] * len(got), got


def status_of(port: int, data: bytes) -> str:
    """The status line the server answers ``data`` with ('' if it closes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        got = b""
        while b"\r\n" not in got:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    return got.split(b"\r\n")[0].decode()


def test_oversized_and_odd_requests_are_refused_without_reading_on(endpoint):
    # A head that never ends: refused once it is past 8 KiB, not read on.
    assert " 431 " in status_of(endpoint, b"GET / HTTP/1.1\r\nX: " + b"a" * 8200)
    assert " 414 " in status_of(endpoint, b"GET /" + b"a" * 3000)
    assert " 405 " in status_of(endpoint, b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")
    assert " 400 " in status_of(endpoint, b"nonsense\r\n\r\n")
    assert " 200 " in status_of(endpoint, b"HEAD /metrics HTTP/1.1\r\n\r\n")


def test_a_dripping_connection_is_closed_at_one_deadline_for_the_whole_request(monkeypatch):
    monkeypatch.setattr(prometheus, "SOCKET_TIMEOUT_S", 1.0)
    port = free_port()
    server = prometheus.serve(synthetic_state(), port)
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        t0 = time.monotonic()
        closed = None
        while time.monotonic() - t0 < 6.0:  # a byte every 0.2 s: each read is quick
            try:
                s.sendall(b"X")
            except OSError:
                closed = time.monotonic() - t0
                break
            s.settimeout(0.2)
            try:
                if s.recv(4096) == b"":
                    closed = time.monotonic() - t0
                    break
            except TimeoutError:
                pass
            except OSError:
                closed = time.monotonic() - t0
                break
        s.close()
        assert closed is not None and closed < 2.0, closed
    finally:
        server.shutdown()
        server.server_close()


def test_the_exposition_is_rendered_once_per_interval_not_per_request(monkeypatch):
    renders = []
    collect = prometheus.collect

    def counting(*args, **kwargs):
        renders.append(time.monotonic())
        return collect(*args, **kwargs)

    monkeypatch.setattr(prometheus, "collect", counting)
    state = synthetic_state()
    port = free_port()
    server = prometheus.serve(state, port)
    samples = synthetic.samples(4242, 2, 1000.0, 100_000)
    stop = threading.Event()

    def new_samples() -> None:  # a sample every 10 ms: always something new
        while not stop.is_set():
            state.update(next(samples))
            time.sleep(0.01)

    feeder = threading.Thread(target=new_samples, daemon=True)
    feeder.start()
    try:
        t0 = time.monotonic()
        answered = 0
        while time.monotonic() - t0 < 2.5:  # 8 scrapes a second, a new sample before each
            answered += "jaxtop_sample_seq" in scrape(port)
            time.sleep(0.12)
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        feeder.join()
        server.shutdown()
        server.server_close()
    assert answered >= 15
    assert len(renders) <= elapsed + 2, (len(renders), answered)


SERVING_CHILD = r"""
import sys, time
from jaxtop.testing import synthetic
from jaxtop.wire import prometheus
state = prometheus.StreamState()
state.update(synthetic.hello(4242, 2, 1000.0))
state.update(next(synthetic.samples(4242, 2, 1000.0, 1)))
prometheus.serve(state, int(sys.argv[1]))
print("ready", flush=True)
time.sleep(120)
"""


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_flood_costs_the_serving_process_little_cpu(tmp_path):
    """All the serving process's CPU under a 16-thread flood is its server's
    (the main thread sleeps); every bit of it held the program's GIL."""
    port = free_port()
    child = subprocess.Popen([sys.executable, "-c", SERVING_CHILD, str(port)], stdout=subprocess.PIPE,
                             cwd=tmp_path)
    try:
        assert child.stdout.readline().startswith(b"ready")
        with Attacker(port, 16, flood):
            c0, t0 = cpu_s(child.pid), time.monotonic()
            time.sleep(3.0)
            share = (cpu_s(child.pid) - c0) / (time.monotonic() - t0)
        print(json.dumps({"serving_process_cpu_share": share}))
        assert share < 0.15, share
    finally:
        child.kill()
        child.wait()
