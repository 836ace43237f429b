"""Pure layer: the model and its history, fed records by hand."""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import numpy as np
import pytest

from jaxtop.testing import synthetic
from jaxtop.dashboard.history import History
from jaxtop.dashboard.model import DEVICE_SERIES, DISCONNECTED, EXITED, LIVE, STALE, Model
from jaxtop.dashboard.readings import TransferView


def test_history_keeps_spikes_when_downsampling():
    h = History(("v",), levels=((0.0, 100), (1.0, 1000)))
    for k in range(5000):  # 500 s at 10 Hz, raw level holds only 10 s
        h.append(k * 0.1, {"v": 1000.0 if k == 1234 else 1.0})
    w = h.window(None)
    assert w.bucket_s == 1.0
    assert np.nanmax(w.hi[:, 0]) == 1000.0  # the single spike survived
    assert np.nanmin(w.lo[:, 0]) == 1.0
    recent = h.window(5.0)
    assert recent.bucket_s == 0.0 and len(recent.t) == 51


def test_history_missing_values_are_nan_not_zero():
    h = History(("a", "b"))
    h.append(1.0, {"a": 5, "b": None})
    w = h.window(60)
    assert w.hi[0, 0] == 5 and math.isnan(w.hi[0, 1])


def test_history_memory_is_bounded():
    h = History(("a", "b", "c"))
    before = h.nbytes()
    for k in range(20000):
        h.append(k * 0.1, {"a": k, "b": k, "c": k})
    assert h.nbytes() == before  # preallocated rings: no growth with run length


def _feed_synthetic(model, pid=1, n=2, count=50):
    model.feed(pid, synthetic.hello(pid, n, 1000.0))
    for rec in synthetic.samples(pid, n, 1000.0, count):
        model.feed(pid, rec)


def test_snapshot_from_gpu_shaped_stream():
    clock = [0.0]
    model = Model(clock=lambda: clock[0])
    _feed_synthetic(model, n=2, count=30)
    snap = model.snapshot(selected=1, window_s=60.0, now=1010.0)
    assert len(snap.devices) == 2 and snap.device.id == 1
    dev = snap.device
    assert dev.source == "memory_stats"
    assert dev.nvml is not None and dev.nvml.memory_used_bytes >= dev.pool_bytes >= dev.bytes_in_use
    assert dev.allocs_per_s is not None and dev.allocs_per_s > 0
    assert dev.cached_unused_bytes == dev.pool_bytes - dev.bytes_in_use
    assert len(dev.timeline.t) == 30
    proc = snap.processes[0]
    assert proc.state == LIVE
    assert proc.transfers["h2d"].count_total >= 0
    assert proc.transfers["h2d"].count_per_s is not None
    assert snap.process_of(dev) is proc


def test_cpu_stream_reports_reasons_not_zeros():
    model = Model()
    model.feed(5, {"type": "hello", "t": 1.0, "pid": 5, "argv": ["x.py"], "interval_s": 0.1,
                   "nvml": {"available": False, "reason": "NVML unavailable: NVMLError_LibraryNotFound"},
                   "transfer_capture": {"available": True}})
    model.feed(5, {"type": "sample", "t": 1.1, "seq": 1, "devices": [
        {"id": 0, "platform": "cpu", "source": "live_arrays", "bytes_in_use": 4096, "fragmentation": None,
         "fragmentation_reason": "memory_stats() is None on cpu backend",
         "live_arrays": {"bytes": 4096, "count": 1, "largest_bytes": 4096, "map": [[100, 4096]], "top": []}}],
        "transfers": {"h2d": {"count": 3, "bytes_known": 12, "count_total": 3, "bytes_known_total": 12}}})
    snap = model.snapshot()
    dev = snap.device
    assert dev.pool_bytes is None and dev.fragmentation is None and "cpu" in dev.fragmentation_reason
    assert dev.allocs_per_s is None and dev.allocs_reason
    assert dev.buffer_map == ((100, 4096),)
    # NVML missing on a CPU machine is no news: not an event (on a GPU it is).
    assert not any("NVML" in e.text for e in snap.events)
    assert snap.processes[0].transfers["h2d"].count_per_s == 30.0  # 3 in a 0.1 s interval


