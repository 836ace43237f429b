"""A running total's recent values (:class:`Total`) and what the advisor
asks of it over a window: how much it rose, and whether it rose steadily
(in most slices of the window, the last ones included) rather than in one
spike."""

from __future__ import annotations

import bisect
import math

__all__ = ["MAX_POINTS", "Total", "Steady", "slices_of"]

#: Points kept per total: a window of 60 s holds about 60 fields (the agent
#: sends sparse fields at most once a second); a recording whose clock creeps
#: by nanoseconds must not grow it without end.
MAX_POINTS = 512
#: Seconds of points a total keeps (the evidence window is a minute, at
#: most a few with ``jaxtop advise --window``), and the points it keeps
#: before it trims by time.
KEEP_S = 300.0
KEEP_MIN = 64
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
    """A running total as fields reported it: times and values in time
    order, at most :data:`MAX_POINTS` of them (the oldest go first)."""

    __slots__ = ("times", "values")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.values: list[float] = []

    def add(self, t: float, total: float) -> None:
        times = self.times
        if times and t <= times[-1]:
            if t == times[-1]:
                self.values[-1] = total
            return  # older than what is in: a history folded in order never sends it
        times.append(t)
        self.values.append(total)
        if len(times) > 2 * MAX_POINTS:  # trimmed now and then, not at every point
            del times[:-MAX_POINTS]
            del self.values[:-MAX_POINTS]
        elif len(times) > KEEP_MIN and times[0] < t - KEEP_S:
            # What no window reaches: the last point before it is kept (a
            # window's base). A replay index keeps the advisor at each of
            # its checkpoints: the less it holds, the smaller the index.
            cut = bisect.bisect_left(times, t - KEEP_S) - 1
            if cut > 0:
                del times[:cut]
                del self.values[:cut]

    @property
    def last(self) -> float | None:
        return self.values[-1] if self.values else None

    def over(self, start: float, end: float) -> Steady:
        """The rise from the last value at or before ``start`` (else the
        first one) to the newest at or before ``end``, and the slices of
        ``[start, end]`` in which it rose. The window's bounds are found by
        bisection, and a total with no point in the window is answered at
        once (most lines, most of the time)."""
        times, values = self.times, self.values
        if not times or times[0] > end or times[-1] <= start:
            return Steady(0.0, end - start, 0, slices_of(end - start), False)  # no point in the window: no rise
        stop = bisect.bisect_right(times, end)
        first = max(0, bisect.bisect_right(times, start) - 1)
        base_t, base_v = times[first], values[first]
        rise = max(0.0, values[stop - 1] - base_v)
        span = max(end - start, 0.0) if base_t <= start else max(end - base_t, 0.0)
        # A total that began inside the window (a line first listed once the
        # loop ran) is sliced over its own time, where that holds two
        # slices: the window's start-up seconds (imports, compiles: 10 s of
        # a 17 s recording of Flax's miniGPT example) held no rise of it and
        # made a steady line of every step read as a spike.
        if base_t > start and end - base_t >= 2 * MIN_SLICE_S:
            start = base_t
        n = slices_of(end - start)
        width = (end - start) / n if end > start else 0.0
        active: set[int] = set()
        prev = base_v
        for i in range(first + 1, stop):
            total = values[i]
            if total > prev and width > 0:
                active.add(min(n - 1, int((times[i] - start) // width)))
            if total > prev:
                prev = total
        recent = bool(active) and max(active) >= n - 2
        return Steady(rise, span, len(active), n, recent)
