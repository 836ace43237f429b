"""The agent's history at two resolutions, sent after the present.

An agent keeps its samples of the last ``backfill_s`` (the fine level) and,
per 10 s bucket over the last day, the min and max of every timeline series
(the coarse level). A client that connects gets hello, the present (the
newest sample with the last buffer map and sparse fields), the coarse
history, the fine history as ``backfill`` records, then ``history_end``.
These tests check that the coarse level stays small for a day at 10 Hz,
that a dashboard fed that greeting shows what one fed every sample shows,
and that a recording of it stays a time-ordered stream that replays and
exports.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest

from jaxtop.wire import client, protocol
from jaxtop.testing import synthetic
from jaxtop.agent.clients import Client
from jaxtop.agent.history import Backfill, Coarse, Present
from jaxtop.dashboard.model import DEVICE_SERIES, PROCESS_SERIES, Model
from jaxtop.dashboard.sources.live import ingest
from jaxtop.wire.records import decode, kind_of

PID = 11
T0 = 1_000_000.0


def agent_history(n_devices: int, count: int, interval_s: float, backfill_s: float, map_every: int = 10,
                  extra=None) -> tuple[dict, list[dict], Backfill]:
    """An agent's Backfill after ``count`` samples, fed as the agent feeds it."""
    hello = synthetic.hello(PID, n_devices, T0, interval_s)
    records = list(synthetic.samples(PID, n_devices, T0, count, interval_s, map_every=map_every))
    if extra:
        extra(records)
    backfill = Backfill()
    backfill.note_hello(hello)
    for rec in records:
        backfill.add(rec, protocol.encode(rec))
        backfill.trim(rec["t"] - backfill_s)
    return hello, records, backfill


def sent(backfill: Backfill, hello: dict, backfill_s: float) -> list[bytes]:
    """The lines a client that connects now is sent, through a real socket
    and the agent's own Client queue (coarse records expanded one at a
    time, the fine range retyped as it goes)."""
    hello = dict(hello, history=backfill.describe(backfill_s))
    greeting = backfill.greeting(protocol.encode(hello), backfill.present.record["t"] - backfill_s)
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    theirs.setblocking(False)
    queue = Client(ours, 1, time.monotonic())
    for line in greeting.head:
        queue.queue(line, droppable=False)
    queue.queue_coarse(greeting.coarse)
    queue.queue_backfill(greeting.first, greeting.last, retype=True)
    for line in greeting.tail:
        queue.queue(line, droppable=False)
    data = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = theirs.recv(1 << 20)
            except BlockingIOError:
                return
            if not chunk:
                return
            data.extend(chunk)

    while queue.has_output:
        assert queue.flush(backfill)
        drain()
    drain()
    ours.close()
    theirs.close()
    return [line + b"\n" for line in bytes(data).split(b"\n")[:-1]]


def fed(lines: list[bytes], batch: int = 90) -> Model:
    model = Model(clock=lambda: 0.0)
    for i in range(0, len(lines), batch):
        ingest(model, PID, lines[i:i + batch])
    return model


# -- the coarse level ------------------------------------------------------------------------------


def test_a_day_at_10_hz_keeps_the_coarse_level_small_and_bounded():
    """864,000 samples (an hour of distinct samples, played 25 times over,
    one hour later each time): the coarse level holds one day of 10 s
    buckets, well under a MB for one device, and no more after 25 h."""
    hour = list(synthetic.samples(PID, 1, T0, 36_000, 0.1, map_every=10**9))
    coarse = Coarse()
    sizes = []
    for h in range(25):
        shift = h * 3600.0
        for rec in hour:
            coarse.add(dict(rec, t=rec["t"] + shift))
        sizes.append(coarse.nbytes())
    day = 24 * 3600 // 10
    assert day <= len(coarse) <= day + 2 * coarse.chunk_rows
    assert sizes[23] < 1 << 20, f"{sizes[23]} bytes for a day of one device"
    assert sizes[24] <= sizes[23] * 1.05  # bounded: the oldest hour went
    oldest = json.loads(zlib.decompress(coarse.entries()[-1][1]))
    newest_t = T0 + 25 * 3600
    assert oldest["rows"][0][0] >= newest_t - 24 * 3600 - 600


