"""Time series that stay small for runs of any length, without losing peaks.

A :class:`History` keeps several resolutions of the same K series: the raw
samples for the last few minutes, then 1 s, 10 s and 60 s buckets. Each
bucket keeps the min and max of every series, so a chart of a day-long run
still shows a 100 ms spike. Memory is bounded by the capacities, not by the
run length (the 60 s level holds 2 weeks; values are float32).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# (bucket seconds, capacity); 0 = raw samples.
DEFAULT_LEVELS = ((0.0, 6000), (1.0, 3600), (10.0, 8640), (60.0, 20_000))


class _Ring:
    """Fixed-capacity arrays of (t, lo[K], hi[K]) in time order."""

    def __init__(self, capacity: int, k: int) -> None:
        self.capacity = capacity
        self.t = np.full(capacity, np.nan)
        self.lo = np.full((capacity, k), np.nan, dtype=np.float32)
        self.hi = np.full((capacity, k), np.nan, dtype=np.float32)
        self.start = 0
        self.size = 0

    def append(self, t: float, lo: np.ndarray, hi: np.ndarray) -> None:
        i = (self.start + self.size) % self.capacity
        self.t[i], self.lo[i], self.hi[i] = t, lo, hi
        if self.size < self.capacity:
            self.size += 1
        else:
            self.start = (self.start + 1) % self.capacity

    def extend(self, t: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        """Append many rows at once (oldest first): one fancy-indexed write
        instead of a Python call per row, for a backlog."""
        n = len(t)
        if n == 0:
            return
        if n >= self.capacity:  # only the newest ``capacity`` rows survive
            t, lo, hi = t[-self.capacity:], lo[-self.capacity:], hi[-self.capacity:]
            n = self.capacity
        idx = (self.start + self.size + np.arange(n)) % self.capacity
        self.t[idx], self.lo[idx], self.hi[idx] = t, lo, hi
        grown = min(n, self.capacity - self.size)
        self.size += grown
        self.start = (self.start + n - grown) % self.capacity

    def ordered(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.size == 0:
            k = self.lo.shape[1]
            return np.empty(0), np.empty((0, k)), np.empty((0, k))
        idx = (self.start + np.arange(self.size)) % self.capacity
        return self.t[idx], self.lo[idx], self.hi[idx]

    def first_t(self) -> float | None:
        return float(self.t[self.start]) if self.size else None


@dataclass(frozen=True)
class BucketPlan:
    """:meth:`History.plan`: for each level (``steps``), where the times
    ``t`` start a new bucket and the bucket ids there (None for the raw
    level)."""

    steps: tuple[float, ...]
    t: np.ndarray
    runs: list[tuple[np.ndarray, np.ndarray] | None]


@dataclass(frozen=True)
class Window:
    """A slice of a History: times and per-series min/max, oldest first."""

    t: np.ndarray
    lo: np.ndarray  # shape (n, K)
    hi: np.ndarray
    bucket_s: float  # 0 for raw samples

    def series(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.t, self.lo[:, index], self.hi[:, index]


class History:
    """K named series at several resolutions.

    Args:
        names: series names, in column order.
        levels: (bucket_s, capacity) pairs, finest first; bucket 0 = raw.
    """

    def __init__(self, names: tuple[str, ...], levels: tuple[tuple[float, int], ...] = DEFAULT_LEVELS) -> None:
        self.names = names
        self.index = {n: i for i, n in enumerate(names)}
        k = len(names)
        self._levels = [(step, _Ring(cap, k)) for step, cap in levels]
        # The bucket being filled at each coarse level: (bucket id, lo, hi).
        self._open: list[tuple[int, np.ndarray, np.ndarray] | None] = [None] * len(levels)
        self.last_t: float | None = None
        #: The oldest time any row has (history merged in included): a level
        #: that does not reach back to it is missing part of the run.
        self.first_t: float | None = None
        #: Given by a replay index being built: every row put into a ring,
        #: level by level, so that the rings at any point of the recording
        #: can be rebuilt from the log (see :meth:`restore`).
        self.log: HistoryLog | None = None

    @property
    def levels_steps(self) -> tuple[float, ...]:
        """Each level's bucket seconds (0: raw samples), finest first."""
        return tuple(step for step, _ in self._levels)

    @property
    def levels(self) -> tuple[tuple[float, int], ...]:
        return tuple((step, ring.capacity) for step, ring in self._levels)

    def _put(self, li: int, t: float, lo: np.ndarray, hi: np.ndarray) -> None:
        self._levels[li][1].append(t, lo, hi)
        if self.log is not None:
            self.log.add(li, np.array([t]), lo[None, :], hi[None, :])

    def _put_many(self, li: int, t: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        self._levels[li][1].extend(t, lo, hi)
        if self.log is not None:
            self.log.add(li, t, lo, hi)

    def state(self) -> tuple[tuple[int, ...], list, float | None]:
        """What, with the log, makes this history again: the rows put into
        each level so far, the buckets being filled, the last time."""
        assert self.log is not None
        return self.log.counts(), [None if o is None else (o[0], o[1].copy(), o[2].copy()) for o in self._open], self.last_t

    @classmethod
    def restore(cls, names: tuple[str, ...], levels: tuple[tuple[float, int], ...], rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                open_buckets: list, last_t: float | None) -> History:
        """The history whose log held ``rows`` (level by level, oldest first,
        as many as the level keeps or fewer), with the buckets being filled."""
        history = cls(names, levels)
        for (_, ring), (t, lo, hi) in zip(history._levels, rows):
            ring.extend(t, lo, hi)
        history._open = list(open_buckets)
        history.last_t = last_t
        # first_t stays None: nothing was merged into a logged history, so a
        # level that is not full holds the whole run (History.window).
        return history

    def append(self, t: float, values: dict[str, float | None]) -> None:
        """Add one sample (missing or None values are stored as NaN)."""
        self._append_row(t, np.array([_num(values.get(n)) for n in self.names], dtype=np.float32))

    def _append_row(self, t: float, row: np.ndarray) -> None:
        self.last_t = t
        if self.first_t is None:
            self.first_t = t
        for li, (step, ring) in enumerate(self._levels):
            if step == 0:
                self._put(li, t, row, row)
                continue
            bucket = math.floor(t / step)
            cur = self._open[li]
            if cur is not None and cur[0] != bucket:
                self._put(li, cur[0] * step, cur[1], cur[2])
                cur = None
            if cur is None:
                self._open[li] = (bucket, row.copy(), row.copy())
            else:
                with np.errstate(invalid="ignore"):
                    np.fmin(cur[1], row, out=cur[1])
                    np.fmax(cur[2], row, out=cur[2])

    def plan(self, t: np.ndarray) -> BucketPlan:
        """Where the sample times ``t`` (float64, oldest first) open and
        close each level's buckets: the same for every history of these
        levels fed these times, so a batch's histories (a process's and
        each of its devices') share one."""
        out: list[tuple[np.ndarray, np.ndarray] | None] = []
        for step, _ in self._levels:
            if step == 0:
                out.append(None)
                continue
            buckets = np.floor(t / step).astype(np.int64)
            # Runs of one bucket id, in arrival order: exactly where the
            # one-at-a-time path closes and opens buckets.
            starts = np.concatenate(([0], np.flatnonzero(buckets[1:] != buckets[:-1]) + 1))
            out.append((starts, buckets[starts]))
        return BucketPlan(self.levels_steps, t, out)

    def extend(self, t: np.ndarray, rows: np.ndarray, plan: BucketPlan | None = None) -> None:
        """Add many samples at once, oldest first; the same result as
        :meth:`append` for each row in turn, at a fraction of the cost.

        Args:
            t: sample times, shape (n,).
            rows: values in column order, shape (n, K), NaN for missing.
            plan: :meth:`plan` of ``t`` for histories of these levels,
                made once for several (else here).
        """
        n = len(t)
        if n == 0:
            return
        t = np.asarray(t, dtype=np.float64)
        rows = np.asarray(rows, dtype=np.float32)
        if n == 1:  # a live sample: the per-row path is cheaper than the batch setup
            self._append_row(float(t[0]), rows[0].copy())
            return
        if plan is None or plan.t is not t or plan.steps != self.levels_steps:
            plan = self.plan(t)
        self.last_t = float(t[-1])
        if self.first_t is None:
            self.first_t = float(t[0])
        for li, (step, ring) in enumerate(self._levels):
            runs = plan.runs[li]
            if runs is None:
                self._put_many(li, t, rows, rows)
                continue
            starts, ids = runs
            lo = np.fmin.reduceat(rows, starts, axis=0)
            hi = np.fmax.reduceat(rows, starts, axis=0)
            cur = self._open[li]
            if cur is not None:
                if cur[0] == ids[0]:
                    np.fmin(lo[0], cur[1], out=lo[0])
                    np.fmax(hi[0], cur[2], out=hi[0])
                else:
                    self._put(li, cur[0] * step, cur[1], cur[2])
            if len(ids) > 1:
                self._put_many(li, (ids[:-1] * step).astype(np.float64), lo[:-1], hi[:-1])
            self._open[li] = (int(ids[-1]), lo[-1].copy(), hi[-1].copy())

    def window(self, seconds: float | None, end_t: float | None = None) -> Window:
        """The finest level that covers ``seconds`` back from ``end_t``.

        ``seconds=None`` means the whole run.
        """
        end = end_t if end_t is not None else self.last_t
        if end is None:
            k = len(self.names)
            return Window(np.empty(0), np.empty((0, k)), np.empty((0, k)), 0.0)
        start = -math.inf if seconds is None else end - seconds
        chosen = len(self._levels) - 1
        for li, (step, ring) in enumerate(self._levels):
            first = ring.first_t()
            if first is None:
                continue
            if first <= start:
                chosen = li
                break
            if ring.size < ring.capacity:
                # Not full: the level holds all it was given. That is the
                # whole run unless older history was merged into coarser
                # levels only (an agent's coarse history): then it must reach
                # back to the window's start, give or take 1 %.
                whole = self.first_t is None or first <= self.first_t + step
                if whole or (seconds is not None and first <= start + 0.01 * seconds):
                    chosen = li
                    break
        step, ring = self._levels[chosen]
        t, lo, hi = ring.ordered()
        cur = self._open[chosen]
        if cur is not None:  # include the bucket still being filled
            t = np.append(t, cur[0] * step)
            lo = np.vstack([lo, cur[1]])
            hi = np.vstack([hi, cur[2]])
        mask = (t >= start) & (t <= end)
        return Window(t[mask], lo[mask], hi[mask], step)

    def nbytes(self) -> int:
        return sum(r.t.nbytes + r.lo.nbytes + r.hi.nbytes for _, r in self._levels)

    # -- history that arrives after the present ----------------------------------
    def merge(self, other: History, below_s: float | None = None) -> None:
        """Put the rows of ``other`` (the same series and levels, built from
        older samples: history received after the present) into this one;
        with ``below_s``, only into the levels of finer buckets than that
        (the coarser ones have the same samples from a coarse history).

        Level by level, rows join in time order; a bucket both have becomes
        one, with the min of the lows and the max of the highs (so merging
        the same samples twice changes nothing), and raw rows this history
        has already are not added again. Each level keeps its newest
        ``capacity`` rows. A history whose rows are logged (a replay index
        being built) takes nothing: its log must stay in order.
        """
        if self.log is not None or other.first_t is None:
            return
        for li, (step, ring) in enumerate(other._levels):
            if below_s is not None and step >= below_s:
                continue
            t, lo, hi = ring.ordered()
            cur = other._open[li]
            if cur is not None:
                t = np.append(t, cur[0] * step)
                lo = np.vstack([lo, cur[1]])
                hi = np.vstack([hi, cur[2]])
            self._merge_rows(li, t, lo, hi)
        self._merged_first(other.first_t)

    def merge_buckets(self, step_s: float, t: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        """Put buckets of ``step_s`` (an agent's coarse history: their start
        times, lows and highs, any order) into every level whose bucket is a
        multiple of it; finer levels cannot take them."""
        if self.log is not None or len(t) == 0 or not step_s > 0:
            return
        t = np.asarray(t, dtype=np.float64)
        lo = np.asarray(lo, dtype=np.float32)
        hi = np.asarray(hi, dtype=np.float32)
        for li, (step, _ring) in enumerate(self._levels):
            ratio = step / step_s
            if step < step_s or abs(ratio - round(ratio)) > 1e-9:
                continue
            self._merge_rows(li, np.floor(t / step) * step, lo, hi)
        self._merged_first(float(t.min()))

    def _merged_first(self, t: float) -> None:
        self.first_t = t if self.first_t is None else min(self.first_t, t)
        if self.last_t is None:
            self.last_t = t

    def _merge_rows(self, li: int, t: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        step, ring = self._levels[li]
        if len(t) == 0:
            return
        cur = self._open[li]
        if step > 0 and cur is not None:
            open_t = cur[0] * step
            into = t >= open_t  # the bucket being filled (never newer: history is older)
            if into.any():
                with np.errstate(invalid="ignore"):
                    np.fmin(cur[1], np.fmin.reduce(lo[into], axis=0), out=cur[1])
                    np.fmax(cur[2], np.fmax.reduce(hi[into], axis=0), out=cur[2])
                keep = ~into
                t, lo, hi = t[keep], lo[keep], hi[keep]
                if len(t) == 0:
                    return
        et, elo, ehi = ring.ordered()
        if len(t) > 1 and not np.all(t[1:] > t[:-1]):
            order = np.argsort(t, kind="stable")
            t, lo, hi = t[order], lo[order], hi[order]
            if not np.all(t[1:] > t[:-1]):
                et = None  # equal times among them: the general way
        if et is not None and (len(et) == 0 or t[-1] < et[0]):
            # All older than what is here (history arrives newest part
            # first, or behind the present): no sort.
            n = min(len(t) + len(et), ring.capacity)
            all_t = np.concatenate([t, et])[-n:]
            all_lo = np.concatenate([lo, elo.astype(np.float32, copy=False)])[-n:]
            all_hi = np.concatenate([hi, ehi.astype(np.float32, copy=False)])[-n:]
            ring.start, ring.size = 0, 0
            ring.extend(all_t, all_lo, all_hi)
            return
        if et is None:
            et, elo, ehi = ring.ordered()
        # Existing rows first: a stable sort keeps them first among equal times.
        all_t = np.concatenate([et, t])
        all_lo = np.concatenate([elo.astype(np.float32, copy=False), lo])
        all_hi = np.concatenate([ehi.astype(np.float32, copy=False), hi])
        order = np.argsort(all_t, kind="stable")
        all_t, all_lo, all_hi = all_t[order], all_lo[order], all_hi[order]
        starts = np.concatenate(([0], np.flatnonzero(all_t[1:] != all_t[:-1]) + 1))
        if len(starts) < len(all_t):
            if step > 0:
                with np.errstate(invalid="ignore"):
                    all_lo = np.fmin.reduceat(all_lo, starts, axis=0)
                    all_hi = np.fmax.reduceat(all_hi, starts, axis=0)
            else:  # a raw sample twice is the same sample: the first copy stays
                all_lo, all_hi = all_lo[starts], all_hi[starts]
            all_t = all_t[starts]
        n = min(len(all_t), ring.capacity)
        ring.start, ring.size = 0, 0
        ring.extend(all_t[-n:], all_lo[-n:], all_hi[-n:])


class HistoryLog:
    """Every row a :class:`History` put into its rings, level by level.

    Raw rows (``lo`` equal to ``hi``) are kept once. Rows come in chunks
    (one per append or batch); :meth:`arrays` joins them.
    """

    def __init__(self, n_levels: int, raw_levels: tuple[int, ...] = (0,)) -> None:
        self._chunks: list[list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]] = [[] for _ in range(n_levels)]
        self._counts = [0] * n_levels
        self._raw = set(raw_levels)

    def add(self, li: int, t: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        t = np.array(t, dtype=np.float64)  # copies: the caller's buffers are reused
        self._chunks[li].append((t, np.array(lo, dtype=np.float32), None if li in self._raw else np.array(hi, dtype=np.float32)))
        self._counts[li] += len(t)

    def counts(self) -> tuple[int, ...]:
        return tuple(self._counts)

    def arrays(self, li: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Level ``li``'s rows: times, lows and highs (None for a raw level)."""
        chunks = self._chunks[li]
        if not chunks:
            return np.empty(0), np.empty((0, k), np.float32), None if li in self._raw else np.empty((0, k), np.float32)
        t = np.concatenate([c[0] for c in chunks])
        lo = np.concatenate([c[1] for c in chunks])
        hi = None if li in self._raw else np.concatenate([c[2] for c in chunks])
        self._chunks[li] = [(t, lo, hi)]
        return t, lo, hi


def _num(value: object) -> float:
    """A value as a history stores it: a number as a float, NaN (not
    measured) for anything else, a string of digits too (the wire writes
    numbers as JSON numbers)."""
    if value is None or isinstance(value, (bool, str, bytes)):
        return math.nan
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond a float
        return math.nan
