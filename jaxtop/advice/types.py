"""What the advisor says: one piece of advice (:class:`Advice`), what could
not be judged and why (:class:`NotJudged`), and a whole evaluation
(:class:`Report`).

The strategies are the demo's (``jaxtop demo``), found in the user's own
program: each piece of advice names the line that misses one, the evidence
measured over a window, the gain to expect (never more than what was
measured), and the change to make as code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["INFERRED", "MEASURED", "STRATEGIES", "Advice", "NotJudged", "Report"]

#: Every strategy the advisor judges, in the order the demo presents them.
STRATEGIES = ("placement", "donation", "in_place", "batching", "jit", "host_sync", "runahead", "checkpointing",
              "guard", "leak", "fragmentation")

#: The evidence and the gain are figures jaxtop measured over the window.
MEASURED = "measured"
#: Part of the case is a reading of the figures (e.g. that an output takes
#: the place of an input): the evidence says which part.
INFERRED = "inferred"


@dataclass(frozen=True)
class Advice:
    """One strategy a line of the program misses.

    Attributes:
        strategy: one of :data:`STRATEGIES`.
        file: the program's file (full path) or None where no line is known.
        line: its line (None: the whole program).
        function: the program's function at that line.
        jitted: the jitted function (or jax op) it concerns, if any.
        title: what to do, in a few words.
        evidence: what was measured, with its window.
        gain: what to expect, bounded by what was measured.
        fix: the change, as code.
        basis: :data:`MEASURED` or :data:`INFERRED`.
        window_s: the seconds of samples the evidence spans.
        score: the expected gain as a share in (0, 1], for ordering: of the
            program's calls or transfers per second (rates), or of the
            device memory in use (bytes).
    """

    strategy: str
    file: str | None
    line: int | None
    function: str | None
    jitted: str | None
    title: str
    evidence: str
    gain: str
    fix: str
    basis: str
    window_s: float
    score: float

    @property
    def where(self) -> str:
        """``train.py:55`` (the file's base name), or ``(whole program)``."""
        if not self.file:
            return "(whole program)"
        name = os.path.basename(self.file)
        return f"{name}:{self.line}" if self.line is not None else name

    @property
    def key(self) -> tuple[str, str | None, int | None, str | None]:
        return (self.strategy, self.file, self.line, self.jitted)


@dataclass(frozen=True)
class NotJudged:
    """A strategy the records could not judge, and why."""

    strategy: str
    why: str


@dataclass(frozen=True)
class Report:
    """One evaluation: the advice, highest expected gain first, and the
    strategies that could not be judged.

    Attributes:
        t: the newest sample's time the evaluation ends at (None: no sample).
        window_s: the evidence window asked for.
        span_s: the seconds of samples actually in it.
        advice: highest :attr:`Advice.score` first.
        not_judged: one per strategy that could not be judged, with why.
    """

    t: float | None
    window_s: float
    span_s: float
    advice: tuple[Advice, ...] = ()
    not_judged: tuple[NotJudged, ...] = ()

    def of(self, strategy: str) -> tuple[Advice, ...]:
        """The advice of one strategy."""
        return tuple(a for a in self.advice if a.strategy == strategy)
