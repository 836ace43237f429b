"""The demo's screen at 80×24 and larger: the real DemoApp on a pushed source
(a made-up demo state, no workload); what a reader sees, cell by cell."""

from __future__ import annotations

import io
import os
import time

import pytest
from rich.console import Console
from textual.containers import VerticalScroll

from jaxtop.testing import synthetic
from jaxtop.dashboard.app import HelpScreen
from jaxtop.dashboard.sources import PushSource
from jaxtop.demo.app import BOTH_FIT_ROWS, DemoApp, Worker
from jaxtop.demo.panel import StrategiesPanel
from jaxtop.demo.runner import describe
from jaxtop.demo.strategies import STRATEGIES

PID = 4242


class NoWorkload(Worker):
    """Stands in for the workload child: nothing runs, nothing restarts."""

    def start(self, timeout_s: float = 0.0) -> int:
        raise RuntimeError("no workload in this test")


def demo_state(active=None, results=None, measuring=None):
    """A ``demo`` sample field as the runner sends it, with made-up results."""
    strategies = []
    for cls in STRATEGIES:
        s = describe(cls)
        s["variant"] = cls.variants[-1] if cls.name == active else cls.variants[0]
        s["results"] = (results or {}).get(cls.name, {})
        strategies.append(s)
    return {"active": active, "measuring": measuring, "measure_steps": 30, "version": 1, "backend": "cpu",
            "steps": 1234, "strategies": strategies}


def push(src, state):
    t0 = time.time() - 2.0
    src.push(PID, synthetic.hello(PID, 1, t0), update=False)
    for rec in synthetic.samples(PID, 1, t0, 5):
        rec["demo"] = state
        src.push(PID, rec, update=False)
    src.on_update()


def shown_lines(widget) -> list[str]:
    """The widget's text as drawn in its region: cut to its width and height."""
    width, height = widget.size.width, widget.size.height
    console = Console(width=width, height=height, record=True, file=io.StringIO(), color_system=None)
    lines = console.render_lines(widget.render(), console.options.update_dimensions(width, height), pad=False)
    return ["".join(seg.text for seg in line).rstrip() for line in lines]


