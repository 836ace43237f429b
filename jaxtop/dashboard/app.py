"""The Textual dashboard: ``make_app(source)`` builds it for any source."""

from __future__ import annotations

import gc
import os
import threading
import time
from functools import partial
from typing import Any, Iterable

from textual import events
from textual.actions import parse as parse_action
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer

from jaxtop.dashboard.advice_screen import AdviceScreen
from jaxtop.dashboard.collector import tune_gc
from jaxtop.dashboard.holders_screen import HoldersScreen
from jaxtop.dashboard.jit_screen import JitScreen
from jaxtop.dashboard.messages import SnapshotReady
from jaxtop.dashboard.modals import HelpScreen, ProfileScreen
from jaxtop.dashboard.model import Model, Snapshot
from jaxtop.dashboard.oom_screen import OomScreen
from jaxtop.dashboard.sources import LiveSource, ReplaySource, Source
from jaxtop.dashboard.transfer_sites_screen import TransferSitesScreen
from jaxtop.dashboard.web import WebDeliveries
from jaxtop.widgets.panels import (
    EventsPanel, FragmentationPanel, HeaderBar, HostPanel, LoadingLine, MemoryMapPanel, MemoryPanel,
    OverviewPanel, Panel, TimelinePanel, TransfersPanel,
)

WINDOWS = {"1": 60.0, "2": 600.0, "3": 3600.0, "4": None}
# Redraws per second are what the dashboard's CPU scales with (Textual
# renders every panel on each snapshot); samples arrive at 10 Hz regardless
# and all of them go into the history. Keys redraw at once. 2 s is nvitop's
# default too; benchmarks/tui.py measures the cost (docs/benchmarks.md).
DEFAULT_REFRESH_S = 2.0
# Input a user waits to see answered (mouse moves are not: they come by the
# hundred and answer nothing).
_ANSWERED_INPUT = (events.Key, events.MouseDown, events.MouseScrollDown, events.MouseScrollUp)
# The longest a thread feeding the model waits for the UI to answer a key
# before it feeds one more batch: keys held down must not stop a backlog.
INPUT_YIELD_S = 0.1
AGE_REFRESH_S = 1.0

#: Footer groups: one label for a pair of keys ("←→ seek", "+- speed").
SEEK_KEYS = Binding.Group("seek", compact=True)
SPEED_KEYS = Binding.Group("speed", compact=True)
#: Actions that act on a recording's playback: offered while the source replays.
REPLAY_ACTIONS = frozenset({"seek", "seek_fraction", "seek_to", "step", "speed"})
#: Actions that need running agents: offered while the source is live.
LIVE_ACTIONS = frozenset({"profile", "holders_mark"})
#: Help lists these first, in this order (the screens a key opens), then the rest.
HELP_FIRST = {name: i for i, name in enumerate(("quit", "help", "jit", "holders", "holders_mark", "oom",
                                                 "transfer_sites", "show_profile", "profile", "write", "pause"))}
#: Actions the command palette does not list: Textual's own entries already
#: cover them (Quit), or they are the palette itself.
NOT_IN_PALETTE = frozenset({"quit", "command_palette"})


