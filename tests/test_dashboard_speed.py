"""Speed guards for the dashboard: ingesting a backlog never blocks the UI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from textual import events

from jaxtop.wire import protocol
from jaxtop.testing import synthetic
from jaxtop.dashboard.app import INPUT_YIELD_S, JaxtopApp
from jaxtop.dashboard.keytiming import KeyNotAnswered, type_keys
from jaxtop.dashboard.model import Model
from jaxtop.dashboard.sources import PushSource
from jaxtop.dashboard.sources.live import STEP_ASIDE_LINES, ingest
from jaxtop.wire.records import decode

SIZE = (120, 40)
BACKFILL = 6000  # an agent's 10-minute backfill at 10 Hz


@pytest.mark.parametrize("gaps", [False, True])
def test_feed_many_equals_feed(gaps):
    """A backlog fed in batches gives the same snapshot as record by record:
    also where a device is missing from some samples, so that the
    histories of one batch have different sample times (a batch plans the
    buckets once for the histories whose times are the same)."""
    recs = [synthetic.hello(1, 2, 1000.0)] + list(synthetic.samples(1, 2, 1000.0, 700, map_every=7))
    if gaps:
        for k, r in enumerate(recs[1:]):
            # As many skipped by each device, at other times: same counts, other times.
            if k % 8 == 2:
                r["devices"] = r["devices"][:1]  # device 1 skips a sample
            elif k % 8 == 5:
                r["devices"] = r["devices"][1:]  # device 0 skips one
    one, many = Model(clock=lambda: 5.0), Model(clock=lambda: 5.0)
    for r in recs:
        one.feed(1, r)
    for i in range(0, len(recs), 64):
        many.feed_many(1, recs[i:i + 64])
    a, b = one.snapshot(now=2000.0, window_s=None), many.snapshot(now=2000.0, window_s=None)
    for da, db in zip(a.devices, b.devices):
        assert da.buffer_map == db.buffer_map and da.top_buffers == db.top_buffers
        assert (da.timeline.t == db.timeline.t).all()
        assert np.array_equal(da.timeline.lo, db.timeline.lo, equal_nan=True)
        assert np.array_equal(da.timeline.hi, db.timeline.hi, equal_nan=True)
    assert a.processes[0].transfers == b.processes[0].transfers
    assert [e.text for e in a.events] == [e.text for e in b.events]


@pytest.mark.parametrize("batch", [1, 7, 64, 1000])
def test_maps_are_decoded_only_where_shown_and_a_batch_changes_nothing(batch):
    """A backfill read in batches of any size gives the model that reading
    it line by line gives: each device's newest map (maps stay undecoded
    in the records, and a batch decodes only the last one of each device)."""
    recs = [synthetic.hello(1, 3, 1000.0)] + list(synthetic.samples(1, 3, 1000.0, 700, map_every=7))
    lines = [protocol.encode(r) for r in recs]
    one, many = Model(clock=lambda: 5.0), Model(clock=lambda: 5.0)
    for line in lines:
        ingest(one, 1, [line])
    for i in range(0, len(lines), batch):
        ingest(many, 1, lines[i:i + batch])
    a, b = one.snapshot(now=2000.0, window_s=None), many.snapshot(now=2000.0, window_s=None)
    for da, db in zip(a.devices, b.devices):
        assert da.buffer_map and da.buffer_map == db.buffer_map and da.top_buffers == db.top_buffers
        assert (da.map_live_count, da.map_live_bytes, da.unmapped) == (db.map_live_count, db.map_live_bytes, db.unmapped)
        assert np.array_equal(da.timeline.hi, db.timeline.hi, equal_nan=True)


def test_a_map_that_is_not_pairs_keeps_its_pairs_and_reads_empty_otherwise():
    model = Model(clock=lambda: 5.0)
    model.feed(1, {"type": "sample", "t": 1.0, "devices": [
        {"id": 0, "platform": "cpu", "live_arrays": {"count": 2, "map": [[1, 2], "x", [3], [4, 5], [2**70, 1]]}},
        {"id": 1, "platform": "cpu", "live_arrays": {"count": 0, "map": "x"}}]})
    d0, d1 = model.snapshot(now=2.0).devices
    assert d0.buffer_map == ((1, 2), (4, 5)) and d1.buffer_map == ()


@pytest.mark.asyncio
async def test_keys_answered_while_backfill_loads():
    """A 6,000-sample backfill is decoded and fed on another thread, as the
    live source reads it; keys pressed meanwhile are answered, the screen
    drawn after each, long before the backfill is in.

    Keys are typed by ``type_keys`` on a thread, as the terminal driver's
    thread posts them, and timed to the screen drawn after each. Polling
    from the UI thread would not do (``pilot.press`` waited 0.96 s for an
    idle screen that a streaming backlog never gives, and was once taken for
    the dashboard's latency)."""
    lines = [protocol.encode(synthetic.hello(7, 8, time.time() - BACKFILL * 0.1))]
    lines += [protocol.encode(r) for r in synthetic.samples(7, 8, time.time() - BACKFILL * 0.1, BACKFILL)]
    source = PushSource(pids=[7])
    app = JaxtopApp(source)
    async with app.run_test(size=SIZE):
        loaded, done = threading.Event(), threading.Event()
        latencies: list[float] = []
        failures: list[BaseException] = []

        def reader() -> None:
            for i in range(0, len(lines), 90):  # about one 1 MiB socket read each
                ingest(app.model, 7, lines[i:i + 90])
                source.on_update()
                loaded.set()  # tab needs a device to step to
            done.set()

        def typist() -> None:
            loaded.wait(30)
            try:
                latencies.extend(type_keys(app, done, limit=20, timeout_s=5.0))
            except KeyNotAnswered as exc:
                failures.append(exc)

        threading.Thread(target=reader, daemon=True).start()
        typing = threading.Thread(target=typist, daemon=True)
        typing.start()
        while typing.is_alive():
            await asyncio.sleep(0.02)
        assert not failures, failures
        assert latencies, "the backfill went in before a key could be pressed"
        # Never blocked by ingest (blocked, a key waits for the whole backlog,
        # about 1 s here). The 100 ms target itself is timed by
        # benchmarks/tui.py (median 30 ms there): a test on a shared 2-core
        # runner beside another job can take several times as long.
        assert sorted(latencies)[len(latencies) // 2] < 0.3, latencies
        assert max(latencies) < 0.6, latencies
        for _ in range(300):
            if done.is_set():
                break
            await asyncio.sleep(0.1)
        assert app.model.processes[7].samples == BACKFILL


@pytest.mark.asyncio
async def test_a_feeding_thread_steps_aside_while_a_key_is_answered():
    """A key clears the app's idle flag until the screen has been drawn
    after it; a thread feeding the model waits on it (capped), the UI thread
    never does, and the hook goes with the app."""
    source = PushSource(pids=[7])
    app = JaxtopApp(source)
    async with app.run_test(size=SIZE) as pilot:
        push = [synthetic.hello(7, 2, 1000.0)] + list(synthetic.samples(7, 2, 1000.0, 20))
        app.model.feed_many(7, push)
        source.on_update()
        await pilot.pause()
        assert app.model.pace == app._yield_to_input and app._ui_idle.is_set()

        await app.on_event(events.Key("tab", None))  # as the driver's key arrives
        assert app.selected == 1
        assert not app._ui_idle.is_set()  # answered, not yet drawn
        began = time.monotonic()
        app.model.step_aside()  # on the UI thread: never waits
        assert time.monotonic() - began < INPUT_YIELD_S / 2
        await pilot.pause()
        assert app._ui_idle.is_set()  # drawn: feeding goes on

        app._ui_idle.clear()  # a key whose screen is never drawn: the wait is capped
        waited: list[float] = []

        def feeder() -> None:
            began = time.monotonic()
            app.model.feed_many(7, list(synthetic.samples(7, 2, 1002.0, 1)))
            waited.append(time.monotonic() - began)

        thread = threading.Thread(target=feeder)
        thread.start()
        thread.join(5)
        assert waited and INPUT_YIELD_S * 0.9 <= waited[0] < 2.0
        app._ui_idle.set()
    assert app.model.pace is None


def test_ingest_steps_aside_every_few_lines_and_keeps_errors_in_place():
    model = Model(clock=lambda: 5.0)
    calls = []
    model.pace = lambda: calls.append(1)
    lines = [protocol.encode(synthetic.hello(1, 1, 1000.0))]
    lines += [protocol.encode(r) for r in synthetic.samples(1, 1, 1000.0, 40)]
    lines.insert(20, b"{not json\n")
    lines.append(protocol.encode({"type": "exit", "t": 1004.5, "code": 0}))
    assert ingest(model, 1, lines) is True
    # feed_many steps aside at each batch (two: before and after the bad
    # line), the decoding loop every STEP_ASIDE_LINES lines.
    assert len(calls) == len(lines) // STEP_ASIDE_LINES + 2
    proc = model.processes[1]
    assert proc.samples == 40
    errors = [e for e in model.events if e.kind == "error"]
    assert len(errors) == 1 and "malformed line from agent skipped" in errors[0].text
    assert ingest(model, 1, lines[1:3]) is False


def test_tune_gc_freezes_and_raises_the_young_threshold_but_leaves_a_disabled_collector():
    code = (
        "import gc, json; from jaxtop.dashboard.collector import tune_gc, GC_GEN0; before = gc.get_threshold(); "
        "tune_gc(); tuned = gc.get_threshold(); frozen = gc.get_freeze_count(); "
        "gc.set_threshold(0); tune_gc(); "
        "print(json.dumps([before, tuned, frozen, gc.get_threshold()[0], GC_GEN0]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    before, tuned, frozen, disabled, gen0 = json.loads(out.stdout)
    assert before[0] < gen0 and tuned == [gen0, before[1], before[2]]
    assert frozen > 10_000  # the modules jaxtop's dashboard imports, no longer walked
    assert disabled == 0


def test_the_agent_never_tunes_the_collector():
    """The agent lives in the user's job: the collector is theirs."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    for path in [*(root / "jaxtop" / "agent").rglob("*.py"), *(root / "probes").rglob("*.py")]:
        text = path.read_text()
        assert "gc.freeze" not in text and "set_threshold" not in text and "tune_gc" not in text, path


def test_the_agents_backfill_keeps_only_the_newest_maps_and_shows_the_same():
    """The agent's backfill drops superseded buffer maps (the key goes): a
    dashboard fed that backfill shows the same as one fed every line, and
    the lines stay valid JSON."""
    from jaxtop.agent.history import Backfill

    recs = [synthetic.hello(1, 3, 1000.0)] + list(synthetic.samples(1, 3, 1000.0, 700, map_every=7))
    lines = [protocol.encode(r) for r in recs]
    backfill = Backfill()
    for r, line in zip(recs, lines):
        backfill.append(r["t"], line)
        backfill.trim(r["t"] - 60.0)  # a 60 s backfill: some of it trimmed on the way
    kept = backfill.lines(backfill.start, backfill.end)
    with_maps = [x for x in kept if b'"map":' in x]
    assert with_maps == [lines[max(i for i, x in enumerate(lines) if b'"map":' in x)]]  # the newest, whole
    assert sum(map(len, kept)) < 0.7 * sum(map(len, lines[-len(kept):]))
    full, lean = Model(clock=lambda: 5.0), Model(clock=lambda: 5.0)
    full.feed_many(1, [decode(x) for x in lines[:1] + lines[-len(kept):]])
    lean.feed_many(1, [decode(x) for x in lines[:1] + kept])
    a, b = full.snapshot(now=2000.0, window_s=None), lean.snapshot(now=2000.0, window_s=None)
    for da, db in zip(a.devices, b.devices):
        assert da.buffer_map and da.buffer_map == db.buffer_map and da.top_buffers == db.top_buffers
        assert np.array_equal(da.timeline.hi, db.timeline.hi, equal_nan=True)


@pytest.mark.asyncio
async def test_the_frame_that_completes_a_backlog_is_not_held_for_the_redraw_period():
    """A backfill that starts and ends within one redraw period (an agent's
    10 minutes arrive in well under the default 2 s) is shown when it is in,
    not when the period ends."""
    n = 600
    t0 = time.time() - n * 0.1
    recs = [synthetic.hello(7, 2, t0)] + list(synthetic.samples(7, 2, t0, n))
    source = PushSource(pids=[7])
    app = JaxtopApp(source, refresh_s=10.0)
    async with app.run_test(size=SIZE) as pilot:
        app.model.feed_many(7, recs[:1])  # the hello: a frame goes out, nothing is loading yet
        source.on_update()
        await pilot.pause(0.3)  # the pump now waits its redraw period
        start = time.monotonic()
        for i in range(1, len(recs), 50):
            app.model.feed_many(7, recs[i:i + 50])
            source.on_update()
            await pilot.pause(0.01)
        while time.monotonic() - start < 5.0:
            snap = app.snapshot
            if snap is not None and snap.processes and snap.processes[0].seq == n:
                break
            await pilot.pause(0.02)
        assert app.snapshot.processes[0].seq == n
        assert time.monotonic() - start < 2.0  # not the 10 s redraw period


@pytest.mark.asyncio
async def test_the_loading_line_says_how_much_is_in_and_goes_when_caught_up():
    """While a backlog loads, one line says how many samples are in and how
    far behind the newest is; it is gone once the stream is current."""
    n = 300
    t0 = time.time() - 3600.0  # an hour behind: a backlog
    recs = [synthetic.hello(7, 2, t0)] + list(synthetic.samples(7, 2, t0, n + 51))
    source = PushSource(pids=[7])
    app = JaxtopApp(source, refresh_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        line = app.query_one("#loading")
        assert not line.display

        async def shown(predicate) -> None:
            deadline = time.monotonic() + 5
            while not predicate() and time.monotonic() < deadline:
                await pilot.pause(0.05)
            assert predicate(), (line.display, str(line.render()))

        app.model.feed_many(7, recs[:n + 1])
        source.on_update()
        await shown(lambda: line.display)
        text = str(line.render())
        assert f"loading backlog: {n:,} samples in" in text and "s behind" in text
        behind = float(text.split("samples in, ")[1].split(" s behind")[0].replace(",", ""))
        assert 3500 < behind < 3700
        app.model.feed_many(7, recs[n + 1:n + 51])
        source.on_update()
        await shown(lambda: f"loading backlog: {n + 50:,} samples in" in str(line.render()))
        # Caught up: the next sample is dated now.
        last = dict(recs[-1], t=time.time() - 0.5)
        app.model.feed_many(7, [last])
        source.on_update()
        await shown(lambda: not line.display)
