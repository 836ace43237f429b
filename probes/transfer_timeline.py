"""Guard lines to calls in bulk: the relay's stamps and each thread's timeline of notes.

A program that transfers a thousand times a second writes a thousand guard
lines a second and notes at least as many calls. Tying them one by one in
Python cost the agent's thread about 5 us a line (holding the GIL the
program needs). Here the work per line and per call is done by list
operations that run in C (``map``, ``bisect``, ``zip``, ``Counter``): the
agent's Python runs per report, per thread and per call site, not per line
and not per call.

Standard library only (this runs inside the user's job).
"""

from __future__ import annotations

import bisect
import re
import time
from collections import Counter
from functools import partial
from operator import itemgetter, sub
from typing import Any

__all__ = ["Timeline", "file_calls", "parse_stamps", "tie"]

#: The head of a group of stamps: ``dir,thread,HH:MM:`` then the first
#: line's seconds; the lines after it of the same direction, thread and
#: minute follow as bare seconds (``h2d,41,12:34:05.100000 05.100900 ...``).
_HEAD = re.compile(rb"(h2d|d2h|d2d),(\d+),(\d\d):(\d\d):")  # no look-behind: 4x faster a scan
_SECONDS = re.compile(rb"\d\d(?:\.\d+)?")
_DIRECTIONS = {b"h2d": "h2d", b"d2h": "d2h", b"d2d": "d2d"}
_first, _second, _third, _fourth, _fifth = (itemgetter(i) for i in range(5))


def parse_stamps(data: bytes, now: float) -> list[tuple[str, int, list[float]]]:
    """The relay's stamps as ``(direction, thread id, [Unix times])`` groups,
    in the order written; anything malformed is skipped. The log header has
    the local time of day only: the day is the one of ``now`` (a line is at
    most seconds old), the day before where that puts it ahead of ``now``."""
    local = time.localtime(now)
    midnight = now - (local.tm_hour * 3600 + local.tm_min * 60 + local.tm_sec + (now % 1.0))
    late = now + 300
    parts = _HEAD.split(data)
    out = []
    for k in range(1, len(parts) - 4, 5):
        direction, thread, hour, minute, rest = parts[k:k + 5]
        tokens = rest.split()
        try:
            secs = list(map(float, tokens))
        except ValueError:
            secs = []
        if secs and (min(secs) < 0.0 or not all(map((61.0).__gt__, secs))):  # nan, inf, negative
            secs = []
        if not secs:  # something in this group is not seconds: each token checked
            secs = [float(tok) for tok in tokens if _SECONDS.fullmatch(tok)]
            if not secs:
                continue
        base = midnight + int(hour) * 3600 + int(minute) * 60
        times = list(map(base.__add__, secs))
        if base + 61.0 > late:  # near midnight: a time of day ahead of now is yesterday's
            times = [t if t <= late else t - 86400.0 for t in times]
        out.append((_DIRECTIONS[direction], int(thread), times))
    return out


class Timeline:
    """One thread's notes, oldest first.

    ``times`` (Unix) and ``keys`` run side by side. A common note (a call
    on the fast path, a host read) is its key: hashable, so the lines of
    many calls at one site are summed in C. A rare one (a slow-path call, a
    call whose arguments were read) has key None and its whole value in
    ``extras``, by absolute position (``base`` is the absolute position of
    ``times[0]``; trimming the front moves it).
    """

    __slots__ = ("times", "keys", "extras", "base")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.keys: list[Any] = []
        self.extras: dict[int, tuple] = {}
        self.base = 0

    def add(self, times: list[float], keys: list[Any], extras: dict[int, tuple] | None = None) -> None:
        """Notes in time order; ``extras`` by position in these lists."""
        if not times:
            return
        if self.times and times[0] < self.times[-1]:
            self._merge(times, keys, extras)
            return
        if extras:
            start = self.base + len(self.times)
            self.extras.update((start + i, value) for i, value in extras.items())
        self.times += times
        self.keys += keys

    def _merge(self, times: list[float], keys: list[Any], extras: dict[int, tuple] | None) -> None:
        """Notes from another queue of the same thread (the slow path's) that
        go between notes already filed: the tail re-sorted (a stable sort:
        equal times keep their order)."""
        cut = bisect.bisect_right(self.times, times[0])
        start = self.base + cut
        pop = self.extras.pop
        tail = [(t, k, pop(start + j, None)) for j, (t, k) in enumerate(zip(self.times[cut:], self.keys[cut:]))]
        extras = extras or {}
        tail += [(t, k, extras.get(j)) for j, (t, k) in enumerate(zip(times, keys))]
        tail.sort(key=_first)
        del self.times[cut:], self.keys[cut:]
        for j, (t, k, x) in enumerate(tail):
            self.times.append(t)
            self.keys.append(k)
            if x is not None:
                self.extras[start + j] = x

    def trim(self, horizon: float) -> None:
        """Let go of the notes before ``horizon``."""
        cut = bisect.bisect_left(self.times, horizon)
        if not cut:
            return
        del self.times[:cut], self.keys[:cut]
        self.base += cut
        if self.extras:
            self.extras = {i: v for i, v in self.extras.items() if i >= self.base}

    def value(self, i: int) -> Any:
        """The note at position ``i``: its key, or its whole value if rare."""
        key = self.keys[i]
        return key if key is not None else self.extras[self.base + i]


