"""What feeding a batch of records leaves to its end: history rows, written
in one numpy step per history, and each device's newest buffer map."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from jaxtop.wire import protocol
from jaxtop.dashboard.history import History, _num

if TYPE_CHECKING:
    from jaxtop.dashboard.model import _DeviceState

#: Why a live buffer has no place in a scan's memory map (``live_arrays.unmapped``).
UNMAPPED_KINDS = ("not_ready", "last_address", "sharded", "no_address")


class Batch:
    """What :meth:`Model.feed_many <jaxtop.dashboard.model.Model.feed_many>`
    defers to the end of a batch: history rows (appended in one numpy write
    per history) and each device's newest buffer map (the only one a
    snapshot shows)."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[History, list[float], list[list[float]]]] = {}
        self.maps: dict[int, tuple[_DeviceState, dict[str, Any]]] = {}
        self.samples = 0
        self.past = False  # fine history rows went into `past` histories

    def add(self, history: History, t: float, values: tuple[Any, ...]) -> None:
        entry = self.rows.get(id(history))
        if entry is None:
            entry = self.rows[id(history)] = (history, [], [])
        entry[1].append(t)
        # Numbers pass as they are; anything else as History.append stores it.
        entry[2].append([v if (v.__class__ is float or v.__class__ is int) else _num(v) for v in values])

    def flush(self) -> None:
        for state, live in self.maps.values():
            take_map(state, live)
        for history, ts, rows in self.rows.values():
            history.extend(np.asarray(ts, dtype=np.float64), np.asarray(rows, dtype=np.float32))
        self.rows.clear()
        self.maps.clear()


def take_map(state: _DeviceState, live: dict[str, Any]) -> None:
    """Keep the buffer map of a map-carrying ``live_arrays``, with the counts
    of its own scan, so that the map's caption never compares it with the
    bytes of another scan."""
    state.buffer_map = tuple((int(p), int(n)) for p, n in live.get("map") or [] if p is not None)
    state.map_complete = bool(live.get("map_complete", True))
    state.top_buffers = tuple(live.get("top") or ())
    count, nbytes = live.get("count"), live.get("bytes")
    state.map_live_count = int(count) if isinstance(count, (int, float)) else None
    map_t = live.get("map_t")
    state.map_t = float(map_t) if protocol.is_number(map_t) else None
    state.map_live_bytes = int(nbytes) if isinstance(nbytes, (int, float)) else None
    # Absent means "none skipped" (the agent omits an empty dict) or an
    # older agent that did not say; the caption tells the two apart by count.
    unmapped = live.get("unmapped") if isinstance(live.get("unmapped"), dict) else {}
    # A kind this viewer does not know counts as "without an address".
    state.unmapped = {k: int(v) for k, v in unmapped.items() if k in UNMAPPED_KINDS and isinstance(v, (int, float)) and v > 0}
