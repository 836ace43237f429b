"""The Textual dashboard: ``make_app(source)`` builds it for any source."""

from __future__ import annotations

import os
import threading
import time
from functools import partial
from typing import Iterable

from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.command import Hit, Hits, Provider
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from jaxtop.dashboard.messages import SnapshotReady
from jaxtop.dashboard.model import Model, Snapshot
from jaxtop.dashboard.sources import LiveSource, ReplaySource, Source
from jaxtop.widgets.panels import (
    EventsPanel, FragmentationPanel, HeaderBar, HostPanel, MemoryMapPanel, MemoryPanel,
    OverviewPanel, Panel, TimelinePanel, TransfersPanel,
)
from jaxtop.widgets.render import fmt_bytes

WINDOWS = {"1": 60.0, "2": 600.0, "3": 3600.0, "4": None}
# Redraws per second are what the dashboard's CPU scales with (Textual
# renders every panel on each snapshot); samples arrive at 10 Hz regardless
# and all of them go into the history. Keys redraw at once. 2 s is nvitop's
# default too; benchmarks/tui.py measures the cost (docs/benchmarks.md).
DEFAULT_REFRESH_S = 2.0
AGE_REFRESH_S = 1.0

HELP = """\
[b]jaxtop[/b] — top for JAX memory

[b]q[/b]        quit                       [b]space[/b]    pause (live) / play-pause (replay)
[b]tab d[/b]    next device (then overview) [b]shift+tab[/b] previous device
[b]o[/b]        all-devices overview        [b]1 2 3 4[/b]  window: 1 min, 10 min, 1 h, whole run
[b]s[/b]        memory profile snapshot (saved file + top allocation sites)
[b]w[/b]        write the session to a JSON-lines file
[b]p[/b]        show the last memory profile
[b]← →[/b]      replay: seek ∓10 s          [b].[/b]        replay: step one sample
[b]+ -[/b]      replay: speed ×2 / ÷2       [b]?[/b]        this help
[b]ctrl+p[/b]   command palette

Memory layers: NVML used ≥ allocator pool ≥ bytes in use ≥ live arrays.
With the default GPU allocator JAX preallocates 75 % of the card: NVML shows
the pool, not what your arrays use. On CPU there is no allocator pool; sizes
come from jax.live_arrays(). Transfer bytes are a lower bound (cached jit calls
log no shapes). n/a always comes with the reason.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90%; max-width: 100; height: 80%; border: round $accent; background: $surface; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(HELP, id="help-text")


class ProfileScreen(ModalScreen[None]):
    """The last device memory profile: file and top allocation sites."""

    BINDINGS = [Binding("escape,q,p", "dismiss", "close")]
    DEFAULT_CSS = """
    ProfileScreen { align: center middle; }
    ProfileScreen > VerticalScroll { width: 95%; height: 85%; border: round $accent; background: $surface; padding: 0 1; }
    """

    def __init__(self, profile: dict | None) -> None:
        super().__init__()
        self.profile = profile

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(self._render_profile(), id="profile-text")

    def _render_profile(self):
        p = self.profile
        if not p:
            return Text("No memory profile yet: press s to take one.", style="dim")
        if p.get("error"):
            return Text(f"Memory profile failed: {p['error']}", style="red")
        table = Table(title=f"{p.get('path')}  ·  total {fmt_bytes(p.get('total_bytes'))}", expand=True)
        table.add_column("bytes", justify="right")
        table.add_column("allocs", justify="right")
        table.add_column("allocation site")
        for site in p.get("top_sites") or []:
            table.add_row(fmt_bytes(site.get("bytes")), str(site.get("allocations", "")), str(site.get("site")))
        return table


class JaxtopCommands(Provider):
    """Dashboard actions in Textual's command palette."""

    async def search(self, query: str) -> Hits:
        app = self.app
        assert isinstance(app, JaxtopApp)
        matcher = self.matcher(query)
        actions = [
            ("Next device", app.action_next_device, "show the next device"),
            ("All-devices overview", app.action_overview, "every device side by side"),
            ("Window: 1 minute", partial(app.action_window, "1"), "timeline window"),
            ("Window: 10 minutes", partial(app.action_window, "2"), "timeline window"),
            ("Window: 1 hour", partial(app.action_window, "3"), "timeline window"),
            ("Window: whole run", partial(app.action_window, "4"), "timeline window"),
            ("Memory profile snapshot", app.action_profile, "device memory profile from the agent"),
            ("Write session to file", app.action_write, "JSON lines, readable by jaxtop replay"),
            ("Pause / resume", app.action_pause, ""),
            ("Help", app.action_help, "keys and what the panels mean"),
        ]
        for name, callback, help_text in actions:
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)


