"""``jaxtop attach --prometheus URL`` against servers that are hostile or
just very large, each a real HTTP server on loopback: a time limit for each
whole query (not for each read), a cap on an answer's bytes and on the
processes and devices kept, JSON too deep for the parser as one clear line,
and a URL's password never shown. benchmarks/prometheus_attach_memory.py
measures the dashboard's memory for such answers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from loopback_http import LoopbackServer
from jaxtop.dashboard.model import Model
from jaxtop.dashboard.sources import prometheus as source_mod
from jaxtop.dashboard.sources.prometheus import PrometheusSource

T = 1_800_000_000.0
JSON_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"


class Server(LoopbackServer):
    """A loopback HTTP server that answers every request with ``answer(conn)``
    (the request read whole first); closed by :meth:`close`."""

    def __init__(self, answer) -> None:
        self.answer = answer
        super().__init__()

    @property
    def requests(self) -> int:
        return self.connections

    def handle(self, conn: socket.socket) -> None:
        self._one(conn)

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                self.answer(conn, self.stop)
            except OSError:
                pass  # the client gave up: as it should


def deep(conn, stop) -> None:
    conn.sendall(JSON_HEAD + b"[" * 200_000 + b"]" * 200_000)


def drip(conn, stop) -> None:
    conn.sendall(JSON_HEAD + b'{"status":')
    end = time.monotonic() + 30
    while not stop.is_set() and time.monotonic() < end:  # a byte every 0.2 s: every read is quick
        conn.sendall(b" ")
        time.sleep(0.2)


def endless(conn, stop) -> None:
    conn.sendall(JSON_HEAD + b'{"status":"success","data":{"resultType":"vector","result":[')
    chunk = b" " * (1 << 20)
    for _ in range(80):  # 80 MiB, past the cap
        if stop.is_set():
            return
        conn.sendall(chunk)


def series(name: str, value: float, **labels: str) -> dict:
    return {"metric": {"__name__": name, **labels}, "value": [T, str(value)]}


def processes(n: int, devices: int = 1) -> list[dict]:
    out = []
    for i in range(n):
        base = {"job": "big", "host": f"node-{i // 8}", "pid": str(1000 + i), "process_index": str(i),
                "process_count": str(n)}
        out.append(series("jaxtop_sample_seq", 7, **base))
        out.append(series("jaxtop_process_resident_memory_bytes", 1 << 30, **base))
        for d in range(devices):
            dev = dict(base, device=str(d), platform="gpu")
            out.append(series("jaxtop_device_bytes_in_use", 1 << 20, **dev))
            out.append(series("jaxtop_device_info", 1, kind="H100", gpu=str(d), **dev))
    return out


def answer_of(result: list[dict]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def serving(payload: bytes):
    def answer(conn, stop) -> None:
        conn.sendall(JSON_HEAD + payload)
    return answer


@pytest.fixture
def server(request):
    srv = Server(request.param)
    yield srv
    srv.close()


def attach(url: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "jaxtop", "attach", "--prometheus", url], capture_output=True,
                         text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return run, time.monotonic() - t0


def one_line(run: subprocess.CompletedProcess) -> str:
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    return lines[0]


@pytest.mark.parametrize("server", [deep], indirect=True)
def test_json_nested_too_deep_at_the_first_check_is_one_clear_line(server):
    run, _ = attach(server.url)
    assert "nested too deeply" in one_line(run)


@pytest.mark.parametrize("server", [drip], indirect=True)
def test_a_server_dripping_its_answer_is_cut_off_at_one_time_limit(server):
    run, took = attach(server.url)
    line = one_line(run)
    assert f"cannot query {server.url}: no complete answer within 10 s" in line
    assert took < source_mod.TIMEOUT_S + 8, took  # the interpreter's start, then 10 s at most


@pytest.mark.parametrize("server", [endless], indirect=True)
def test_an_answer_past_the_cap_is_one_clear_line(server):
    run, _ = attach(server.url)
    assert "Prometheus answered more than 64 MiB: narrow the query with --job" in one_line(run)


def test_a_password_in_the_url_is_never_shown():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run, _ = attach(f"http://viewer:s3cr3t@127.0.0.1:{port}")
    assert f"cannot query http://viewer:***@127.0.0.1:{port}:" in one_line(run)
    assert "s3cr3t" not in run.stderr


@pytest.mark.parametrize("server", [serving(answer_of(processes(5000)))], indirect=True)
def test_only_the_first_processes_are_kept_and_a_notice_says_how_many_more(server, monkeypatch):
    monkeypatch.setattr(source_mod, "MAX_PROCESSES", 40)
    monkeypatch.setattr(source_mod, "MAX_DEVICES", 30)
    source = PrometheusSource(server.url, poll_s=2.0, backfill_s=0)
    source.model = model = Model()
    assert source.check() == 40
    source.poll()
    source.poll()  # the same processes: the set kept does not change
    assert len(model.processes) == 40
    snap = model.snapshot()
    assert len(snap.devices) == 30  # the device cap, over all processes
    assert model.notices == ["Prometheus has 4960 more processes than the 40 shown (narrow them with --job)"]


def test_a_process_claiming_thousands_of_devices_keeps_a_bounded_number():
    result = processes(1, devices=5000)
    kept = source_mod.group(source_mod.parse_answer(answer_of(result)))
    [items] = kept.values()
    devices = {labels["device"] for labels, _ in items if "device" in labels}
    assert len(devices) == source_mod.MAX_DEVICES_PER_PROCESS
    assert len(items) <= source_mod.MAX_SERIES_PER_PROCESS


def test_the_backfill_step_keeps_a_big_jobs_history_under_the_cap():
    source = PrometheusSource("http://prom:9090", poll_s=2.0, backfill_s=600.0,
                              fetch=lambda url: answer_of(processes(5000)))
    source.check()
    # 5,000 processes x 4 series: 600 s at 2 s would be 6,000,000 points.
    assert source.backfill_step_s() == 600.0 * 20_000 / source_mod.MAX_BACKFILL_POINTS
    assert PrometheusSource("http://prom:9090", poll_s=2.0).backfill_step_s() == 2.0


MEMORY_CHILD = textwrap.dedent("""
    import json, resource, sys
    # A reader that holds everything would need tens of GB: stop it at 3 GB.
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    from jaxtop.dashboard.model import Model
    from jaxtop.dashboard.sources import prometheus as m
    m.MAX_PROCESSES = m.MAX_DEVICES = 5  # the model's histories (MBs each) are not what is measured here
    def rss():
        with open("/proc/self/status") as f:
            return {k: int(v.split()[0]) * 1024 for k, v in (l.split(":", 1) for l in f) if k in ("VmRSS", "VmHWM")}
    before = rss()["VmRSS"]
    source = m.PrometheusSource(sys.argv[1], poll_s=2.0, backfill_s=0)
    source.model = Model()
    source.check()
    source.poll()
    print(json.dumps({"peak_growth": rss()["VmHWM"] - before, "processes": len(source.model.processes)}))
""")


def test_a_60_mib_answer_is_read_in_bounded_memory(tmp_path):
    payload = answer_of(processes(24_000, devices=5))
    assert 55 << 20 < len(payload) < 64 << 20  # valid, under the byte cap
    srv = Server(serving(payload))
    try:
        run = subprocess.run([sys.executable, "-c", MEMORY_CHILD, srv.url], capture_output=True, text=True,
                             timeout=300, cwd=tmp_path, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    finally:
        srv.close()
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    print(got)
    assert got["processes"] == 5
    # The answer itself (read, then parsed from it): a few times its size at
    # most, never the tens of GB of a model with every process.
    assert got["peak_growth"] < 4 * len(payload), got