def test_states_stale_disconnected_exited_and_events():
    clock = [0.0]
    model = Model(clock=lambda: clock[0])
    _feed_synthetic(model, count=3)
    assert model.snapshot().processes[0].state == LIVE
    clock[0] = 0.5  # > 3 intervals of 0.1 s without a sample
    model.refresh_states()
    assert model.snapshot().processes[0].state == STALE
    model.set_state(1, DISCONNECTED, "connection lost")
    model.feed(1, {"type": "exit", "t": 2000.0, "pid": 1})
    model.set_state(1, DISCONNECTED, "eof")  # stays exited
    snap = model.snapshot()
    assert snap.processes[0].state == EXITED
    kinds = [e.kind for e in snap.events]
    assert "disconnect" in kinds and "exit" in kinds
    model.feed(1, {"type": "dropped", "t": 2010.0, "count": 7, "count_total": 7})
    dropped = [e for e in model.snapshot().events if e.kind == "dropped"]
    assert len(dropped) == 1 and dropped[0].text.startswith("7 samples dropped")


def test_overview_selection_and_multiple_processes():
    model = Model()
    _feed_synthetic(model, pid=1, n=2, count=5)
    _feed_synthetic(model, pid=2, n=1, count=5)
    snap = model.snapshot(selected=-1)
    assert snap.device is None and len(snap.devices) == 3
    assert {d.pid for d in snap.devices} == {1, 2}
    assert model.snapshot(selected=2).device.pid == 2


def _cpu_hello(pid: int, t: float = 100.0, started_t: float | None = None) -> dict:
    rec = {"type": "hello", "t": t, "pid": pid, "argv": ["x.py"], "interval_s": 0.1, "transfer_capture": {"available": True}}
    if started_t is not None:
        rec["started_t"] = started_t
    return rec


def _cpu_sample(t: float, live: dict, process: dict | None = None) -> dict:
    return {"type": "sample", "t": t, "seq": 1, "devices": [
        {"id": 0, "platform": "cpu", "source": "live_arrays", "bytes_in_use": live.get("bytes"), "fragmentation": None,
         "fragmentation_reason": "memory_stats() is None on cpu backend", "live_arrays": live}],
        "process": process or {"rss_bytes": 1 << 20}}


def test_unmapped_buffers_travel_with_the_map_they_belong_to():
    model = Model()
    model.feed(5, _cpu_hello(5))
    live = {"bytes": 10 << 20, "count": 10, "map": [[4096 * (i + 1), 1 << 20] for i in range(7)],
            "unmapped": {"not_ready": 3, "future_kind": 2}}
    model.feed(5, _cpu_sample(100.1, live))
    dev = model.snapshot().device
    assert len(dev.buffer_map) == 7 and dev.map_live_count == 10 and dev.map_live_bytes == 10 << 20
    assert dev.unmapped == {"not_ready": 3}  # a kind this viewer does not know counts as unexplained
    # A sample between scans (no map) leaves the map and its counts alone,
    # even though its live bytes moved on.
    model.feed(5, _cpu_sample(100.2, {"bytes": 12 << 20, "count": 12}))
    dev = model.snapshot().device
    assert dev.live_count == 12 and dev.map_live_count == 10 and dev.unmapped == {"not_ready": 3}
    # The next scan's map without "unmapped": every buffer placed.
    model.feed(5, _cpu_sample(100.3, {"bytes": 4096, "count": 1, "map": [[4096, 4096]]}))
    dev = model.snapshot().device
    assert dev.unmapped == {} and dev.map_live_count == 1 and dev.buffer_map == ((4096, 4096),)


def test_uptime_is_the_process_uptime_not_the_agent_uptime():
    model = Model()
    # The agent was injected at t=100 into a process that started at t=70.
    model.feed(5, _cpu_hello(5, t=100.0, started_t=100.0))
    assert model.snapshot(now=110.0).processes[0].uptime_s == 10.0  # only hello: the agent's start
    model.feed(5, _cpu_sample(100.1, {"bytes": 0, "count": 0}, process={"rss_bytes": 1 << 20, "started_t": 70.0}))
    assert model.snapshot(now=110.0).processes[0].uptime_s == 40.0
    # A later sample whose probe failed keeps the start time already known.
    model.feed(5, _cpu_sample(100.2, {"bytes": 0, "count": 0}, process={"available": False, "reason": "gone"}))
    assert model.snapshot(now=110.0).processes[0].uptime_s == 40.0