class JaxtopApp(App[None]):
    """Live or replayed view of one or more jaxtop agents."""

    TITLE = "jaxtop"
    COMMANDS = App.COMMANDS | {JaxtopCommands}
    CSS = """
    Screen { layout: vertical; }
    #header { height: 2; }
    #main { height: 1fr; }
    #left, #right { width: 1fr; }
    #memory { height: 6; }
    #frag { height: 2; }
    #map { height: 1fr; min-height: 3; }
    #host { height: 4; }
    #timeline { height: 1fr; min-height: 6; }
    #transfers { height: 7; }
    #overview { height: 1fr; display: none; }
    #events { height: 5; }
    Panel { padding: 0 1 0 0; }
    """
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("space", "pause", "pause"),
        Binding("tab,d", "next_device", "device", priority=True),
        Binding("shift+tab", "prev_device", "prev device", show=False, priority=True),
        Binding("o", "overview", "overview", show=False),
        Binding("1", "window('1')", "1m", show=False),
        Binding("2", "window('2')", "10m", show=False),
        Binding("3", "window('3')", "1h", show=False),
        Binding("4", "window('4')", "all", show=False),
        Binding("s", "profile", "profile"),
        Binding("w", "write", "write"),
        Binding("p", "show_profile", "last profile", show=False),
        Binding("left", "seek(-10)", "seek", show=False),
        Binding("right", "seek(10)", "seek", show=False),
        Binding("full_stop", "step", "step", show=False),
        Binding("plus,equals_sign", "speed(2)", "faster", show=False),
        Binding("minus", "speed(0.5)", "slower", show=False),
        Binding("question_mark", "help", "help"),
    ]

    def __init__(self, source: Source, model: Model | None = None, save_dir: str | None = None,
                 refresh_s: float = DEFAULT_REFRESH_S) -> None:
        super().__init__()
        self.source = source
        self.refresh_s = refresh_s
        self.model = model or Model()
        self.save_dir = save_dir or os.getcwd()
        self.selected = 0
        self.window_s: float | None = 600.0
        self.paused = False
        self.snapshot: Snapshot | None = None
        self._pump_stop = threading.Event()
        self._pump_poke = threading.Event()
        self._pump: threading.Thread | None = None

    # -- layout ------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield HeaderBar(id="header")
        yield from self.compose_extra()
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield MemoryPanel(id="memory")
                yield FragmentationPanel(id="frag")
                yield MemoryMapPanel(id="map")
                yield HostPanel(id="host")
            with Vertical(id="right"):
                yield TimelinePanel(id="timeline")
                yield TransfersPanel(id="transfers")
        yield OverviewPanel(id="overview")
        yield EventsPanel(id="events")
        yield Footer()

    def compose_extra(self) -> ComposeResult:
        """Panels a subclass puts between the header and the main area."""
        return iter(())

    def on_mount(self) -> None:
        self.source.start(self.model, self._poke)
        self._pump = threading.Thread(target=self._pump_loop, name="jaxtop-snapshots", daemon=True)
        self._pump.start()

    def on_unmount(self) -> None:
        self._pump_stop.set()
        self._pump_poke.set()
        self.source.stop()

    # -- snapshots: built on the pump thread, posted as one message ------------
    def _poke(self) -> None:
        self._pump_poke.set()

    def _pump_loop(self) -> None:
        last_version = -1
        last_post = 0.0
        while not self._pump_stop.is_set():
            self._pump_poke.wait(AGE_REFRESH_S)
            self._pump_poke.clear()
            if self._pump_stop.is_set():
                return
            self.model.refresh_states()
            now = time.monotonic()
            if self.model.version == last_version and now - last_post < AGE_REFRESH_S:
                continue
            wait = self.refresh_s - (now - last_post)
            if wait > 0:
                self._pump_stop.wait(wait)
            last_version = self.model.version
            last_post = time.monotonic()
            try:
                snap = self.build_snapshot()
            except Exception as exc:  # show, don't die
                self.call_from_thread(self.notify, f"snapshot failed: {exc}", severity="error")
                continue
            self.post_message(SnapshotReady(snap))

    def build_snapshot(self) -> Snapshot:
        return self.model.snapshot(
            selected=self.selected,
            window_s=self.window_s,
            replay=self.source.replay_state(),
        )

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        if self.paused and self.source.kind == "live":
            return
        try:
            self.show(message.snapshot)
        except NoMatches:
            # The app is closing: its widgets went before this message, which
            # the snapshot thread posted just before it stopped.
            pass

    def show(self, snap: Snapshot) -> None:
        self.snapshot = snap
        overview = snap.selected < 0 and bool(snap.devices)
        self.query_one("#main").display = not overview
        self.query_one("#overview").display = overview
        with self.batch_update():
            for panel in self.query(Panel):
                panel.snapshot = snap

    def refresh_now(self) -> None:
        """Rebuild after a key changed the view (UI thread, immediate)."""
        self.show(self.build_snapshot())

    # -- actions -------------------------------------------------------------------
    def action_pause(self) -> None:
        if isinstance(self.source, ReplaySource):
            playing = self.source.toggle()
            self.notify("playing" if playing else "paused", timeout=1.5)
        else:
            self.paused = not self.paused
            self.query_one(HeaderBar).paused = self.paused
        self.refresh_now()

    def _device_count(self) -> int:
        return len(self.model.device_keys())

    def _step_device(self, delta: int) -> None:
        """Cycle through devices 0..n-1, then the overview (-1), and round."""
        n = self._device_count()
        if n:
            pos = n if self.selected < 0 else self.selected
            pos = (pos + delta) % (n + 1)
            self.selected = -1 if pos == n else pos
        self.refresh_now()

    def action_next_device(self) -> None:
        self._step_device(1)

    def action_prev_device(self) -> None:
        self._step_device(-1)

    def action_overview(self) -> None:
        self.selected = 0 if self.selected < 0 else -1
        self.refresh_now()

    def action_window(self, key: str) -> None:
        self.window_s = WINDOWS[key]
        self.refresh_now()

    def _target_pid(self) -> int | None:
        snap = self.snapshot
        dev = snap.device if snap else None
        if dev is not None:
            return dev.pid
        pids = self.source.pids
        return pids[0] if pids else None

    def action_profile(self) -> None:
        pid = self._target_pid()
        if pid is None:
            return
        error = self.source.send_command(pid, "memory_profile", {})
        if error:
            self.model.add_event(pid, "error", f"memory profile: {error}")
            self.notify(f"memory profile: {error}", severity="warning")
        else:
            self.model.add_event(pid, "profile", "memory profile requested…")
            self.notify("memory profile requested; p shows it when it arrives", timeout=3)
        self.refresh_now()

    def action_show_profile(self) -> None:
        pid = self._target_pid()
        proc = next((p for p in (self.snapshot.processes if self.snapshot else ()) if p.pid == pid), None)
        self.push_screen(ProfileScreen(proc.last_profile if proc else None))

    def action_write(self) -> None:
        pid = self._target_pid() or 0
        name = f"jaxtop-{pid}-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
        path = os.path.join(self.save_dir, name)
        try:
            written = self.source.save(path)
        except OSError as exc:
            self.model.add_event(pid, "error", f"could not write session: {exc}")
            self.notify(f"could not write session: {exc}", severity="error")
        else:
            self.model.add_event(pid, "info", f"session written to {', '.join(written)}")
            self.notify(f"session written to {', '.join(written)}", timeout=4)
        self.refresh_now()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_seek(self, delta: float) -> None:
        if isinstance(self.source, ReplaySource):
            self.source.seek(self.source.current_t() + float(delta))

    def action_step(self) -> None:
        if isinstance(self.source, ReplaySource):
            self.source.step(1)

    def action_speed(self, factor: float) -> None:
        if isinstance(self.source, ReplaySource):
            self.source.set_speed(self.source.speed * float(factor))
            self.refresh_now()


def make_app(source: Source, model: Model | None = None, save_dir: str | None = None,
             refresh_s: float = DEFAULT_REFRESH_S) -> JaxtopApp:
    """Build the dashboard for any source (live agents, a recording, a fake)."""
    return JaxtopApp(source, model, save_dir, refresh_s=refresh_s)


def live_app(pids: Iterable[int], refresh_s: float = DEFAULT_REFRESH_S, external: Iterable[int] = ()) -> JaxtopApp:
    """The dashboard on running agents; ``external`` pids are watched from outside."""
    return make_app(LiveSource(list(pids), external=external), refresh_s=refresh_s)


def replay_app(path: str, speed: float = 1.0, refresh_s: float = DEFAULT_REFRESH_S) -> JaxtopApp:
    return make_app(ReplaySource(path, speed=speed), refresh_s=refresh_s)
