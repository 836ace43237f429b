"""The advisor's part of :class:`~jaxtop.dashboard.model.Model`: each
process's :class:`~jaxtop.advice.Advisor` is fed its samples in time order
(the present and the live samples that come while the agent's history
loads are held until it is in: :meth:`HistoryFeed._history_end
<jaxtop.dashboard.backlog.HistoryFeed._history_end>` feeds them), and
evaluated on demand, at most once a second, with the model's jit ledger.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Callable

from jaxtop.advice import WINDOW_S, Report
from jaxtop.wire.records import Sample

if TYPE_CHECKING:
    from jaxtop.dashboard.ledger import LedgerStore
    from jaxtop.dashboard.state import ProcessModel

__all__ = ["ADVICE_EVERY_S", "ADVICE_HELD_MAX", "AdviceFeed"]

#: The advisor is evaluated at most once per this many seconds of samples.
ADVICE_EVERY_S = 1.0
#: Samples held for the advisor while a history loads (the present, and the
#: live ones that come meanwhile: a few seconds' worth).
ADVICE_HELD_MAX = 2_000


class AdviceFeed:
    """Feeds and asks each process's advisor (a part of the model)."""

    #: The advisor's evidence window (the demo's is shorter: a variant's
    #: advice leaves within seconds of switching to the next).
    advice_window_s: float = WINDOW_S
    processes: dict[int, ProcessModel]
    ledgers: LedgerStore
    _lock: threading.Lock
    _clock: Callable[[], float]

    def _advise(self, proc: ProcessModel, rec: Sample) -> None:
        """A present or live sample, to the advisor (held while the history loads)."""
        if proc.history_loading:
            if len(proc.advice_held) < ADVICE_HELD_MAX:
                proc.advice_held.append(rec)
        else:
            proc.advisor.feed(rec)

    def advice(self, pid: int) -> Report | None:
        """The advisor's report on ``pid`` (None: no such process), as of
        the newest sample's second (:meth:`_advice_of`)."""
        with self._lock:
            proc = self.processes.get(pid)
            return self._advice_of(proc) if proc is not None else None

    def _advice_of(self, proc: ProcessModel) -> Report | None:
        """:meth:`advice` of a process, the model's lock held. A process
        whose history is still loading has none yet: its evidence waits for
        the history (see :meth:`_advise`).

        The report is evaluated at the newest sample's time rounded down to
        the second, and kept until the samples reach the next second: a
        pure function of the records (a replay sought to a moment shows what
        playing up to it shows), at most once per second of samples."""
        if proc.history_loading and proc.advice is None:
            return None
        last_t = proc.advisor.evidence.last_t
        end = math.floor(last_t / ADVICE_EVERY_S) * ADVICE_EVERY_S if last_t is not None else None
        last = proc.advice
        if last is not None and last.t == end and last.window_s == self.advice_window_s:
            return last
        proc.advisor.window_s = self.advice_window_s
        proc.advice = proc.advisor.evaluate(end=end, ledger=self.ledgers.view(proc.pid))
        return proc.advice
