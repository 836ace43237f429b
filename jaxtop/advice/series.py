"""A running total's recent values (:class:`Total`) and what the advisor
asks of it over a window: how much it rose, and whether it rose steadily
(in most slices of the window, the last ones included) rather than in one
spike."""

from __future__ import annotations

import collections
import math

__all__ = ["MAX_POINTS", "Total", "Steady", "slices_of"]

#: Points kept per total: a window of 60 s holds about 60 fields (the agent
#: sends sparse fields at most once a second); a recording whose clock creeps
#: by nanoseconds must not grow it without end.
MAX_POINTS = 512
#: The shortest slice a window is cut into: the agent's sparse fields come
#: about once a second, so a slice of 2 s holds at least one.
MIN_SLICE_S = 2.0
#: Slices a full window is cut into.
SLICES = 6


def slices_of(span_s: float) -> int:
    """How many slices a window of ``span_s`` seconds of samples is cut into
    (at most :data:`SLICES`, each at least :data:`MIN_SLICE_S`)."""
    return max(1, min(SLICES, int(span_s // MIN_SLICE_S)))


class Steady:
    """What a total did over a window: its rise, the seconds that rise is
    over, and in how many of the window's slices it rose."""

    __slots__ = ("rise", "span_s", "active", "slices", "recent")

    def __init__(self, rise: float, span_s: float, active: int, slices: int, recent: bool) -> None:
        self.rise = rise
        self.span_s = span_s
        self.active = active  # slices in which it rose
        self.slices = slices
        self.recent = recent  # it rose in one of the last two slices

    @property
    def per_s(self) -> float:
        return self.rise / self.span_s if self.span_s > 0 else 0.0

    @property
    def steady(self) -> bool:
        """Rose in at least two thirds of the slices, and lately: evidence
        that holds over the window, not one spike, and that leaves once the
        program stops doing it."""
        return self.rise > 0 and self.recent and self.active >= math.ceil(2 * self.slices / 3)


class Total:
    """A running total as fields reported it: ``(t, total)``, oldest first."""

    __slots__ = ("points",)

    def __init__(self) -> None:
        self.points: collections.deque[tuple[float, float]] = collections.deque(maxlen=MAX_POINTS)

    def add(self, t: float, total: float) -> None:
        points = self.points
        if points and t <= points[-1][0]:
            if t == points[-1][0]:
                points[-1] = (t, total)
            return  # older than what is in: a history folded in order never sends it
        points.append((t, total))

    @property
    def last(self) -> float | None:
        return self.points[-1][1] if self.points else None

    def over(self, start: float, end: float) -> Steady:
        """The rise from the last value at or before ``start`` (else the
        first one) to the newest at or before ``end``, and the slices of
        ``[start, end]`` in which it rose."""
        points = [p for p in self.points if p[0] <= end]
        n = slices_of(end - start)
        if not points:
            return Steady(0.0, end - start, 0, n, False)
        base = points[0]
        for p in points:
            if p[0] <= start:
                base = p
            else:
                break
        last = points[-1]
        rise = max(0.0, last[1] - base[1])
        span = max(end - start, 0.0) if base[0] <= start else max(end - base[0], 0.0)
        width = (end - start) / n if end > start else 0.0
        active: set[int] = set()
        prev = base[1]
        for t, total in points:
            if t <= base[0]:
                continue
            if total > prev and width > 0:
                active.add(min(n - 1, int((t - start) // width)))
            prev = max(prev, total)
        recent = bool(active) and max(active) >= n - 2
        return Steady(rise, span, len(active), n, recent)