def test_events_of_several_pids_are_shown_in_time_order():
    model = Model()
    model.feed(1, {"type": "error", "t": 10.0, "message": "a"})
    model.feed(1, {"type": "error", "t": 30.0, "message": "c"})
    model.feed(2, {"type": "error", "t": 20.0, "message": "b"})  # another stream, read later
    model.feed(2, {"type": "error", "t": 5.0, "message": "first"})
    texts = [e.text for e in model.snapshot().events]
    assert texts == ["agent: first", "agent: a", "agent: b", "agent: c"]


def test_timelines_share_one_span_and_record_fragmentation():
    model = Model()
    model.feed(1, synthetic.hello(1, 1, 1000.0))
    for rec in synthetic.samples(1, 1, 1000.0, 100):  # 10 s, samples at 1000.1 .. 1010.0
        model.feed(1, rec)
    snap = model.snapshot(window_s=600.0)
    proc, dev = snap.processes[0], snap.device
    # A run shorter than the window fills it: from the first sample to the last.
    assert proc.span == (1000.1, 1010.0)
    snap = model.snapshot(window_s=5.0)
    assert snap.processes[0].span == (1005.0, 1010.0)
    # Fragmentation and the largest free block are history, min/max per point.
    t, _, hi = dev.timeline.series(DEVICE_SERIES.index("fragmentation"))
    assert len(t) == 100 and np.all((hi >= 0) & (hi <= 1))
    _, _, hi = dev.timeline.series(DEVICE_SERIES.index("largest_free_block_bytes"))
    assert np.all(hi > 0)
    # One sample only: an axis of a second, not of zero width.
    model = Model()
    model.feed(1, synthetic.hello(1, 1, 1000.0))
    model.feed(1, next(synthetic.samples(1, 1, 1000.0, 1)))
    assert model.snapshot().processes[0].span == (1000.1 - 1.0, 1000.1)


def test_holes_among_live_buffers_are_a_series_where_the_allocator_has_no_fragmentation():
    model = Model()
    model.feed(1, synthetic.hello(1, 1, 1000.0))
    for i, rec in enumerate(synthetic.samples(1, 1, 1000.0, 10)):
        dev = rec["devices"][0]
        dev["fragmentation"], dev["fragmentation_reason"] = None, "no pool on CPU"
        live = dev.setdefault("live_arrays", {"bytes": 0, "count": 0})
        if i % 2 == 0:
            live["holes"] = i / 20
        else:
            live.pop("holes", None)  # a scan where some buffer had no address
        model.feed(1, rec)
    dev = model.snapshot(window_s=600.0).device
    _, _, hi = dev.timeline.series(DEVICE_SERIES.index("live_holes"))
    assert np.allclose(hi[::2], [0.0, 0.1, 0.2, 0.3, 0.4]) and np.all(np.isnan(hi[1::2]))
    assert dev.live_holes is None  # the latest scan measured none: not the one before
    assert dev.fragmentation is None


def test_profile_reply_and_reset():
    model = Model()
    _feed_synthetic(model, count=2)
    model.feed(1, {"type": "reply", "t": 5.0, "ok": True, "result": {"path": "/tmp/x.prof", "top_sites": [{"site": "f (a.py:1)", "bytes": 10}]}})
    snap = model.snapshot()
    assert snap.processes[0].last_profile.path == "/tmp/x.prof"
    assert snap.events[-1].kind == "profile"
    model.reset(1)
    assert model.snapshot().processes == ()


def test_live_source_removes_its_session_spool_when_stopped(sockdir):
    import os
    import subprocess

    from jaxtop.dashboard.sources import LiveSource

    gone = subprocess.Popen(["true"])
    gone.wait()
    src = LiveSource([gone.pid])
    spool_dir = src._spool_dir
    assert os.path.isdir(spool_dir)
    src.start(Model(), lambda: None)
    src.stop()
    assert not os.path.exists(spool_dir)