def test_a_bucket_holds_the_extremes_and_the_sums_of_its_samples():
    records = list(synthetic.samples(PID, 2, T0, 300, 0.1, map_every=10**9))
    coarse = Coarse(step_s=10.0)
    for rec in records:
        coarse.add(rec)
    [(compressed, line)] = coarse.entries()
    assert not compressed
    rec = json.loads(line)
    assert rec["type"] == protocol.HISTORY and rec["level_s"] == 10.0
    assert rec["process_columns"] == list(PROCESS_SERIES) and rec["device_columns"] == list(DEVICE_SERIES)
    row = rec["rows"][1]  # [T0 + 10, T0 + 20): samples 100..199 (t = T0 + 0.1 * (k + 1))
    t, n, plo, phi, devices, sums = row
    inside = [r for r in records if t <= r["t"] < t + 10.0]
    assert n == len(inside) == 100
    in_use = [r["devices"][1]["bytes_in_use"] for r in inside]
    dev1 = next(d for d in devices if d[0] == 1)
    col = DEVICE_SERIES.index("bytes_in_use")
    assert (dev1[1][col], dev1[2][col]) == (min(in_use), max(in_use))
    assert sums[0] == sum(r["transfers"]["h2d"]["count"] for r in inside)
    rss = PROCESS_SERIES.index("rss_bytes")
    assert plo[rss] == phi[rss] == inside[0]["process"]["rss_bytes"]


# -- the present ---------------------------------------------------------------------------------------


def test_the_present_carries_the_last_map_and_sparse_fields():
    """The newest sample has no map (maps come with scans, soon only when
    they change) nor holders; the present fills in the last of each, and the
    jit table is the last whole one with the changes since applied."""
    present = Present()
    records = list(synthetic.samples(PID, 2, T0, 30, 0.1, map_every=10))
    records[0]["holders"] = {"seq": 1, "sites": []}
    records[1]["jit"] = {"full": True, "t": T0, "live_count": 1, "functions": [{"name": "f", "compiles": 1}],
                         "executables": [{"id": 1, "name": "f"}], "executables_reason": "n/a"}
    records[5]["jit"] = {"full": False, "t": T0 + 1, "live_count": 2, "functions": [{"name": "g", "compiles": 1}],
                         "executables": [{"id": 2, "name": "g"}], "gone": [1]}
    for rec in records:
        present.add(rec)
    out = json.loads(present.line())
    assert out["present"] is True and out["seq"] == 30 and out["type"] == protocol.SAMPLE
    last_map = next(r for r in reversed(records) if "map" in r["devices"][0]["live_arrays"])
    for dev, want in zip(out["devices"], last_map["devices"]):
        assert dev["live_arrays"]["map"] == want["live_arrays"]["map"]
        assert dev["live_arrays"]["top"] == want["live_arrays"]["top"]
        assert dev["bytes_in_use"] == records[-1]["devices"][dev["id"]]["bytes_in_use"]  # the rest is the newest's
    assert out["holders"] == {"seq": 1, "sites": []}
    jit = out["jit"]
    assert jit["full"] is True and jit["live_count"] == 2 and "executables_reason" not in jit
    assert sorted(f["name"] for f in jit["functions"]) == ["f", "g"]
    assert [e["id"] for e in jit["executables"]] == [2]
    assert "events" not in out or out["events"] == records[-1].get("events")


# -- attaching: present first, then the history -----------------------------------------------------------


