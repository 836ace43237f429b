"""Typed views of an out-of-memory census (an ``oom_census`` record).

The OOM screen reads these. The sentences that ``jaxtop oom`` prints
(:mod:`jaxtop.dashboard.oom_report`) are worded from the decoded record
itself, so the view keeps it (``record``, and each site's and the host's
part) to hand to that wording: the screen and the text report then never
say different things.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from jaxtop.wire.records import CensusArrayGroup, CensusArrays, CensusDevice, CensusHost, CensusSite
from jaxtop.wire.records import OomCensus as CensusRecord

__all__ = ["OomArrayGroup", "OomArrays", "OomCensus", "OomDevice", "OomSite", "device_label", "said"]


def device_label(dev: CensusDevice) -> str:
    """``gpu:0``: a census's device as the screen and ``jaxtop oom`` name it."""
    return f"{'?' if dev.platform is None else dev.platform}:{'?' if dev.id is None else dev.id}"


def said(part: msgspec.Struct | None) -> bool:
    """Whether a part of a census says anything: an empty object (a part
    whose probe failed, as ``host: {}``) is shown as absent."""
    return part is not None and part != part.__class__()


@dataclass(frozen=True)
class OomDevice:
    """One device at the failure; None where the census has no figure."""

    label: str  # "gpu:0"
    bytes_in_use: int | float | None
    bytes_limit: int | float | None
    pool_bytes: int | float | None
    largest_free_block_bytes: int | float | None
    fragmentation: float | None
    live_array_bytes: int | float | None
    failed: bool  # the request failed on this device

    @classmethod
    def from_wire(cls, d: CensusDevice) -> OomDevice:
        return cls(
            label=device_label(d),
            bytes_in_use=d.bytes_in_use,
            bytes_limit=d.bytes_limit,
            pool_bytes=d.pool_bytes,
            largest_free_block_bytes=d.largest_free_block_bytes,
            fragmentation=d.fragmentation,
            live_array_bytes=d.live_array_bytes,
            failed=bool(d.failed),
        )


@dataclass(frozen=True)
class OomArrayGroup:
    """Live arrays of one shape, dtype and placement."""

    count: int | float  # 0 where the census gives none
    bytes: int | float | None
    bytes_each: int | float | None
    shape: tuple[Any, ...] | str | None  # dims, or the agent's text for them
    dtype: str | None
    placement: str

    @classmethod
    def from_wire(cls, g: CensusArrayGroup) -> OomArrayGroup:
        shape = g.shape
        return cls(
            count=g.count if g.count is not None else 0,
            bytes=g.bytes,
            bytes_each=g.bytes_each,
            shape=tuple(shape) if isinstance(shape, list) else shape,
            dtype=g.dtype,
            placement=g.placement or "",
        )


@dataclass(frozen=True)
class OomArrays:
    """The largest live arrays, grouped; ``groups`` lists the largest only."""

    groups: tuple[OomArrayGroup, ...]
    groups_total: int | float | None
    bytes: int | float | None
    shown_bytes: int | float | None

    @property
    def groups_not_shown(self) -> int | float:
        return (self.groups_total or 0) - len(self.groups)

    @property
    def bytes_not_shown(self) -> int | float:
        return (self.bytes or 0) - (self.shown_bytes or 0)

    @classmethod
    def from_wire(cls, a: CensusArrays | None) -> OomArrays | None:
        """The view, or None when the census did not scan the arrays."""
        if a is None or not said(a):
            return None
        return cls(groups=tuple(OomArrayGroup.from_wire(g) for g in a.groups or ()),
                   groups_total=a.groups_total, bytes=a.bytes, shown_bytes=a.shown_bytes)


@dataclass(frozen=True)
class OomSite:
    """An allocation site holding memory at the failure."""

    user: bool  # a frame of the user's code is in its stack
    record: CensusSite  # for jaxtop.dashboard.oom_report.site_line's words


@dataclass(frozen=True)
class OomCensus:
    """One census, as the OOM screen shows it."""

    pid: int | float | None
    argv: tuple[str, ...]
    message: str | None  # the error's text (its first line is shown)
    verdict: str | None
    devices: tuple[OomDevice, ...]
    host: CensusHost | None  # for jaxtop.dashboard.oom_report.host_line's words; None when it says nothing
    arrays: OomArrays | None
    sites: tuple[OomSite, ...]
    skipped_parts: tuple[str, ...]  # parts left out for the time budget ("sites", …)
    allocator_stats: tuple[tuple[str, int | float], ...]  # (name, value) at the failure
    allocator_occupancy: str | None  # the pool's occupancy string
    path: str | None  # the file the census was written to
    record: CensusRecord  # the census, for jaxtop.dashboard.oom_report's shared wording

    @classmethod
    def from_wire(cls, c: CensusRecord) -> OomCensus:
        """The view of a decoded census (:func:`jaxtop.wire.records.decode`)."""
        trigger, request, log = c.trigger, c.request, c.allocator_log
        message = (trigger.message if trigger is not None else None) or (request.text if request is not None else None)
        return cls(
            pid=c.pid,
            argv=tuple(c.argv or ()),
            message=message or None,
            verdict=c.verdict or None,
            devices=tuple(OomDevice.from_wire(d) for d in c.devices or ()),
            host=c.host if said(c.host) else None,
            arrays=OomArrays.from_wire(c.arrays),
            sites=tuple(OomSite(user=s.user is not False, record=s) for s in (c.sites.top if c.sites else None) or ()),
            skipped_parts=tuple(str(s.part) for s in c.skipped or ()),
            allocator_stats=log.stats.items() if log is not None and log.stats is not None else (),
            allocator_occupancy=(log.occupancy or None) if log is not None else None,
            path=c.path or None,
            record=c,
        )