def test_session_spool_is_capped_and_a_save_still_opens_with_hello(tmp_path, monkeypatch):
    import json
    import os

    from jaxtop.wire import protocol
    from jaxtop.dashboard.sources.live import _Connection

    monkeypatch.setenv("JAXTOP_SPOOL_MAX_BYTES", str(64 * 1024))
    conn = _Connection(7, str(tmp_path))
    conn.spool_line(protocol.encode(synthetic.hello(7, 1, 1000.0)))
    conn.spool_line(protocol.encode({"type": "backend", "t": 1000.0, "backend": "cpu", "devices": []}))
    for seq in range(1, 5001):
        noise = os.urandom(48).hex()  # incompressible, so the cap is reached
        conn.spool_line(protocol.encode({"type": "sample", "t": 1000.0 + seq, "seq": seq, "devices": [], "pad": noise}))
    assert conn.rotations >= 2
    on_disk = sum(os.path.getsize(tmp_path / f) for f in os.listdir(tmp_path))
    assert on_disk < 2 * 64 * 1024  # two segments of at most half the cap each (plus a partial block)
    out = tmp_path / "saved.jsonl"
    conn.save(str(out))
    recs = [json.loads(l) for l in out.read_bytes().splitlines()]
    assert [r["type"] for r in recs[:2]] == ["hello", "backend"]
    seqs = [r["seq"] for r in recs if r["type"] == "sample"]
    assert seqs == list(range(seqs[0], 5001))  # the newest part, contiguous, up to the last line
    assert seqs[0] > 1


def test_malformed_records_are_skipped_with_an_event_and_the_model_goes_on():
    """Wrong shapes from a newer agent, a bug or a hostile peer: each record
    is skipped with an error event; records after it still apply and a
    snapshot can still be built."""
    m = Model()
    m.feed(1, {"type": "hello", "t": 1.0, "pid": 1, "argv": ["x"], "interval_s": 0.1})
    bad = [
        {"type": "sample", "t": 2.0, "devices": [1, 2]},
        {"type": "sample", "t": 2.1, "transfers": [1]},
        {"type": "sample", "t": 2.2, "process": "x"},
        {"type": "backend", "t": 2.3, "versions": "x"},
        {"type": "sample", "t": "soon"},
    ]
    for rec in bad:
        m.feed(1, rec)  # must not raise
    m.feed(1, {"type": "sample", "t": 3.0, "seq": 7, "devices": [{"id": 0, "platform": "cpu", "bytes_in_use": 64}]})
    snap = m.snapshot()
    assert snap.processes[0].seq == 7 and snap.devices[0].bytes_in_use == 64
    skipped = [e for e in snap.events if e.kind == "error" and "malformed" in e.text]
    assert skipped, [e.text for e in snap.events]


def test_a_stream_naming_thousands_of_devices_gets_a_bounded_model():
    from jaxtop.dashboard.model import MAX_DEVICES

    m = Model()
    m.feed(1, synthetic.hello(1, 2, 1000.0))
    for k in range(3):  # a hostile peer, a bug, a crafted recording: 10,000 device ids a sample
        m.feed(1, {"type": "sample", "t": 1000.1 + k, "devices": [{"id": i, "platform": "gpu", "bytes_in_use": i}
                                                                    for i in range(k * 10_000, (k + 1) * 10_000)]})
    snap = m.snapshot()
    assert len(snap.devices) == MAX_DEVICES == 64
    assert [d.bytes_in_use for d in snap.devices[:2]] == [0, 1]
    said = [e.text for e in snap.events if "devices in one process" in e.text]
    assert said == ["more than 64 devices in one process: device 64 and any later new one are not shown"]
    assert sum(h.nbytes() for h in [m.processes[1].devices[i].history for i in range(64)]) < 300 << 20


def test_the_age_of_a_scan_and_of_a_map_reaches_the_view_and_the_panels():
    """The agent scans many arrays less often (its CPU budget): the memory
    and map panels say how old their figures are, not just show them."""
    from rich.console import Console

    from jaxtop.widgets.panels import MemoryMapPanel, MemoryPanel

    model = Model(clock=lambda: 0.0)
    model.feed(1, synthetic.hello(1, 1, 1000.0))
    recs = list(synthetic.samples(1, 1, 1000.0, 80))
    for i, rec in enumerate(recs):
        live = rec["devices"][0]["live_arrays"]
        live["scanned_t"] = recs[0]["t"]  # one scan, at the start
        if i == 0:
            live.update({"map": [[4096, 64]], "map_complete": True, "top": [], "map_t": recs[0]["t"]})
        else:
            live.pop("map", None)
        model.feed(1, rec)
    dev = model.snapshot(selected=0, window_s=60.0, now=recs[-1]["t"]).device
    span = recs[-1]["t"] - recs[0]["t"]
    assert dev.live_age_s == span and dev.map_age_s == span and dev.buffer_map == ((4096, 64),)
    snap = model.snapshot(selected=0, window_s=60.0, now=recs[-1]["t"])

    def text(panel):
        console = Console(width=100, record=True)
        console.print(panel.draw(snap, 100, 10))
        return console.export_text()

    assert span >= 5
    assert f"as of {int(span)}s ago" in text(MemoryPanel()) and f"{int(span)}s ago" in text(MemoryMapPanel())


