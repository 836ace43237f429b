"""The model's events list: an :class:`Event` line, the list's bound, the
lines a sample adds to it, and merging the events of a process rebuilt
elsewhere."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Iterable

from jaxtop.wire.protocol import shown
from jaxtop.wire.records import Event as EventRecord
from jaxtop.wire.records import Sample


@dataclass(frozen=True)
class Event:
    """One line of the events list."""

    t: float
    pid: int
    kind: str  # compile, donation, dropped, disconnect, error, exit, profile, info, ...
    text: str


#: Events kept, all processes together (the oldest go first).
MAX_EVENTS = 500


def sample_events(rec: Sample, t: float) -> list[tuple[str, str, float]]:
    """The events list's lines a sample brings, ``(kind, text, t)``: its
    compiles, failed donations and the agent's events. One wording for a
    live sample and for one of the history."""
    out = []
    comp = rec.compile
    if comp is not None and comp.count:
        seconds = comp.seconds_total if comp.seconds_total is not None else 0
        out.append(("compile", f"{shown(comp.count)} backend compile(s); {shown(comp.count_total)} total, "
                               f"{seconds:.2f} s", t))
    don = rec.donation
    if don is not None and don.failed:
        out.append(("donation", f"{shown(don.failed)} failed donation(s): {shown(don.last_message or '')}", t))
    for ev in rec.events or ():
        out.append((ev.kind if ev.kind is not None else "event", ev.text or event_fields(ev),
                    ev.t if ev.t is not None else t))
    return out


def event_fields(ev: EventRecord) -> str:
    """An event without a text, quoted by its other fields (``key=value``)."""
    return ", ".join(f"{k}={v}" for k, v in (("source", ev.source), ("census_id", ev.census_id)) if v is not None)


def merged_events(events: Iterable[Event], pid: int, ours: list[Event]) -> collections.deque[Event]:
    """``events`` with ``pid``'s replaced by ``ours``. Alone, ``ours`` keep
    the order they were fed in (a replay rebuilt by seeking shows what
    playing gave); among other processes' events, all go in time order."""
    kept = [e for e in events if e.pid != pid]
    merged = sorted(kept + ours, key=lambda e: e.t) if kept else ours
    return collections.deque(merged, maxlen=MAX_EVENTS)
