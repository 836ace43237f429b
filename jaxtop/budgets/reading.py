"""The agent's ``sample`` records, read into the cumulative values a budget
needs (:class:`Reading`); docs/protocol.md has the record format.

Pure: the meter feeds it the agent's stream as typed records
(:func:`jaxtop.wire.records.decode`), tests feed it records made with
:func:`jaxtop.wire.records.from_dict`. It runs in the measured program's
process (the pytest plugin, ``jaxtop run --budget``) beside the agent, which
never imports it: msgspec, a dependency of jaxtop, is there.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from jaxtop.wire.protocol import DIRECTIONS
from jaxtop.wire.records import HostSyncs, Sample, TopBuffer, TransferSites, from_dict, kind_of
from jaxtop.wire.records.base import Num

#: Figures a budget reads from a sparse part of the samples (a probe sends
#: its part when it changed; the last one sent holds): name -> (part,
#: figure, kind), as reports and docs/budgets.md name them. ``total`` values
#: are differenced over a window; ``max`` values are process-wide maxima,
#: isolated like ``peak``.
WIRE_FIELDS: dict[str, tuple[str, str, str]] = {
    "host_syncs": ("host_syncs", "count", "total"),
    "host_syncs_per_step": ("host_syncs", "per_step_max", "max"),
}

#: How each of :data:`WIRE_FIELDS` is read from its part.
_FIGURES: dict[str, Callable[[HostSyncs], Num]] = {
    "host_syncs": lambda part: part.count,
    # docs/budgets.md's per-step figure: no probe sends it yet, and HostSyncs
    # (jaxtop.wire.records.holders) has no field for it, so it reads n/a
    # until that type names it.
    "host_syncs_per_step": lambda part: part.per_step_max,
}

#: Shapes per direction as the agent sends them: the 5 most frequent.
TOP_SHAPES_SENT = 5


@dataclass(frozen=True)
class KeptParts:
    """The sparse parts of the samples a budget reads, as last sent (a probe
    sends its part only on samples that have news of it).

    Attributes:
        host_syncs: host reads of device arrays (:data:`WIRE_FIELDS`).
        transfer_sites: the implicit transfers per line of the program, for
            limits such as ``h2d@train.py:27`` (:mod:`jaxtop.budgets.sites`).
    """

    host_syncs: HostSyncs | None = None
    transfer_sites: TransferSites | None = None


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
    top: list[TopBuffer] | None


@dataclass
class Reading:
    """The cumulative values of one ``sample`` record a budget needs."""

    t: float
    seq: Num = None
    counts: dict[str, int] | None = None
    bytes_known: dict[str, int] = field(default_factory=dict)
    bytes_unknown: dict[str, int] = field(default_factory=dict)
    shapes: dict[tuple[str, str], int] = field(default_factory=dict)
    shapes_complete: bool = False
    compiles: int | None = None
    devices: dict[Any, DeviceReading] = field(default_factory=dict)
    rss: int | None = None
    peak_rss: int | None = None
    fields: KeptParts = field(default_factory=KeptParts)

    @classmethod
    def from_sample(cls, rec: Sample | Mapping[str, Any],
                    fields: KeptParts | Mapping[str, Any] | None = None) -> "Reading":
        """Read a ``sample`` record (docs/protocol.md).

        Args:
            rec: the record; a dict is read as a line of the wire would be
                (:func:`jaxtop.wire.records.from_dict`).
            fields: the sparse parts seen so far (the previous reading's
                :attr:`fields`); the record's own win. A dict holds them by
                their wire names, read as the record is; None: none yet.

        Raises:
            ValueError: a dict that is not a ``sample`` (or ``backfill``).
        """
        rec = _sample(rec)
        kept = fields if isinstance(fields, KeptParts) else _kept(fields)
        r = cls(t=rec.t or 0.0, seq=rec.seq)
        tr = rec.transfers
        per = {d: tr.direction(d) for d in DIRECTIONS} if tr is not None else {}
        sent = {d: p for d, p in per.items() if p is not None}
        if tr is not None and len(sent) == len(DIRECTIONS):
            r.counts = {d: _int(p.count_total) for d, p in sent.items()}
            r.bytes_known = {d: _int(p.bytes_known_total) for d, p in sent.items()}
            r.bytes_unknown = {d: _int(p.count_bytes_unknown_total) for d, p in sent.items()}
            top = tr.top_shapes or []
            for s in top:
                if s.shape is not None:
                    # A shape without a direction is kept as the text "None" (it matches none).
                    r.shapes[(str(s.direction), s.shape)] = _int(s.count)
            r.shapes_complete = len(top) < TOP_SHAPES_SENT
        comp = rec.compile
        if comp is not None and comp.available is not False:
            r.compiles = _opt_int(comp.count_total)
        for dev in rec.devices or []:
            live = dev.live_arrays
            source = dev.source or ""
            r.devices[dev.id] = DeviceReading(
                id=dev.id,
                source=source,
                in_use=_opt_int(dev.bytes_in_use),
                peak=_opt_int(dev.peak_bytes_in_use) if source == "memory_stats" else None,
                scanned_t=live.scanned_t if live is not None else None,
                top=live.top if live is not None else None,
            )
        proc = rec.process
        if proc is not None:
            r.rss = _opt_int(proc.rss_bytes)
            r.peak_rss = _opt_int(proc.peak_rss_bytes)
        r.fields = replace(
            kept,
            host_syncs=rec.host_syncs if rec.host_syncs is not None else kept.host_syncs,
            transfer_sites=rec.transfer_sites if rec.transfer_sites is not None else kept.transfer_sites,
        )
        return r


def _sample(rec: Sample | Mapping[str, Any]) -> Sample:
    """``rec`` as a typed sample (a dict read as the wire's)."""
    if isinstance(rec, Sample):
        return rec
    record = from_dict(dict(rec))
    if not isinstance(record, Sample):
        raise ValueError(f"not a sample record: {kind_of(record)!r}")
    return record


def _kept(fields: Mapping[str, Any] | None) -> KeptParts:
    """Sparse parts given by their wire names, read as a sample's."""
    if not fields:
        return KeptParts()
    rec = _sample({**fields, "type": "sample"})
    return KeptParts(host_syncs=rec.host_syncs, transfer_sites=rec.transfer_sites)


def _int(value: Num) -> int:
    """A total: 0 where the agent sent none."""
    return int(value) if value is not None else 0


def _opt_int(value: Num) -> int | None:
    return int(value) if value is not None else None


def wire_value(reading: Reading | None, name: str) -> float | None:
    """A :data:`WIRE_FIELDS` value in a reading; None when not sent (or the
    probe says it is not available)."""
    part = wire_part(reading, name)
    if part is None or part.available is False:
        return None
    value = _FIGURES[name](part)
    return float(value) if value is not None else None


def wire_part(reading: Reading | None, name: str) -> HostSyncs | None:
    """The part a :data:`WIRE_FIELDS` value is read from, as last sent up to
    ``reading`` (None: never sent)."""
    # Every figure of WIRE_FIELDS is host_syncs's.
    return reading.fields.host_syncs if reading is not None else None
