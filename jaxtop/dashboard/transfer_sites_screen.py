"""The Transfer sites screen: every line of the program that made implicit
transfers, with its arguments, rates and recent history; the transfers not
tied to a line, with the reasons.

A full screen over the dashboard (``T``; ``escape``, ``q`` or ``T`` goes
back). It draws :class:`~jaxtop.widgets.transfer_sites.TransferSitesReport`
of the shown process's view (:class:`~jaxtop.dashboard.report_screen.
ReportScreen` polls it).
"""

from __future__ import annotations

from typing import Any

from textual.binding import Binding

from jaxtop.dashboard.report_screen import ReportScreen
from jaxtop.dashboard.transfer_sites import TransferSitesView
from jaxtop.dashboard.views import DISCONNECTED, EXITED
from jaxtop.widgets.transfer_sites import TransferSitesReport

__all__ = ["TransferSitesScreen"]


class TransferSitesScreen(ReportScreen):
    """Which line makes each implicit transfer."""

    NAME = "Transfer sites"
    ABOUT = "which line makes each implicit transfer, with what"
    PREFIX = "sites"
    BINDINGS = [Binding("escape,q,T", "close", "back", tooltip="Back to the dashboard")]

    @classmethod
    def for_app(cls, app: Any) -> "TransferSitesScreen":
        """The screen for the process a running dashboard shows (its latest snapshot)."""

        def fetch() -> tuple[TransferSitesView | None, bool, str]:
            snap = getattr(app, "snapshot", None)
            proc = snap.process_of(snap.device) if snap is not None and snap.processes else None
            if proc is None:
                return None, False, ""
            return proc.transfer_sites, proc.state in (EXITED, DISCONNECTED), proc.who

        return cls(fetch, lambda view, ended: TransferSitesReport(view, ended=ended))
