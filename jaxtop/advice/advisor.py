"""The advisor: records in, advice out. No I/O, no Textual; it runs where
the records are read (the dashboard, ``jaxtop advise``, ``jaxtop snapshot``),
never in the agent.

    advisor = Advisor()
    for record in records:          # typed, as jaxtop.wire.records.decode makes them
        advisor.feed(record)
    report = advisor.evaluate()     # Report: advice, highest expected gain first

Advice needs evidence that holds over the window (:data:`WINDOW_S`, the
last minute of samples): a rate must have risen in most slices of it, the
last ones included, so a single spike gives none, and advice leaves once
the program stops doing what it was given for (within a third of the
window).
"""

from __future__ import annotations

from jaxtop.advice.detectors import DETECTORS, Window
from jaxtop.advice.evidence import Evidence
from jaxtop.advice.types import STRATEGIES, Advice, NotJudged, Report
from jaxtop.dashboard.ledger import LedgerView
from jaxtop.wire.records import Record, Unknown

__all__ = ["Advisor", "WINDOW_S"]

#: The evidence window: the last minute of samples.
WINDOW_S = 60.0


class Advisor:
    """One process's advisor.

    Args:
        window_s: the evidence window.
        fold_jit: fold the samples' jit ledger itself; False where the
            caller keeps one fed with the same records and passes its view
            to :meth:`evaluate` (the dashboard's model).
    """

    def __init__(self, window_s: float = WINDOW_S, fold_jit: bool = True) -> None:
        self.evidence = Evidence(fold_jit)
        self.window_s = window_s

    def feed(self, record: Record | Unknown) -> None:
        """Take one record, in the order the process sent them."""
        self.evidence.feed(record)

    def evaluate(self, end: float | None = None, ledger: LedgerView | None = None) -> Report:
        """The advice over the window ending at ``end`` (default: the newest
        sample), with ``ledger`` the jit ledger (default: the one folded
        here). A detector that fails on odd records is reported as not
        judged, with the error: one detector never takes the others down."""
        ev = self.evidence
        end = ev.last_t if end is None else end
        if end is None or ev.first_t is None:
            return Report(t=None, window_s=self.window_s, span_s=0.0,
                          not_judged=tuple(NotJudged(s, "no sample yet") for s in STRATEGIES))
        start = max(ev.first_t, end - self.window_s)
        window = Window(ev, start, end, ledger if ledger is not None else ev.ledger())
        advice: dict[tuple, Advice] = {}
        not_judged: list[NotJudged] = []
        for strategy, detect in DETECTORS:
            try:
                found = detect(window)
            except Exception as exc:  # an odd record must not stop the others
                not_judged.append(NotJudged(strategy, f"the detector failed: {type(exc).__name__}: {exc}"))
                continue
            for item in found:
                if isinstance(item, NotJudged):
                    not_judged.append(item)
                elif item.key not in advice or advice[item.key].score < item.score:
                    advice[item.key] = item
        ranked = sorted(advice.values(), key=lambda a: (-a.score, a.strategy, a.where))
        return Report(t=end, window_s=self.window_s, span_s=end - start, advice=tuple(ranked),
                      not_judged=tuple(not_judged))
