"""The Advice screen: the strategies the program misses, line by line, with
the evidence, the gain and the fix (:mod:`jaxtop.advice`).

A full screen over the dashboard (``A``; ``escape``, ``q`` or ``A`` goes
back). It draws the advisor's report on the shown process as the model
last evaluated it (at most once a second), polling it twice a second, and
keeps no state of its own.
"""

from __future__ import annotations

from typing import Any, Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from jaxtop.advice import Report
from jaxtop.dashboard.views import DISCONNECTED, EXITED
from jaxtop.widgets.advice import advice_text

#: Seconds between two polls of the report.
REFRESH_S = 0.5

#: Returns (the report, whether the process ended, the process's name).
ReportFn = Callable[[], "tuple[Report | None, bool, str]"]


class AdviceScreen(Screen[None]):
    """Which line misses which strategy.

    Args:
        report_fn: returns the report to draw (None: none yet), whether the
            process ended and its name for the title.
        refresh_s: seconds between polls; 0 never (tests).
    """

    BINDINGS = [Binding("escape,q,A", "close", "back", tooltip="Back to the dashboard")]
    DEFAULT_CSS = """
    AdviceScreen { layout: vertical; }
    AdviceScreen #advice-title { height: 1; }
    AdviceScreen #advice-scroll { height: 1fr; }
    AdviceScreen #advice-body { padding: 0 1; }
    """

    def __init__(self, report_fn: ReportFn, refresh_s: float = REFRESH_S) -> None:
        super().__init__()
        self.report_fn = report_fn
        self.refresh_s = refresh_s
        self.report: Report | None = None
        self._drawn: tuple[Any, ...] | None = None

    @classmethod
    def for_app(cls, app: Any) -> "AdviceScreen":
        """The screen for the process a running dashboard shows."""

        def report_fn() -> tuple[Report | None, bool, str]:
            snap = getattr(app, "snapshot", None)
            proc = snap.process_of(snap.device) if snap is not None and snap.processes else None
            if proc is None:
                return None, False, ""
            return app.model.advice(proc.pid), proc.state in (EXITED, DISCONNECTED), proc.who

        return cls(report_fn)

    def compose(self) -> ComposeResult:
        yield Static(id="advice-title")
        with VerticalScroll(id="advice-scroll"):
            yield Static(id="advice-body")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_view()
        if self.refresh_s > 0:
            self.set_interval(self.refresh_s, self.refresh_view)

    def refresh_view(self) -> None:
        """Polls the report and redraws when it changed (not while the dashboard is paused)."""
        if getattr(self.app, "paused", False) and self.report is not None:
            return
        try:
            report, ended, name = self.report_fn()
            notice = ""
        except Exception as exc:  # show, don't die
            report, ended, name, notice = None, False, "", f"advice failed: {exc}"
        key = (ended, name, notice)
        if report is self.report and key == self._drawn and report is not None:
            return  # the model hands out the same report until it evaluates again
        self._drawn = key
        self.report = report
        title = Text(" Advice ", style="bold reverse")
        if name:
            title.append(f" {name}", style="bold")
        title.append("  which line misses which memory strategy: evidence, gain, fix", style="dim")
        if notice:
            title.append(f"  {notice}", style="yellow")
        self.query_one("#advice-title", Static).update(title)
        self.query_one("#advice-body", Static).update(advice_text(report, ended=ended))

    def action_close(self) -> None:
        self.dismiss(None)
