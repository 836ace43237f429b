"""Pilot layer: the real app on a pushed (fake) source; keys in, widget text out."""

from __future__ import annotations

import io
import json
import os
import socket
import threading
import time

import pytest
from rich.console import Console
from textual.actions import parse as parse_action
from textual.binding import Binding
from textual.command import CommandList
from textual.widgets import Static

from jaxtop.wire import protocol
from jaxtop.testing import synthetic
from jaxtop.dashboard.app import (
    LIVE_ACTIONS, NOT_IN_PALETTE, REPLAY_ACTIONS, HelpScreen, JaxtopApp, ProfileScreen, make_app,
)
from jaxtop.dashboard.model import DISCONNECTED
from jaxtop.dashboard.sources import LiveSource, PushSource, ReplaySource
from jaxtop.demo.app import DemoApp, Worker

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
        # A run shorter than the window: the title names the run's length.
        assert "1 min" in text_of(app.query_one("#header")) and "so far" in text_of(app.query_one("#timeline"))
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


# -- the action table: help, palette, footer ----------------------------------------
def declared_bindings(app_class) -> list[Binding]:
    """Every binding the app's classes declare, read from their BINDINGS."""
    out: list[Binding] = []
    for klass in reversed(app_class.__mro__):
        if issubclass(klass, JaxtopApp):
            out += [b if isinstance(b, Binding) else Binding(*b) for b in vars(klass).get("BINDINGS", ())]
    return out


def replay_file(tmp_path, count=100):
    path = tmp_path / "rec.jsonl"
    t0 = 1_000_000.0
    with open(path, "wb") as f:
        f.write(protocol.encode(synthetic.hello(3, 1, t0)))
        f.writelines(protocol.encode(rec) for rec in synthetic.samples(3, 1, t0, count))
    return str(path)


def dashboard_app(tmp_path):
    return make_app(PushSource())


class NoWorkload(Worker):
    """A workload that never starts: a key that restarts it only logs an error."""

    def start(self, timeout_s: float = 0.0) -> int:
        raise RuntimeError("no workload in this test")


def demo_app(tmp_path):
    return DemoApp(NoWorkload(), os.getpid())  # no agent at that pid: the view waits


def replay_app_on(tmp_path):
    return make_app(ReplaySource(replay_file(tmp_path), start_playing=False))


APPS = [dashboard_app, demo_app, replay_app_on]
APP_IDS = ["dashboard", "demo", "replay"]


def acts_with(app, binding: Binding) -> bool:
    """Whether the action acts with the app's source, by the rule the app states."""
    _, name, _ = parse_action(binding.action)
    if name in REPLAY_ACTIONS:
        return app.source.replays
    if name in LIVE_ACTIONS:
        return app.source.live
    return True


@pytest.mark.parametrize("make", APPS, ids=APP_IDS)
async def test_help_lists_every_key_of_the_app(make, tmp_path, sockdir):
    app = make(tmp_path)
    bindings = declared_bindings(type(app))
    assert len(bindings) >= 19
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await pilot.pause(0.1)
        assert isinstance(app.screen, HelpScreen)
        # Wide enough that no row wraps: one line per binding.
        console = Console(width=400, record=True, file=io.StringIO(), color_system=None)
        console.print(app.screen.query_one("#help-text").content)
        text = console.export_text()
        lines = [line.strip() for line in text.splitlines()]
        for b in bindings:
            assert b.description and b.tooltip, f"{b.key!r}: a key needs a description (footer) and a tooltip (help, palette)"
            keys = " ".join(app.get_key_display(Binding(key, b.action)) for key in b.key.split(","))
            if b.action.startswith("window("):
                # The four windows share one row: "1 2 3 4  Timeline window: 1 1 minute, ...".
                what = b.tooltip.split(": ", 1)[-1]
                assert any(line.startswith("1 2 3 4") and f"{keys} {what}" in line for line in lines), (keys, lines)
                continue
            assert any(line.startswith(keys) and line.endswith(b.tooltip) for line in lines), f"{keys!r} ({b.action}) not in help"
        assert "Memory layers: NVML used" in text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


@pytest.mark.parametrize("make", APPS, ids=APP_IDS)
async def test_palette_offers_each_action_that_acts(make, tmp_path, sockdir):
    app = make(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.1)
        commands = {c.title: c for c in app.get_system_commands(app.screen)}
        assert "Quit" in commands  # Textual's own stay
        for b in declared_bindings(type(app)):
            offered = b.action not in NOT_IN_PALETTE and acts_with(app, b)
            assert (b.tooltip in commands) == offered, b.action
        if app.source.replays:
            assert any("seek" in title for title in commands) and not any("Memory profile" in t for t in commands)
        else:
            assert not any("seek" in title for title in commands)

        # Through the palette itself: the command runs the action as its key does.
        assert app.window_s == 600.0
        await pilot.press("ctrl+p")
        await pilot.pause(0.2)
        await pilot.press(*"whole", "space", *"run")
        hits = app.screen.query_one(CommandList)

        def best() -> str:
            return "" if hits.highlighted is None else str(hits.get_option_at_index(hits.highlighted).prompt)

        # The search runs as we type: wait for the final hits before choosing.
        deadline = time.monotonic() + 5
        while not best().startswith("Timeline window: the whole run") and time.monotonic() < deadline:
            await pilot.pause(0.05)
        assert best().startswith("Timeline window: the whole run"), best()
        await pilot.press("enter")
        await settle(pilot, app, lambda: app.window_s is None)


