"""Typed views of the parts of a jit ledger that still come as wire objects.

:class:`~jaxtop.dashboard.ledger.LedgerView` hands on the agent's
``explain`` status, its leak and compile-storm verdicts and each recompile
reason as they came;
the Jit screen reads them through these instead of by key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from jaxtop.wire import protocol
from jaxtop.dashboard.ledger import LedgerView

__all__ = ["LedgerNotes", "recompile_t"]


def _obj(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class LedgerNotes:
    """Whether recompile reasons are recorded, and the leak and storm verdicts.

    ``explain_na_reason`` says why reasons are n/a (None when they are
    recorded, or the agent gave no reason).
    """

    explain_enabled: bool
    explain_by: str | None  # whose option turned reasons on: "user" (the program's) or jaxtop's
    explain_na_reason: str | None
    leak_message: str | None  # set while the ledger suspects an executable leak
    storm_message: str | None = None  # set while one function keeps compiling (what and why)

    @classmethod
    def of(cls, view: LedgerView) -> LedgerNotes:
        explain = _obj(view.explain)
        by, reason = explain.get("by"), explain.get("reason")
        leak = _obj(view.leak)
        storm = _obj(view.storm)
        return cls(
            explain_enabled=bool(explain.get("enabled")),
            explain_by=protocol.shown(by) if by else None,
            explain_na_reason=protocol.shown(reason) if reason else None,
            leak_message=None if not leak else protocol.shown(leak.get("message")),
            storm_message=None if not storm else protocol.shown(storm.get("message")),
        )


def recompile_t(reason: Any) -> float | None:
    """When a recompile reason (an entry of ``JitFunction.reasons``) was seen."""
    return protocol.timestamp(_obj(reason).get("t"))
