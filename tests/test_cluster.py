"""A multi-process jax.distributed job on a real Prometheus server.

Two processes of one job (gloo collectives over localhost, two CPU devices
each) run under ``jaxtop run --prometheus``; Debian's ``prometheus`` scrapes
them every second. Checked against the processes' own figures (their
agents' recordings, matched by the sample's ``seq``): the labels, every
expression of the Grafana dashboard, and ``jaxtop attach --prometheus``'s
model. A short-lived process pushes its last metrics to a Pushgateway.

Needs the ``prometheus`` (and ``prometheus-pushgateway``) binaries; ``.ci/run``
installs them, elsewhere the tests are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from jaxtop.dashboard.model import Model
from jaxtop.dashboard.sources.prometheus import PrometheusSource

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "tests" / "targets" / "distributed_job.py"
DASHBOARD = ROOT / "contrib" / "grafana" / "jaxtop.json"
PROCESSES = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 10.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


#: One evaluation time for every query of a test (set by ``freeze``): two
#: queries then see the same scrape, so their figures come from one sample.
AT: list[float] = []


def freeze() -> None:
    """Evaluate every following query at one moment, just past (scrapes up to it are stored)."""
    AT[:] = [time.time() - 1.5]


@pytest.fixture(autouse=True)
def _now():
    AT.clear()
    yield
    AT.clear()


def query(base: str, expr: str) -> list[dict]:
    params = {"query": expr, **({"time": f"{AT[0]:.3f}"} if AT else {})}
    answer = get_json(f"{base}/api/v1/query?{urllib.parse.urlencode(params)}")
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (OSError, ValueError, KeyError):
            value = None
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def samples_of(log: Path) -> dict[int, dict]:
    out = {}
    for line in log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line being written
        if record.get("type") == "sample":
            out[record["seq"]] = record
    return out


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"Debian's {name} is not installed here (.ci/run installs it: apt-get install {name})")
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The job's processes and a Prometheus server scraping them, paused
    once they have worked: (prometheus URL, job name, [(pid, log)])."""
    prometheus_bin = _binary("prometheus")
    tmp = tmp_path_factory.mktemp("cluster")
    sockdir = tmp / "sock"
    sockdir.mkdir(mode=0o700)
    env = dict(os.environ, JAXTOP_SOCKET_DIR=str(sockdir), JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    env.pop("JAX_TRANSFER_GUARD", None)
    env.pop("JAXTOP_JOB", None)
    coordinator = f"localhost:{free_port()}"
    pause, stop = tmp / "pause", tmp / "stop"
    ports = [free_port() for _ in range(PROCESSES)]
    procs, logs = [], []
    for i, port in enumerate(ports):
        log = tmp / f"p{i}.jsonl"
        logs.append(log)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "jaxtop", "run", "--prometheus", str(port), "--log", str(log), str(TARGET),
             "--coordinator", coordinator, "--process-id", str(i), "--processes", str(PROCESSES),
             "--pause", str(pause), "--stop", str(stop), "--timeout", "240"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp))
    prom_port = free_port()
    config = tmp / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: jaxtop\n    honor_labels: true\n    static_configs:\n"
        f"      - targets: [{', '.join(repr(f'127.0.0.1:{p}') for p in ports)}]\n")
    server = subprocess.Popen(
        [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp)
    base = f"http://127.0.0.1:{prom_port}"
    try:
        # Both processes scraped, and both have done implicit transfers.
        wait_for(lambda: len(query(base, 'jaxtop_transfers_total{direction="h2d"} > 20')) == PROCESSES, 120,
                 "both processes' transfers in Prometheus")
        pause.touch()
        time.sleep(3.0)  # the steps stop; several scrapes of the still state follow
        job = query(base, "jaxtop_sample_seq")[0]["metric"]["job"]
        yield base, job, [(p.pid, log) for p, log in zip(procs, logs)]
    finally:
        stop.touch()
        for p in procs:
            try:
                out, _ = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            assert p.returncode == 0, out.decode(errors="replace")[-3000:]
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def figures_at(base: str, logs, expr: str = "jaxtop_sample_seq") -> dict[str, dict]:
    """pid -> the process's own sample with the seq Prometheus has now."""
    out = {}
    for series in query(base, expr):
        pid = series["metric"]["pid"]
        seq = int(float(series["value"][1]))
        log = dict((str(p), log) for p, log in logs)[pid]
        out[pid] = wait_for(lambda: samples_of(log).get(seq), 10, f"sample {seq} in {log.name}")
    return out


def test_every_process_is_labelled_with_the_job_host_and_its_place(cluster):
    base, job, procs = cluster
    series = query(base, "jaxtop_sample_seq")
    assert len(series) == PROCESSES
    labels = [s["metric"] for s in series]
    assert {label["pid"] for label in labels} == {str(pid) for pid, _ in procs}
    assert {label["process_index"] for label in labels} == {"0", "1"}
    assert {label["process_count"] for label in labels} == {"2"}
    assert job.startswith("jax-localhost:")  # the coordinator names the job: the same in every process
    assert {label["job"] for label in labels} == {job}
    assert {label["host"] for label in labels} == {os.uname().nodename}
    devices = query(base, "jaxtop_device_info")
    assert len(devices) == 2 * PROCESSES and {d["metric"].get("gpu", "") for d in devices} == {""}  # no NVML on CPU (an empty label is dropped)


def test_prometheus_holds_the_processes_own_figures(cluster):
    base, job, procs = cluster
    freeze()
    own = figures_at(base, procs)
    in_use = query(base, f'jaxtop_device_bytes_in_use{{job="{job}"}}')
    assert len(in_use) == 2 * PROCESSES
    for s in in_use:
        sample = own[s["metric"]["pid"]]
        device = next(d for d in sample["devices"] if str(d["id"]) == s["metric"]["device"])
        assert float(s["value"][1]) == device["bytes_in_use"] > 0
    for s in query(base, 'jaxtop_transfers_total{direction="h2d"}'):
        assert int(float(s["value"][1])) == own[s["metric"]["pid"]]["transfers"]["h2d"]["count_total"] > 20
    for s in query(base, "jaxtop_compiles_total"):
        assert int(float(s["value"][1])) == own[s["metric"]["pid"]]["compile"]["count_total"] > 0
    for s in query(base, "jaxtop_process_resident_memory_bytes"):
        assert float(s["value"][1]) == own[s["metric"]["pid"]]["process"]["rss_bytes"]
    # The processes hold different amounts (their own arrays differ): a label mix-up would show.
    per_pid = {pid: sum(d["bytes_in_use"] for d in s["devices"]) for pid, s in own.items()}
    assert len(set(per_pid.values())) == PROCESSES


#: What a CPU backend has no figure for: an allocator's pool, limit and
#: fragmentation, and NVML.
GPU_ONLY = {"jaxtop_device_pool_bytes", "jaxtop_device_limit_bytes", "jaxtop_device_largest_free_block_bytes",
            "jaxtop_device_fragmentation_ratio", "jaxtop_gpu_memory_used_bytes", "jaxtop_gpu_process_memory_bytes"}


def dashboard_expressions():
    dash = json.loads(DASHBOARD.read_text())
    for panel in dash["panels"]:
        no_value = panel["fieldConfig"]["defaults"].get("noValue")
        for target in panel["targets"]:
            yield panel["title"], target["expr"], no_value


def test_every_grafana_expression_runs_and_gives_the_job_or_says_why_not(cluster):
    base, job, procs = cluster
    variables = {"$job": re.escape(job).replace("\\", "\\\\"), "$host": ".*", "$process_index": ".*",
                 "$device": ".*", "$scrape_job": "jaxtop", "$__rate_interval": "5s", "$__range": "5m"}
    seen, panels = 0, {}
    for title, expr, no_value in dashboard_expressions():
        gpu_only = set(re.findall(r"\bjaxtop_\w+", expr)) & GPU_ONLY
        for name, value in sorted(variables.items(), key=lambda kv: -len(kv[0])):
            expr = expr.replace(name, value)
        result = query(base, expr)
        seen += 1
        panels.setdefault(title, []).append(bool(result))
        if gpu_only:
            # Only a GPU has these: on CPU nothing, and the panel says why
            # (its noValue) or draws the other layers; never a 0.
            assert not result, (title, expr, result)
            assert no_value is None or no_value.startswith("n/a: "), title
        else:
            assert result, f"{title}: {expr} gives nothing on CPU"
    assert seen >= 15
    freeze()
    for title, has_data in panels.items():
        no_value = next(nv for t, _, nv in dashboard_expressions() if t == title)
        assert any(has_data) or (no_value or "").startswith("n/a: "), f"{title}: blank on CPU, with no reason"
    # The aggregates equal the processes' own figures.
    own = figures_at(base, procs)
    total = sum(d["bytes_in_use"] for s in own.values() for d in s["devices"])
    per_host = query(base, f'sum by (host) (jaxtop_device_bytes_in_use{{job="{job}"}})')
    assert [float(s["value"][1]) for s in per_host] == [total]
    top = query(base, f'topk(10, jaxtop_device_bytes_in_use{{job="{job}"}})')
    assert sorted(float(s["value"][1]) for s in top) == sorted(
        d["bytes_in_use"] for s in own.values() for d in s["devices"])


def test_attach_over_prometheus_shows_every_process_and_device_of_the_job(cluster):
    base, job, procs = cluster
    source = PrometheusSource(base, job=re.escape(job), backfill_s=60)
    model = Model()
    source.model = model
    assert source.check() == PROCESSES
    assert source.poll(backfill=True) > PROCESSES  # the last minute: timelines drawn at once
    source.poll()
    snap = model.snapshot()
    assert {p.own_pid for p in snap.processes} == {pid for pid, _ in procs}
    assert {p.host for p in snap.processes} == {os.uname().nodename} and {p.job for p in snap.processes} == {job}
    assert len(snap.devices) == 2 * PROCESSES
    logs = {pid: log for pid, log in procs}
    own = {str(p.own_pid): wait_for(lambda p=p: samples_of(logs[p.own_pid]).get(p.seq), 10, "the sample shown")
           for p in snap.processes}  # each process's own sample with the seq the dashboard shows
    for p in snap.processes:
        sample = own[str(p.own_pid)]
        assert p.transfers["h2d"].count_total == sample["transfers"]["h2d"]["count_total"]
        assert p.process.rss_bytes == sample["process"]["rss_bytes"]
        assert p.compile.count_total == sample["compile"]["count_total"]
        assert len(p.history.t) >= 2 and list(p.history.t) == sorted(p.history.t)  # the backfill's scrapes
    for dev in snap.devices:
        proc = next(p for p in snap.processes if p.pid == dev.pid)
        device = next(d for d in own[str(proc.own_pid)]["devices"] if d["id"] == dev.id)
        assert dev.bytes_in_use == device["bytes_in_use"]
        assert dev.pool_bytes is None and dev.fragmentation is None  # CPU: not exported, n/a
    assert source.send_command(snap.processes[0].pid, "holders_mark").startswith("not over Prometheus")


def test_a_process_shorter_than_a_scrape_pushes_its_last_metrics(tmp_path):
    gateway_bin = _binary("prometheus-pushgateway")
    port = free_port()
    # Debian's build persists to /var/lib by default: a file of this test's own.
    gateway = subprocess.Popen([gateway_bin, f"--web.listen-address=127.0.0.1:{port}",
                                f"--persistence.file={tmp_path / 'pushgateway.data'}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: urllib.request.urlopen(f"{url}/-/ready", timeout=2).status == 200, 30, "the pushgateway")
        script = tmp_path / "short.py"
        script.write_text("import jax.numpy as jnp, numpy as np\nx = jnp.asarray(np.ones(4)) + 1\nprint(float(x[0]))\n")
        sockdir = tmp_path / "sock"
        sockdir.mkdir(mode=0o700)
        env = dict(os.environ, JAXTOP_SOCKET_DIR=str(sockdir), JAX_PLATFORMS="cpu")
        log = tmp_path / "short.jsonl"
        run = subprocess.run([sys.executable, "-m", "jaxtop", "run", "--job", "ci-smoke", "--prometheus-push", url,
                              "--log", str(log), str(script)], env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and run.stdout == "2.0\n", run.stderr
        last = max(samples_of(log).values(), key=lambda r: r["seq"])
        text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
        line = next(ln for ln in text.splitlines() if ln.startswith("jaxtop_sample_seq{"))
        assert 'job="ci-smoke"' in line and f'pid="{run_pid(log)}"' in line
        assert float(line.rsplit(" ", 1)[1]) == last["seq"]
        h2d = next(ln for ln in text.splitlines() if ln.startswith("jaxtop_transfers_total{") and 'direction="h2d"' in ln)
        assert float(h2d.rsplit(" ", 1)[1]) == last["transfers"]["h2d"]["count_total"] >= 1
        # An unreachable gateway: one line on stderr, the program's exit status unchanged.
        bad = subprocess.run([sys.executable, "-m", "jaxtop", "run", "--prometheus-push", "http://127.0.0.1:9",
                              str(script)], env=env, capture_output=True, text=True, timeout=120)
        assert bad.returncode == 0 and bad.stdout == "2.0\n"
        assert "could not push the last metrics to http://127.0.0.1:9" in bad.stderr
    finally:
        gateway.terminate()
        gateway.wait(timeout=30)


def run_pid(log: Path) -> int:
    return next(json.loads(line)["pid"] for line in log.read_text().splitlines() if '"hello"' in line)
