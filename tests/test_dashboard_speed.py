"""Speed guards for the dashboard: ingesting a backlog never blocks the UI."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from jaxtop import protocol, synthetic
from jaxtop.dashboard.app import JaxtopApp
from jaxtop.dashboard.model import Model
from jaxtop.dashboard.sources import PushSource
from jaxtop.dashboard.sources.live import drop_superseded_maps, fast_decode

SIZE = (120, 40)
BACKFILL = 6000  # an agent's 10-minute backfill at 10 Hz


def test_feed_many_equals_feed():
    """A backlog fed in batches gives the same snapshot as record by record."""
    recs = [synthetic.hello(1, 2, 1000.0)] + list(synthetic.samples(1, 2, 1000.0, 700, map_every=7))
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
def test_superseded_maps_are_not_decoded_and_nothing_else_changes(batch):
    """Reads of a backfill decoded with the maps that a later line of the
    same read replaces emptied: the same model as decoding every line."""
    recs = [synthetic.hello(1, 3, 1000.0)] + list(synthetic.samples(1, 3, 1000.0, 700, map_every=7))
    lines = [protocol.encode(r) for r in recs]
    full, lean = Model(clock=lambda: 5.0), Model(clock=lambda: 5.0)
    emptied = 0
    for i in range(0, len(lines), batch):
        chunk = lines[i:i + batch]
        full.feed_many(1, [fast_decode(x) for x in chunk])
        kept = drop_superseded_maps(chunk)
        emptied += sum(a != b for a, b in zip(chunk, kept))
        lean.feed_many(1, [fast_decode(x) for x in kept])
    if batch > 7:
        assert emptied > 0  # maps really were skipped
    a, b = full.snapshot(now=2000.0, window_s=None), lean.snapshot(now=2000.0, window_s=None)
    for da, db in zip(a.devices, b.devices):
        assert da.buffer_map and da.buffer_map == db.buffer_map and da.top_buffers == db.top_buffers
        assert (da.map_live_count, da.map_live_bytes, da.unmapped) == (db.map_live_count, db.map_live_bytes, db.unmapped)
        assert np.array_equal(da.timeline.hi, db.timeline.hi, equal_nan=True)


def test_a_map_is_kept_when_the_last_one_covers_fewer_devices():
    lines = [b'{"type":"sample","devices":[{"live_arrays":{"map":[[1,2]]}},{"live_arrays":{"map":[[3,4]]}}]}',
             b'{"type":"sample","devices":[{"live_arrays":{"map":[[5,6]]}}]}']
    assert drop_superseded_maps(lines) == lines
    text = b'{"type":"sample","events":[{"text":"\\"map\\":[[9,9]]"}],"devices":[{"live_arrays":{"map":[[1,2],[3,4]]}}]}'
    out = drop_superseded_maps([text, lines[1]])
    assert out[0] == text.replace(b'"map":[[1,2],[3,4]]', b'"map":[]')  # a string that looks like one is left alone


@pytest.mark.asyncio
async def test_keys_answered_while_backfill_loads():
    """A 6,000-sample backfill goes in on another thread, as the live source
    feeds it; key presses meanwhile are answered within 100 ms (median).

    Keys are posted as the terminal driver posts them (``simulate_key``).
    ``pilot.press`` would not do: it waits until the screen is idle, which
    it never is while a backlog streams in (that waiting, 0.96 s, was once
    taken for the dashboard's latency)."""
    lines = [protocol.encode(synthetic.hello(7, 8, time.time() - BACKFILL * 0.1))]
    lines += [protocol.encode(r) for r in synthetic.samples(7, 8, time.time() - BACKFILL * 0.1, BACKFILL)]
    source = PushSource(pids=[7])
    app = JaxtopApp(source)
    async with app.run_test(size=SIZE) as pilot:
        done = threading.Event()

        def reader() -> None:
            for i in range(0, len(lines), 90):  # about one 1 MiB socket read each
                app.model.feed_many(7, [fast_decode(x) for x in lines[i:i + 90]])
                source.on_update()
            done.set()

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        while 7 not in app.model.processes or not app.model.processes[7].devices:
            await pilot.pause(0.001)  # tab needs a device to step to
        latencies = []
        while not done.is_set() and len(latencies) < 20:
            before = app.selected
            t0 = time.monotonic()
            app.simulate_key("tab")
            while app.selected == before and time.monotonic() - t0 < 2.0:
                await pilot.pause(0.001)
            latencies.append(time.monotonic() - t0)
        thread.join(30)
        assert done.is_set()
        assert latencies, "the backfill went in before a key could be pressed"
        # Never blocked by ingest (blocked, a key waits for the whole backlog,
        # about 1 s here). The 100 ms target itself is timed by
        # benchmarks/tui.py: a test on a shared 2-core runner measured a
        # median of 65-90 ms alone and up to 200 ms beside another job.
        assert sorted(latencies)[len(latencies) // 2] < 0.3, latencies
        assert max(latencies) < 0.6, latencies
        assert app.model.processes[7].samples == BACKFILL


def test_the_agents_backfill_keeps_only_the_newest_maps_and_shows_the_same():
    """The agent's backfill drops superseded buffer maps (the key goes): a
    dashboard fed that backfill shows the same as one fed every line, and
    the lines stay valid JSON."""
    from jaxtop.agent.clients import Backfill

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
    full.feed_many(1, [fast_decode(x) for x in lines[:1] + lines[-len(kept):]])
    lean.feed_many(1, [fast_decode(x) for x in lines[:1] + kept])
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
