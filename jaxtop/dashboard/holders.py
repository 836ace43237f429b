"""The dashboard's fold of ``holders``, ``labels`` and ``host_syncs`` fields.

One :class:`HoldersFold` per process takes each ``sample`` record and keeps
what the Holders screen shows:
allocation sites with the history of their bytes, the mark, leak suspects,
named pytrees and host-sync call sites. :meth:`HoldersFold.view` returns a
frozen :class:`HoldersView`. No Textual, no sockets, no jax; not thread-safe
by itself (the model feeds and reads it under its own lock).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jaxtop.wire.records import Sample

#: Profiles of history kept per site (the sparkline shows the last ones).
SITE_HISTORY = 120
#: Sites kept at most; the smallest that are no longer listed are dropped first.
MAX_SITES = 2000

SiteKey = tuple[str, int, str]


@dataclass(frozen=True)
class Growth:
    """How a site grows in its current run of rises (from the agent)."""

    rises: int
    for_s: float
    bytes_per_min: float | None
    count_per_min: float | None
    since_t: float | None


@dataclass(frozen=True)
class SiteView:
    """One allocation site in the latest profile."""

    key: SiteKey
    site: str  # train.py:120
    function: str
    file: str
    line: int
    bytes: int
    count: int
    share: float | None  # of the bytes in use (allocator) or of the profile's total
    devices: dict[str, tuple[int, int]]
    history: tuple[float | None, ...]  # bytes per profile, oldest first (None: not listed then)
    mark_bytes: int | None  # change since the mark; None without a mark
    mark_count: int | None
    suspect: bool
    growth: Growth | None
    library: bool = False


@dataclass(frozen=True)
class LabelView:
    """One named pytree."""

    name: str
    bytes: int
    arrays: int
    alive: int
    labelled_t: float | None
    followed: bool = False  # an object whose leaves the agent lists again as it changes


@dataclass(frozen=True)
class SyncSiteView:
    """One call site that read device arrays on the host."""

    site: str
    function: str
    file: str
    line: int
    count: int
    kinds: dict[str, int]
    per_s: float | None  # between the last two records
    last_t: float | None


@dataclass(frozen=True)
class HoldersView:
    """Everything the Holders screen shows for one process."""

    t: float | None = None  # the latest profile
    seq: int | None = None
    profiles: int = 0  # profiles seen by this viewer
    seconds: float | None = None
    interval_s: float | None = None
    reason: str | None = None
    bytes: int | None = None
    count: int | None = None
    in_use_bytes: int | None = None
    by_device: dict[str, tuple[int, int]] = field(default_factory=dict)
    sites: tuple[SiteView, ...] = ()
    sites_total: int = 0
    other_bytes: int = 0
    other_count: int = 0
    other_sites: int = 0
    mark_t: float | None = None
    mark_bytes: int | None = None
    mark_count: int | None = None
    error: str | None = None
    labels: tuple[LabelView, ...] = ()
    labels_t: float | None = None
    syncs: tuple[SyncSiteView, ...] = ()
    syncs_total: int | None = None
    syncs_by_kind: dict[str, int] = field(default_factory=dict)
    syncs_sites_total: int = 0
    syncs_available: bool | None = None  # None: the agent sends no host_syncs
    syncs_reason: str | None = None
    syncs_uncounted: str | None = None  # reads the agent cannot see (numpy's of CPU arrays)
    syncs_t: float | None = None
    last_t: float | None = None  # the latest sample of the process

    @property
    def suspects(self) -> tuple[SiteView, ...]:
        return tuple(s for s in self.sites if s.suspect)

    @property
    def empty(self) -> bool:
        return self.t is None and not self.labels and self.syncs_available is None and self.error is None


def _int(value: Any, default: int = 0) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _key(rec: dict[str, Any]) -> SiteKey:
    return (str(rec.get("file") or ""), _int(rec.get("line")), str(rec.get("function") or rec.get("site") or "?"))


def _devices(value: Any) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    if isinstance(value, dict):
        for name, pair in value.items():
            if isinstance(pair, (list, tuple)) and len(pair) >= 2:
                out[str(name)] = (_int(pair[0]), _int(pair[1]))
    return out


class _Site:
    __slots__ = ("rec", "history", "seen_seq")

    def __init__(self) -> None:
        self.rec: dict[str, Any] = {}
        self.history: collections.deque[float | None] = collections.deque(maxlen=SITE_HISTORY)
        self.seen_seq = 0


class HoldersFold:
    """Folds one process's records into a :class:`HoldersView`."""

    def __init__(self) -> None:
        self._sites: dict[SiteKey, _Site] = {}
        self._latest: dict[str, Any] | None = None
        self._profiles = 0
        self._labels: dict[str, Any] | None = None
        self._syncs: dict[str, Any] | None = None
        self._sync_prev: dict[SiteKey, tuple[float, int]] = {}
        self._sync_rate: dict[SiteKey, float] = {}
        self._error: str | None = None
        self._last_t: float | None = None
        self._view: HoldersView | None = None

    def feed(self, sample: Sample) -> bool:
        """Takes one sample; returns whether it changed anything.

        Reads its ``holders``, ``labels`` and ``host_syncs``.
        """
        changed = False
        t = sample.t
        if t is not None:
            self._last_t = t
        holders = sample.holders
        if holders is not None:
            self._take_profile(holders)
            changed = True
        labels = sample.labels
        if labels is not None:
            self._labels = labels
            changed = True
        syncs = sample.host_syncs
        if syncs is not None:
            self._take_syncs(syncs)
            changed = True
        if changed:
            self._view = None
        return changed

    def _take_profile(self, rec: dict[str, Any]) -> None:
        if rec.get("error") and "sites" not in rec:
            self._error = str(rec["error"])
            return
        self._error = None
        self._latest = rec
        self._profiles += 1
        seq = self._profiles
        sites = rec.get("sites") if isinstance(rec.get("sites"), list) else []
        complete = _int(rec.get("sites_total"), len(sites)) <= len(sites)
        listed: set[SiteKey] = set()
        for site in sites:
            if not isinstance(site, dict):
                continue
            key = _key(site)
            listed.add(key)
            state = self._sites.get(key)
            if state is None:
                state = self._sites[key] = _Site()
                # A site first listed now may have lived before in "other":
                # its earlier profiles are unknown, not zero.
                state.history.extend([None] * min(seq - 1, SITE_HISTORY))
            state.rec = site
            state.history.append(float(_int(site.get("bytes"))))
            state.seen_seq = seq
        for key, state in self._sites.items():
            if key not in listed:
                # Not listed: gone (0) when the record lists every site, else unknown.
                state.history.append(0.0 if complete else None)
        if len(self._sites) > MAX_SITES:
            ranked = sorted(self._sites.items(), key=lambda kv: (kv[1].seen_seq, _int(kv[1].rec.get("bytes"))), reverse=True)
            self._sites = dict(ranked[:MAX_SITES])

    def _take_syncs(self, rec: dict[str, Any]) -> None:
        t = _num(rec.get("t"))
        for site in rec.get("sites") or []:
            if not isinstance(site, dict):
                continue
            key = _key(site)
            count = _int(site.get("count"))
            prev = self._sync_prev.get(key)
            if t is not None:
                if prev is not None and t > prev[0]:
                    self._sync_rate[key] = max(0.0, (count - prev[1]) / (t - prev[0]))
                self._sync_prev[key] = (t, count)
        self._syncs = rec

    # -- reading --------------------------------------------------------------------
    def view(self) -> HoldersView:
        """The frozen view (cached until the next change)."""
        if self._view is not None and self._view.last_t == self._last_t:
            return self._view
        self._view = self._build()
        return self._view

    def _build(self) -> HoldersView:
        latest = self._latest or {}
        in_use = latest.get("in_use_bytes")
        total = _int(latest.get("bytes")) if latest else None
        denominator = _num(in_use) or (float(total) if total else None)
        mark = latest.get("mark") if isinstance(latest.get("mark"), dict) else None
        sites: list[SiteView] = []
        listed_now = {_key(s) for s in latest.get("sites") or [] if isinstance(s, dict)}
        for key, state in self._sites.items():
            if key not in listed_now:
                continue  # the screen lists the latest profile's sites (the agent adds those gone since the mark)
            rec = state.rec
            nbytes = _int(rec.get("bytes"))
            growth = rec.get("growth") if isinstance(rec.get("growth"), dict) else None
            mark_rec = rec.get("mark") if (mark and isinstance(rec.get("mark"), dict)) else None
            sites.append(SiteView(
                key=key,
                site=str(rec.get("site") or key[2]),
                function=key[2],
                file=key[0],
                line=key[1],
                bytes=nbytes,
                count=_int(rec.get("count")),
                share=(nbytes / denominator) if denominator else None,
                devices=_devices(rec.get("devices")),
                history=tuple(state.history),
                mark_bytes=_int(mark_rec.get("bytes")) if mark_rec else None,
                mark_count=_int(mark_rec.get("count")) if mark_rec else None,
                suspect=bool(rec.get("suspect")),
                growth=Growth(
                    rises=_int(growth.get("rises")),
                    for_s=_num(growth.get("for_s")) or 0.0,
                    bytes_per_min=_num(growth.get("bytes_per_min")),
                    count_per_min=_num(growth.get("count_per_min")),
                    since_t=_num(growth.get("since_t")),
                ) if growth else None,
                library=bool(rec.get("library")),
            ))
        sites.sort(key=lambda s: (-s.bytes, -s.count, s.site, s.function))
        other = latest.get("other") if isinstance(latest.get("other"), dict) else {}

        labels = []
        for tree in (self._labels or {}).get("trees") or []:
            if isinstance(tree, dict):
                labels.append(LabelView(
                    name=str(tree.get("name", "?")),
                    bytes=_int(tree.get("bytes")),
                    arrays=_int(tree.get("arrays")),
                    alive=_int(tree.get("alive")),
                    labelled_t=_num(tree.get("labelled_t")),
                    followed=tree.get("followed") is True,
                ))
        syncs = []
        sync_rec = self._syncs or {}
        for site in sync_rec.get("sites") or []:
            if isinstance(site, dict):
                key = _key(site)
                kinds = site.get("kinds") if isinstance(site.get("kinds"), dict) else {}
                syncs.append(SyncSiteView(
                    site=str(site.get("site") or key[2]),
                    function=key[2],
                    file=key[0],
                    line=key[1],
                    count=_int(site.get("count")),
                    kinds={str(k): _int(v) for k, v in kinds.items()},
                    per_s=self._sync_rate.get(key),
                    last_t=_num(site.get("last_t")),
                ))
        by_kind = sync_rec.get("by_kind") if isinstance(sync_rec.get("by_kind"), dict) else {}
        return HoldersView(
            t=_num(latest.get("t")),
            seq=_int(latest.get("seq")) if latest else None,
            profiles=self._profiles,
            seconds=_num(latest.get("seconds")),
            interval_s=_num(latest.get("interval_s")),
            reason=latest.get("reason"),
            bytes=total,
            count=_int(latest.get("count")) if latest else None,
            in_use_bytes=_int(in_use) if _num(in_use) is not None else None,
            by_device=_devices(latest.get("by_device")),
            sites=tuple(sites),
            sites_total=_int(latest.get("sites_total"), len(sites)),
            other_bytes=_int(other.get("bytes")),
            other_count=_int(other.get("count")),
            other_sites=_int(other.get("sites")),
            mark_t=_num(mark.get("t")) if mark else None,
            mark_bytes=_int(mark.get("bytes")) if mark else None,
            mark_count=_int(mark.get("count")) if mark else None,
            error=self._error,
            labels=tuple(labels),
            labels_t=_num((self._labels or {}).get("t")),
            syncs=tuple(syncs),
            syncs_total=_int(sync_rec.get("count")) if self._syncs is not None else None,
            syncs_by_kind={str(k): _int(v) for k, v in by_kind.items()},
            syncs_sites_total=_int(sync_rec.get("sites_total"), len(syncs)),
            syncs_available=bool(sync_rec.get("available")) if self._syncs is not None else None,
            syncs_reason=sync_rec.get("reason") if self._syncs is not None else None,
            syncs_uncounted=sync_rec["uncounted"] if isinstance(sync_rec.get("uncounted"), str) else None,
            syncs_t=_num(sync_rec.get("t")),
            last_t=self._last_t,
        )


def fold_records(records: list[dict[str, Any]]) -> HoldersView:
    """Folds a list of records (one process) into a view: tests, exports."""
    fold = HoldersFold()
    for record in records:
        fold.feed(record)
    return fold.view()
