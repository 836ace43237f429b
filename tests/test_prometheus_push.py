"""The push of the last metrics at exit (``--prometheus-push URL``) against
gateways that answer slowly or never: one deadline for the whole push,
whatever the gateway does, a notice when it fails, and a URL's password
never printed. The real Pushgateway is tests/test_cluster.py's."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import time

import pytest

from loopback_http import LoopbackServer
from jaxtop.testing import synthetic
from jaxtop.wire import prometheus

pytest.importorskip("prometheus_client")


class Gateway(LoopbackServer):
    """A loopback stand-in for a Pushgateway: reads each request whole, then
    answers it as ``mode`` says: ``ok`` (204), ``drip`` (a 200 a byte every
    0.25 s, for 8 s at most) or ``hang`` (never, for 8 s at most)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.requests: list[bytes] = []
        super().__init__()

    def handle(self, conn: socket.socket) -> None:
        self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                body += chunk
            self.requests.append(head + b"\r\n\r\n" + body)
            end = time.monotonic() + 8.0
            if self.mode == "ok":
                conn.sendall(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
            elif self.mode == "drip":
                for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" * 10:
                    if self.stop.is_set() or time.monotonic() > end:
                        return
                    try:
                        conn.sendall(bytes([byte]))
                    except OSError:  # the pusher gave up
                        return
                    time.sleep(0.25)
            else:
                while not self.stop.is_set() and time.monotonic() < end:
                    time.sleep(0.1)

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        self.thread.join(timeout=5)


@pytest.fixture
def gateway(request):
    gw = Gateway(request.param)
    yield gw
    gw.close()


def a_state() -> prometheus.StreamState:
    state = prometheus.StreamState()
    state.update(synthetic.hello(4242, 1, 1000.0))
    state.update(next(synthetic.samples(4242, 1, 1000.0, 1)))
    return state


@pytest.mark.parametrize("gateway", ["drip", "hang"], indirect=True)
def test_a_push_ends_within_its_deadline_whatever_the_gateway_does(gateway):
    t0 = time.monotonic()
    with pytest.raises(OSError, match="within 2 s"):
        prometheus.push(a_state(), f"http://127.0.0.1:{gateway.port}")
    assert time.monotonic() - t0 < 2.5


@pytest.mark.parametrize("gateway", ["ok"], indirect=True)
def test_a_password_in_the_url_is_sent_as_basic_auth(gateway):
    prometheus.push(a_state(), f"http://ci:s3cr%40t@127.0.0.1:{gateway.port}/base/")
    [req] = gateway.requests
    head, _, body = req.partition(b"\r\n\r\n")
    line, *headers = head.decode().split("\r\n")
    assert line.startswith("PUT /base/metrics/job/synthetic-train/host/") and line.endswith("/pid/4242 HTTP/1.1")
    assert f"Authorization: Basic {base64.b64encode(b'ci:s3cr@t').decode()}" in headers
    assert b"jaxtop_sample_seq{" in body


def test_a_url_is_printed_without_its_password():
    assert prometheus.redact("http://ci:s3cr3t@gw:9091/x") == "http://ci:***@gw:9091/x"
    assert prometheus.redact("https://ci@gw:9091") == "https://ci@gw:9091"
    assert prometheus.redact("http://gw:9091") == "http://gw:9091"


def run_pushing(url: str, tmp_path) -> tuple[subprocess.CompletedProcess, float]:
    """``jaxtop run --prometheus-push URL`` of a short program: its result,
    and the seconds from the program's last line to the process's exit."""
    script = tmp_path / "short.py"
    script.write_text("import jax.numpy as jnp\n(jnp.ones(4) + 1).block_until_ready()\nprint('done', flush=True)\n")
    sockdir = tmp_path / "sock"
    sockdir.mkdir(mode=0o700, exist_ok=True)
    env = dict(os.environ, JAXTOP_SOCKET_DIR=str(sockdir), JAX_PLATFORMS="cpu")
    proc = subprocess.Popen([sys.executable, "-m", "jaxtop", "run", "--prometheus-push", url, str(script)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        done = time.monotonic()
        stdout, stderr = proc.communicate(timeout=60)
        waited = time.monotonic() - done
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, first + stdout, stderr), waited


@pytest.mark.parametrize("gateway", ["drip"], indirect=True)
def test_a_dripping_gateway_delays_the_exit_by_the_deadline_at_most_and_is_named(gateway, tmp_path):
    url = f"http://127.0.0.1:{gateway.port}"
    run, waited = run_pushing(url, tmp_path)
    print(f"exit delayed {waited:.2f} s after the program's last line")
    assert run.returncode == 0 and run.stdout == "done\n"
    assert waited < 4.0, waited  # the push's 2 s, the final sample and the teardown
    notice = [line for line in run.stderr.splitlines() if "could not push" in line]
    assert notice == [f"jaxtop: could not push the last metrics to {url}: no complete answer within 2 s"], run.stderr


@pytest.mark.parametrize("gateway", ["hang"], indirect=True)
def test_the_exit_notice_never_shows_the_urls_password(gateway, tmp_path):
    run, _ = run_pushing(f"http://ci:s3cr3t@127.0.0.1:{gateway.port}", tmp_path)
    assert run.returncode == 0
    assert f"could not push the last metrics to http://ci:***@127.0.0.1:{gateway.port}: " in run.stderr
    assert "s3cr3t" not in run.stderr
