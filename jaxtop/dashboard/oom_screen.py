"""The OOM screen: the census a program took when it ran out of memory."""

from __future__ import annotations

from typing import Iterable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from jaxtop.dashboard.oom_views import OomCensus
from jaxtop.wire.records import OomCensus as CensusRecord
from jaxtop.widgets.oom import OomCensusView

__all__ = ["OomScreen"]

Census = OomCensus | CensusRecord
Censuses = Census | Iterable[Census] | None


def _views(censuses: Censuses) -> list[OomCensus]:
    """The censuses as views, oldest first; decoded records are turned into views."""
    if censuses is None:
        return []
    items = [censuses] if isinstance(censuses, (CensusRecord, OomCensus)) else list(censuses)
    return [OomCensus.from_wire(c) if isinstance(c, CensusRecord) else c for c in items]


class OomScreen(Screen[None]):
    """A whole screen for one process's OOM censuses, newest first.

    Args:
        censuses: a census (its view, or the decoded record), a list of them
            (oldest first, as they arrived), or None when there is none yet
            (the screen says so).
    """

    BINDINGS = [
        Binding("escape,q", "dismiss", "close", tooltip="Back to the dashboard"),
        Binding("n", "step(1)", "older", tooltip="The census before this one"),
        Binding("N", "step(-1)", "newer", tooltip="The census after this one"),
    ]
    DEFAULT_CSS = """
    OomScreen { layout: vertical; }
    OomScreen > VerticalScroll { height: 1fr; padding: 0 1; }
    """

    def __init__(self, censuses: Censuses) -> None:
        super().__init__()
        self.censuses: list[OomCensus] = _views(censuses)
        self.index = 0  # 0: the newest

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(self._view(), id="oom-census")
        yield Footer()

    def _view(self) -> OomCensusView:
        if not self.censuses:
            return OomCensusView(None)
        total = len(self.censuses)
        census = self.censuses[total - 1 - self.index]
        return OomCensusView(census, position=(self.index, total))

    def show(self, censuses: Censuses) -> None:
        """Show these censuses instead (a new one arrived); the newest first."""
        self.censuses = _views(censuses)
        self.index = 0
        self.query_one("#oom-census", Static).update(self._view())

    def action_step(self, delta: int) -> None:
        if not self.censuses:
            return
        self.index = (self.index + int(delta)) % len(self.censuses)
        self.query_one("#oom-census", Static).update(self._view())
