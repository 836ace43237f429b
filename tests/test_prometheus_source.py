"""``jaxtop attach --prometheus``: Prometheus answers turned back into the
records the dashboard reads (pure), bad answers, and the app drawn over
them (Pilot). The real server is tests/test_cluster.py's."""

from __future__ import annotations

import json

import pytest

from jaxtop.dashboard.model import Model
from jaxtop.dashboard.sources.prometheus import (
    KEY_BASE, PrometheusError, PrometheusSource, group, hello_for, parse_answer, records_for, selector,
)

T = 1_800_000_000.0


def series(name, value, t=T, **labels):
    return {"metric": {"__name__": name, **labels}, "value": [t, str(value)]}


def process_series(host, pid, index, seq, in_use, h2d, t=T, job="run-1"):
    base = {"job": job, "host": host, "pid": str(pid), "process_index": str(index), "process_count": "2"}
    dev = dict(base, device=str(index * 2), platform="gpu")
    return [
        series("jaxtop_sample_seq", seq, t, **base),
        series("jaxtop_sample_timestamp_seconds", t - 0.05, t, **base),
        series("jaxtop_device_bytes_in_use", in_use, t, **dev),
        series("jaxtop_device_pool_bytes", 4 * in_use, t, **dev),
        series("jaxtop_device_limit_bytes", 80 << 30, t, **dev),
        series("jaxtop_device_fragmentation_ratio", 0.25, t, **dev),
        series("jaxtop_device_live_array_bytes", in_use - 100, t, **dev),
        series("jaxtop_device_info", 1, t, kind="H100", gpu=str(index), **dev),
        series("jaxtop_transfers_total", h2d, t, direction="h2d", **base),
        series("jaxtop_transfer_known_bytes_total", 8 * h2d, t, direction="h2d", **base),
        series("jaxtop_process_resident_memory_bytes", 3 << 30, t, **base),
        series("jaxtop_process_cpu_ratio", 1.5, t, **base),
        series("jaxtop_compiles_total", 7, t, **base),
        series("jaxtop_gpu_process_memory_bytes", 5 << 30, t, gpu=str(index), **base),
        series("jaxtop_versions_info", 1, t, jax="0.10.2", jaxtop="0.1.0", **base),
    ]


def answer(result, kind="vector"):
    return json.dumps({"status": "success", "data": {"resultType": kind, "result": result}}).encode()


def test_each_process_of_the_job_becomes_a_hello_and_a_sample():
    found = group(parse_answer(answer(process_series("node-1", 1, 0, 50, 1000, 10)
                                      + process_series("node-2", 1, 1, 60, 3000, 20))))
    assert sorted(found) == [("run-1", "node-1", "1"), ("run-1", "node-2", "1")]  # both pid 1: two processes
    items = found[("run-1", "node-2", "1")]
    hello = hello_for(("run-1", "node-2", "1"), items, 2.0)
    assert (hello["pid"], hello["host"], hello["job"]) == (1, "node-2", "run-1")
    assert hello["devices"] == [{"id": 2, "platform": "gpu", "kind": "H100", "process_index": 1}]
    assert hello["nvml"] == {"available": True, "devices": [{"index": 1, "jax_id": 2}]}
    assert hello["versions"] == {"jax": "0.10.2", "jaxtop": "0.1.0"}
    [sample] = records_for(items)
    assert sample["seq"] == 60 and sample["t"] == T - 0.05
    [dev] = sample["devices"]
    assert dev == {"id": 2, "platform": "gpu", "bytes_in_use": 3000, "pool_bytes": 12000, "bytes_limit": 80 << 30,
                   "fragmentation": 0.25, "live_arrays": {"bytes": 2900}, "source": "memory_stats"}
    assert sample["transfers"]["h2d"] == {"count_total": 20, "bytes_known_total": 160, "count": 0, "bytes_known": 0}
    assert sample["process"] == {"rss_bytes": 3 << 30, "cpu_percent": 150.0}
    assert sample["nvml"]["devices"] == [{"index": 1, "memory_used_bytes": None, "process_memory_bytes": 5 << 30}]


def test_counts_per_interval_come_from_the_counters_and_a_repeated_scrape_adds_nothing():
    previous: dict = {}
    first = records_for(group(parse_answer(answer(process_series("h", 5, 0, 10, 1, 100))))[("run-1", "h", "5")],
                        previous)
    again = records_for(group(parse_answer(answer(process_series("h", 5, 0, 30, 1, 130))))[("run-1", "h", "5")],
                        previous)
    assert first[0]["transfers"]["h2d"]["count"] == 0 and again[0]["transfers"]["h2d"]["count"] == 30
    restarted = records_for(group(parse_answer(answer(process_series("h", 5, 0, 1, 1, 2))))[("run-1", "h", "5")],
                            previous)
    assert restarted[0]["transfers"]["h2d"]["count"] == 0  # a counter that went back: a restart, not -128