async def settle(pilot, app, predicate, timeout=10.0, what="the screen"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await pilot.pause(0.05)
        if app.snapshot is not None and predicate():
            return
    raise AssertionError(f"timed out waiting for {what}")


def within_screen(app, widget) -> bool:
    region = widget.region
    return (widget.display and region.height > 0 and region.x >= 0 and region.y >= 0
            and region.right <= app.size.width and region.bottom <= app.size.height)


MEASURED = {
    "placement": {"off": {"h2d_per_step": 1.0, "step_s": 6e-5}, "on": {"h2d_per_step": 0.0, "step_s": 9e-5}},
    "inplace": {"off": {"alloc_bytes_per_step": 8960.0, "compiles_per_step": 1.0},
                "on": {"alloc_bytes_per_step": 16, "compiles_per_step": 0.0}},
    # Against the expected direction: the panel must say so.
    "fragmentation": {"off": {"fragmentation": None, "fragmentation_reason": "no pool on CPU", "gap_ratio": 0.30},
                      "on": {"fragmentation": None, "fragmentation_reason": "no pool on CPU", "gap_ratio": 0.45}},
}


async def test_every_strategy_reads_whole_at_80x24():
    src = PushSource()
    app = DemoApp(NoWorkload(), PID, source=src)
    async with app.run_test(size=(80, 24)) as pilot:
        push(src, demo_state(active="placement", results=MEASURED))
        panel = app.query_one(StrategiesPanel)
        await settle(pilot, app, lambda: panel.snapshot is not None and panel.size.height > 0)
        # Too short for both: the Strategies page, all of it on the screen.
        assert app.size.height < BOTH_FIT_ROWS
        assert within_screen(app, panel)
        assert not app.query_one("#main").display
        lines = shown_lines(panel)
        text = "\n".join(lines)
        for i, cls in enumerate(STRATEGIES):
            row = next((line for line in lines if line[1:].startswith(f"{i + 1} ")), None)
            assert row is not None and f"{i + 1} {cls.title} " in row, (cls.title, text)
        # A label, then its values, then the verdict.
        assert "implicit h2d/step 1 → 0 ✓" in text, text
        assert "alloc/step 8.75 KiB → 16 B ✓" in text, text
        # The running one tells what enter does next, and how it is measured.
        assert "enter: switch to OFF and measure it (30 steps" in text, text
        assert "v memory panels" in lines[0]

        # The selected strategy's metrics, each with its full label; a result
        # against the expected direction carries ✗ and a reason.
        for _ in range(8):
            await pilot.press("down")
        await pilot.pause(0.05)
        text = "\n".join(shown_lines(panel))
        assert "holes 30% → 45% ✗" in text, text
        assert "holes among the demo's buffers  30% → 45% ✗ expected lower" in text.replace("\n", " "), text
        assert "allocator fragmentation" in text and "n/a: no pool on CPU" in text, text
        assert "enter: measure OFF (30 steps); enter again: switch to ON" in text, text

        # v: the memory panels instead; enter brings the strategies back.
        await pilot.press("v")
        await settle(pilot, app, lambda: app.query_one("#main").display and not panel.display)
        await pilot.press("enter")
        await settle(pilot, app, lambda: panel.display and not app.query_one("#main").display)
        assert src.commands[-1] == (PID, "demo_set", {"strategy": "fragmentation"})


async def test_strategies_before_any_key_show_nothing_measured():
    src = PushSource()
    app = DemoApp(NoWorkload(), PID, source=src)
    async with app.run_test(size=(80, 24)) as pilot:
        push(src, demo_state())
        panel = app.query_one(StrategiesPanel)
        await settle(pilot, app, lambda: panel.snapshot is not None)
        lines = shown_lines(panel)
        text = "\n".join(lines)
        assert "→" not in "\n".join(lines[1:10]), text  # no value before a measurement
        assert "▶" not in text
        assert "enter: measure OFF (30 steps); enter again: switch to ON, measure it" in text, text


async def test_both_views_fit_from_40_rows():
    src = PushSource()
    app = DemoApp(NoWorkload(), PID, source=src)
    async with app.run_test(size=(120, BOTH_FIT_ROWS)) as pilot:
        push(src, demo_state(active="placement", results=MEASURED))
        panel = app.query_one(StrategiesPanel)
        await settle(pilot, app, lambda: panel.snapshot is not None and panel.size.height > 0)
        assert within_screen(app, panel) and app.query_one("#main").display
        assert within_screen(app, app.query_one("#memory"))
        text = "\n".join(shown_lines(panel))
        for cls in STRATEGIES:
            assert f" {cls.title} " in text, text
        # Wide: every metric of a row, each after its label.
        assert "implicit h2d/step 1 → 0 ✓  step 0.06ms → 0.09ms" in text, text
        assert "v memory panels" not in text


@pytest.mark.parametrize("close", ["escape", "q", "question_mark"])
async def test_help_lists_the_demo_keys_and_scrolls_at_80x24(close):
    src = PushSource()
    app = DemoApp(NoWorkload(), PID, source=src)
    async with app.run_test(size=(80, 24)) as pilot:
        push(src, demo_state())
        await settle(pilot, app, lambda: True)
        await pilot.press("question_mark")
        await pilot.pause(0.1)
        assert isinstance(app.screen, HelpScreen)
        console = Console(width=400, record=True, file=io.StringIO(), color_system=None)
        console.print(app.screen.query_one("#help-text").content)
        lines = [line.strip() for line in console.export_text().splitlines()]
        for keys, words in [("⏎ t", "measure"), ("↑ k", "above"), ("↓ j", "below"), ("v", "memory panels"),
                            ("P", "XLA_PYTHON_CLIENT_PREALLOCATE"), ("F", "XLA_PYTHON_CLIENT_MEM_FRACTION"),
                            ("L", "XLA_PYTHON_CLIENT_ALLOCATOR")]:
            assert any(line.startswith(keys + " ") and words in line for line in lines), (keys, lines)
        # It does not fit at 80×24: the keys scroll it.
        scroll = app.screen.query_one(VerticalScroll)
        assert scroll.max_scroll_y > 0
        await pilot.press("down")
        await pilot.pause(0.05)
        assert scroll.scroll_y > 0
        await pilot.press("end")
        await pilot.pause(0.1)
        assert scroll.scroll_y == scroll.max_scroll_y
        cursor = app.query_one(StrategiesPanel).cursor
        await pilot.press(close)
        await pilot.pause(0.05)
        assert not isinstance(app.screen, HelpScreen)
        assert app.query_one(StrategiesPanel).cursor == cursor  # the keys scrolled help, not the panel
        assert app.is_running  # q closed help, not the demo


def test_demo_without_a_terminal_says_to_use_headless(child_env, tmp_path):
    import subprocess

    from conftest import PY

    env = dict(child_env, TMPDIR=str(tmp_path))
    res = subprocess.run([PY, "-m", "jaxtop", "demo", "--small"], env=env, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stdout == "" and len(res.stderr.strip().splitlines()) == 1 and "--headless" in res.stderr
    assert not os.listdir(tmp_path)  # no workload was started


#: Step times read per block (with their spread), and the run-ahead
#: strategy on CPU: its bytes n/a with the reason, its queue measured.
SPREAD = {
    "jit": {"off": {"buffers_per_step": 16, "step_s": 6.0e-4, "step_s_spread": 5e-4},
            "on": {"buffers_per_step": 1, "step_s": 3.0e-4, "step_s_spread": 1e-4}},
    "batching": {"off": {"h2d_per_step": 16.0, "step_s": 4.0e-4, "step_s_spread": 2e-5},
                 "on": {"h2d_per_step": 1.0, "step_s": 1.0e-4, "step_s_spread": 1e-5}},
    "runahead": {"off": {"held_bytes": None, "held_bytes_reason": "memory_stats() is None on cpu backend",
                         "queued_steps": 10, "queued_steps_spread": 0},
                 "on": {"held_bytes": None, "held_bytes_reason": "memory_stats() is None on cpu backend",
                        "queued_steps": 1, "queued_steps_spread": 0}},
}


async def test_a_change_within_its_spread_reads_as_no_change():
    src = PushSource()
    app = DemoApp(NoWorkload(), PID, source=src)
    async with app.run_test(size=(120, BOTH_FIT_ROWS)) as pilot:
        push(src, demo_state(active="jit", results=SPREAD))
        panel = app.query_one(StrategiesPanel)
        await settle(pilot, app, lambda: panel.snapshot is not None and panel.size.height > 0)
        for _ in range(4):  # the jit row
            await pilot.press("down")
        await pilot.pause(0.05)
        text = "\n".join(shown_lines(panel))
        # 0.6 → 0.3 ms where the off blocks ranged over 0.5 ms: not a ✓.
        assert "buffers/step 16 → 1 ✓  step 0.60ms → 0.30ms ≈" in text, text
        assert "step time            0.60ms → 0.30ms ±0.50ms ≈ no change beyond the spread (±0.50ms)" in text, text
        # Beyond its spread, a step time keeps its ✓.
        assert "step 0.40ms → 0.10ms ✓" in text, text
        # The run-ahead row: its bytes n/a on CPU (skipped in the row), its queue measured.
        row = next(line for line in text.splitlines() if " bounded run-ahead " in line)
        assert "queued 10 → 1 ✓" in row, row
