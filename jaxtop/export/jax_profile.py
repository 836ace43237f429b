"""The JAX profiler's trace, merged into jaxtop's Perfetto export on one clock
(``jaxtop export FILE --format perfetto --with-jax-profile DIR``).

``jax.profiler.trace(DIR)`` (or ``start_trace``) writes, per run, a folder
``DIR/plugins/profile/RUN/`` holding ``HOST.xplane.pb`` (the profiler's own
protobuf) and ``HOST.trace.json.gz`` (Chrome trace events; also
``perfetto_trace.json.gz`` with ``create_perfetto_trace=True``). The JSON's
times are microseconds from the start of the profile; the start itself, in
Unix nanoseconds, is only in the ``.xplane.pb``: the stat
``profile_start_time`` of its plane "Task Environment" (jax 0.10.2; the
event lines' ``timestamp_ns`` are relative to it, as the JSON's times are).

The JSON and the XSpace are then checked against each other: an event
named and timed the same in both gives the offset between the two files'
times (the median over every match; 0 on the jax checked, where the
converter writes the XSpace's times as they are). jaxtop's own trace is in
Unix microseconds, so the JAX events shifted by the start land on jaxtop's
clock: a ``jax.profiler.TraceAnnotation`` opened right after a jaxtop event
shows within microseconds of it (tests/test_export_jax_profile.py holds it
to 1 ms).

Protobuf fields read (xla/tsl/profiler/protobuf/xplane.proto):
XSpace.planes=1; XPlane.name=2, lines=3, event_metadata=4 and
stat_metadata=5 (maps of int64 to {id=1, name=2}), stats=6;
XLine.timestamp_ns=3, events=4; XEvent.metadata_id=1, offset_ps=2,
duration_ps=3; XStat.metadata_id=1, uint64_value=3, int64_value=4.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
from dataclasses import dataclass
from typing import Any

from jaxtop.probes.pprof import ProfileDecodeError, iter_fields

__all__ = ["JaxProfile", "JaxProfileError", "load", "merge"]

#: JAX's process ids are moved past any real pid, so that they never share
#: a track with jaxtop's (which uses the program's pid).
PID_OFFSET = 1 << 30
#: Events matched at most, to find the base (the first ones are enough).
MAX_MATCHES = 2000


class JaxProfileError(ValueError):
    """No usable JAX profile in the folder (the message says what is missing)."""


@dataclass
class JaxProfile:
    """One profiling run: its trace events and where they sit in Unix time."""

    run_dir: str
    events: list[dict[str, Any]]
    base_us: float  # add to an event's ts (µs from the profile's start) for Unix µs
    matched: int  # events the base was computed from


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _map_names(entry: Any) -> tuple[int | None, str | None]:
    """One entry of a metadata map: ``(key, value.name)``."""
    key, name = None, None
    for en, ew, ev in iter_fields(entry):
        if en == 1 and ew == 0:
            key = _signed(ev)
        elif en == 2 and ew == 2:
            for mn, mw, mv in iter_fields(ev):
                if mn == 2 and mw == 2:
                    name = bytes(mv).decode("utf-8", "replace")
    return key, name


def parse_xspace(data: bytes) -> tuple[list[tuple[str, int, int]], int | None]:
    """``(events, profile start)``: ``(name, start in ns from the profile's
    start, duration in ps)`` of every event of an XSpace, and the profile's
    start in Unix ns (None when the XSpace does not say). Raises
    JaxProfileError on data that is not an XSpace."""
    out: list[tuple[str, int, int]] = []
    start: int | None = None
    try:
        for number, wire, plane in iter_fields(data):
            if number != 1 or wire != 2:
                continue
            names: dict[int, str] = {}
            stat_names: dict[int, str] = {}
            lines, stats = [], []
            for pn, pw, value in iter_fields(plane):
                if pn == 3 and pw == 2:
                    lines.append(value)
                elif pn in (4, 5) and pw == 2:
                    key, name = _map_names(value)
                    if key is not None and name is not None:
                        (names if pn == 4 else stat_names)[key] = name
                elif pn == 6 and pw == 2:
                    stats.append(value)
            for stat in stats:
                fields = {sn: sv for sn, sw, sv in iter_fields(stat) if sw == 0}
                if stat_names.get(fields.get(1)) == "profile_start_time":
                    value = fields.get(3, fields.get(4))
                    if isinstance(value, int) and value > 0:
                        start = value
            for line in lines:
                start_ns, events = 0, []
                for ln, lw, lv in iter_fields(line):
                    if ln == 3 and lw == 0:
                        start_ns = _signed(lv)
                    elif ln == 4 and lw == 2:
                        events.append(lv)
                for event in events:
                    meta_id = offset_ps = duration_ps = 0
                    for en, ew, ev in iter_fields(event):
                        if ew != 0:
                            continue
                        if en == 1:
                            meta_id = _signed(ev)
                        elif en == 2:
                            offset_ps = _signed(ev)
                        elif en == 3:
                            duration_ps = _signed(ev)
                    if meta_id in names:
                        out.append((names[meta_id], start_ns + offset_ps // 1000, duration_ps))
    except ProfileDecodeError as exc:
        raise JaxProfileError(f"not a profiler XSpace: {exc}") from None
    return out, start


def _run_dir(directory: str) -> str:
    """The newest profiling run under ``directory`` (the folder that holds an ``.xplane.pb``)."""
    runs = []
    for root, _dirs, files in os.walk(directory):
        if any(f.endswith(".xplane.pb") for f in files):
            runs.append(root)
    if not runs:
        raise JaxProfileError(f"no JAX profile under {directory} (no .xplane.pb: was it written by "
                              "jax.profiler.trace(DIR) or start_trace(DIR)?)")
    return max(runs, key=lambda r: (os.path.getmtime(r), r))


def load(directory: str) -> JaxProfile:
    """The newest run of ``directory``, its events and their base.

    Raises:
        JaxProfileError: no run, no trace JSON beside its .xplane.pb, or no
            event found in both (the base cannot be known: nothing is guessed).
    """
    run = _run_dir(directory)
    files = sorted(os.listdir(run))
    traces = [f for f in files if f.endswith(".trace.json.gz")] or [f for f in files if f == "perfetto_trace.json.gz"]
    if not traces:
        raise JaxProfileError(f"{run} has an .xplane.pb but no .trace.json.gz (the profiler writes both)")
    try:
        with gzip.open(os.path.join(run, traces[0]), "rt", encoding="utf-8") as f:
            trace = json.load(f)
    except (OSError, ValueError, EOFError) as exc:
        raise JaxProfileError(f"{os.path.join(run, traces[0])}: not a trace: {exc}") from None
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        raise JaxProfileError(f"{traces[0]}: no traceEvents")
    planes: list[tuple[str, int, int]] = []
    start: int | None = None
    for name in (f for f in files if f.endswith(".xplane.pb")):
        with open(os.path.join(run, name), "rb") as f:
            found, started = parse_xspace(f.read())
        planes += found
        start = started if start is None else start
    if start is None:
        raise JaxProfileError(f"{run}: the .xplane.pb names no profile_start_time: where its times sit in "
                              "Unix time cannot be known")
    offset, matched = _offset_us(planes, events)
    return JaxProfile(run, [e for e in events if isinstance(e, dict)], start / 1000.0 + offset, matched)


def _offset_us(planes: list[tuple[str, int, int]], events: list[Any]) -> tuple[float, int]:
    """How far the JSON's times are from the XSpace's (µs), over the events in both."""
    by_key: dict[tuple[str, int], list[int]] = {}
    for name, start_ns, duration_ps in planes:
        by_key.setdefault((name, round(duration_ps / 1000)), []).append(start_ns)
    candidates = []
    for event in events:
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        ts, dur = event.get("ts"), event.get("dur")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            continue
        starts = by_key.get((str(event.get("name")), round(dur * 1000)))
        if starts and len(starts) == 1:  # one event of that name and length: no doubt which
            candidates.append(starts[0] / 1000.0 - ts)
            if len(candidates) >= MAX_MATCHES:
                break
    if not candidates:
        raise JaxProfileError("no event is in both the trace JSON and the .xplane.pb: they cannot be put on "
                              "one clock")
    return statistics.median(candidates), len(candidates)


def merge(trace_text: str, profile: JaxProfile) -> str:
    """jaxtop's trace JSON with the profile's events added on its clock."""
    trace = json.loads(trace_text)
    out = trace.setdefault("traceEvents", [])
    for event in profile.events:
        event = dict(event)
        if isinstance(event.get("pid"), int):
            event["pid"] += PID_OFFSET
        if isinstance(event.get("ts"), (int, float)):
            event["ts"] = round(event["ts"] + profile.base_us, 3)
        if event.get("ph") == "M" and event.get("name") == "process_name" and isinstance(event.get("args"), dict):
            event["args"] = {**event["args"], "name": f"jax profiler: {event['args'].get('name', '')}"}
        out.append(event)
    return json.dumps(trace, separators=(",", ":")) + "\n"