@pytest.fixture(scope="module")
def three_hours():
    """3 h at 1 Hz with a 10-minute fine level: the reference model gets
    every sample; the attached one what an agent sends on connecting."""
    hello, records, backfill = agent_history(2, 3 * 3600, 1.0, 600.0)
    lines = sent(backfill, hello, 600.0)
    reference = Model(clock=lambda: 0.0)
    reference.feed_many(PID, [dict(hello, history=backfill.describe(600.0))] + records)
    return hello, records, backfill, lines, reference


def test_the_greeting_is_hello_present_coarse_fine_end(three_hours):
    hello, records, backfill, lines, _ = three_hours
    recs = [protocol.decode(line) for line in lines]
    kinds = [r["type"] for r in recs]
    assert kinds[0] == protocol.HELLO and recs[0]["history"]["present_first"] is True
    assert kinds[1] == protocol.SAMPLE and recs[1]["present"] is True and recs[1]["seq"] == records[-1]["seq"]
    coarse = [r for r in recs if r["type"] == protocol.HISTORY]
    fine = [r for r in recs if r["type"] == protocol.BACKFILL]
    assert kinds == ["hello", "sample"] + ["history"] * len(coarse) + ["backfill"] * len(fine) + ["history_end"]
    # The coarse records come newest first, each in time order; together a bucket per 10 s of the run.
    firsts = [r["rows"][0][0] for r in coarse]
    assert firsts == sorted(firsts, reverse=True)
    buckets = [row[0] for r in coarse for row in r["rows"]]
    assert sorted(buckets) == [T0 + 10 * k for k in range(len(buckets))] and len(buckets) == 3 * 360 + 1
    # The fine level: the samples of the last 10 minutes, in order, as they were taken.
    assert [r["seq"] for r in fine] == [r["seq"] for r in records if r["t"] >= records[-1]["t"] - 600.0]
    assert fine[-1]["seq"] == recs[1]["seq"]


def test_an_attached_dashboard_shows_what_every_sample_shows(three_hours):
    hello, records, backfill, lines, reference = three_hours
    attached = fed(lines)
    end = records[-1]["t"]
    a, b = reference.snapshot(window_s=None, now=end), attached.snapshot(window_s=None, now=end)
    # The whole run: the 10 s level, from the agent's coarse buckets, as the reference built it.
    for va, vb in [(a.processes[0].history, b.processes[0].history)] + [
            (da.timeline, db.timeline) for da, db in zip(a.devices, b.devices)]:
        assert va.bucket_s == vb.bucket_s == 10.0
        assert np.array_equal(va.t, vb.t)
        assert np.allclose(va.lo, vb.lo, rtol=1e-6, equal_nan=True)
        assert np.allclose(va.hi, vb.hi, rtol=1e-6, equal_nan=True)
    assert a.processes[0].span == b.processes[0].span
    # The last minute: raw samples, the same rows (allocations/s of the
    # present has no sample before it on the live path).
    a, b = reference.snapshot(window_s=60.0, now=end), attached.snapshot(window_s=60.0, now=end)
    for da, db in zip(a.devices, b.devices):
        assert da.timeline.bucket_s == db.timeline.bucket_s == 0.0
        assert np.array_equal(da.timeline.t, db.timeline.t)
        keep = [i for i, name in enumerate(DEVICE_SERIES) if name != "allocs_per_s"]
        assert np.allclose(da.timeline.hi[:, keep], db.timeline.hi[:, keep], rtol=1e-6, equal_nan=True)
    assert np.allclose(a.processes[0].history.hi, b.processes[0].history.hi, rtol=1e-6, equal_nan=True)
    # The panels: the present, its map, its totals (counted once).
    pa, pb = a.processes[0], b.processes[0]
    assert pa.seq == pb.seq == records[-1]["seq"]
    assert {d: v.count_total for d, v in pa.transfers.items()} == {d: v.count_total for d, v in pb.transfers.items()}
    for da, db in zip(a.devices, b.devices):
        assert da.buffer_map and da.buffer_map == db.buffer_map and da.top_buffers == db.top_buffers
        assert da.bytes_in_use == db.bytes_in_use
    # Events of the fine history, each once, in time order.
    recent = [e for e in a.events if e.t >= end - 600.0 and e.kind == "compile"]
    assert [(e.t, e.text) for e in b.events if e.kind == "compile"] == [(e.t, e.text) for e in recent]
    assert attached.loading(now=end) is None


