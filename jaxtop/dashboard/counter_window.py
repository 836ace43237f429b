"""Per-second rates of an agent's counters, over a window of samples.

The agent counts implicit transfers as they are read from its stderr relay,
which passes them on in batches about as often as the agent samples: one
sample may get two batches and the next none. A rate taken from one sample's
count therefore swings (0/s, then twice the true rate) around a steady
loop, and disagrees with the per-line rates of the Transfers panel, which
are measured over :data:`RATE_WINDOW_S`. Both are read over that window
here: the growth of the counter's total between the last sample at or
before the window's start and the newest, divided by the time between them.

No Textual, no sockets; pure.
"""

from __future__ import annotations

import collections
from typing import Sequence

__all__ = ["CounterWindow", "RATE_WINDOW_S"]

#: Seconds of samples a rate is measured over: long enough that a line the
#: agent tied a tick late, or a batch the relay passed on a tick late, still
#: counts in the same second; short enough to follow a loop's phases.
RATE_WINDOW_S = 2.0
#: Samples kept at most: 2 s hold 21 at 10 Hz; a hostile recording whose
#: clock creeps by nanoseconds must not grow the window without end (its
#: rates are then read over the samples kept).
KEPT_MAX = 256


class CounterWindow:
    """Totals of a few counters per sample time, the last :data:`RATE_WINDOW_S` kept.

    Args:
        window_s: seconds a rate is measured over.
    """

    __slots__ = ("window_s", "_kept")

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._kept: collections.deque[tuple[float, tuple[float | None, ...]]] = collections.deque(maxlen=KEPT_MAX)

    def add(self, t: float, totals: Sequence[float | None]) -> tuple[float | None, ...]:
        """:meth:`push`, then :meth:`rates`."""
        self.push(t, tuple(totals))
        return self.rates()

    def push(self, t: float, totals: tuple[float | None, ...]) -> None:
        """Take one sample's totals (None: not known). A sample older than
        the newest starts the window over (history after the present), one
        of the same moment replaces it, and so does a sample where a total
        went down (a counter that started over: another agent in the
        process): rates are measured from there."""
        kept = self._kept
        if kept:
            last_t, last = kept[-1]
            if t <= last_t:
                if t < last_t:
                    kept.clear()
                else:
                    kept.pop()  # the same moment again: the newer totals
            if kept:
                for now, then in zip(totals, kept[-1][1]):
                    if now is not None and then is not None and now < then:
                        kept.clear()
                        break
        kept.append((t, totals))
        cut = t - self.window_s
        while len(kept) > 2 and kept[1][0] <= cut:
            kept.popleft()

    def rates(self) -> tuple[float | None, ...]:
        """Each counter's per-second growth over the window ending at the
        newest sample: None where there is no earlier sample yet (the
        first, or the first after a start over) or either end is unknown.
        A batch of samples asks once, after its last."""
        kept = self._kept
        if not kept:
            return ()
        t, newest = kept[-1]
        base_t, base = kept[0]
        span = t - base_t
        if span <= 0:
            return (None,) * len(newest)
        return tuple(None if now is None or then is None else (now - then) / span
                     for now, then in zip(newest, base))