# -- typed views: what the widgets read ---------------------------------------------

def test_views_carry_none_and_the_reason_for_what_was_not_measured():
    """A recorded-looking stream with figures missing or unavailable: every
    view says None (never 0) and, where the agent said why, the reason."""
    model = Model(clock=lambda: 0.0)
    model.feed(1, {"type": "hello", "t": 10.0, "pid": 1, "argv": ["train.py"], "interval_s": 0.1,
                   "versions": {"jax": "0.4.30"},
                   "nvml": {"available": True, "devices": [{"index": 0, "name": "H100", "uuid": "u", "jax_id": 0}]},
                   "transfer_capture": {"available": False, "reason": "transfer guard unavailable in this jax"}})
    model.feed(1, {"type": "sample", "t": 10.1, "seq": 1, "devices": [
        {"id": 0, "platform": "gpu", "source": "memory_stats", "bytes_in_use": 100, "pool_bytes": 200,
         "fragmentation": None, "fragmentation_reason": "cuda_async reports no pool",
         "live_arrays": {"bytes": 90, "count": 2, "map": [[4096, 90]],
                         "top": [{"nbytes": 90, "dtype": "float32", "shape": [3, 30], "ptr": 4096}]}}],
        "process": {"available": False, "reason": "psutil: access denied"},
        "donation": {"failed": 0, "failed_total": 2},  # no last_message
        "nvml": {"available": True, "t": 10.05, "devices": [
            {"index": 0, "memory_used_bytes": 300, "memory_total_bytes": 1000, "gpu_util_percent": None,
             "process_memory_bytes": None, "process_memory_reason": "pid namespace: the driver sees other pids"}]}})
    model.feed(1, {"type": "reply", "t": 10.2, "ok": True, "result": {"path": "/tmp/p.prof", "top_sites": [
        {"site": "f (a.py:1)", "bytes": 10}]}})
    model.feed(1, {"type": "oom_census", "t": 10.3, "id": "1-1", "pid": 1, "argv": ["train.py"],
                   "devices": [{"id": 0, "platform": "gpu", "bytes_in_use": 100, "failed": True}],
                   "skipped": [{"part": "sites"}]})
    snap = model.snapshot(replay={"playing": True, "speed": 1.0, "t": 10.1, "t_start": 10.0, "t_end": None,
                                  "indexing": [1, 4], "index_error": None, "pending_seek": None})
    proc, dev = snap.processes[0], snap.device

    host = proc.process
    assert host.available is False and host.na_reason == "psutil: access denied"
    assert host.rss_bytes is None and host.cpu_percent is None and host.threads is None
    assert (proc.compile.count_total, proc.compile.seconds_total, proc.compile.cache_hits_total) == (None, None, None)
    assert proc.donation.failed_total == 2 and proc.donation.last_message is None
    assert proc.capture.available is False and proc.capture.na_reason == "transfer guard unavailable in this jax"
    assert proc.nvml_status.available is True and proc.nvml_status.na_reason is None
    # The sample had no transfers: every direction's figures are None, not 0.
    assert set(proc.transfers) == {"h2d", "d2h", "d2d"} and proc.top_shapes == ()
    assert all(v == TransferView() for v in proc.transfers.values())
    assert proc.jax_version == "0.4.30"
    assert proc.last_profile.path == "/tmp/p.prof" and proc.last_profile.error is None
    assert proc.last_profile.top_sites[0].bytes == 10 and proc.last_profile.top_sites[0].allocations is None

    gpu = dev.nvml
    assert gpu.memory_used_bytes == 300 and gpu.gpu_util_percent is None and gpu.temperature_c is None
    assert gpu.process_memory_bytes is None and gpu.process_memory_reason.startswith("pid namespace")
    assert proc.nvml.t == 10.05 and proc.nvml.gpus == (gpu,)
    assert dev.fragmentation is None and dev.fragmentation_reason == "cuda_async reports no pool"
    assert dev.num_allocs is None and dev.allocs_per_s is None and dev.allocs_reason == "allocator reports no num_allocs"
    buf = dev.top_buffers[0]
    assert (buf.nbytes, buf.dtype, buf.shape, buf.ptr) == (90, "float32", "[3, 30]", 4096)

    census = proc.oom_censuses[0]
    assert census.arrays is None and census.sites == () and census.skipped_parts == ("sites",)
    assert census.host is None and census.verdict is None and census.message is None
    d = census.devices[0]
    assert d.label == "gpu:0" and d.failed and d.bytes_in_use == 100 and d.pool_bytes is None and d.fragmentation is None
    assert snap.replay.indexing == (1, 4) and snap.replay.t_end is None and snap.replay.playing

    # A CPU process whose hello says NVML is unavailable, with a sample that
    # lacks most objects: the reasons reach the views, the figures stay None.
    model.feed(2, {"type": "hello", "t": 10.0, "pid": 2, "argv": ["x.py"], "interval_s": 0.1,
                   "nvml": {"available": False, "reason": "NVML unavailable: NVMLError_LibraryNotFound"}})
    model.feed(2, {"type": "sample", "t": 10.1, "seq": 1, "process": {"rss_bytes": 4096},
                   "devices": [{"id": 0, "platform": "cpu", "source": "live_arrays", "bytes_in_use": 0}]})
    cpu = next(p for p in model.snapshot().processes if p.pid == 2)
    assert cpu.nvml_status.available is False and cpu.nvml_status.na_reason.startswith("NVML unavailable")
    assert cpu.nvml is None and cpu.capture.available is None and cpu.jax_version is None
    assert cpu.process.available and cpu.process.rss_bytes == 4096 and cpu.process.vms_bytes is None
    assert cpu.process.peak_rss_bytes is None and cpu.donation.failed_total is None
    cpu_dev = next(d for d in model.snapshot().devices if d.pid == 2)
    assert cpu_dev.nvml is None and cpu_dev.bytes_in_use == 0 and cpu_dev.pool_bytes is None


