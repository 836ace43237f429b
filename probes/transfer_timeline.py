"""Guard lines to calls in bulk: the relay's stamps and each thread's timeline of notes.

A program that transfers a thousand times a second writes a thousand guard
lines a second and notes at least as many calls. Tying them one by one in
Python cost the agent's thread about 5 us a line (holding the GIL the
program needs); with lists, ``map`` and ``bisect`` in C, 2.2-2.5 us, most of
it first touches of cold memory: a float object and a list slot per line
and per call, several times over. Here a batch's times are NumPy arrays (jax's
own dependency, imported before this probe starts): the relay sends each
line's time as a double (:func:`parse_stamps` reads a run of them with one
``unhexlify``), a thread's notes keep their times in one array and their
sites as small integer codes (:class:`KeyTable`), and a line finds its call
with one ``searchsorted`` per thread. The agent's Python runs per report,
thread and call site, not per line and not per call.

This runs inside the user's job: the standard library and NumPy only.
"""

from __future__ import annotations

from binascii import unhexlify
from operator import itemgetter
from typing import Any, Callable, Iterable

import numpy as np

__all__ = ["KeyTable", "Timeline", "file_calls", "parse_stamps", "tie"]

#: A run of stamps from the relay is ``dir,thread,HEX``: the lines' Unix
#: times as native doubles, in hex.
_DIRECTIONS = {b"h2d": "h2d", b"d2h": "d2h", b"d2d": "d2d"}
#: A stamp this far ahead of the agent's clock (seconds) is not a time it wrote.
_AHEAD_S = 300.0
#: ... nor one older than this.
_BEHIND_S = 86400.0
_EMPTY_TIMES = np.empty(0, np.float64)
_EMPTY_CODES = np.empty(0, np.int64)
_first, _second, _third, _fourth, _fifth = (itemgetter(i) for i in range(5))


def parse_stamps(data: bytes, now: float) -> list[tuple[str, int, np.ndarray]]:
    """The relay's stamps as ``(direction, thread id, Unix times)``, one entry
    per direction and thread in the order first written (a batch holds
    several reports; their runs of one thread are read together: NumPy calls
    cost per call, not per line). A run that is not whole doubles is
    skipped, and so is a time that cannot be a line's (not finite, a day
    old, minutes ahead)."""
    runs: dict[tuple[bytes, bytes], list[bytes]] = {}
    for run in data.split():
        parts = run.split(b",")
        if len(parts) != 3 or not parts[1].isdigit() or len(parts[2]) % 16 or parts[0] not in _DIRECTIONS:
            continue
        runs.setdefault((parts[0], parts[1]), []).append(parts[2])
    out = []
    lo, hi = now - _BEHIND_S, now + _AHEAD_S
    for (direction, thread), payloads in runs.items():
        try:
            raw = unhexlify(b"".join(payloads))
        except ValueError:  # binascii.Error: not hex somewhere: each run on its own
            raw = b"".join(_unhex_or_nothing(p) for p in payloads)
        if not raw:
            continue
        times = np.frombuffer(raw, np.float64)
        if not (times.min() > lo and times.max() < hi):  # False for nan too
            times = times[(times > lo) & (times < hi)]
            if not times.size:
                continue
        out.append((_DIRECTIONS[direction], int(thread), times))
    return out


def _unhex_or_nothing(payload: bytes) -> bytes:
    try:
        return unhexlify(payload)
    except ValueError:
        return b""


class KeyTable:
    """Small integer codes for the notes' hashable keys, shared by a probe's
    timelines (so a code means one site on every thread). ``None`` is -1:
    a rare note, whose whole value a timeline keeps apart."""

    def __init__(self) -> None:
        self.keys: list[Any] = []  # code -> key
        self._codes = _Codes(self.keys)

    def __len__(self) -> int:
        return len(self.keys)

    def intern(self, keys: Iterable[Any], n: int = -1) -> np.ndarray:
        """The codes of ``keys`` (new keys get the next free codes), one C loop."""
        return np.fromiter(map(self._codes.__getitem__, keys), np.int64, n)

    def compact(self, timelines: Iterable["Timeline"]) -> None:
        """Forget the keys no note of ``timelines`` names (a program that makes
        code at run time would grow the table without end); the notes' codes
        are renumbered."""
        timelines = list(timelines)
        used = np.unique(np.concatenate([tl.codes for tl in timelines] + [_EMPTY_CODES]))
        used = used[used >= 0]
        renumber = np.full(len(self.keys) + 1, -1, np.int64)  # the last slot: -1 stays -1
        renumber[used] = np.arange(used.size)
        kept = [self.keys[c] for c in used.tolist()]
        self.keys[:] = kept
        self._codes = _Codes(self.keys)
        for tl in timelines:
            tl.codes = renumber[tl.codes]

    def rewrite(self, new_key: Callable[[Any], Any]) -> None:
        """Each key replaced by ``new_key(key)``, its code unchanged (keys
        that become equal share the code the later one had for new notes)."""
        self.keys[:] = [new_key(key) for key in self.keys]
        self._codes = _Codes(self.keys)


