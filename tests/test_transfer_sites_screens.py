"""Snapshot layer for the transfer sites: the dashboard with the Transfers
panel's site lines at 80x24, 120x40 and 200x60, and the screen of every
site (``T``), on a recording made here (tests/test_transfer_sites_dashboard's
stream), replayed, paused and sought to its end, in UTC."""

from __future__ import annotations

import json
import time

import pytest

from jaxtop.dashboard.app import make_app
from jaxtop.dashboard.sources import ReplaySource
from test_transfer_sites_dashboard import stream

SIZES = [(80, 24), (120, 40), (200, 60)]


pytestmark = pytest.mark.usefixtures("utc")  # conftest's: clock times drawn in UTC


def replayed(tmp_path, keys=()):
    path = tmp_path / "sites.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in stream()))
    src = ReplaySource(str(path), start_playing=False)
    app = make_app(src)

    async def run_before(pilot):
        src.seek(src.replay_state()["t_end"])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            await pilot.pause(0.1)
            snap = app.snapshot
            if snap is not None and snap.processes and snap.processes[0].transfer_sites is not None:
                break
        app.refresh_now()
        await pilot.pause(0.1)
        for key in keys:
            await pilot.press(key)
        await pilot.pause(0.2)

    return app, run_before


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_transfers_panel_names_the_lines(snap_compare, tmp_path, size):
    app, run_before = replayed(tmp_path)
    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_screen_of_every_site(snap_compare, tmp_path, size):
    app, run_before = replayed(tmp_path, keys=("T",))
    assert snap_compare(app, terminal_size=size, run_before=run_before)
