"""A full screen over the dashboard that draws one report of the shown
process (the Transfer sites screen, the Advice screen): a title line, the
report in a scrolling body, the footer. It polls ``fetch`` twice a second
(the model hands out the same view until something changed), redraws only
when what it got changed, and keeps no state of its own.
"""

from __future__ import annotations

from typing import Any, Callable

from rich.console import RenderableType
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

__all__ = ["REFRESH_S", "Draw", "Fetch", "ReportScreen"]

#: Seconds between two polls.
REFRESH_S = 0.5

#: Returns (the view, whether the process ended, the process's name).
Fetch = Callable[[], "tuple[Any, bool, str]"]
#: The report of a view: ``draw(view, ended)``.
Draw = Callable[[Any, bool], RenderableType]


class ReportScreen(Screen[None]):
    """Polls ``fetch`` and draws what ``draw`` makes of it.

    Subclasses name the screen (:attr:`NAME`, :attr:`ABOUT`), the ids of its
    parts (:attr:`PREFIX`: ``{PREFIX}-title``, ``-scroll``, ``-body``) and
    its bindings.

    Args:
        fetch: returns the view to draw (None: nothing yet), whether the
            process ended and its name for the title.
        draw: the report of a view (``draw(view, ended)``).
        refresh_s: seconds between polls; 0 never (tests).
    """

    NAME = ""
    ABOUT = ""
    PREFIX = "report"
    DEFAULT_CSS = """
    ReportScreen { layout: vertical; }
    ReportScreen .report-title { height: 1; }
    ReportScreen .report-scroll { height: 1fr; }
    ReportScreen .report-body { padding: 0 1; }
    """

    def __init__(self, fetch: Fetch, draw: Draw, refresh_s: float = REFRESH_S) -> None:
        super().__init__()
        self.fetch = fetch
        self.draw = draw
        self.refresh_s = refresh_s
        self.view: Any = None
        self._drawn: tuple[Any, ...] | None = None

    def compose(self) -> ComposeResult:
        yield Static(id=f"{self.PREFIX}-title", classes="report-title")
        with VerticalScroll(id=f"{self.PREFIX}-scroll", classes="report-scroll"):
            yield Static(id=f"{self.PREFIX}-body", classes="report-body")
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
            view, ended, name = self.fetch()
            notice = ""
        except Exception as exc:  # show, don't die
            view, ended, name, notice = None, False, "", f"{self.NAME.strip().lower()} view failed: {exc}"
        key = (ended, name, notice)
        if view is self.view and key == self._drawn and view is not None:
            return
        self._drawn = key
        self.view = view
        title = Text(f" {self.NAME} ", style="bold reverse")
        if name:
            title.append(f" {name}", style="bold")
        title.append(f"  {self.ABOUT}", style="dim")
        if notice:
            title.append(f"  {notice}", style="yellow")
        self.query_one(f"#{self.PREFIX}-title", Static).update(title)
        self.query_one(f"#{self.PREFIX}-body", Static).update(self.draw(view, ended))

    def action_close(self) -> None:
        self.dismiss(None)