def test_the_present_shows_before_the_history_and_coarse_before_fine(three_hours):
    hello, records, backfill, lines, _ = three_hours
    kinds = [kind_of(decode(line)) for line in lines]
    first_fine = kinds.index(protocol.BACKFILL)
    model = Model(clock=lambda: 0.0)
    ingest(model, PID, lines[:2])  # hello and the present
    end = records[-1]["t"]
    snap = model.snapshot(window_s=None, now=end)
    assert snap.processes[0].seq == records[-1]["seq"] and snap.devices[0].buffer_map
    assert model.loading(now=end) is not None  # its history is still to come
    milestone = model.milestone
    ingest(model, PID, lines[2:first_fine + 1])  # the coarse history, and the first fine record
    assert model.milestone > milestone  # a frame goes out now
    snap = model.snapshot(window_s=None, now=end)
    assert snap.processes[0].span[0] == T0 and snap.processes[0].history.bucket_s == 10.0
    assert snap.processes[0].seq == records[-1]["seq"]  # history never replaces the present
    ingest(model, PID, lines[first_fine + 1:])
    assert model.loading(now=end) is None


def test_connecting_again_adds_nothing_twice(three_hours):
    hello, records, backfill, lines, _ = three_hours
    once = fed(lines)
    twice = fed(lines + lines)
    end = records[-1]["t"]
    for window in (None, 60.0, 600.0):
        a, b = once.snapshot(window_s=window, now=end), twice.snapshot(window_s=window, now=end)
        assert np.array_equal(a.processes[0].history.t, b.processes[0].history.t)
        assert np.allclose(a.processes[0].history.hi, b.processes[0].history.hi, equal_nan=True)
    assert once.snapshot().events == twice.snapshot().events
    raw = twice.processes[PID].history.window(60.0).t
    assert np.all(np.diff(raw) > 0)


# -- recordings ---------------------------------------------------------------------------------------------


