"""Adversarial: idle connections to the Prometheus endpoint.

The endpoint listens on loopback, where every local user can connect. With a
thread and an fd per connection and no cap, ~1,000 idle connections made the
training program's own ``open()`` fail with EMFILE. The server must hold a
small fixed number of threads and fds whatever its peers do.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.request

import pytest

from jaxtop.wire import prometheus
from jaxtop.testing import synthetic

pytest.importorskip("prometheus_client")


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """True when the server closes (or resets) the connection in time."""
    sock.settimeout(seconds)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except TimeoutError:
        return False
    except OSError:  # reset by the server: closed too
        return True


def test_idle_connections_get_bounded_threads_fds_and_time(monkeypatch):
    monkeypatch.setattr(prometheus, "SOCKET_TIMEOUT_S", 1.0, raising=False)
    state = prometheus.StreamState()
    state.update(synthetic.hello(4242, 1, 1000.0))
    state.update(next(synthetic.samples(4242, 1, 1000.0, 1)))
    port = free_port()
    threads_before = threading.active_count()
    fds_before = open_fds()
    server = prometheus.serve(state, port)
    conns = []
    try:
        for _ in range(200):
            conns.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.5)
        # Ours: the 200 client ends; the server's: its listener, its thread
        # and a few connections it serves.
        server_threads = threading.active_count() - threads_before
        server_fds = open_fds() - fds_before - len(conns)
        assert server_threads <= 1 + prometheus.MAX_CONNECTIONS, server_threads
        assert server_fds <= 1 + prometheus.MAX_CONNECTIONS, server_fds
        # Every idle connection is closed: at once past the cap, after the
        # socket timeout within it.
        deadline = time.monotonic() + 5.0
        for c in conns:
            assert closed_within(c, max(0.1, deadline - time.monotonic()))
        for c in conns:
            c.close()
        conns.clear()
        time.sleep(0.3)
        assert threading.active_count() - threads_before <= 1
        # And it still serves a scrape.
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert "jaxtop_sample_seq" in text
    finally:
        for c in conns:
            c.close()
        server.shutdown()
        server.server_close()


def test_module_docstring_says_who_can_read_the_metrics():
    doc = prometheus.__doc__
    assert "every local user" in doc
    assert "firewall" in doc and "bind" in doc
