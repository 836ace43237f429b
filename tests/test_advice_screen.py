"""The advice where a user sees it: the top advice atop the Events panel, the
Advice screen (``A``; Pilot and snapshots at 80x24 and 120x40) and
`jaxtop snapshot`'s section, on the TPU v5e's training-loop recording
(run-ahead, donation and host reads, the figures the chip measured)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jaxtop.dashboard.advice_screen import AdviceScreen
from jaxtop.dashboard.app import make_app
from jaxtop.dashboard.model import Model
from jaxtop.dashboard.snapshot_text import snapshot_text
from jaxtop.dashboard.sources import ReplaySource
from jaxtop.wire.records import decode
from test_tpu_replay import widget_text

TPU = Path(__file__).parent / "fixtures" / "tpu"
RECORDING = TPU / "training-loop-stall.jsonl.gz"

pytestmark = pytest.mark.usefixtures("utc")  # conftest's: clock times drawn in UTC


def replayed(keys=()):
    src = ReplaySource(str(RECORDING), start_playing=False)
    app = make_app(src)

    async def run_before(pilot):
        src.seek(src.replay_state()["t_end"])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            await pilot.pause(0.1)
            snap = app.snapshot
            if snap is not None and snap.processes and snap.processes[0].advice is not None \
                    and snap.processes[0].advice.advice:
                break
        app.refresh_now()
        await pilot.pause(0.1)
        for key in keys:
            await pilot.press(key)
        await pilot.pause(0.3)

    return app, run_before


async def test_the_top_advice_heads_the_events_and_a_opens_every_one():
    app, run_before = replayed()
    async with app.run_test(size=(120, 40)) as pilot:
        await run_before(pilot)
        events = widget_text(app.query_one("#events"), 120)
        assert events.splitlines()[1].startswith(" ★ advice (1 of 2, A): runahead train.py:27: bound how far the loop")
        proc = app.snapshot.processes[0]
        assert [a.strategy for a in proc.advice.advice] == ["runahead", "donation"]
        # The loss read every 10 steps, the step's rate unknown (no line feeds it host values): not judged.
        assert "the step's rate is unknown" in {n.strategy: n.why for n in proc.advice.not_judged}["host_sync"]
        await pilot.press("A")
        await pilot.pause(0.3)
        screen = app.screen
        assert isinstance(screen, AdviceScreen)
        body = widget_text(screen.query_one("#advice-body"), 118)
        assert "bound how far the loop runs ahead of the device" in body
        assert "train.py:27" in body and "donate_argnums=..." in body
        await pilot.press("A")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, AdviceScreen)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_advice_screen(snap_compare, size):
    app, run_before = replayed(keys=("A",))
    assert snap_compare(app, terminal_size=size, run_before=run_before)


def test_snapshot_text_has_the_advice_section():
    import gzip

    model = Model()
    records = [decode(line) for line in gzip.open(RECORDING)]
    pid = records[0].pid
    model.feed_many(pid, records)
    text = snapshot_text(model.snapshot())
    section = text[text.index("  advice over the last"):]
    assert "[runahead] train.py:27 (step): bound how far the loop runs ahead of the device  (measured)" in section
    assert "6.1 calls of `step`" in section
    assert "[donation] train.py:27 in <module> (step)" in section