class JaxtopApp(App[None]):
    """Live or replayed view of one or more jaxtop agents."""

    TITLE = "jaxtop"
    # Short terminals (80x24) give the timelines the lines that the
    # transfer table's last two (top shape, PCIe) and one event line take
    # on taller ones: three strips need at least 2 lines each. While the
    # agent names the lines that make transfers (TransfersPanel's "-sites"),
    # the panel takes the lines they need, up to a third of the column
    # (two lines more than without them at 80x24).
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]
    CSS = """
    Screen { layout: vertical; }
    #header { height: 2; }
    #main { height: 1fr; }
    #left, #right { width: 1fr; }
    #memory { height: 6; }
    #frag { height: 3; }
    #map { height: 1fr; min-height: 3; }
    #host { height: 4; }
    #timeline { height: 1fr; min-height: 6; }
    #transfers { height: 7; }
    #transfers.-sites { max-height: 38%; }
    #overview { height: 1fr; display: none; }
    #events { height: 5; }
    Screen.-short #transfers { height: 5; }
    Screen.-short #transfers.-sites { max-height: 7; }
    Screen.-short #events { height: 4; }
    Panel { padding: 0 1 0 0; }
    """
    # The one table of the app's actions. Each binding is declared once here
    # (a subclass adds its own in its BINDINGS); the footer, the help screen
    # and the command palette all read it: ``description`` is the footer's
    # short label, ``tooltip`` the sentence in help and the palette.
    BINDINGS = [
        Binding("q", "quit", "quit", tooltip="Quit jaxtop"),
        Binding("space", "pause", "pause",
                tooltip="Pause: freeze the screen (live) or play / pause (replay)"),
        Binding("tab,d", "next_device", "device", priority=True,
                tooltip="Next device (after the last one: the all-devices overview)"),
        Binding("shift+tab", "prev_device", "prev device", show=False, priority=True, tooltip="Previous device"),
        Binding("o", "overview", "overview", show=False, tooltip="All-devices overview, or back to one device"),
        Binding("1", "window('1')", "1m", show=False, tooltip="Timeline window: 1 minute"),
        Binding("2", "window('2')", "10m", show=False, tooltip="Timeline window: 10 minutes"),
        Binding("3", "window('3')", "1h", show=False, tooltip="Timeline window: 1 hour"),
        Binding("4", "window('4')", "all", show=False, tooltip="Timeline window: the whole run"),
        Binding("s", "profile", "profile", tooltip="Memory profile snapshot (saved file + top allocation sites)"),
        Binding("w", "write", "write", tooltip="Write the session to a JSON-lines file (jaxtop replay reads it)"),
        Binding("p", "show_profile", "last profile", show=False, tooltip="Show the last memory profile"),
        # The "why" screens: upper case, so they never take a key a
        # subclass (the demo) uses for its own rows.
        Binding("J", "jit", "jit", show=False,
                tooltip="Jit ledger: each compiled function's memory, compiles and recompile reasons"),
        Binding("H", "holders", "holders", show=False,
                tooltip="Holders: memory by allocation site, leak suspects, named pytrees, host syncs"),
        Binding("M", "holders_mark", "mark", show=False,
                tooltip="Mark now: the Holders screen then shows each site's change since this moment"),
        Binding("O", "oom", "OOM", show=False,
                tooltip="Out-of-memory census: what held the memory when the program ran out"),
        Binding("T", "transfer_sites", "transfer sites", show=False,
                tooltip="Transfer sites: which line makes each implicit transfer, with what, and its history"),
        Binding("A", "advice", "advice", show=False,
                tooltip="Advice: which line misses which memory strategy, with the evidence, the gain and the fix"),
        Binding("left", "seek(-10)", "-10s", group=SEEK_KEYS, tooltip="Replay: seek back 10 s"),
        Binding("right", "seek(10)", "+10s", group=SEEK_KEYS, tooltip="Replay: seek forward 10 s"),
        Binding("left_square_bracket", "seek_fraction(-0.1)", "-10%", show=False, tooltip="Replay: seek back a tenth of the recording"),
        Binding("right_square_bracket", "seek_fraction(0.1)", "+10%", show=False,
                tooltip="Replay: seek forward a tenth of the recording"),
        Binding("home", "seek_to(0)", "start", show=False, tooltip="Replay: seek to the start"),
        Binding("end", "seek_to(1)", "end", show=False, tooltip="Replay: seek to the end"),
        Binding("full_stop", "step", "step", tooltip="Replay: step one sample (and pause)"),
        Binding("plus,equals_sign", "speed(2)", "faster", group=SPEED_KEYS, tooltip="Replay: speed ×2"),
        Binding("minus", "speed(0.5)", "slower", group=SPEED_KEYS, tooltip="Replay: speed ÷2"),
        Binding("question_mark", "help", "help", tooltip="Help: keys and what the panels mean"),
        # Textual binds ctrl+p itself unless an app does: declared here, it is
        # listed in help like every other key.
        Binding(App.COMMAND_PALETTE_BINDING, "command_palette", "palette", show=False, priority=True,
                tooltip="Command palette: every action by name"),
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
        self._loading: tuple[int, float] | None = None  # (samples in, seconds behind) while a backlog loads
        # Clear from a key (or click) until the screen has been drawn after it;
        # feeding threads wait on it (Model.pace).
        self._ui_idle = threading.Event()
        self._ui_idle.set()
        self._ui_thread: int | None = None
        self._tune_gc = False  # run_as_main: freeze the mounted widgets too
        self.web = WebDeliveries(self)  # in a browser (jaxtop serve): files go to it as downloads

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
        loading = LoadingLine(id="loading")
        loading.display = False  # shown only while a backlog loads
        yield loading
        yield Footer()

    def compose_extra(self) -> ComposeResult:
        """Panels a subclass puts between the header and the main area."""
        return iter(())

    def run_as_main(self) -> Any:
        """Run the app as its process's main job (the CLI's and the demo's
        way), the collector tuned for it (:func:`tune_gc`)."""
        self._tune_gc = True
        tune_gc()
        return self.run()

    def on_mount(self) -> None:
        if self._tune_gc:
            gc.freeze()
        self._ui_thread = threading.get_ident()
        self.model.pace = self._yield_to_input
        self.source.start(self.model, self._poke)
        self._pump = threading.Thread(target=self._pump_loop, name="jaxtop-snapshots", daemon=True)
        self._pump.start()

    def on_unmount(self) -> None:
        if self.model.pace == self._yield_to_input:
            self.model.pace = None
        self._ui_idle.set()
        self._pump_stop.set()
        self._pump_poke.set()
        self.source.stop()
        self.web.close()  # the temporary files of browser downloads (jaxtop serve)

    # -- input first: a backlog's reader steps aside while a key is answered ----
    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, _ANSWERED_INPUT) and not event.is_forwarded:
            self._ui_idle.clear()
            # Runs once the screen has been refreshed after this key (at once
            # if nothing needed drawing); set at unmount too.
            self.call_after_refresh(self._ui_idle.set)
        await super().on_event(event)

    def _yield_to_input(self) -> None:
        """Model.pace: on a feeding thread, wait while a key is being answered."""
        if not self._ui_idle.is_set() and threading.get_ident() != self._ui_thread:
            self._ui_idle.wait(INPUT_YIELD_S)

    # -- snapshots: built on the pump thread, posted as one message ------------
    def _poke(self) -> None:
        self._pump_poke.set()

    def _pump_loop(self) -> None:
        last_version = -1
        last_post = 0.0
        was_loading = False
        last_milestone = self.model.milestone
        while not self._pump_stop.is_set():
            self._pump_poke.wait(AGE_REFRESH_S)
            self._pump_poke.clear()
            if self._pump_stop.is_set():
                return
            self.model.refresh_states()
            now = time.monotonic()
            if self.model.version == last_version and now - last_post < AGE_REFRESH_S:
                continue
            loading = self.model.loading()
            # The frame that completes a backlog goes out at once: waiting
            # for the redraw period would show the backfill up to refresh_s late.
            # So does one after a milestone (an agent's coarse history is in,
            # behind its present: the first complete frame).
            caught_up = (was_loading and loading is None) or self.model.milestone != last_milestone
            was_loading = loading is not None
            wait = self.refresh_s - (now - last_post)
            if wait > 0 and not caught_up:
                # Wait out the redraw period, but not past the end of a
                # backlog: its completing frame goes out the moment it is in.
                # A backlog may also start and end within one wait (an
                # agent's backfill takes well under the redraw period).
                deadline = now + wait
                seen_loading = was_loading
                while not self._pump_stop.is_set():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._pump_poke.wait(min(left, 0.05))
                    self._pump_poke.clear()
                    if self.model.milestone != last_milestone:
                        break
                    if self.model.loading() is not None:
                        seen_loading = True
                    elif seen_loading:
                        # Caught up: the newest samples are current. Let the
                        # reader put in what is left of the backlog (its last
                        # reads come back to back) before drawing it.
                        settle = time.monotonic() + 0.5
                        while self._pump_poke.wait(0.05) and time.monotonic() < settle:
                            self._pump_poke.clear()
                        break
                if self._pump_stop.is_set():
                    return
                loading = self.model.loading()
                was_loading = loading is not None
            self._loading = loading
            last_version = self.model.version
            last_milestone = self.model.milestone
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
        if self.paused:
            return
        try:
            self.show(message.snapshot)
        except NoMatches:
            # The app is closing: its widgets went before this message, which
            # the snapshot thread posted just before it stopped.
            pass

    def show(self, snap: Snapshot) -> None:
        self.snapshot = snap
        if self.web.active:
            self.web.on_snapshot(snap)  # a memory profile goes to the browser
        indicator = self.query_one("#loading", LoadingLine)
        loading = self._loading
        indicator.display = loading is not None
        if loading is not None:
            indicator.text = f" loading backlog: {loading[0]:,} samples in, {loading[1]:,.0f} s behind"
        overview = snap.selected < 0 and bool(snap.devices)
        self.query_one("#main").display = not overview
        self.query_one("#overview").display = overview
        with self.batch_update():
            for panel in self.query(Panel):
                panel.snapshot = snap

    def refresh_now(self) -> None:
        """Rebuild after a key changed the view (UI thread, immediate)."""
        self.show(self.build_snapshot())

    # -- the action table: footer, help and palette ------------------------------
    @classmethod
    def action_table(cls) -> list[Binding]:
        """Every binding this app declares, the dashboard's first, then a subclass's.

        Textual's own defaults (ctrl+q, ctrl+c) are left out: they are not
        this app's actions.
        """
        table: list[Binding] = []
        for klass in reversed(cls.__mro__):
            if issubclass(klass, JaxtopApp) and "BINDINGS" in vars(klass):
                table.extend(b if isinstance(b, Binding) else Binding(*b) for b in vars(klass)["BINDINGS"])
        return table

    def keys_shown(self, binding: Binding) -> str:
        """All keys of a binding, each as Textual displays it ("tab d", "+ =")."""
        if binding.key_display:
            return binding.key_display
        return " ".join(self.get_key_display(binding.with_key(key.strip())) for key in binding.key.split(","))

    def applies(self, binding: Binding) -> bool:
        """Whether the binding's action acts with this source (see check_action)."""
        _, name, parameters = parse_action(binding.action)
        return bool(self.check_action(name, parameters))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Hide and disable the actions that do not act with this source.

        Replay controls need a source that replays; a memory profile and
        writing the session need a live one. Textual asks this for the
        footer and before running any action; help and the palette ask too.
        """
        if action in REPLAY_ACTIONS:
            return self.source.replays
        if action in LIVE_ACTIONS:
            return self.source.live
        return True

    def help_rows(self) -> list[tuple[str, str, bool]]:
        """The help screen's key list: one row per binding of the table, the
        keys that open a screen first and the four timeline windows as one
        row, so that at 80x24 the screens are above the fold; keys that do
        nothing with this source last."""
        rows, windows = [], []
        for b in self.action_table():
            if b.action.startswith("window("):
                windows.append((self.keys_shown(b), (b.tooltip or b.description).split(": ", 1)[-1]))
                continue
            rows.append((HELP_FIRST.get(parse_action(b.action)[1], len(HELP_FIRST)), self.keys_shown(b),
                         b.tooltip or b.description, self.applies(b)))
        if windows:
            rows.append((len(HELP_FIRST), " ".join(k for k, _ in windows),
                         "Timeline window: " + ", ".join(f"{k} {what}" for k, what in windows), True))
        rows.sort(key=lambda r: (not r[3], r[0]))  # stable: the table's order within a rank
        return [(keys, text, active) for _, keys, text, active in rows]

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Textual's commands, then each action of the table that acts now.

        A command runs its action as its key does (``run_action``), so the
        palette and the key cannot drift apart.
        """
        yield from super().get_system_commands(screen)
        for binding in self.action_table():
            if binding.action in NOT_IN_PALETTE or not self.applies(binding):
                continue
            yield SystemCommand(binding.tooltip or binding.description, f"key: {self.keys_shown(binding)}",
                                partial(self.run_action, binding.action))

    # -- actions -------------------------------------------------------------------
    def action_pause(self) -> None:
        playing = self.source.toggle()
        if playing is None:
            # Nothing plays: pausing freezes this screen while records keep
            # arriving into the model (unpausing shows the latest at once).
            self.paused = not self.paused
            self.query_one(HeaderBar).paused = self.paused
        else:
            self.notify("playing" if playing else "paused", timeout=1.5)
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
        # In a browser the profile is written where WebDeliveries sends files from.
        error = self.source.send_command(pid, "memory_profile", self.web.profile_args())
        if error:
            self.model.add_event(pid, "error", f"memory profile: {error}")
            self.notify(f"memory profile: {error}", severity="warning")
        else:
            self.web.profile_requested()
            self.model.add_event(pid, "profile", "memory profile requested…")
            self.notify("memory profile requested; p shows it when it arrives", timeout=3)
        self.refresh_now()

    def _target_process(self):
        pid = self._target_pid()
        return next((p for p in (self.snapshot.processes if self.snapshot else ()) if p.pid == pid), None)

    def action_jit(self) -> None:
        self.push_screen(JitScreen.for_store(self.model.ledgers, self._target_pid(),
                                             send_command=self.source.send_command, live=self.source.live))

    def action_holders(self) -> None:
        self.push_screen(HoldersScreen.for_app(self))

    def action_holders_mark(self) -> None:
        pid = self._target_pid()
        if pid is None:
            return
        error = self.source.send_command(pid, "holders_mark", {})
        self.model.add_event(pid, "holders", f"mark: {error}" if error else "mark set: H shows each site's change since now")
        self.refresh_now()

    def action_oom(self) -> None:
        proc = self._target_process()
        self.push_screen(OomScreen(proc.oom_censuses if proc else None))

    def action_advice(self) -> None:
        self.push_screen(AdviceScreen.for_app(self))

    def action_transfer_sites(self) -> None:
        self.push_screen(TransferSitesScreen.for_app(self))

    def action_show_profile(self) -> None:
        pid = self._target_pid()
        proc = next((p for p in (self.snapshot.processes if self.snapshot else ()) if p.pid == pid), None)
        self.push_screen(ProfileScreen(proc.last_profile if proc else None))

    def action_write(self) -> None:
        pid = self._target_pid() or 0
        name = f"jaxtop-{pid}-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
        path = os.path.join(self.web.session_dir() if self.web.active else self.save_dir, name)
        try:
            written = self.source.save(path)
            if self.web.active:
                self.web.deliver(written)  # to the browser, not a file on the server
        except OSError as exc:
            self.model.add_event(pid, "error", f"could not write session: {exc}")
            self.notify(f"could not write session: {exc}", severity="error")
        else:
            self.model.add_event(pid, "info", f"session written to {', '.join(written)}")
            self.notify(f"session written to {', '.join(written)}", timeout=4)
        self.refresh_now()

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.help_rows()))

    # Replay controls: the source answers None where nothing plays, and the
    # source's own update redraws after a seek or a step.
    def action_seek(self, delta: float) -> None:
        self.source.seek_by(float(delta))

    def action_seek_fraction(self, delta: float) -> None:
        self.source.seek_fraction(float(delta), relative=True)

    def action_seek_to(self, fraction: float) -> None:
        self.source.seek_fraction(float(fraction))

    def action_step(self) -> None:
        self.source.step(1)

    def action_speed(self, factor: float) -> None:
        if self.source.scale_speed(float(factor)) is not None:
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
