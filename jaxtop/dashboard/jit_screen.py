"""The Jit screen: every compiled function's memory, compiles and recompile reasons.

A full screen over the dashboard (``j``; ``escape``, ``q`` or ``j`` goes back). It
reads the ledger from a provider (the model's :class:`LedgerStore`) once a
second, so it keeps no state of its own but the sort key; drawing is
:class:`jaxtop.widgets.jit.JitLedgerTable`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from jaxtop.dashboard.ledger import LedgerStore, LedgerView
from jaxtop.widgets.jit import SORTS, JitLedgerTable

#: How often the screen reads the ledger again (the agent passes once a second).
REFRESH_S = 1.0

Provider = Callable[[], "LedgerView | None"]
Request = Callable[[], "str | None"]


class JitScreen(Screen[None]):
    """The jit ledger of one process.

    Args:
        provider: returns the ledger to show (None before one arrived).
        request: asks the agent for its whole ledger now; returns None when
            sent, else why not (no live agent). None: nothing can be asked.
        refresh_s: how often the ledger is read again; 0 never (tests).
    """

    BINDINGS = [
        Binding("escape,q,j", "close", "back", tooltip="Back to the dashboard"),
        Binding("s", "cycle_sort", "sort", tooltip="Sort functions by temp bytes, total bytes, compiles or code bytes"),
        Binding("r", "request", "refresh", tooltip="Ask the agent for its whole jit ledger now (live agents only)"),
    ]
    DEFAULT_CSS = """
    JitScreen > VerticalScroll { height: 1fr; padding: 0 1; }
    """

    def __init__(self, provider: Provider, request: Request | None = None, refresh_s: float = REFRESH_S) -> None:
        super().__init__()
        self.provider = provider
        self.request = request
        self.refresh_s = refresh_s
        self.sort = SORTS[0]

    @classmethod
    def for_store(cls, store: LedgerStore, pid: int | None, send_command: Callable[[int, str, dict], Any] | None = None,
                  live: bool = False, refresh_s: float = REFRESH_S) -> JitScreen:
        """The screen on ``pid``'s ledger in ``store`` (None: the first process that has one).

        Args:
            send_command: the source's ``send_command``; used when ``live``.
        """
        def provider() -> LedgerView | None:
            return store.view(pid)

        def request() -> str | None:
            target = pid if pid is not None else next(iter(store.pids()), None)
            if target is None:
                return "no process to ask"
            return send_command(target, "jit_ledger", {}) if send_command else "no source"

        return cls(provider, request if live and send_command is not None else None, refresh_s=refresh_s)

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(self._renderable(), id="jit-text")

    def on_mount(self) -> None:
        if self.request is not None:
            # The samples carry a whole table only every few seconds: ask for
            # one now, so the screen is complete as soon as the reply lands.
            self.request()
        if self.refresh_s > 0:
            self.set_interval(self.refresh_s, self.redraw)

    def key_hints(self) -> str:
        """The screen's keys, from its bindings (they are the one table)."""
        parts = []
        for b in self.BINDINGS:
            if isinstance(b, Binding) and (b.action != "request" or self.request is not None):
                keys = "/".join("esc" if k.strip() == "escape" else k.strip() for k in b.key.split(","))
                parts.append(f"{keys} {b.description}")
        return " · ".join(parts)

    def _renderable(self) -> JitLedgerTable:
        return JitLedgerTable(self.provider(), sort=self.sort, keys=self.key_hints())

    def redraw(self) -> None:
        """Read the ledger again and draw it (unless the dashboard is paused)."""
        if getattr(self.app, "paused", False):
            return
        self.query_one("#jit-text", Static).update(self._renderable())

    def action_close(self) -> None:
        self.dismiss()

    def action_cycle_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self.query_one("#jit-text", Static).update(self._renderable())

    def action_request(self) -> None:
        if self.request is None:
            self.notify("the whole ledger can only be asked of a live agent", severity="warning", timeout=2)
            return
        error = self.request()
        if error:
            self.notify(f"jit ledger: {error}", severity="warning", timeout=3)
        else:
            self.notify("jit ledger requested", timeout=1.5)
