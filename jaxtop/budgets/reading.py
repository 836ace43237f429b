"""The agent's ``sample`` records, read into the cumulative values a budget
needs (:class:`Reading`); docs/protocol.md has the record format.

Pure and standard library only: the meter feeds it the agent's stream,
tests feed it plain dicts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from jaxtop.wire.protocol import DIRECTIONS

#: Sample fields a budget reads as they are when present, for probes that
#: add their own field to the stream: name -> (field, key, kind). ``total``
#: values are differenced over a window; ``max`` values are process-wide
#: maxima, isolated like ``peak``.
WIRE_FIELDS: dict[str, tuple[str, str, str]] = {
    "host_syncs": ("host_syncs", "count", "total"),
    "host_syncs_per_step": ("host_syncs", "per_step_max", "max"),
}

#: Sample fields kept whole, as last sent (a probe sends them when they
#: change): the implicit transfers per line of the program, for limits such
#: as ``h2d@train.py:27`` (jaxtop.budgets.sites).
KEPT_FIELDS = ("transfer_sites",)

#: Shapes per direction as the agent sends them: the 5 most frequent.
TOP_SHAPES_SENT = 5


@dataclass
class DeviceReading:
    """One device in one sample.

    Attributes:
        id: the device id.
        source: ``memory_stats`` (the allocator's counters) or
            ``live_arrays`` (CPU: bytes of live jax arrays, as last scanned).
        in_use: bytes in use.
        peak: ``peak_bytes_in_use`` (memory_stats only; a process-wide max).
        scanned_t: when the live arrays were last scanned.
        top: the largest live buffers of the last scan, when the sample
            carries them.
    """

    id: Any
    source: str
    in_use: int | None
    peak: int | None
    scanned_t: float | None
    top: list[dict[str, Any]] | None


@dataclass
class Reading:
    """The cumulative values of one ``sample`` record a budget needs."""

    t: float
    seq: int | None = None
    counts: dict[str, int] | None = None
    bytes_known: dict[str, int] = field(default_factory=dict)
    bytes_unknown: dict[str, int] = field(default_factory=dict)
    shapes: dict[tuple[str, str], int] = field(default_factory=dict)
    shapes_complete: bool = False
    compiles: int | None = None
    devices: dict[Any, DeviceReading] = field(default_factory=dict)
    rss: int | None = None
    peak_rss: int | None = None
    fields: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_sample(cls, rec: Mapping[str, Any], fields: Mapping[str, Any] | None = None) -> "Reading":
        """Read a ``sample`` record (docs/protocol.md).

        Args:
            rec: the record.
            fields: the latest value of each of :data:`WIRE_FIELDS`'s fields
                seen so far (a probe may send its field only when it changed);
                the record's own win.
        """
        r = cls(t=_num(rec.get("t")) or 0.0, seq=rec.get("seq") if isinstance(rec.get("seq"), int) else None)
        tr = rec.get("transfers")
        if isinstance(tr, dict) and all(isinstance(tr.get(d), dict) for d in DIRECTIONS):
            r.counts = {d: _int(tr[d].get("count_total")) for d in DIRECTIONS}
            r.bytes_known = {d: _int(tr[d].get("bytes_known_total")) for d in DIRECTIONS}
            r.bytes_unknown = {d: _int(tr[d].get("count_bytes_unknown_total")) for d in DIRECTIONS}
            top = tr.get("top_shapes") if isinstance(tr.get("top_shapes"), list) else []
            for s in top:
                if isinstance(s, dict) and isinstance(s.get("shape"), str):
                    r.shapes[(str(s.get("direction")), s["shape"])] = _int(s.get("count"))
            r.shapes_complete = len(top) < TOP_SHAPES_SENT
        comp = rec.get("compile")
        if isinstance(comp, dict) and comp.get("available", True) is not False:
            r.compiles = _int(comp.get("count_total")) if "count_total" in comp else None
        for dev in rec.get("devices") or []:
            if not isinstance(dev, dict):
                continue
            live = dev.get("live_arrays") if isinstance(dev.get("live_arrays"), dict) else {}
            source = str(dev.get("source") or "")
            r.devices[dev.get("id")] = DeviceReading(
                id=dev.get("id"),
                source=source,
                in_use=_opt_int(dev.get("bytes_in_use")),
                peak=_opt_int(dev.get("peak_bytes_in_use")) if source == "memory_stats" else None,
                scanned_t=_num(live.get("scanned_t")),
                top=live.get("top") if isinstance(live.get("top"), list) else None,
            )
        proc = rec.get("process")
        if isinstance(proc, dict):
            r.rss = _opt_int(proc.get("rss_bytes"))
            r.peak_rss = _opt_int(proc.get("peak_rss_bytes"))
        r.fields = dict(fields or {})
        for name in (*(f for f, _key, _kind in WIRE_FIELDS.values()), *KEPT_FIELDS):
            if isinstance(rec.get(name), dict):
                r.fields[name] = rec[name]
        return r


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _int(value: Any) -> int:
    n = _num(value)
    return int(n) if n is not None else 0


def _opt_int(value: Any) -> int | None:
    n = _num(value)
    return int(n) if n is not None else None


def wire_value(reading: Reading | None, name: str) -> float | None:
    """A :data:`WIRE_FIELDS` value in a reading; None when not sent (or the
    probe says it is not available)."""
    if reading is None:
        return None
    fname, key, _kind = WIRE_FIELDS[name]
    rec = reading.fields.get(fname)
    if not isinstance(rec, dict) or rec.get("available") is False:
        return None
    return _num(rec.get(key))