def test_views_are_read_by_attribute_only():
    """The views are typed: a wire key name (``["rss_bytes"]``) does not
    answer, so nothing reads the sample's layout through them."""
    model = Model()
    _feed_synthetic(model, count=3)
    proc = model.snapshot().processes[0]
    assert proc.process.rss_bytes > 0 and proc.transfers["h2d"].count_total >= 0
    with pytest.raises(TypeError):
        proc.process["rss_bytes"]
    with pytest.raises(TypeError):
        proc.transfers["h2d"]["count_total"]


# -- widgets read no wire keys --------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
#: Parts of docs/protocol.md that list the fields of the agent's records:
#: hello, backend and sample (to the dropped record), and the OOM census,
#: holders and jit ledger sections at its end.
PROTOCOL_SECTIONS = (("## Records from the agent", "### `dropped`"), ("## OOM census", None))
#: ``live_arrays.unmapped``'s kinds: the memory map renderable takes the
#: counts as that dict (``DeviceView.unmapped``), and so reads its keys.
UNMAPPED_KEYS = frozenset({"not_ready", "sharded", "last_address"})


def _wire_keys() -> set[str]:
    """Every name in backticks in the record sections of docs/protocol.md."""
    text = (ROOT / "docs" / "protocol.md").read_text()
    keys: set[str] = set()
    for start, end in PROTOCOL_SECTIONS:
        part = text[text.index(start):text.index(end) if end else len(text)]
        for span in re.findall(r"`([^`]+)`", part):
            keys.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span))
    return keys


