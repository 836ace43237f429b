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
        """Take one sample's totals (None: not known) and return each
        counter's per-second growth over the window ending at ``t``: None
        where there is no earlier sample yet (the first, or the first after
        a total went down: a counter that started over) or either end is
        unknown."""
        kept = self._kept
        entry = (t, tuple(totals))
        if kept and t <= kept[-1][0]:
            if t < kept[-1][0]:
                kept.clear()  # older than the newest (history after the present): start over
            else:
                kept.pop()  # the same moment again: the newer totals
        if kept and any(now is not None and then is not None and now < then
                        for now, then in zip(entry[1], kept[-1][1])):
            kept.clear()  # a counter started over (another agent in the process): measured from here
        kept.append(entry)
        while len(kept) > 2 and kept[1][0] <= t - self.window_s:
            kept.popleft()
        base_t, base = kept[0]
        span = t - base_t
        if span <= 0:
            return (None,) * len(entry[1])
        return tuple(None if now is None or then is None else (now - then) / span
                     for now, then in zip(entry[1], base))
