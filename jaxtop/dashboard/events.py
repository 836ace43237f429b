"""The model's events list: its bound, the lines a sample adds to it, and
merging the events of a process rebuilt elsewhere."""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from jaxtop.dashboard.model import Event

#: Events kept, all processes together (the oldest go first).
MAX_EVENTS = 500


def sample_events(rec: dict[str, Any], t: float) -> list[tuple[str, str, Any]]:
    """The events list's lines a sample brings, ``(kind, text, t)``: its
    compiles, failed donations and the agent's events. One wording for a
    live sample and for one of the history."""
    out = []
    comp = rec.get("compile") or {}
    if comp.get("count"):
        out.append(("compile", f"{comp['count']} backend compile(s); {comp.get('count_total')} total, "
                               f"{comp.get('seconds_total', 0):.2f} s", t))
    don = rec.get("donation") or {}
    if don.get("failed"):
        out.append(("donation", f"{don['failed']} failed donation(s): {don.get('last_message') or ''}", t))
    for ev in rec.get("events") or []:
        if isinstance(ev, dict):
            text = ev.get("text") or ", ".join(f"{k}={v}" for k, v in ev.items() if k not in ("kind", "t"))
            out.append((str(ev.get("kind", "event")), text, ev.get("t", t)))
    return out


def merged_events(events: Iterable[Event], pid: int, ours: list[Event]) -> collections.deque[Event]:
    """``events`` with ``pid``'s replaced by ``ours``. Alone, ``ours`` keep
    the order they were fed in (a replay rebuilt by seeking shows what
    playing gave); among other processes' events, all go in time order."""
    kept = [e for e in events if e.pid != pid]
    merged = sorted(kept + ours, key=lambda e: e.t) if kept else ours
    return collections.deque(merged, maxlen=MAX_EVENTS)
