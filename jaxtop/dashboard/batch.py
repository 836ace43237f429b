"""What feeding a batch of records leaves to its end: history rows, written
in one numpy step per history, and each device's newest buffer map."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from jaxtop.wire import protocol
from jaxtop.dashboard.history import BucketPlan, History, _num
from jaxtop.wire.records import buffer_map

if TYPE_CHECKING:
    from jaxtop.dashboard.state import _DeviceState
    from jaxtop.wire.records import LiveArrays

#: Why a live buffer has no place in a scan's memory map (``live_arrays.unmapped``).
UNMAPPED_KINDS = ("not_ready", "last_address", "sharded", "no_address")


class Batch:
    """What :meth:`Model.feed_many <jaxtop.dashboard.model.Model.feed_many>`
    defers to the end of a batch: history rows (appended in one numpy write
    per history) and each device's newest buffer map (the only one a
    snapshot shows)."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[History, list[float], list[tuple[Any, ...]]]] = {}
        self.maps: dict[int, tuple[_DeviceState, LiveArrays]] = {}
        self.samples = 0
        #: pid -> (process, process row, transfers by direction) of its last sample: the
        #: Transfers panel's rates, measured once a batch over the process's window
        self.rates: dict[int, tuple[Any, tuple[Any, ...], tuple[Any, ...]]] = {}
        self.past = False  # fine history rows went into `past` histories

    def add(self, history: History, t: float, values: tuple[Any, ...]) -> None:
        entry = self.rows.get(id(history))
        if entry is None:
            entry = self.rows[id(history)] = (history, [], [])
        entry[1].append(t)
        # A decoded record's figures are numbers or None, which numpy stores
        # as NaN (not measured) when the rows are written at flush.
        entry[2].append(values)

    def flush(self) -> None:
        for state, live in self.maps.values():
            take_map(state, live)
        # A process's history and its devices' are fed the same sample
        # times: their buckets are planned once (History.plan).
        plans: list[tuple[list[float], BucketPlan]] = []
        for history, ts, rows in self.rows.values():
            # A value beyond float32 (1e308 in a recording) is stored as inf:
            # n/a, as the timelines draw it; no warning for it.
            with np.errstate(over="ignore"):
                try:
                    values = np.asarray(rows, dtype=np.float32)
                except (OverflowError, TypeError, ValueError):  # a coarse row's value of another kind
                    values = np.asarray([[_num(v) for v in row] for row in rows], dtype=np.float32)
                plan = None
                if len(ts) > 1:
                    plan = next((p for same, p in plans if same == ts), None)
                    if plan is None or plan.steps != history.levels_steps:
                        plan = history.plan(np.asarray(ts, dtype=np.float64))
                        plans.append((ts, plan))
                history.extend(plan.t if plan is not None else np.asarray(ts, dtype=np.float64), values, plan)
        self.rows.clear()
        self.maps.clear()


def take_map(state: _DeviceState, live: LiveArrays) -> None:
    """Keep the buffer map of a map-carrying ``live_arrays``, with the counts
    of its own scan, so that the map's caption never compares it with the
    bytes of another scan."""
    state.buffer_map = buffer_map(live.map)
    state.map_complete = live.map_complete is not False
    state.top_buffers = tuple(live.top or ())
    state.map_live_count = _whole(live.count)
    state.map_t = live.map_t
    state.map_live_bytes = _whole(live.bytes)
    # Absent means "none skipped" (the agent omits an empty dict) or an
    # older agent that did not say; the caption tells the two apart by count.
    # A kind this viewer does not know counts as "without an address".
    state.unmapped = {k: n for k, n in ((k, _whole(v)) for k, v in (live.unmapped or {}).items() if k in UNMAPPED_KINDS)
                      if n is not None and n > 0}


#: Addresses, sizes and counts of a buffer map: what int64 holds.
_INT63 = 1 << 63


def _whole(value: Any) -> int | None:
    """A count, size or address as an int within int64, or None (not a
    finite number, or beyond it)."""
    if value.__class__ is int:
        return value if -_INT63 <= value < _INT63 else None
    value = protocol.finite(value)
    return int(value) if value is not None and -_INT63 <= value < _INT63 else None
