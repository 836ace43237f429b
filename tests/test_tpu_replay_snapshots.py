"""Snapshot layer on the TPU recordings: every screen of the dashboard as the
chip's runs drew it, at 120x40 and 80x24.

The recordings (tests/fixtures/tpu/, made on a TPU v5e) are replayed
paused and sought, clocks come from the recording and the time zone is
fixed, so the screens are deterministic. The figures on them are asserted
in tests/test_tpu_replay.py; these keep the layout.

Baselines are written with
``pytest tests/test_tpu_replay_snapshots.py --snapshot-update``
once the screens stop changing, and reviewed like any other snapshot.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from jaxtop.dashboard.app import HelpScreen, ProfileScreen, make_app
from jaxtop.dashboard.holders_screen import HoldersScreen
from jaxtop.dashboard.jit_screen import JitScreen
from jaxtop.dashboard.oom_screen import OomScreen
from jaxtop.dashboard.sources import PushSource, ReplaySource

TPU = Path(__file__).parent / "fixtures" / "tpu"
SIZES = [(120, 40), (80, 24)]
IDS = [f"{w}x{h}" for w, h in SIZES]


@pytest.fixture(autouse=True)
def _utc(utc):
    """Clock times on the screens (events, headers) in UTC."""


def replay_at(path: Path, at: float | None = None, key: str | None = None, screen: type | None = None):
    """The app on ``path``, paused ``at`` seconds in (the end when None);
    then ``key`` pressed, and the run waits until ``screen`` is up."""
    src = ReplaySource(str(path), start_playing=False)
    app = make_app(src)

    async def run_before(pilot):
        state = src.replay_state()
        src.seek(state["t_end"] if at is None else state["t_start"] + at)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            await pilot.pause(0.05)
            if app.snapshot is not None and app.snapshot.processes and app.snapshot.processes[0].seq:
                break
        app.refresh_now()
        if key is not None:
            await pilot.press(key)
            deadline = time.monotonic() + 5
            while screen is not None and not isinstance(app.screen, screen) and time.monotonic() < deadline:
                await pilot.pause(0.05)
            assert screen is None or isinstance(app.screen, screen), f"{key} did not open {screen.__name__}"
            if isinstance(app.screen, HoldersScreen):
                app.screen.refresh_view()
            if isinstance(app.screen, JitScreen):
                app.screen.redraw()
        await pilot.pause(0.2)

    return app, run_before


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_main_screen(snap_compare, size):
    # The end of the training loop: 2.26 GiB in use of 15.7 GiB after a
    # 12.6 GiB peak, the chip's opening a gap at the left of the timelines.
    app, run_before = replay_at(TPU / "training-loop.jsonl.gz")
    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_main_screen_while_the_live_array_scan_stalls(snap_compare, size):
    # 50 s in: in use moves while the live arrays are those of the 26 s scan.
    app, run_before = replay_at(TPU / "training-loop-stall.jsonl.gz", at=50.0)
    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_overview(snap_compare, size):
    app, run_before = replay_at(TPU / "training-loop.jsonl.gz", key="o")
    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_jit_screen(snap_compare, size):
    app, run_before = replay_at(TPU / "training-loop.jsonl.gz", key="J", screen=JitScreen)
    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_holders_screen(snap_compare, size):
    app, run_before = replay_at(TPU / "training-loop.jsonl.gz", key="H", screen=HoldersScreen)
    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_profile_screen(snap_compare, size):
    app, run_before = replay_at(TPU / "training-loop.jsonl.gz", key="p", screen=ProfileScreen)
    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_help_screen(snap_compare, size):
    app, run_before = replay_at(TPU / "training-loop.jsonl.gz", key="question_mark", screen=HelpScreen)
    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_oom_screen_with_the_chips_census(snap_compare, size):
    # The training loop never ran out: the census is the one written when a
    # program filled the chip 1 GiB at a time, sent as the agent sends it.
    census = json.loads((TPU / "oom-census.json").read_text())
    src = PushSource()
    app = make_app(src)

    async def run_before(pilot):
        src.push(census["pid"], census)
        await pilot.pause(0.1)
        app.push_screen(OomScreen(app.model.processes[census["pid"]].oom_censuses))
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=size, run_before=run_before)
