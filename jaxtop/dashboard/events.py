"""The model's events list: an :class:`Event` line, the list's bound, the
lines a sample adds to it, and merging the events of a process rebuilt
elsewhere."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any, Iterable

from jaxtop.wire import protocol
from jaxtop.wire.protocol import shown


@dataclass(frozen=True)
class Event:
    """One line of the events list."""

    t: float
    pid: int
    kind: str  # compile, donation, dropped, disconnect, error, exit, profile, info, ...
    text: str


#: Events kept, all processes together (the oldest go first).
MAX_EVENTS = 500


def sample_events(rec: dict[str, Any], t: float) -> list[tuple[str, str, Any]]:
    """The events list's lines a sample brings, ``(kind, text, t)``: its
    compiles, failed donations and the agent's events. One wording for a
    live sample and for one of the history."""
    out = []
    # Values are quoted with protocol.shown: a recording may hold anything there.
    comp = protocol.obj_of(rec.get("compile"))
    if comp.get("count"):
        seconds = protocol.finite(comp.get("seconds_total", 0))
        out.append(("compile", f"{shown(comp['count'])} backend compile(s); {shown(comp.get('count_total'))} total, "
                               + (f"{seconds:.2f} s" if seconds is not None else "time n/a"), t))
    don = protocol.obj_of(rec.get("donation"))
    if don.get("failed"):
        out.append(("donation", f"{shown(don['failed'])} failed donation(s): {shown(don.get('last_message') or '')}", t))
    for ev in protocol.list_of(rec.get("events")):
        if isinstance(ev, dict):
            text = ev.get("text") or ", ".join(f"{k}={shown(v)}" for k, v in ev.items() if k not in ("kind", "t"))
            out.append((shown(ev.get("kind", "event")), text if isinstance(text, str) else shown(text), ev.get("t", t)))
    return out


def merged_events(events: Iterable[Event], pid: int, ours: list[Event]) -> collections.deque[Event]:
    """``events`` with ``pid``'s replaced by ``ours``. Alone, ``ours`` keep
    the order they were fed in (a replay rebuilt by seeking shows what
    playing gave); among other processes' events, all go in time order."""
    kept = [e for e in events if e.pid != pid]
    merged = sorted(kept + ours, key=lambda e: e.t) if kept else ours
    return collections.deque(merged, maxlen=MAX_EVENTS)
