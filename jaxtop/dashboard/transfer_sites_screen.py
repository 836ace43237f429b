"""The Transfer sites screen: every line of the program that made implicit
transfers, with its arguments, rates and recent history; the transfers not
tied to a line, with the reasons.

A full screen over the dashboard (``T``; ``escape``, ``q`` or ``T`` goes
back). It draws :class:`~jaxtop.widgets.transfer_sites.TransferSitesReport`
of whatever ``view_fn`` returns, polling it twice a second (the model
caches the view), and keeps no state of its own.
"""

from __future__ import annotations

from typing import Any, Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from jaxtop.dashboard.transfer_sites import TransferSitesView
from jaxtop.dashboard.views import DISCONNECTED, EXITED
from jaxtop.widgets.transfer_sites import TransferSitesReport

#: Seconds between two polls of the view.
REFRESH_S = 0.5

#: Returns (the view, whether the process ended, the process's name).
ViewFn = Callable[[], "tuple[TransferSitesView | None, bool, str]"]


class TransferSitesScreen(Screen[None]):
    """Which line makes each implicit transfer.

    Args:
        view_fn: returns the view to draw (None: nothing yet), whether the
            process ended (no current rate) and its name for the title.
        refresh_s: seconds between polls of ``view_fn``; 0 never (tests).
    """

    BINDINGS = [Binding("escape,q,T", "close", "back", tooltip="Back to the dashboard")]
    DEFAULT_CSS = """
    TransferSitesScreen { layout: vertical; }
    TransferSitesScreen #sites-title { height: 1; }
    TransferSitesScreen #sites-scroll { height: 1fr; }
    TransferSitesScreen #sites-body { padding: 0 1; }
    """

    def __init__(self, view_fn: ViewFn, refresh_s: float = REFRESH_S) -> None:
        super().__init__()
        self.view_fn = view_fn
        self.refresh_s = refresh_s
        self.view: TransferSitesView | None = None
        self._drawn: tuple[Any, ...] | None = None

    @classmethod
    def for_app(cls, app: Any) -> "TransferSitesScreen":
        """The screen for the process a running dashboard shows (its latest snapshot)."""

        def view_fn() -> tuple[TransferSitesView | None, bool, str]:
            snap = getattr(app, "snapshot", None)
            proc = snap.process_of(snap.device) if snap is not None and snap.processes else None
            if proc is None:
                return None, False, ""
            return proc.transfer_sites, proc.state in (EXITED, DISCONNECTED), proc.who

        return cls(view_fn)

    def compose(self) -> ComposeResult:
        yield Static(id="sites-title")
        with VerticalScroll(id="sites-scroll"):
            yield Static(id="sites-body")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_view()
        if self.refresh_s > 0:
            self.set_interval(self.refresh_s, self.refresh_view)

    def refresh_view(self) -> None:
        """Polls the view and redraws when it changed (not while the dashboard is paused)."""
        if getattr(self.app, "paused", False) and self.view is not None:
            return
        try:
            view, ended, name = self.view_fn()
            notice = ""
        except Exception as exc:  # show, don't die
            view, ended, name, notice = None, False, "", f"transfer sites view failed: {exc}"
        key = (ended, name, notice)
        if view is self.view and key == self._drawn and view is not None:
            return  # the model hands out the same view until something changed
        self._drawn = key
        self.view = view
        title = Text(" Transfer sites ", style="bold reverse")
        if name:
            title.append(f" {name}", style="bold")
        title.append("  which line makes each implicit transfer, with what", style="dim")
        if notice:
            title.append(f"  {notice}", style="yellow")
        self.query_one("#sites-title", Static).update(title)
        self.query_one("#sites-body", Static).update(TransferSitesReport(view, ended=ended))

    def action_close(self) -> None:
        self.dismiss(None)