class Calls:
    """Mixin: records every replay control the app calls, then does it."""

    def init_calls(self):
        self.calls: list[tuple] = []

    def toggle(self):
        self.calls.append(("toggle",))
        return super().toggle()

    def step(self, samples=1):
        self.calls.append(("step", samples))
        return super().step(samples)

    def seek_by(self, delta_s):
        self.calls.append(("seek_by", delta_s))
        return super().seek_by(delta_s)

    def scale_speed(self, factor):
        self.calls.append(("scale_speed", factor))
        return super().scale_speed(factor)


class SpyReplay(Calls, ReplaySource):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.init_calls()


class SpyPush(Calls, PushSource):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.init_calls()


REPLAY_KEYS = ["full_stop", "right", "left", "plus", "minus"]
REPLAY_CALLS = [("step", 1), ("seek_by", 10.0), ("seek_by", -10.0), ("scale_speed", 2.0), ("scale_speed", 0.5)]


def footer_actions(app) -> set[str]:
    return {key.action for key in app.query("FooterKey")}


async def test_replay_keys_call_the_source_and_show_in_the_footer(tmp_path):
    src = SpyReplay(replay_file(tmp_path), start_playing=False)
    app = make_app(src)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        shown = footer_actions(app)
        assert {"seek(-10)", "seek(10)", "step", "speed(2)", "speed(0.5)"} <= shown
        assert "profile" not in shown and "write" in shown  # a profile needs a live agent; a replay saves what it played
        for key in REPLAY_KEYS:
            await pilot.press(key)
        assert src.calls == REPLAY_CALLS
        assert src.speed == 1.0 and src.position > 0
        await pilot.press("space")
        assert src.calls[-1] == ("toggle",) and src.playing and not app.paused


async def test_replay_keys_are_no_ops_on_a_live_source(tmp_path):
    src = SpyPush()
    app = make_app(src)
    async with app.run_test(size=SIZE) as pilot:
        push_stream(src, n_devices=1, count=10)
        await settle(pilot, app, lambda: app.snapshot.processes and app.snapshot.processes[0].seq == 10)
        shown = footer_actions(app)
        assert {"profile", "write"} <= shown and not shown & {"seek(-10)", "seek(10)", "step", "speed(2)"}
        version = app.model.version
        for key in REPLAY_KEYS:
            await pilot.press(key)  # disabled: the source is not even asked
        assert src.calls == []
        # Run directly (as a subclass might), each asks the source, which declines.
        app.action_step()
        app.action_seek(10)
        app.action_seek(-10)
        app.action_speed(2)
        app.action_speed(0.5)
        assert src.calls == REPLAY_CALLS
        await pilot.pause(0.1)
        assert app.model.version == version and app.snapshot.processes[0].seq == 10
        assert (app.selected, app.window_s, app.paused) == (0, 600.0, False)
        await pilot.press("space")  # nothing plays: the app freezes its screen
        assert src.calls[-1] == ("toggle",) and app.paused


async def test_a_big_replay_is_shown_while_it_is_indexed_and_its_keys_seek_once_it_is(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXTOP_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "rec.jsonl"
    t0 = 1_000_000.0
    with open(path, "wb") as f:
        f.write(protocol.encode(synthetic.hello(3, 2, t0)))
        for rec in synthetic.samples(3, 2, t0, 3000):
            f.write(protocol.encode(rec))
    src = ReplaySource(str(path), start_playing=False, background_min_bytes=0)  # indexed by a separate process
    app = make_app(src)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("full_stop")
        await settle(pilot, app, lambda: app.snapshot.processes and app.snapshot.processes[0].seq == 1)
        await pilot.press("end")  # kept until the index is in, then done
        if src.index is None:
            header = text_of(app.query_one("#header"))
            assert "/?" in header and "indexing" in header, header
        await settle(pilot, app, lambda: app.snapshot.processes[0].seq == 3000, timeout=60)
        assert "indexing" not in text_of(app.query_one("#header"))
        await pilot.press("left_square_bracket")  # back a tenth: 30 s of 300
        await settle(pilot, app, lambda: app.snapshot.processes[0].seq == 2700)
        await pilot.press("home")
        await settle(pilot, app, lambda: app.snapshot.processes[0].seq == 1)
