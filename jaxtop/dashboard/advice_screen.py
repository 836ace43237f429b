"""The Advice screen: the strategies the program misses, line by line, with
the evidence, the gain and the fix (:mod:`jaxtop.advice`).

A full screen over the dashboard (``A``; ``escape``, ``q`` or ``A`` goes
back): the advisor's report on the shown process as the model last
evaluated it (at most once a second).
"""

from __future__ import annotations

from typing import Any

from textual.binding import Binding

from jaxtop.advice import Report
from jaxtop.dashboard.report_screen import ReportScreen
from jaxtop.dashboard.views import DISCONNECTED, EXITED
from jaxtop.widgets.advice import advice_text


class AdviceScreen(ReportScreen):
    """Which line misses which strategy."""

    NAME = "Advice"
    ABOUT = "which line misses which memory strategy: evidence, gain, fix"
    PREFIX = "advice"
    BINDINGS = [Binding("escape,q,A", "close", "back", tooltip="Back to the dashboard")]

    @classmethod
    def for_app(cls, app: Any) -> "AdviceScreen":
        """The screen for the process a running dashboard shows."""

        def fetch() -> tuple[Report | None, bool, str]:
            snap = getattr(app, "snapshot", None)
            proc = snap.process_of(snap.device) if snap is not None and snap.processes else None
            if proc is None:
                return None, False, ""
            return app.model.advice(proc.pid), proc.state in (EXITED, DISCONNECTED), proc.who

        return cls(fetch, lambda view, ended: advice_text(view, ended=ended))
