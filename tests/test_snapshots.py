"""Snapshot layer: the dashboard at 80x24, 120x40 and 200x60 on recordings.

Replays are paused and sought to the end, clocks come from the recording and
the time zone is fixed, so the screens are deterministic.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jaxtop.dashboard.app import make_app
from jaxtop.dashboard.sources import ReplaySource

FIXTURES = Path(__file__).parent / "fixtures"
SIZES = [(80, 24), (120, 40), (200, 60)]


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    time.tzset()


def replay_to_end(name: str):
    src = ReplaySource(str(FIXTURES / name), start_playing=False)
    app = make_app(src)

    async def run_before(pilot):
        src.seek(src.replay_state()["t_end"])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            await pilot.pause(0.1)
            if app.snapshot is not None and app.snapshot.processes and app.snapshot.processes[0].seq:
                break
        app.refresh_now()
        await pilot.pause(0.2)

    return app, run_before


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_cpu_recording(snap_compare, size):
    app, run_before = replay_to_end("cpu_train_loop.jsonl")
    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_synthetic_gpu_recording(snap_compare, size):
    app, run_before = replay_to_end("synthetic_gpu.jsonl")
    assert snap_compare(app, terminal_size=size, run_before=run_before)


def test_overview_80x24(snap_compare):
    app, run_before = replay_to_end("synthetic_gpu.jsonl")

    async def then_overview(pilot):
        await run_before(pilot)
        await pilot.press("o")
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=(80, 24), run_before=then_overview)