class _Codes(dict):
    """key -> code, a new key coded on first lookup (``__missing__`` runs in
    Python only then: a loop calls a few sites over and over)."""

    def __init__(self, keys: list[Any]) -> None:
        super().__init__({key: code for code, key in enumerate(keys)})
        self[None] = -1
        self._keys = keys

    def __missing__(self, key: Any) -> int:
        code = self[key] = len(self._keys)
        self._keys.append(key)
        return code


class Timeline:
    """One thread's notes, oldest first.

    ``times`` (Unix) and ``codes`` run side by side. A common note (a call
    on the fast path, a host read) is its key's code in ``table``; a rare one
    (a slow-path call, a call whose arguments were read) has code -1 and its
    whole value in ``extras``, by absolute position (``base`` is the
    absolute position of ``times[0]``; trimming the front moves it).
    """

    __slots__ = ("times", "codes", "extras", "base", "table")

    def __init__(self, table: KeyTable | None = None) -> None:
        self.times = _EMPTY_TIMES
        self.codes = _EMPTY_CODES
        self.extras: dict[int, tuple] = {}
        self.base = 0
        self.table = table if table is not None else KeyTable()

    def add(self, times: Any, codes: Any, extras: dict[int, tuple] | None = None) -> None:
        """Notes in time order (``codes`` from :attr:`table`); ``extras`` by position in these."""
        times = np.asarray(times, np.float64)
        if not times.size:
            return
        codes = np.asarray(codes, np.int64)
        if self.times.size and times[0] < self.times[-1]:
            self._merge(times, codes, extras)
            return
        if extras:
            start = self.base + self.times.size
            self.extras.update((start + i, value) for i, value in extras.items())
        self.times = np.concatenate((self.times, times))
        self.codes = np.concatenate((self.codes, codes))

    def add_keys(self, times: Any, keys: list[Any], extras: dict[int, tuple] | None = None) -> None:
        """:meth:`add` with the keys themselves (None: a rare note)."""
        self.add(times, self.table.intern(keys, len(keys)), extras)

    def _merge(self, times: np.ndarray, codes: np.ndarray, extras: dict[int, tuple] | None) -> None:
        """Notes from another queue of the same thread (the slow path's) that
        go between notes already filed: the tail re-sorted (a stable sort:
        equal times keep their order)."""
        cut = int(np.searchsorted(self.times, times[0], "right"))
        start = self.base + cut
        old = self.times.size - cut
        moved = {i - start: self.extras.pop(i) for i in [i for i in self.extras if i >= start]}  # rare: a few
        moved.update((old + j, value) for j, value in (extras or {}).items())
        tail_times = np.concatenate((self.times[cut:], times))
        order = np.argsort(tail_times, kind="stable")
        self.times = np.concatenate((self.times[:cut], tail_times[order]))
        self.codes = np.concatenate((self.codes[:cut], np.concatenate((self.codes[cut:], codes))[order]))
        if moved:
            where = np.empty_like(order)
            where[order] = np.arange(order.size)  # old tail position -> new one
            self.extras.update((start + int(where[j]), value) for j, value in moved.items())

    def trim(self, horizon: float) -> None:
        """Let go of the notes before ``horizon``."""
        cut = int(np.searchsorted(self.times, horizon, "left"))
        if not cut:
            return
        self.times, self.codes = self.times[cut:], self.codes[cut:]
        self.base += cut
        if self.extras:
            self.extras = {i: v for i, v in self.extras.items() if i >= self.base}

    def value(self, i: int) -> Any:
        """The note at position ``i``: its key, or its whole value if rare."""
        code = int(self.codes[i])
        return self.table.keys[code] if code >= 0 else self.extras[self.base + i]


