"""Prometheus metrics: served by a real agent (and re-exported by
`jaxtop log`), scraped over HTTP, parsed with prometheus_client.parser and
checked against the JSON sample of the same moment."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import PY, TARGETS, wait_for
from jaxtop.wire import prometheus
from jaxtop.testing import synthetic


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def scrape(port: int) -> dict[str, list]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def samples_in(path):
    recs = []
    for line in path.read_bytes().splitlines():
        try:
            recs.append(json.loads(line))
        except ValueError:
            pass  # the line being written
    return {r["seq"]: r for r in recs if r.get("type") == "sample"}


def check_matches_json(metrics, samples, pid):
    seq = int(metrics["jaxtop_sample_seq"][0].value)
    sample = samples[seq]
    assert metrics["jaxtop_sample_seq"][0].labels["pid"] == str(pid)
    by_dir = {s.labels["direction"]: s.value for s in metrics["jaxtop_transfers_total"]}
    for d in ("h2d", "d2h", "d2d"):
        assert by_dir[d] == sample["transfers"][d]["count_total"]
    known = {s.labels["direction"]: s.value for s in metrics["jaxtop_transfer_known_bytes_total"]}
    assert known["h2d"] == sample["transfers"]["h2d"]["bytes_known_total"]
    dev0 = next(s for s in metrics["jaxtop_device_bytes_in_use"] if s.labels["device"] == "0")
    assert dev0.value == sample["devices"][0]["bytes_in_use"]
    assert dev0.labels["platform"] == "cpu" and dev0.labels["process_index"] == "0"
    assert metrics["jaxtop_process_resident_memory_bytes"][0].value == sample["process"]["rss_bytes"]
    return sample


@pytest.mark.slow
def test_agent_serves_metrics_equal_to_its_json_samples(child_env, sockdir, tmp_path):
    port = free_port()
    log = tmp_path / "run.jsonl"
    proc = subprocess.Popen([PY, "-m", "jaxtop", "run", "--prometheus", str(port), "--log", str(log),
                             str(TARGETS / "loop.py"), "--seconds", "30"], env=child_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: log.exists() and any(s["devices"] and s["transfers"]["h2d"]["count_total"] > 5
                                              for s in samples_in(log).values()), timeout=60, what="samples")
        metrics = scrape(port)
        time.sleep(0.3)  # let the log catch up with the scraped sample
        sample = check_matches_json(metrics, samples_in(log), proc.pid)
        assert sample["transfers"]["h2d"]["count_total"] > 5
        # n/a is left out, not exported as 0: CPU has no allocator pool.
        assert "jaxtop_device_fragmentation_ratio" not in metrics
        assert "jaxtop_device_pool_bytes" not in metrics
        # Loopback unless asked otherwise.
        listening = [c for c in psutil.Process(proc.pid).net_connections(kind="tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        assert [c.laddr.ip for c in listening] == ["127.0.0.1"]
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_log_reexports_a_running_agent(targets, child_env, tmp_path):
    target = targets.run(TARGETS / "loop.py", "--seconds", "30")
    port = free_port()
    out = tmp_path / "rec.jsonl"
    rec = subprocess.Popen([PY, "-m", "jaxtop", "log", str(target.pid), "-o", str(out), "--duration", "20",
                            "--prometheus", str(port)], env=child_env)
    try:
        wait_for(lambda: out.exists() and any(s["devices"] and s["transfers"]["h2d"]["count_total"] > 5
                                              for s in samples_in(out).values()), timeout=60, what="samples")
        metrics = scrape(port)
        time.sleep(0.3)
        check_matches_json(metrics, samples_in(out), target.pid)
    finally:
        rec.terminate()
        rec.wait(timeout=30)


def test_port_in_use_is_refused_before_anything_changes(child_env, sockdir, tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("print('ran')\n")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    try:
        res = subprocess.run([PY, "-m", "jaxtop", "run", "--prometheus", str(port), str(script)], env=child_env,
                             capture_output=True, timeout=60)
        assert res.returncode == 2
        assert b"cannot start the agent" in res.stderr and b"Address already in use" in res.stderr
        assert res.stdout == b""  # the program did not run
        assert list(sockdir.iterdir()) == []  # no socket left behind
    finally:
        s.close()


def test_gpu_sample_gives_every_device_metric_with_labels():
    state = prometheus.StreamState()
    hello = synthetic.hello(4242, 2, 1000.0)
    state.update(hello)
    sample = next(synthetic.samples(4242, 2, 1000.0, 1))
    state.update(sample)
    registry = prometheus.make_registry(state, host="node-7")
    from prometheus_client import generate_latest

    metrics: dict[str, list] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            metrics.setdefault(s.name, []).append(s)
    frag = {s.labels["device"]: s for s in metrics["jaxtop_device_fragmentation_ratio"]}
    assert set(frag) == {"0", "1"}
    assert frag["1"].value == pytest.approx(sample["devices"][1]["fragmentation"])
    # host: the agent's own (its hello), never the serving machine's; job: the
    # program's name when none was given and there is no coordinator.
    assert frag["0"].labels == {"device": "0", "platform": "gpu", "host": hello["host"], "pid": "4242",
                                "process_index": "0", "process_count": "1", "job": "synthetic-train"}
    pool = {s.labels["device"]: s.value for s in metrics["jaxtop_device_pool_bytes"]}
    assert pool["0"] == sample["devices"][0]["pool_bytes"]
    mine = {s.labels["gpu"]: s.value for s in metrics["jaxtop_gpu_process_memory_bytes"]}
    assert mine["1"] == sample["nvml"]["devices"][1]["process_memory_bytes"]
    # The NVML <-> jax device join is exported.
    joined = {s.labels["device"]: s.labels["gpu"] for s in metrics["jaxtop_device_info"]}
    assert joined == {str(d["jax_id"]): str(d["index"]) for d in hello["nvml"]["devices"]}


def test_the_labels_name_the_job_and_the_agents_host():
    state = prometheus.StreamState()
    hello = dict(synthetic.hello(7, 1, 1000.0), host="worker-3", job=None)
    state.update(hello)
    assert state.identity("reexporter")[:2] == ["synthetic-train", "worker-3"]
    state.update({"type": "backend", "t": 1.0, "devices": [],
                  "distributed": {"process_index": 2, "process_count": 4, "coordinator": "10.0.0.1:1234"}})
    assert state.identity() == ["jax-10.0.0.1:1234", "worker-3", "7", "2", "4"]
    state.update(dict(hello, job="run-42"))
    assert state.identity()[0] == "run-42"
    del hello["host"]
    state.update(hello)
    assert state.identity("reexporter")[1] == "reexporter"  # an agent too old to name its host
    assert prometheus.job_name("a\nb") == "a_b" and prometheus.job_name("") is None
    assert len(prometheus.job_name("x" * 1000)) == 200


def test_grafana_dashboard_queries_only_metrics_the_exporter_has():
    """Every metric name in contrib/grafana/jaxtop.json exists in the
    exporter's output for a GPU-shaped sample (names drift otherwise)."""
    import re
    from pathlib import Path

    from prometheus_client import generate_latest

    dash = json.loads((Path(__file__).parent.parent / "contrib" / "grafana" / "jaxtop.json").read_text())
    state = prometheus.StreamState()
    state.update(synthetic.hello(1, 2, 1000.0))
    state.update(next(synthetic.samples(1, 2, 1000.0, 1)))
    exported = {s.name for f in text_string_to_metric_families(generate_latest(prometheus.make_registry(state)).decode())
                for s in f.samples}
    queried = set()
    for panel in dash["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            queried |= set(re.findall(r"\bjaxtop_\w+", target["expr"]))
    for var in dash["templating"]["list"]:
        queried |= set(re.findall(r"\bjaxtop_\w+", json.dumps(var.get("query", ""))))
    assert queried and queried <= exported, queried - exported
