"""The sample's ``transfer_capture`` field: whether implicit transfers are
being counted, and if not, why.

jax reports an implicit transfer only as a line on stderr, written by the
transfer guard at level "log". The stderr relay (``jaxtop.probes.stderr_capture``)
takes fd 2, passes every byte on unchanged and reports the guard's lines
back; the guard is armed once ``import jax`` finishes
(``jaxtop.probes.transfer_guard.GuardController``), at "log" only for the
directions the user left at "allow" (their lines are then taken out of what
reaches the terminal; the user's own settings keep theirs).

Standard library only (the agent imports it inside the user's job).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from jaxtop.probes.base import Tick
from jaxtop.probes.stderr_capture import CaptureError, StderrCapture
from jaxtop.probes.transfer_guard import CachedParser, GuardController, TransferCounter, untested_jax_reason

__all__ = ["CaptureProbe", "jax_version"]


def jax_version() -> str | None:
    module = sys.modules.get("jax")
    return getattr(module, "__version__", None) if module else None


class CaptureProbe:
    """The stderr relay and the transfer guard, feeding ``transfers``.

    Listed before the ``transfers`` probe: each tick first takes what the
    relay reported, so the counts in a sample include every line written
    before it.

    Args:
        transfers: the counter the guard's lines go to.
        enabled: False: nothing is captured (the field says so).
        on_notice: the relay's own notices (it died, the terminal went away).
        on_oom_line: an allocator's out-of-memory line seen on stderr.
    """

    name = "transfer_capture"
    needs_jax = False

    def __init__(self, transfers: TransferCounter, enabled: bool = True,
                 on_notice: Callable[[str], None] | None = None,
                 on_oom_line: Callable[[str], None] | None = None) -> None:
        self.transfers = transfers
        self.enabled = enabled
        self._on_notice_cb = on_notice
        self._on_oom_line = on_oom_line
        self._parse = CachedParser()
        self.capture: StderrCapture | None = None
        self.guard: GuardController | None = None
        self.reason: str | None = None if enabled else "stderr capture disabled"
        self._cache: dict[str, Any] | None = None
        #: Who takes the guard lines' stamps (when and on which thread each
        #: was written): the transfer-sites probe, or nobody.
        self.on_stamps: Callable[[bytes], None] | None = None

    def start(self) -> None:
        if not self.enabled or self.capture is not None:
            return
        capture = StderrCapture(self._on_guard_lines, on_notice=self._on_notice, on_oom_line=self._on_oom_line,
                                on_guard_stamps=self._on_guard_stamps)
        try:
            capture.start()
        except CaptureError as exc:
            self.reason = str(exc)
            return
        self.capture = capture

    def on_jax_imported(self) -> None:
        """Arm the guard (on the thread that imported jax)."""
        if self.capture is None or self.guard is not None:
            return
        try:
            guard = GuardController(self.capture.set_visibility)
            guard.start()
            self.guard = guard
        except Exception as exc:
            self.reason = f"transfer guard could not be set: {exc}"
        self._cache = None

    def on_tick(self, tick: Tick) -> dict[str, Any]:
        if self.capture is not None:
            self.capture.read_reports()
        if tick.slow and self.guard is not None:
            try:
                self.guard.refresh()
            except Exception:
                pass
        # Worked out again once a second (or when the capture or the guard
        # changed): ticks in between reuse it.
        if tick.slow or tick.final or self._cache is None:
            self._cache = self.status()
        return self._cache

    def stop(self) -> None:
        """The user's guard levels back, fd 2 back (the relay gone)."""
        guard, self.guard = self.guard, None
        if guard is not None:
            guard.restore()
        capture, self.capture = self.capture, None
        if capture is not None:
            capture.stop()

    def wait_report(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` until the relay has something to report
        (a guard line, most likely); False without a relay."""
        capture = self.capture
        return capture.wait_report(timeout_s) if capture is not None else False

    def sync(self, timeout_s: float) -> bool:
        """Wait until every guard line written so far is counted (False: not in time)."""
        return self.capture.sync(timeout_s=timeout_s) if self.capture is not None else True

    def _on_guard_lines(self, message: str, n: int) -> None:
        parsed = self._parse(message)
        if parsed is not None:
            self.transfers.add(parsed, n)

    def _on_guard_stamps(self, stamps: bytes) -> None:
        if self.on_stamps is not None:
            self.on_stamps(stamps)

    def _on_notice(self, text: str) -> None:
        """The relay lost its way (killed, or the terminal went away). Once it
        has given up for good, the guard goes back to the user's setting, so
        the lines only jaxtop caused stop."""
        self._cache = None
        if self._on_notice_cb is not None:
            self._on_notice_cb(text)
        if self.capture is not None and not self.capture.active and self.guard is not None:
            self.guard.restore()

    def status(self) -> dict[str, Any]:
        """The ``transfer_capture`` field: ``available`` and the guard's
        levels, or the reason counts would be a guess."""
        if self.capture is None:
            return {"available": False, "reason": self.reason or "not started"}
        if self.guard is None:
            if self.reason:
                return {"available": False, "reason": self.reason}
            return {"available": True, "guard": None, "note": "waiting for jax to be imported"}
        if self.capture.unrecognised is not None:
            return {"available": False, "reason": "guard lines arrive in a form jaxtop does not recognise "
                    f"(jax {jax_version()}): {self.capture.unrecognised[:160]}"}
        untested = untested_jax_reason(jax_version())
        if untested and not any(self.transfers.totals().values()):
            # Until one guard line is recognised, 0 could mean "none" or
            # "not understood": say which we cannot tell.
            return {"available": False, "reason": untested + "; no transfer-guard line recognised yet"}
        if self.guard.reason:
            # The guard's lines never reach stderr (the user's log threshold
            # silences warnings, and this jaxlib cannot lower it): 0 would
            # be a guess.
            return {"available": False, "reason": self.guard.reason}
        return {"available": True, "guard": self.guard.user_levels()}