def test_a_recording_of_the_greeting_is_time_ordered_and_replays(three_hours, tmp_path):
    hello, records, backfill, lines, _ = three_hours
    live = [protocol.encode(dict(records[-1], seq=records[-1]["seq"] + k, t=records[-1]["t"] + k)) for k in (1, 2)]
    order = client.RecordingOrder()
    written = [out for line in lines + live for out in order.feed(line)] + order.flush()
    recs = [json.loads(line) for line in written]
    assert [r["type"] for r in recs] == ["hello"] + ["sample"] * (len(recs) - 1)
    ts = [r["t"] for r in recs[1:]]
    assert ts == sorted(ts)
    seqs = [r["seq"] for r in recs[1:]]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # no sample twice, none missing
    present = [r for r in recs if r.get("present")]
    assert len(present) == 1 and present[0]["seq"] == records[-1]["seq"]
    assert present[0]["devices"][0]["live_arrays"].get("map")  # the recording keeps the newest map
    path = tmp_path / "rec.jsonl"
    path.write_bytes(b"".join(written))
    res = subprocess.run([sys.executable, "-m", "jaxtop", "export", str(path), "--format", "csv", "-o", "-"],
                         capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = res.stdout.decode().splitlines()
    assert len(rows) == 1 + 2 * len(seqs)  # a header, a row per sample and device

    from jaxtop.dashboard.sources import ReplaySource
    src = ReplaySource(str(path), start_playing=False)
    try:
        src.start(Model(), lambda: None)
        src.seek_fraction(1.0)
        deadline = time.monotonic() + 20
        while src.model.snapshot().processes[0].seq != seqs[-1] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert src.model.snapshot().processes[0].seq == seqs[-1]
    finally:
        src.stop()


@pytest.mark.parametrize("read", [1, 7, 90])
def test_a_recording_fed_a_read_at_a_time_is_the_one_fed_a_line_at_a_time(three_hours, read):
    """What the live source spools (RecordingOrder.feed_many, a read of
    lines at a time) is what feeding each line makes, whatever the reads'
    sizes: a hello inside a read, the greeting's present and history."""
    hello, records, backfill, lines, _ = three_hours
    live = [protocol.encode(dict(records[-1], seq=records[-1]["seq"] + k, t=records[-1]["t"] + k)) for k in (1, 2)]
    stream = lines + live + lines  # a second connection: its hello again
    one = client.RecordingOrder()
    want = [out for line in stream for out in one.feed(line)] + one.flush()
    many = client.RecordingOrder()
    got = [out for i in range(0, len(stream), read) for out in many.feed_many(stream[i:i + read])] + many.flush()
    assert got == want


def test_an_older_agents_stream_is_recorded_unchanged():
    lines = [protocol.encode(synthetic.hello(PID, 1, T0))]
    lines += [protocol.encode(r) for r in synthetic.samples(PID, 1, T0, 5)]
    order = client.RecordingOrder()
    assert [out for line in lines for out in order.feed(line)] + order.flush() == lines


# -- the dashboard app ---------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_first_complete_frame_does_not_wait_for_the_redraw_period():
    """Present and coarse history in: that frame goes out at once, not at
    the end of a 10 s redraw period, and well before the fine history."""
    from jaxtop.dashboard.app import JaxtopApp
    from jaxtop.dashboard.sources import PushSource

    now = time.time()
    hello, records, backfill = agent_history(2, 2 * 3600, 1.0, 600.0)
    shift = now - records[-1]["t"]
    lines = sent(backfill, hello, 600.0)
    recs = [protocol.decode(line) for line in lines]
    for r in recs:  # dated to end now
        if isinstance(r.get("t"), float):
            r["t"] += shift
        for row in r.get("rows") or ():
            row[0] += shift
    first_fine = [r["type"] for r in recs].index(protocol.BACKFILL)
    source = PushSource(pids=[PID])
    app = JaxtopApp(source, refresh_s=10.0)
    async with app.run_test(size=(120, 40)) as pilot:
        app.model.feed_many(PID, recs[:1])
        source.on_update()
        await pilot.pause(0.3)  # the hello's frame is out: the pump now waits its redraw period
        start = time.monotonic()
        app.model.feed_many(PID, recs[1:first_fine + 1])
        source.on_update()
        while time.monotonic() - start < 8.0:
            snap = app.snapshot
            if snap is not None and snap.processes and len(snap.processes[0].history.t) > 30:
                break  # the 10-minute window drawn from the coarse history
            await pilot.pause(0.02)
        assert app.snapshot.processes[0].seq == records[-1]["seq"]
        assert app.snapshot.processes[0].history.bucket_s == 10.0
        assert time.monotonic() - start < 5.0  # not the 10 s redraw period
        assert app.query_one("#loading").display  # the fine history is still to come
        live = dict(records[-1], seq=records[-1]["seq"] + 1, t=time.time())  # the stream goes on, current
        app.model.feed_many(PID, recs[first_fine + 1:] + [live])
        source.on_update()
        deadline = time.monotonic() + 5
        while app.query_one("#loading").display and time.monotonic() < deadline:
            await pilot.pause(0.05)
        assert not app.query_one("#loading").display


def test_history_merged_in_any_order_equals_history_fed_in_order():
    """Older rows merged behind newer ones (and some twice) give the same
    levels as every row appended in order."""
    from jaxtop.dashboard.history import History

    rng = np.random.default_rng(0)
    t = T0 + np.cumsum(rng.uniform(0.05, 0.15, 20_000))
    rows = rng.normal(size=(len(t), 3)).astype(np.float32)
    rows[rng.random(rows.shape) < 0.05] = np.nan
    levels = ((0.0, 3000), (1.0, 1200), (10.0, 500), (60.0, 100))
    whole = History(("a", "b", "c"), levels)
    whole.extend(t, rows)
    merged = History(("a", "b", "c"), levels)
    merged.extend(t[15_000:], rows[15_000:])  # the present and what came after it
    for part in (slice(10_000, 15_000), slice(0, 10_000), slice(12_000, 15_000)):  # newest part first, then a repeat
        older = History(("a", "b", "c"), levels)
        older.extend(t[part], rows[part])
        merged.merge(older)
    for window in (None, 60.0, 600.0, 3600.0):
        a, b = whole.window(window), merged.window(window)
        assert a.bucket_s == b.bucket_s
        assert np.array_equal(a.t, b.t)
        assert np.array_equal(a.lo, b.lo, equal_nan=True) and np.array_equal(a.hi, b.hi, equal_nan=True)


# -- a real agent ---------------------------------------------------------------------------------------------

AGENT = r"""
import sys, time
import jaxtop
h = jaxtop.instrument(capture_stderr=False, nvml=False, interval_s=0.02, backfill_s=1.0)
h.agent.register_sample_field("note", lambda: {"once": True} if h.agent._seq == 3 else None)
print("socket", h.socket_path, flush=True)
sys.stdin.readline()
h.stop()
"""


def test_a_real_agent_sends_the_present_then_its_history_and_log_records_it_in_order(child_env, tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    proc = subprocess.Popen([sys.executable, str(script)], env=child_env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline().startswith(b"socket ")
        time.sleep(2.5)  # 2.5 s of samples: 1 s kept whole, every one in the coarse level
        with client.AgentConnection.open(proc.pid) as conn:
            recs = []
            for line in conn.lines(poll_s=0.5):
                recs.append(json.loads(line))
                if recs[-1]["type"] == protocol.SAMPLE and not recs[-1].get("present") and len(recs) > 3:
                    break
        kinds = [r["type"] for r in recs]
        assert kinds[0] == protocol.HELLO and recs[0]["history"]["present_first"] is True
        present = recs[1]
        assert present["type"] == protocol.SAMPLE and present["present"] is True
        assert present["note"] == {"once": True}  # a sparse field from sample 3, long gone from the fine level
        end = kinds.index(protocol.HISTORY_END)
        assert set(kinds[2:end]) == {protocol.HISTORY, protocol.BACKFILL}
        fine = [r for r in recs[2:end] if r["type"] == protocol.BACKFILL]
        assert fine[-1]["seq"] == present["seq"] and fine[-1]["t"] - fine[0]["t"] <= 1.0
        rows = [row for r in recs[2:end] if r["type"] == protocol.HISTORY for row in r["rows"]]
        assert sum(row[1] for row in rows) >= present["seq"] - 1  # every sample taken is in a bucket
        assert recs[end + 1]["type"] == protocol.SAMPLE and recs[end + 1]["seq"] > present["seq"]

        out = tmp_path / "log.jsonl"
        res = subprocess.run([sys.executable, "-m", "jaxtop", "log", str(proc.pid), "-o", str(out), "--duration", "1"],
                             env=child_env, capture_output=True, timeout=60)
        assert res.returncode == 0, res.stderr
        logged = [json.loads(line) for line in out.read_bytes().splitlines()]
        assert logged[0]["type"] == protocol.HELLO
        samples = [r for r in logged[1:] if r["type"] == protocol.SAMPLE]
        assert len(samples) == len(logged) - 1  # no history records, no history_end
        seqs = [r["seq"] for r in samples]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        assert sum(1 for r in samples if r.get("present")) == 1
    finally:
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        proc.communicate(timeout=30)
