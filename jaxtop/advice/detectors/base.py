"""What every detector is handed (:class:`Window`) and the wording they share."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Union

from jaxtop.advice.evidence import Evidence
from jaxtop.advice.types import Advice, NotJudged
from jaxtop.dashboard.ledger import LedgerView
from jaxtop.wire.units import fmt_bytes

__all__ = ["Found", "MIN_SPAN_S", "Window", "comprehension", "per_s", "short", "site_of"]

#: Seconds of samples the advisor needs before it judges a rate: less is
#: one burst, not a habit.
MIN_SPAN_S = 4.0

#: What a detector returns: advice, and at most one reason it could not judge.
Found = list[Union[Advice, NotJudged]]


@dataclass(frozen=True)
class Window:
    """The evidence and the window it is judged over: ``[start, end]``,
    ``end`` the newest sample's time."""

    ev: Evidence
    start: float
    end: float
    ledger: LedgerView | None = None  # the jit ledger at ``end`` (None: none in the records)
    #: What several detectors read, worked out once per evaluation (the
    #: steady transfer lines: placement, batching, host syncs, guard).
    memo: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def span_s(self) -> float:
        return self.end - self.start

    @property
    def too_short(self) -> str | None:
        """Why rates cannot be judged yet (None: they can)."""
        if self.span_s < MIN_SPAN_S:
            return f"{self.span_s:.1f} s of samples; a rate is judged over at least {MIN_SPAN_S:g} s"
        return None

    @property
    def no_sites(self) -> str | None:
        """Why per-line transfers cannot be judged (None: they can)."""
        if self.too_short:
            return self.too_short
        if self.ev.capture_reason is not None and not self.ev.sites_seen:
            return f"implicit transfers are not captured: {self.ev.capture_reason}"
        if not self.ev.sites_seen and self.ev.transfers_seen:
            return ("implicit transfers were counted but never tied to lines (no transfer_sites in the records: "
                    "an agent from before that)")
        return None

    def over(self) -> str:
        """``over the last 60 s`` (the samples' span when shorter)."""
        return f"over the last {self.span_s:.0f} s"


def short(path: str | None, line: int | None = None) -> str:
    """``train.py:55`` from a full path and a line."""
    name = os.path.basename(path) if path else "?"
    return f"{name}:{line}" if line is not None else name


def site_of(site: str | None) -> tuple[str | None, int | None]:
    """``/a/train.py:55`` → (``/a/train.py``, 55); (None, None) if not a site."""
    if not site:
        return None, None
    path, sep, line = site.rpartition(":")
    if not sep or not line.isdigit():
        return site, None
    return path, int(line)


def per_s(rate: float) -> str:
    """``118/s``, ``2.5/s``, ``0.40/s``."""
    if rate >= 10:
        return f"{rate:,.0f}/s"
    return f"{rate:.2g}/s" if rate < 1 else f"{rate:.1f}/s"


def bytes_per_s(rate: float) -> str:
    return f"{fmt_bytes(rate)}/s"


#: Frame names Python gives a comprehension or generator expression (before
#: 3.12 inlined list, dict and set comprehensions into their function).
COMPREHENSIONS = ("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>")


def comprehension(function: str | None) -> bool:
    """Whether the frame is a comprehension's or a generator expression's
    (``<listcomp>``, ``step.<listcomp>``): a call made once per item."""
    return function is not None and function.endswith(COMPREHENSIONS)
