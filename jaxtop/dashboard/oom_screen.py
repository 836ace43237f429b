"""The OOM screen: the census a program took when it ran out of memory."""

from __future__ import annotations

from typing import Any, Iterable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from jaxtop.widgets.oom import OomCensusView

__all__ = ["OomScreen"]


class OomScreen(Screen[None]):
    """A whole screen for one process's OOM censuses, newest first.

    Args:
        censuses: a census dict, a list of them (oldest first, as they
            arrived), or None when there is none yet (the screen says so).
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

    def __init__(self, censuses: dict[str, Any] | Iterable[dict[str, Any]] | None) -> None:
        super().__init__()
        if censuses is None:
            self.censuses: list[dict[str, Any]] = []
        elif isinstance(censuses, dict):
            self.censuses = [censuses]
        else:
            self.censuses = [c for c in censuses if isinstance(c, dict)]
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

    def show(self, censuses: dict[str, Any] | Iterable[dict[str, Any]] | None) -> None:
        """Show these censuses instead (a new one arrived); the newest first."""
        self.censuses = [censuses] if isinstance(censuses, dict) else [c for c in censuses or [] if isinstance(c, dict)]
        self.index = 0
        self.query_one("#oom-census", Static).update(self._view())

    def action_step(self, delta: int) -> None:
        if not self.censuses:
            return
        self.index = (self.index + int(delta)) % len(self.censuses)
        self.query_one("#oom-census", Static).update(self._view())
