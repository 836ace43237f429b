"""Snapshot layer: the dashboard at 80x24, 120x40 and 200x60 on recordings.

Replays are paused and sought to the end, clocks come from the recording and
the time zone is fixed, so the screens are deterministic.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
from rich.console import Console

from jaxtop.dashboard.app import make_app
from jaxtop.dashboard.sources import PushSource, ReplaySource

FIXTURES = Path(__file__).parent / "fixtures"
SIZES = [(80, 24), (120, 40), (200, 60)]


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    time.tzset()


def replay_to_end(name: str, make=make_app, keys=()):
    """An app (``make(source)``) on the recording, sought to its end; then
    ``keys`` are pressed before the screen is taken."""
    src = ReplaySource(str(FIXTURES / name), start_playing=False)  # FIXTURES / an absolute path is that path
    app = make(src)

    async def run_before(pilot):
        src.seek(src.replay_state()["t_end"])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            await pilot.pause(0.1)
            if app.snapshot is not None and app.snapshot.processes and app.snapshot.processes[0].seq:
                break
        for key in keys:
            await pilot.press(key)
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


def _cpu_recording(path: Path) -> None:
    """A CPU run the agent joined 30 s in: memory climbing in steps with
    bursts of h2d transfers, and a memory map that cannot place every
    buffer (3 still being computed at the last scan), in two malloc regions
    terabytes apart."""
    t0 = 1_790_000_000.0
    reason = "memory_stats() is None on cpu backend: the allocator reports no pool"
    records = [{"type": "hello", "t": t0, "protocol": 1, "pid": 777, "argv": ["train_cpu.py"], "started_t": t0,
                "versions": {"jax": "0.10.2"}, "backend": "cpu", "devices": [{"id": 0, "platform": "cpu"}],
                "interval_s": 0.5, "slow_interval_s": 1.0, "transfer_capture": {"available": True},
                "nvml": {"available": False, "reason": "NVML unavailable: no NVIDIA driver"}}]
    heap, mmapped = 0x5600_0000_0000, 0x7F00_0000_0000
    for k in range(1, 81):
        t = t0 + 0.5 * k
        step = min(k // 20, 3)  # memory climbs at k = 20, 40, 60
        placed = [[heap + i * 4096, 1024] for i in range(4)] + [[mmapped + i * (8 << 20), (1 + step) << 20] for i in range(3)]
        live_bytes = sum(n for _, n in placed) + 3 * (1 << 20)
        live = {"bytes": live_bytes, "count": 10, "largest_bytes": (1 + step) << 20, "scanned_t": t}
        if k % 2 == 0:
            live.update({"map": placed, "map_complete": True, "unmapped": {"not_ready": 3},
                         "top": [{"nbytes": (1 + step) << 20, "dtype": "float32", "shape": f"[{256 * (1 + step)}, 1024]", "ptr": mmapped}]})
        burst = k in range(18, 22) or k in range(38, 42) or k in range(58, 62)
        transfers = {d: {"count": 0, "bytes_known": 0, "count_total": 0, "bytes_known_total": 0} for d in ("h2d", "d2h", "d2d")}
        transfers["h2d"] = {"count": 40 if burst else 1, "bytes_known": (40 if burst else 1) << 18, "count_total": k * 4, "bytes_known_total": k << 20}
        records.append({
            "type": "sample", "t": t, "seq": k, "transfers": transfers,
            "devices": [{"id": 0, "platform": "cpu", "source": "live_arrays", "bytes_in_use": live_bytes, "fragmentation": None,
                         "fragmentation_reason": reason, "live_arrays": live}],
            "process": {"rss_bytes": 300 << 20, "peak_rss_bytes": 300 << 20, "cpu_percent": 50.0, "threads": 8, "started_t": t0 - 30},
            "compile": {"count": 0, "count_total": 2, "seconds_total": 0.5},
            "donation": {"failed": 0, "failed_total": 0},
        })
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_cpu_map_with_unplaced_buffers(snap_compare, size, tmp_path):
    # The map says which buffers it places and why not the others; the
    # fragmentation strip says n/a and why; uptime counts from the process's start.
    path = tmp_path / "cpu_unmapped.jsonl"
    _cpu_recording(path)
    app, run_before = replay_to_end(str(path))
    assert snap_compare(app, terminal_size=size, run_before=run_before)


def test_overview_80x24(snap_compare):
    app, run_before = replay_to_end("synthetic_gpu.jsonl")

    async def then_overview(pilot):
        await run_before(pilot)
        await pilot.press("o")
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=(80, 24), run_before=then_overview)


def _text_of(widget) -> str:
    console = Console(width=max(20, widget.size.width), record=True, file=io.StringIO(), color_system=None)
    console.print(widget.render())
    return console.export_text()


async def test_map_with_no_addresses_yet_says_why_beside_the_live_bytes():
    # A Pilot check of the same panels: a scan where every buffer was still
    # being computed must not read "no live buffers" next to 8 KiB in use.
    src = PushSource()
    app = make_app(src)
    async with app.run_test(size=(80, 24)) as pilot:
        t = time.time()
        src.push(9, {"type": "hello", "t": t, "pid": 9, "argv": ["cpu.py"], "interval_s": 0.1, "backend": "cpu", "started_t": t,
                     "transfer_capture": {"available": True}})
        src.push(9, {"type": "sample", "t": t + 0.1, "seq": 1, "devices": [
            {"id": 0, "platform": "cpu", "source": "live_arrays", "bytes_in_use": 8192, "fragmentation": None,
             "fragmentation_reason": "memory_stats() is None on cpu backend: the allocator reports no pool",
             "live_arrays": {"bytes": 8192, "count": 3, "map": [], "unmapped": {"not_ready": 3}, "top": [
                 {"nbytes": 4096, "dtype": "float32", "shape": "[32, 32]", "ptr": None}]}}],
            "process": {"rss_bytes": 1 << 28, "started_t": t - 3600}})
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not (app.snapshot and app.snapshot.devices):
            await pilot.pause(0.05)
        memory_map = _text_of(app.query_one("#map"))
        assert "no buffer addresses yet" in memory_map and "3 buffers still computing" in memory_map
        assert "no live buffers" not in memory_map and "float32[32, 32]" in memory_map
        assert "fragmentation n/a" in _text_of(app.query_one("#timeline"))
        assert "up 1h00m" in _text_of(app.query_one("#header"))  # the process's uptime, not the agent's


def _demo_recording(path: Path) -> None:
    """The demo on CPU running "fragmentation": first off (mixed sizes freed
    out of order), then on (uniform buffers freed as a batch). Holes among
    live buffers fall when it switches on, memory climbs throughout, and an
    h2d burst marks the switch: the three timelines line up."""
    from jaxtop.demo.runner import describe
    from jaxtop.demo.strategies import STRATEGIES

    t0 = 1_790_000_000.0
    pid = 4343
    reason = "memory_stats() is None on cpu backend: the allocator reports no pool"
    records = [{"type": "hello", "t": t0, "protocol": 1, "pid": pid, "argv": ["worker.py"], "started_t": t0,
                "versions": {"jax": "0.10.2"}, "backend": "cpu", "devices": [{"id": 0, "platform": "cpu"}],
                "interval_s": 0.5, "slow_interval_s": 0.5, "transfer_capture": {"available": True},
                "nvml": {"available": False, "reason": "NVML unavailable: no NVIDIA driver"}}]
    base = 0x7F00_0000_0000
    for k in range(1, 81):
        t = t0 + 0.5 * k
        on = k > 40
        n = 8 + (k - 40) // 4 if on else 8 + k // 8
        size = 256 << 10
        # Off: mixed sizes freed out of order leave a hole after every other
        # buffer. On: uniform buffers freed as a batch, back to back.
        placed, cursor = [], base
        for i in range(n):
            placed.append([cursor, size])
            cursor += size + (size if not on and i % 2 else 0)
        live_bytes = n * size
        spans = sorted(placed)
        holes = sum(max(0, q - (p + m)) for (p, m), (q, _) in zip(spans, spans[1:]))
        live = {"bytes": live_bytes, "count": n, "largest_bytes": size, "scanned_t": t, "map": spans, "map_complete": True,
                "top": [{"nbytes": size, "dtype": "float32", "shape": "[65536]", "ptr": base}],
                "holes": holes / (holes + live_bytes)}
        burst = k in range(40, 44)
        transfers = {d: {"count": 0, "bytes_known": 0, "count_total": 0, "bytes_known_total": 0} for d in ("h2d", "d2h", "d2d")}
        transfers["h2d"] = {"count": 30 if burst else 0, "bytes_known": (30 << 16) if burst else 0,
                            "count_total": 30 * max(0, min(k, 44) - 39), "bytes_known_total": (30 << 16) * max(0, min(k, 44) - 39)}
        strategies = []
        for cls in STRATEGIES:
            s = describe(cls)
            s["variant"] = "on" if (cls.name == "fragmentation" and on) else cls.variants[0]
            s["results"] = {}
            if cls.name == "fragmentation":
                s["results"] = {"off": {"fragmentation": None, "fragmentation_reason": "no pool on CPU", "gap_ratio": 0.33}}
                if k == 80:
                    s["results"]["on"] = {"fragmentation": None, "fragmentation_reason": "no pool on CPU",
                                          "gap_ratio": live["holes"]}
            strategies.append(s)
        demo = {"active": "fragmentation", "measuring": None, "measure_steps": 30, "version": 1, "backend": "cpu",
                "steps": 100 * k, "strategies": strategies}
        records.append({
            "type": "sample", "t": t, "seq": k, "transfers": transfers, "demo": demo,
            "devices": [{"id": 0, "platform": "cpu", "source": "live_arrays", "bytes_in_use": live_bytes, "fragmentation": None,
                         "fragmentation_reason": reason, "live_arrays": live}],
            "process": {"rss_bytes": 300 << 20, "peak_rss_bytes": 300 << 20, "cpu_percent": 50.0, "threads": 8, "started_t": t0},
            "compile": {"count": 0, "count_total": 2, "seconds_total": 0.5},
            "donation": {"failed": 0, "failed_total": 0},
        })
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_demo_fragmentation_on_the_three_timelines(snap_compare, size, tmp_path):
    # The demo's screen with its memory panels: memory, holes among live
    # buffers (the CPU's fragmentation measure, so named) and transfers on
    # one time axis, the fragmentation strategy's switch visible on all three.
    from jaxtop.demo.app import DemoApp, Worker

    class NoWorkload(Worker):
        def start(self, timeout_s: float = 0.0) -> int:
            raise RuntimeError("no workload in this test")

    path = tmp_path / "demo.jsonl"
    _demo_recording(path)
    # Select the fragmentation row; on a short terminal, the memory panels' page.
    keys = ["down"] * 8 + (["v"] if size[1] < 40 else [])
    app, run_before = replay_to_end(str(path), make=lambda src: DemoApp(NoWorkload(), 4343, source=src), keys=keys)

    assert snap_compare(app, terminal_size=size, run_before=run_before)
