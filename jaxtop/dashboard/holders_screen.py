"""The Holders screen: memory by allocation site, leak suspects, named
pytrees and host syncs of one process.

The screen draws :class:`~jaxtop.widgets.holders.HoldersReport` of whatever
``view_fn`` returns, polling it twice a second (a cheap call: the model
caches the view), and sends the ``holders_mark`` / ``holders_profile`` /
``holders_who`` commands through ``send``. :meth:`HoldersScreen.for_app` wires both to a
running dashboard: the view of the process the dashboard shows, commands
through its source.
"""

from __future__ import annotations

from typing import Any, Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from jaxtop.dashboard.holders import HoldersView
from jaxtop.widgets.holders import HoldersReport

#: Seconds between two polls of the view.
REFRESH_S = 0.5

ViewFn = Callable[[], "HoldersView | None"]
SendFn = Callable[[str, dict], "str | None"]


def _as_view(value: Any) -> HoldersView | None:
    """A HoldersView from what a process carries (a view, or a fold with ``view()``)."""
    if value is None or isinstance(value, HoldersView):
        return value
    view = getattr(value, "view", None)
    return view() if callable(view) else None


class HoldersScreen(Screen[None]):
    """Who holds the memory, what grows, which lines sync with the host.

    Args:
        view_fn: returns the view to draw (None: nothing yet).
        send: sends a command to the process (``name, args``) and returns an
            error text or None; None disables the mark and profile keys.
        title: what the header names (the process), or a function returning it.
        refresh_s: seconds between polls of ``view_fn``.
    """

    BINDINGS = [
        Binding("escape,q,h", "close", "back", tooltip="Back to the dashboard"),
        Binding("m", "mark", "mark", tooltip="Mark now: every site then shows its change since this moment"),
        Binding("M", "clear_mark", "clear mark", show=False, tooltip="Remove the mark"),
        Binding("r", "profile", "profile now", tooltip="Take a memory profile now (at most one a second)"),
        Binding("k", "who", "who keeps", tooltip="Name what keeps the leak suspects' arrays alive, by the program's "
                "own names (walks the program's objects in pieces: a few ms to a second)"),
        # "d" and tab are the dashboard's own (priority) device keys.
        Binding("v", "device", "one device", tooltip="Show one device's bytes, the next, then all devices"),
    ]
    DEFAULT_CSS = """
    HoldersScreen { layout: vertical; }
    HoldersScreen #holders-title { height: 1; }
    HoldersScreen #holders-scroll { height: 1fr; }
    HoldersScreen #holders-body { padding: 0 1; }
    """

    def __init__(self, view_fn: ViewFn, send: SendFn | None = None, title: str | Callable[[], str] = "",
                 refresh_s: float = REFRESH_S) -> None:
        super().__init__()
        self.view_fn = view_fn
        self.send = send
        self.title_text = title
        self.refresh_s = refresh_s
        self.device: str | None = None
        self.view: HoldersView | None = None
        self.notice = ""
        self._drawn: tuple[Any, ...] | None = None

    @classmethod
    def for_app(cls, app: Any) -> "HoldersScreen":
        """The screen for the process a running dashboard shows.

        Reads ``holders`` of that process in the app's latest snapshot (a
        :class:`HoldersView`, or a fold with ``view()``) and sends commands
        through the app's source.
        """

        def target() -> Any:
            snap = getattr(app, "snapshot", None)
            if snap is None or not snap.processes:
                return None
            return snap.process_of(snap.device)

        def view_fn() -> HoldersView | None:
            proc = target()
            return _as_view(getattr(proc, "holders", None)) if proc is not None else None

        def send(name: str, args: dict) -> str | None:
            proc = target()
            if proc is None:
                return "no process"
            error = app.source.send_command(proc.pid, name, args)
            if error is None:
                app.model.add_event(proc.pid, "holders", f"{name} sent")
            return error

        def title() -> str:
            proc = target()  # the process may show up after the screen opened
            return f"pid {proc.pid}" if proc is not None else ""

        return cls(view_fn, send, title=title)

    def compose(self) -> ComposeResult:
        yield Static(id="holders-title")
        with VerticalScroll(id="holders-scroll"):
            yield Static(id="holders-body")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_view()
        self.set_interval(self.refresh_s, self.refresh_view)

    def refresh_view(self) -> None:
        """Polls the view and redraws when it (or the device shown) changed."""
        try:
            view = self.view_fn()
        except Exception as exc:  # show, don't die
            view = None
            self.notice = f"holders view failed: {exc}"
        try:
            name = self.title_text() if callable(self.title_text) else self.title_text
        except Exception:
            name = ""
        # The model hands out the same view object until something changed.
        key = (self.device, self.notice, name)
        if view is self.view and key == self._drawn and self.view is not None:
            return
        self._drawn = key
        self.view = view
        title = Text(" Holders ", style="bold reverse")
        if name:
            title.append(f" {name}", style="bold")
        if self.device is not None:
            title.append(f"  device {self.device}", style="bold cyan")
        title.append("  who holds the memory · what grows · host syncs", style="dim")
        if self.notice:
            title.append(f"  {self.notice}", style="yellow")
        self.query_one("#holders-title", Static).update(title)
        self.query_one("#holders-body", Static).update(HoldersReport(view, device=self.device))

    # -- actions ------------------------------------------------------------------------
    def action_close(self) -> None:
        self.dismiss(None)

    def _send(self, name: str, args: dict, done: str) -> None:
        if self.send is None:
            self.notice = "commands need a live process"
        else:
            error = self.send(name, args)
            self.notice = f"{name}: {error}" if error else done
        self.refresh_view()

    def action_mark(self) -> None:
        self._send("holders_mark", {}, "mark requested: changes since now appear with the next profile")

    def action_clear_mark(self) -> None:
        self._send("holders_mark", {"clear": True}, "mark removed")

    def action_profile(self) -> None:
        self._send("holders_profile", {}, "profile requested")

    def action_who(self) -> None:
        self._send("holders_who", {}, "who holds the suspects: asked (the answer comes as an event, and in the "
                   "leak advice)")

    def action_device(self) -> None:
        """All devices -> each device of the latest profile -> all devices."""
        names = sorted((self.view.by_device if self.view else {}).keys())
        if not names:
            self.device = None
        elif self.device not in names:
            self.device = names[0]
        else:
            i = names.index(self.device) + 1
            self.device = names[i] if i < len(names) else None
        self.refresh_view()