def _key_reads(source: str) -> list[tuple[int, str]]:
    """``(line, key)`` of each ``x["key"]`` and ``x.get("key", …)`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant)):
            key = node.args[0].value
        if isinstance(key, str):
            found.append((node.lineno, key))
    return found


def _ui_sources() -> list[Path]:
    """The widgets (every module, a split render package included), the app and its screens."""
    dashboard = ROOT / "jaxtop" / "dashboard"
    return sorted((ROOT / "widgets").rglob("*.py")) + [dashboard / "app.py"] + sorted(dashboard.glob("*_screen.py"))


def test_the_wire_key_list_comes_from_the_protocol_document():
    keys = _wire_keys()
    assert {"rss_bytes", "vms_bytes", "cpu_percent", "threads", "count_total", "seconds_total", "cache_hits_total",
            "failed_total", "last_message", "memory_used_bytes", "gpu_util_percent", "process_memory_reason",
            "available", "reason", "bytes_known_total", "top_shapes", "nbytes", "verdict", "groups_total"} <= keys


def test_widgets_read_no_wire_keys():
    keys = _wire_keys()
    bad = []
    for path in _ui_sources():
        source = path.read_text()
        # The memory map renderable reads the unmapped counts' kinds.
        allowed = UNMAPPED_KEYS if "class MemoryMap(" in source else set()
        for line, key in _key_reads(source):
            if key in keys and key not in allowed:
                bad.append(f"{path.relative_to(ROOT)}:{line} reads the wire key {key!r}")
    assert not bad, "\n".join(bad)


def test_the_wire_key_scan_catches_a_subscript_and_a_get():
    source = 'def f(p, g):\n    return p.process["rss_bytes"], g.get("gpu_util_percent", "n/a"), p.get(k), p[0]\n'
    assert [key for _, key in _key_reads(source)] in (["rss_bytes", "gpu_util_percent"], ["gpu_util_percent", "rss_bytes"])


def test_transfer_rates_are_read_over_seconds_not_one_sample():
    """The relay passes guard lines on in batches about as often as the agent
    samples: a steady 1,000 transfers/s reaches the samples as 0, 200, 0,
    200... The panel's rate is the window's (as the per-line rates are), not
    0/s or 2,000/s by the phase of the last sample; the timeline keeps each
    sample's own."""
    model = Model()
    model.feed(5, {"type": "hello", "t": 100.0, "pid": 5, "argv": ["x.py"], "interval_s": 0.1})
    total, seen = 0, []
    for k in range(1, 41):
        count = 200 if k % 2 == 0 else 0
        total += count
        model.feed(5, {"type": "sample", "t": 100.0 + 0.1 * k, "seq": k, "transfers": {
            "h2d": {"count": count, "bytes_known": 4 * count, "count_total": total, "bytes_known_total": 4 * total}}})
        seen.append(model.snapshot().processes[0].transfers["h2d"])
    assert [round(v.count_per_s) for v in seen[20:]] == [1000] * 20
    assert [round(v.bytes_known_per_s) for v in seen[20:]] == [4000] * 20
    assert seen[-1].count_total == 4000
    # The first sample has nothing before it: its own interval's rate; then
    # the growth since the first, until the window is full.
    assert seen[0].count_per_s == 0.0 and round(seen[1].count_per_s) == 2000 and round(seen[2].count_per_s) == 1000
    # A counter that started over (another agent in the process) is not a
    # negative rate: that sample's own, then the window from there.
    for k, total in ((42, 5), (43, 25)):
        model.feed(5, {"type": "sample", "t": 100.0 + 0.1 * k, "seq": k, "transfers": {
            "h2d": {"count": total - 5 * (k == 43), "bytes_known": 0, "count_total": total, "bytes_known_total": 0}}})
        seen.append(model.snapshot().processes[0].transfers["h2d"])
    assert [round(v.count_per_s) for v in seen[-2:]] == [25, 200]


def test_a_stretched_agent_is_not_called_stale_and_a_lying_one_is_not_believed():
    from jaxtop.dashboard.views import LIVE, STALE

    clock = [0.0]
    model = Model(clock=lambda: clock[0])
    model.feed(5, {"type": "hello", "t": 100.0, "pid": 5, "argv": ["x.py"], "interval_s": 0.1})
    for tick, after, state in ((0.2, 0.5, LIVE), (0.1, 0.5, STALE), (1e6, 3.5, STALE), (float("nan"), 0.5, STALE),
                               (-1.0, 0.5, STALE), ("0.2", 0.5, STALE)):
        clock[0] = 0.0
        model.feed(5, {"type": "sample", "t": 101.0, "seq": 1, "agent": {"tick_s": tick}})
        clock[0] = after  # seconds since the last sample came
        model.refresh_states()
        assert model.snapshot().processes[0].state == state, (tick, after)


def test_the_rate_window_stays_bounded_on_a_clock_that_creeps_by_nanoseconds():
    from jaxtop.dashboard.counter_window import KEPT_MAX, CounterWindow

    window = CounterWindow()
    for k in range(20_000):
        rates = window.add(1000.0 + k * 1e-9, [k, None])
    assert len(window._kept) == KEPT_MAX
    assert rates[0] == pytest.approx(1e9, rel=1e-3) and rates[1] is None  # one a nanosecond, over the samples kept
