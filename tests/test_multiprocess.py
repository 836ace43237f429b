"""Several processes in one dashboard: two real CPU JAX targets, one attach."""

from __future__ import annotations

import time

import pytest
from rich.console import Console

from conftest import TARGETS
from jaxtop.dashboard.app import make_app
from jaxtop.dashboard.sources import LiveSource
from jaxtop.widgets.panels import HeaderBar, OverviewPanel

pytestmark = pytest.mark.slow


def text_of(panel, snap, width=120, height=20) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(panel.draw(snap, width, height))
    return console.export_text()


async def test_attach_two_targets_shows_both_side_by_side(targets, tmp_path):
    a = targets.run(TARGETS / "loop.py", "--seconds", "40")
    b = targets.run(TARGETS / "loop.py", "--seconds", "40")
    targets.wait_ready(a)
    targets.wait_ready(b)
    app = make_app(LiveSource([a.pid, b.pid]), refresh_s=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            await pilot.pause(0.3)
            snap = app.snapshot
            if snap and {d.pid for d in snap.devices} == {a.pid, b.pid} and all(
                    (p.transfers["h2d"].count_total if "h2d" in p.transfers else 0) for p in snap.processes):
                break
        snap = app.snapshot
        assert {d.pid for d in snap.devices} == {a.pid, b.pid}
        # Overview: one row per device of each process.
        await pilot.press("o")
        await pilot.pause(0.3)
        assert app.query_one(OverviewPanel).display
        overview = text_of(app.query_one(OverviewPanel), app.snapshot)
        assert str(a.pid) in overview and str(b.pid) in overview
        assert overview.count("cpu:0") == 2
        # Stepping through devices reaches the second process; the header follows.
        await pilot.press("o")
        seen = set()
        for _ in range(3):
            await pilot.pause(0.2)
            header = text_of(app.query_one(HeaderBar), app.snapshot, height=2)
            seen |= {pid for pid in (a.pid, b.pid) if f"pid {pid}" in header}
            await pilot.press("tab")
        assert seen == {a.pid, b.pid}
        assert "(2 processes)" in header
        # `w` saves one recording per process, each a stream of its own.
        import json

        written = app.source.save(str(tmp_path / "session.jsonl"))
        assert sorted(written) == sorted(str(tmp_path / f"session-{p}.jsonl") for p in (a.pid, b.pid))
        for path in written:
            recs = [json.loads(line) for line in open(path, "rb")]
            assert recs[0]["type"] == "hello" and str(recs[0]["pid"]) in path
            assert sum(r["type"] == "sample" for r in recs) > 5
