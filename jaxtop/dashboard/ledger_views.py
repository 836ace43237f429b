"""What the Jit screen says of a ledger beside its tables: whether recompile
reasons are recorded, and the leak and compile-storm verdicts.

:class:`~jaxtop.dashboard.ledger.LedgerView` hands on the agent's
``explain`` status and its flags as decoded
(:class:`~jaxtop.wire.records.jit.JitExplain`,
:class:`~jaxtop.wire.records.jit.JitLeak`,
:class:`~jaxtop.wire.records.jit.JitStorm`); :class:`LedgerNotes` words
them once for every view that shows them.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxtop.dashboard.ledger import LedgerView, leak_message, storm_message
from jaxtop.wire.records.jit import JitReason

__all__ = ["LedgerNotes", "recompile_t"]


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
        explain = view.explain
        return cls(
            explain_enabled=bool(explain is not None and explain.enabled),
            explain_by=(explain.by or None) if explain is not None else None,
            explain_na_reason=(explain.reason or None) if explain is not None else None,
            leak_message=leak_message(view.leak) if view.leak is not None else None,
            storm_message=storm_message(view.storm) if view.storm is not None else None,
        )


def recompile_t(reason: JitReason) -> float | None:
    """When a recompile reason (an entry of ``JitFunction.reasons``) was seen."""
    return reason.t
