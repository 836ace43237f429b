"""Typed views of an out-of-memory census (an ``oom_census`` record).

The OOM screen reads these, never the record's keys. The sentences that
``jaxtop oom`` prints (:mod:`jaxtop.dashboard.oom_report`) are worded from the record
itself, so the view keeps it (``record``, and each site's and the host's
object) to hand to that wording: the screen and the text report then never
say different things.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jaxtop.wire import protocol

__all__ = ["OomArrayGroup", "OomArrays", "OomCensus", "OomDevice", "OomSite"]


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _number(value: Any) -> int | float | None:
    return value if protocol.is_number(value) else None


@dataclass(frozen=True)
class OomDevice:
    """One device at the failure; None where the census has no figure."""

    label: str  # "gpu:0"
    bytes_in_use: int | None
    bytes_limit: int | None
    pool_bytes: int | None
    largest_free_block_bytes: int | None
    fragmentation: float | None
    live_array_bytes: int | None
    failed: bool  # the request failed on this device

    @classmethod
    def from_wire(cls, value: Any) -> OomDevice:
        d = _obj(value)
        return cls(
            label=f"{d.get('platform', '?')}:{d.get('id', '?')}",
            bytes_in_use=_number(d.get("bytes_in_use")),
            bytes_limit=_number(d.get("bytes_limit")),
            pool_bytes=_number(d.get("pool_bytes")),
            largest_free_block_bytes=_number(d.get("largest_free_block_bytes")),
            fragmentation=_number(d.get("fragmentation")),
            live_array_bytes=_number(d.get("live_array_bytes")),
            failed=bool(d.get("failed")),
        )


@dataclass(frozen=True)
class OomArrayGroup:
    """Live arrays of one shape, dtype and placement."""

    count: int
    bytes: int | None
    bytes_each: int | None
    shape: tuple[Any, ...] | str | None  # dims, or the agent's text for them
    dtype: str | None
    placement: str

    @classmethod
    def from_wire(cls, value: Any) -> OomArrayGroup:
        g = _obj(value)
        shape = g.get("shape")
        count = g.get("count", 0)
        return cls(
            count=count if protocol.is_number(count) else 0,
            bytes=_number(g.get("bytes")),
            bytes_each=_number(g.get("bytes_each")),
            shape=tuple(shape) if isinstance(shape, (list, tuple)) else (None if shape is None else str(shape)),
            dtype=None if g.get("dtype") is None else str(g.get("dtype")),
            placement=str(g.get("placement", "")),
        )


@dataclass(frozen=True)
class OomArrays:
    """The largest live arrays, grouped; ``groups`` lists the largest only."""

    groups: tuple[OomArrayGroup, ...]
    groups_total: int | None
    bytes: int | None
    shown_bytes: int | None

    @property
    def groups_not_shown(self) -> int:
        return (self.groups_total or 0) - len(self.groups)

    @property
    def bytes_not_shown(self) -> int:
        return (self.bytes or 0) - (self.shown_bytes or 0)

    @classmethod
    def from_wire(cls, value: Any) -> OomArrays | None:
        """The view, or None when the census did not scan the arrays."""
        a = _obj(value)
        if not a:
            return None
        return cls(groups=tuple(OomArrayGroup.from_wire(g) for g in _list(a.get("groups"))),
                   groups_total=_number(a.get("groups_total")), bytes=_number(a.get("bytes")),
                   shown_bytes=_number(a.get("shown_bytes")))


@dataclass(frozen=True)
class OomSite:
    """An allocation site holding memory at the failure."""

    user: bool  # a frame of the user's code is in its stack
    record: dict[str, Any]  # for jaxtop.dashboard.oom_report.site_line's words


@dataclass(frozen=True)
class OomCensus:
    """One census, as the OOM screen shows it."""

    pid: int | None
    argv: tuple[str, ...]
    message: str | None  # the error's text (its first line is shown)
    verdict: str | None
    devices: tuple[OomDevice, ...]
    host: dict[str, Any] | None  # for jaxtop.dashboard.oom_report.host_line's words
    arrays: OomArrays | None
    sites: tuple[OomSite, ...]
    skipped_parts: tuple[str, ...]  # parts left out for the time budget ("sites", …)
    allocator_stats: tuple[tuple[str, Any], ...]  # (name, value) at the failure
    allocator_occupancy: str | None  # the pool's occupancy string
    path: str | None  # the file the census was written to
    record: dict[str, Any]  # the census, for jaxtop.dashboard.oom_report's shared wording

    @classmethod
    def from_wire(cls, value: Any) -> OomCensus:
        c = _obj(value)
        trigger, request = _obj(c.get("trigger")), _obj(c.get("request"))
        message = trigger.get("message") or request.get("text")
        log = _obj(c.get("allocator_log"))
        sites = _obj(c.get("sites"))
        pid = c.get("pid")
        return cls(
            pid=pid if protocol.is_number(pid) else None,
            argv=tuple(str(a) for a in _list(c.get("argv"))),
            message=str(message) if message else None,
            verdict=str(c.get("verdict")) if c.get("verdict") else None,
            devices=tuple(OomDevice.from_wire(d) for d in _list(c.get("devices"))),
            host=_obj(c.get("host")) or None,
            arrays=OomArrays.from_wire(c.get("arrays")),
            sites=tuple(OomSite(user=bool(_obj(s).get("user", True)), record=_obj(s)) for s in _list(sites.get("top"))),
            skipped_parts=tuple(str(_obj(s).get("part")) for s in _list(c.get("skipped"))),
            allocator_stats=tuple(_obj(log.get("stats")).items()),
            allocator_occupancy=str(log.get("occupancy")) if log.get("occupancy") else None,
            path=str(c.get("path")) if c.get("path") else None,
            record=c,
        )