def test_a_range_answer_gives_one_sample_per_scrape():
    points = []
    for i, seq in enumerate((10, 10, 30, 50)):  # the second point is the same sample scraped again
        points.append(process_series("h", 5, 0, seq, 100 + i, 10 * i, t=T + 2 * i))
    merged: dict = {}
    for group_ in points:
        for s in group_:
            key = json.dumps(s["metric"], sort_keys=True)
            merged.setdefault(key, {"metric": s["metric"], "values": []})["values"].append(s["value"])
    found = group(parse_answer(answer(list(merged.values()), "matrix")))
    samples = records_for(found[("run-1", "h", "5")])
    assert [s["seq"] for s in samples] == [10, 30, 50]
    assert [s["devices"][0]["bytes_in_use"] for s in samples] == [100, 102, 103]


def test_a_cpu_process_reads_n_a_with_the_reason():
    base = {"job": "j", "host": "h", "pid": "9", "process_index": "0", "process_count": "1"}
    items = group(parse_answer(answer([
        series("jaxtop_sample_seq", 3, **base),
        series("jaxtop_device_bytes_in_use", 4096, device="0", platform="cpu", **base)])))[("j", "h", "9")]
    [sample] = records_for(items)
    [dev] = sample["devices"]
    assert dev["fragmentation"] is None and "not exported to Prometheus" in dev["fragmentation_reason"]
    assert "pool_bytes" not in dev and dev["source"] == "live_arrays"
    assert sample["transfer_capture"]["available"] is False  # transfers not exported: n/a, not 0
    assert "transfers" not in sample


@pytest.mark.parametrize("payload,message", [
    (b"<html>proxy error</html>", "not a Prometheus answer"),
    (json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}).encode(),
     "parse error at char 3"),
    (b"[1, 2]", "not a success"),
])
def test_a_bad_answer_is_a_clear_error(payload, message):
    with pytest.raises(PrometheusError, match=message):
        parse_answer(payload)


def test_hostile_values_are_skipped_not_fatal():
    base = {"job": "j", "host": "h", "pid": "not-a-pid"}
    result = [
        {"metric": dict(base, __name__="jaxtop_sample_seq"), "value": [T, "NaN"]},
        {"metric": dict(base, __name__="jaxtop_device_bytes_in_use", device="0"), "value": [T, "1e400"]},
        {"metric": "not a dict", "value": [T, "1"]},
        {"metric": dict(base, __name__="jaxtop_process_cpu_ratio"), "value": ["x", "y"]},
        {"metric": dict(base, __name__="jaxtop_compiles_total")},
    ]
    found = group(parse_answer(answer(result)))
    assert list(found) == [("j", "h", "not-a-pid")]
    hello = hello_for(("j", "h", "not-a-pid"), found[("j", "h", "not-a-pid")], 2.0)
    assert hello["pid"] == "not-a-pid"  # kept as text: the screen shows it as given
    model = Model()
    model.feed(KEY_BASE, hello)
    model.feed_many(KEY_BASE, records_for(found[("j", "h", "not-a-pid")]))  # NaN seq, inf bytes: no exception
    model.snapshot()


def test_the_selector_escapes_the_job():
    assert selector(None) == '{__name__=~"jaxtop_.+"}'
    assert selector('a"b\\c') == '{__name__=~"jaxtop_.+", job=~"a\\"b\\\\c"}'


def test_an_unreachable_server_is_a_clear_error():
    def refuse(url):
        raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(PrometheusError, match="cannot query http://prom:9090: .*Connection refused"):
        PrometheusSource("http://prom:9090/", fetch=refuse).check()


async def test_the_dashboard_over_prometheus_shows_every_process_and_device():
    from jaxtop.dashboard.app import make_app
    from jaxtop.widgets.panels import OverviewPanel

    calls = []

    def fetch(url):
        calls.append(url)
        return answer(process_series("node-1", 1, 0, 50, 1 << 30, 10) + process_series("node-2", 1, 1, 60, 3 << 30, 20))

    source = PrometheusSource("http://prom:9090", job="run-.*", poll_s=0.2, backfill_s=0, fetch=fetch)
    app = make_app(source)
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(50):
            await pilot.pause(0.1)
            if app.snapshot and len(app.snapshot.devices) == 2:
                break
        await pilot.press("o")
        await pilot.pause(0.3)
        snap = app.snapshot
        text = str(app.query_one(OverviewPanel).draw(snap, 120, 10).renderables[1].columns[0]._cells)
        assert "node-1 pid 1" in text and "node-2 pid 1" in text
        assert {d.bytes_in_use for d in snap.devices} == {1 << 30, 3 << 30}
        assert source.send_command(snap.processes[0].pid, "holders_mark").startswith("not over Prometheus")
    assert all("job%3D~%22run-.%2A%22" in url for url in calls)