def tie(timeline: Timeline, lines: list[float], window: float) -> tuple[list[tuple[Any, float, int, int]], int, list[float]]:
    """Each line (sorted times) to the first note at or after it, in bulk.

    Returns ``(credits, too_far, after)``: ``credits`` as ``(note, time,
    lines, calls)`` per site key (the time of the last line tied) and per
    rare note (its own time);
    ``too_far``, how many lines found their next note more than ``window``
    seconds later (it cannot be theirs); ``after``, the lines no note follows
    yet (their call is still running, or never returns).
    """
    times = timeline.times
    if not times:
        return [], 0, lines
    idx = list(map(partial(bisect.bisect_left, times), lines))
    tied = bisect.bisect_left(idx, len(times))  # idx never decreases: the lines after it have no note yet
    after = lines[tied:]
    idx, lines = idx[:tied], lines[:tied]
    too_far = 0
    if idx and max(map(sub, map(times.__getitem__, idx), lines)) > window:  # rare: only then per line
        keep = [i for i, t in zip(idx, lines) if times[i] - t <= window]
        too_far = len(idx) - len(keep)
        idx = keep
    if not idx:
        return [], too_far, after
    keys = timeline.keys
    calls = Counter(idx)  # position of a call -> its lines (one call can log several)
    credits = []
    if timeline.extras:  # some notes are rare ones (key None): each credited apart
        for i in [i for i in calls if keys[i] is None]:
            credits.append((timeline.value(i), times[i], calls.pop(i), 1))
    by_key = Counter(map(keys.__getitem__, idx))
    by_key.pop(None, None)
    # One line a call (the common case): the calls per site are its lines.
    calls_by_key = by_key if len(calls) == len(idx) else Counter(map(keys.__getitem__, calls))
    last = lines[-1]
    credits += [(key, last, n, calls_by_key[key]) for key, n in by_key.items()]
    return credits, too_far, after


def file_calls(batch: Any, offset: float) -> list[tuple[int, list[float], list[Any], dict[int, tuple] | None,
                                                         dict[int, Any], dict[int, Any]]]:
    """Fast-path call notes ``(thread, perf time, function, code, offset[, arguments])``
    as ``(thread, Unix times, keys, extras, functions by id, codes by id)``
    per thread, in C where the notes are of one thread (the common case). A
    key is ``(id(function), id(code), instruction offset)``: once filed, the
    notes keep no jitted function alive (nor its executables); the caller
    keeps what it needs of the functions (their names) and the codes."""
    batch = list(batch)
    if not batch:
        return []
    idents = list(map(_first, batch))
    if idents.count(idents[0]) == len(idents):
        groups: Any = ((idents[0], batch),)
    else:
        split: dict[int, list[tuple]] = {}
        for record in batch:
            split.setdefault(record[0], []).append(record)
        groups = split.items()
    out = []
    for ident, records in groups:
        times = list(map(offset.__add__, map(_second, records)))
        keys = list(zip(map(id, map(_third, records)), map(id, map(_fourth, records)), map(_fifth, records)))
        # One record per site (a loop calls a few sites over and over): its
        # function and code, looked at once.
        sites = dict(zip(keys, records)).values()
        extras = None
        if max(map(len, records)) > 5:  # a call whose arguments were read
            extras = {i: ("d", id(r[2]), r[3], r[4], r[5]) for i, r in enumerate(records) if len(r) > 5}
            for i in extras:
                keys[i] = None
        out.append((ident, times, keys, extras, {id(r[2]): r[2] for r in sites}, {id(r[3]): r[3] for r in sites}))
    return out
