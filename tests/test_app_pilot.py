"""Pilot layer: the real app on a pushed (fake) source; keys in, widget text out."""

from __future__ import annotations

import io
import json
import os
import socket
import threading
import time

from rich.console import Console
from textual.widgets import Static

from jaxtop import protocol, synthetic
from jaxtop.dashboard.app import HelpScreen, ProfileScreen, make_app
from jaxtop.dashboard.model import DISCONNECTED
from jaxtop.dashboard.sources import LiveSource, PushSource, ReplaySource

SIZE = (120, 40)


def text_of(widget) -> str:
    console = Console(width=max(20, widget.size.width), record=True, file=io.StringIO(), color_system=None)
    # Static keeps what it was given; other widgets render a Rich renderable.
    content = widget.content if isinstance(widget, Static) else widget.render()
    console.print(content)
    return console.export_text()


async def settle(pilot, app, predicate=lambda: True, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await pilot.pause(0.05)
        if app.snapshot is not None and predicate():
            return
    raise AssertionError("app did not settle")


def gpu_source(n_devices=2, count=40, profile=None):
    src = PushSource(on_command=(lambda pid, name, args: profile) if profile else None)
    return src


def push_stream(src, pid=4242, n_devices=2, count=40):
    t0 = time.time() - count * 0.1
    src.push(pid, synthetic.hello(pid, n_devices, t0), update=False)
    for rec in synthetic.samples(pid, n_devices, t0, count):
        src.push(pid, rec, update=False)
    src.on_update()


async def test_keys_drive_the_view(tmp_path):
    profile = {"path": "/tmp/p.prof", "total_bytes": 1 << 20, "top_sites": [{"site": "make_batch (train.py:12)", "bytes": 1 << 20, "allocations": 3}]}
    src = gpu_source(profile=profile)
    app = make_app(src, save_dir=str(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        push_stream(src)
        await settle(pilot, app, lambda: len(app.snapshot.devices) == 2)
        header = text_of(app.query_one("#header"))
        assert "pid 4242" in header and "live" in header and "gpu:0" in header
        memory = text_of(app.query_one("#memory"))
        assert "NVML used" in memory and "pool" in memory and "GiB" in memory
        assert "%" in text_of(app.query_one("#frag"))
        assert "h2d" in text_of(app.query_one("#transfers"))

        await pilot.press("tab")
        await settle(pilot, app, lambda: app.snapshot.selected == 1)
        assert "gpu:1" in text_of(app.query_one("#header"))
        await pilot.press("tab")  # after the last device: the overview
        await settle(pilot, app, lambda: app.snapshot.selected == -1)
        assert app.query_one("#overview").display and not app.query_one("#main").display
        over = text_of(app.query_one("#overview"))
        assert "gpu:0" in over and "gpu:1" in over
        await pilot.press("tab")
        await settle(pilot, app, lambda: app.snapshot.selected == 0)

        await pilot.press("1")
        await settle(pilot, app, lambda: app.snapshot.window_s == 60.0)
        assert "1 min" in text_of(app.query_one("#timeline"))
        await pilot.press("4")
        await settle(pilot, app, lambda: app.snapshot.window_s is None)
        assert "whole run" in text_of(app.query_one("#header"))

        await pilot.press("s")
        await settle(pilot, app, lambda: any(e.kind == "profile" and "saved" in e.text for e in app.snapshot.events))
        assert src.commands[-1][1] == "memory_profile"
        await pilot.press("p")
        await pilot.pause(0.1)
        assert isinstance(app.screen, ProfileScreen)
        assert "make_batch" in text_of(app.screen.query_one("#profile-text"))
        await pilot.press("escape")

        await pilot.press("w")
        await pilot.pause(0.1)
        files = list(tmp_path.glob("jaxtop-4242-*.jsonl"))
        assert len(files) == 1
        lines = files[0].read_bytes().splitlines()
        assert json.loads(lines[0])["type"] == "hello" and len(lines) > 40

        await pilot.press("question_mark")
        await pilot.pause(0.1)
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")

        await pilot.press("space")
        await pilot.pause(0.1)
        assert app.paused and "PAUSED" in text_of(app.query_one("#header"))


async def test_cpu_device_shows_na_with_reasons():
    src = PushSource()
    app = make_app(src)
    async with app.run_test(size=SIZE) as pilot:
        src.push(9, {"type": "hello", "t": time.time(), "pid": 9, "argv": ["cpu.py"], "interval_s": 0.1, "backend": "cpu",
                     "nvml": {"available": False, "reason": "NVML unavailable: NVMLError_LibraryNotFound"},
                     "transfer_capture": {"available": True}})
        src.push(9, {"type": "sample", "t": time.time(), "seq": 1, "devices": [
            {"id": 0, "platform": "cpu", "source": "live_arrays", "bytes_in_use": 8192, "fragmentation": None,
             "fragmentation_reason": "memory_stats() is None on cpu backend: the allocator reports no pool",
             "live_arrays": {"bytes": 8192, "count": 2, "largest_bytes": 4096, "map": [[4096, 4096], [16384, 4096]], "top": [
                 {"nbytes": 4096, "dtype": "float32", "shape": "[32, 32]", "ptr": 4096}]}}],
            "transfers": {"h2d": {"count": 1, "bytes_known": 0, "count_total": 1, "bytes_known_total": 0}},
            "process": {"rss_bytes": 1 << 28, "cpu_percent": 12.5, "threads": 9}})
        await settle(pilot, app, lambda: len(app.snapshot.devices) == 1)
        frag = text_of(app.query_one("#frag"))
        assert "n/a" in frag and "cpu" in frag and "0%" not in frag
        memory = text_of(app.query_one("#memory"))
        assert "n/a" in memory  # no pool, no NVML on CPU: said, not drawn as 0
        assert "float32[32, 32]" in text_of(app.query_one("#map"))
        assert "n/a" in text_of(app.query_one("#host"))


async def test_burst_of_10000_samples_keeps_keys_responsive():
    src = PushSource()
    app = make_app(src)
    async with app.run_test(size=SIZE) as pilot:
        pid, t0 = 77, time.time() - 1000
        src.push(pid, synthetic.hello(pid, 2, t0))
        done = threading.Event()

        def burst():
            for rec in synthetic.samples(pid, 2, t0, 10_000, map_every=1000):
                src.push(pid, rec)
            done.set()

        threading.Thread(target=burst, daemon=True).start()
        started = time.monotonic()
        await pilot.press("tab")
        await pilot.press("1")
        await settle(pilot, app, lambda: app.snapshot.window_s == 60.0 and app.snapshot.selected == 1, timeout=10)
        assert time.monotonic() - started < 10
        await settle(pilot, app, lambda: done.is_set() and app.snapshot.processes[0].seq == 10_000, timeout=60)


class FakeAgent:
    """A socket server at our own pid's path that plays a scripted stream."""

    def __init__(self, sockdir, lines: list[bytes], close_after: bool = True):
        self.path = str(sockdir / f"{os.getpid()}.sock")
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(self.path)
        self.server.listen(4)
        self.lines = lines
        self.close_after = close_after
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        conn, _ = self.server.accept()
        for line in self.lines:
            conn.sendall(line)
        if self.close_after:
            conn.close()
            self.server.close()
            os.unlink(self.path)
        else:
            time.sleep(30)


async def test_malformed_lines_and_dead_socket_do_not_freeze(sockdir):
    pid = os.getpid()
    t0 = time.time()
    lines = [protocol.encode(synthetic.hello(pid, 1, t0))]
    lines += [protocol.encode(r) for r in synthetic.samples(pid, 1, t0, 5)]
    lines += [b"{not json\n", b"\xff\xfe garbage\n", b'{"no_type": 1}\n']
    lines += [protocol.encode(r) for r in synthetic.samples(pid, 1, t0 + 1, 5)]
    FakeAgent(sockdir, lines)
    src = LiveSource([pid], retry_s=0.2)
    app = make_app(src)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, lambda: app.snapshot.processes and app.snapshot.processes[0].state == DISCONNECTED, timeout=10)
        events = " ".join(e.text for e in app.snapshot.events)
        assert "malformed line" in events
        assert app.snapshot.processes[0].seq == 5  # samples after the garbage still arrived (seq restarts in 2nd batch)
        await pilot.press("1")
        await settle(pilot, app, lambda: app.snapshot.window_s == 60.0)
        assert "disconnected" in text_of(app.query_one("#header"))


async def test_replay_controls_and_truncated_file(tmp_path):
    path = tmp_path / "rec.jsonl"
    t0 = 1_000_000.0
    with open(path, "wb") as f:
        f.write(protocol.encode(synthetic.hello(3, 1, t0)))
        for rec in synthetic.samples(3, 1, t0, 100):
            f.write(protocol.encode(rec))
        f.write(b"{garbage line\n")
        f.write(b'{"type":"sample","t":1')  # truncated by a killed writer
    src = ReplaySource(str(path), start_playing=False)
    app = make_app(src)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        notices = app.model.snapshot().notices
        assert any("truncated" in n for n in notices) and any("malformed" in n for n in notices)
        await pilot.press("full_stop")
        await settle(pilot, app, lambda: app.snapshot.processes and app.snapshot.processes[0].seq == 1)
        await pilot.press("right")  # +10 s = 100 samples at 0.1 s: the end
        await settle(pilot, app, lambda: app.snapshot.processes[0].seq == 100)
        await pilot.press("left")
        await settle(pilot, app, lambda: app.snapshot.processes[0].seq < 100)
        assert "replay" in text_of(app.query_one("#header"))
        await pilot.press("plus")
        assert src.speed == 2.0
        await pilot.press("space")
        assert src.playing


async def test_a_snapshot_arriving_while_the_app_closes_is_dropped():
    # The snapshot thread may post one last snapshot as the app shuts down,
    # after the screen's widgets are gone: it must not raise out of the app.
    from jaxtop.dashboard.messages import SnapshotReady

    src = PushSource()
    app = make_app(src, refresh_s=0.1)
    async with app.run_test(size=SIZE) as pilot:
        src.push(9, {"type": "hello", "t": time.time(), "pid": 9, "argv": ["x.py"], "interval_s": 0.1, "backend": "cpu"})
        await settle(pilot, app)
        snap = app.build_snapshot()
        await app.query_one("#overview").remove()  # as at shutdown
        app.post_message(SnapshotReady(snap))
        await pilot.pause(0.2)
    assert app.return_code in (0, None)