def tie(timeline: Timeline, lines: Any, window: float) -> tuple[list[tuple[Any, float, int, int]], int, np.ndarray]:
    """Each line (sorted times) to the first note at or after it, in bulk.

    Returns ``(credits, too_far, after)``: ``credits`` as ``(note, time,
    lines, calls)`` per site key (the time of the last line tied) and per
    rare note (its own time);
    ``too_far``, how many lines found their next note more than ``window``
    seconds later (it cannot be theirs); ``after``, the lines no note follows
    yet (their call is still running, or never returns).
    """
    # Each NumPy call here costs microseconds however few the lines (more
    # with cold caches, beside a busy program), so the common cases take
    # the fewest: one line per call, calls of one site.
    lines = np.asarray(lines, np.float64)
    times = timeline.times
    if not times.size:
        return [], 0, lines
    idx = times.searchsorted(lines, "left")
    tied = int(idx.searchsorted(times.size, "left"))  # idx never decreases: the lines after it have no note yet
    after = lines[tied:]
    idx, lines = idx[:tied], lines[:tied]
    too_far = 0
    if idx.size:
        near = times[idx] - lines <= window
        if not near.all():
            too_far = int(idx.size - np.count_nonzero(near))
            idx, lines = idx[near], lines[near]
    if not idx.size:
        return [], too_far, after
    # One call can log several lines: the calls are the distinct positions.
    if idx.size == 1 or (idx[1:] != idx[:-1]).all():
        calls, per_call = idx, None
    else:
        calls, per_call = np.unique(idx, return_counts=True)
    codes = timeline.codes[calls]
    credits = []
    first = codes[0]
    if first >= 0 and (codes == first).all():  # the common case: one site
        n = idx.size
        return [(timeline.table.keys[int(first)], float(lines[-1]), n, calls.size)], too_far, after
    if per_call is None:
        per_call = np.ones(calls.size, np.int64)
    rare = codes < 0
    if rare.any():  # rare notes, each credited apart
        for i, n in zip(calls[rare].tolist(), per_call[rare].tolist()):
            credits.append((timeline.value(i), float(times[i]), n, 1))
        keep = ~rare
        codes, per_call = codes[keep], per_call[keep]
    if codes.size:
        sites, which = np.unique(codes, return_inverse=True)
        n_lines = np.bincount(which, weights=per_call, minlength=sites.size)
        n_calls = np.bincount(which, minlength=sites.size)
        last = float(lines[-1])
        keys = timeline.table.keys
        credits += [(keys[c], last, int(n), k)
                    for c, n, k in zip(sites.tolist(), n_lines.tolist(), n_calls.tolist())]
    return credits, too_far, after


def file_calls(batch: Any, offset: float, table: KeyTable, described: bool = True) -> list[tuple[int, np.ndarray, np.ndarray,
                                                                        dict[int, tuple] | None, dict[int, Any],
                                                                        dict[int, Any]]]:
    """Fast-path call notes ``(thread, perf time, function, code, offset[, arguments])``
    as ``(thread, Unix times, codes, extras, functions by id, codes by id)``
    per thread, in C where the notes are of one thread (the common case). A
    note's key, coded in ``table``, is ``(id(function), id(code),
    instruction offset)``: once filed, the notes keep no jitted function
    alive (nor its executables); the caller keeps what it needs of the
    functions (their names) and the code objects. ``described``: whether
    any note may hold arguments (else none is looked for)."""
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
        n = len(records)
        times = np.fromiter(map(_second, records), np.float64, n)
        times += offset
        # By id: a function's or a code object's == may run the program's
        # code (flax's wrappers define __eq__) or call two objects equal.
        funs, code_objects = list(map(id, map(_third, records))), list(map(id, map(_fourth, records)))
        offsets = list(map(_fifth, records))
        if funs.count(funs[0]) == n and code_objects.count(code_objects[0]) == n and offsets.count(offsets[0]) == n:
            # One site for the whole batch (a loop calling one jitted step):
            # counted in C, without a key tuple per note.
            codes = np.full(n, table.intern(((funs[0], code_objects[0], offsets[0]),), 1)[0], np.int64)
            sites = [records[0]]
        else:
            # A few sites over and over: one record per site, its function
            # and code looked at once.
            codes = table.intern(zip(funs, code_objects, offsets), n)
            sites = [records[i] for i in np.unique(codes, return_index=True)[1].tolist()]
        extras = None
        if described and max(map(len, records)) > 5:  # a call whose arguments were read
            extras = {i: ("d", id(r[2]), r[3], r[4], r[5]) for i, r in enumerate(records) if len(r) > 5}
            codes[list(extras)] = -1
        out.append((ident, times, codes, extras, {id(r[2]): r[2] for r in sites}, {id(r[3]): r[3] for r in sites}))
    return out
