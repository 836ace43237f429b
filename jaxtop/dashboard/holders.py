"""The dashboard's fold of ``holders``, ``labels`` and ``host_syncs`` fields.

One :class:`HoldersFold` per process takes each decoded ``sample``
(:class:`~jaxtop.wire.records.Sample`, its parts typed in
:mod:`jaxtop.wire.records.holders`) and keeps what the Holders screen shows:
allocation sites with the history of their bytes, the mark, leak suspects,
named pytrees and host-sync call sites. :meth:`HoldersFold.view` returns a
frozen :class:`HoldersView`. No Textual, no sockets, no jax; not thread-safe
by itself (the model feeds and reads it under its own lock).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

from jaxtop.wire.records import (
    BytesCountPair, Holders, HolderSite, HostSyncs, Labels, Record, Sample, SyncSite, Unknown, WhoHolds,
)
from jaxtop.wire.records.base import Num

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


def _n(value: Num, default: int = 0) -> int:
    """A figure as the view's whole number; ``default`` where it is n/a."""
    return default if value is None else int(value)


def _f(value: Num) -> float | None:
    """A figure as a float, or None where it is n/a."""
    return None if value is None else float(value)


def _key(rec: HolderSite | SyncSite) -> SiteKey:
    return (rec.file or "", _n(rec.line), rec.function or rec.site or "?")


def _devices(value: dict[str, BytesCountPair] | None) -> dict[str, tuple[int, int]]:
    return {name: (_n(nbytes), _n(count)) for name, (nbytes, count) in (value or {}).items()}


class _Site:
    __slots__ = ("rec", "history", "seen_seq")

    def __init__(self) -> None:
        self.rec = HolderSite()
        self.history: collections.deque[float | None] = collections.deque(maxlen=SITE_HISTORY)
        self.seen_seq = 0


class HoldersFold:
    """Folds one process's records into a :class:`HoldersView`."""

    def __init__(self) -> None:
        self._sites: dict[SiteKey, _Site] = {}
        self._latest: Holders | None = None
        self._profiles = 0
        self._labels: Labels | None = None
        self._syncs: HostSyncs | None = None
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

    def _take_profile(self, rec: Holders) -> None:
        if rec.error and rec.sites is None:
            self._error = rec.error
            return
        self._error = None
        self._latest = rec
        self._profiles += 1
        seq = self._profiles
        sites = rec.sites or []
        complete = _n(rec.sites_total, len(sites)) <= len(sites)
        listed: set[SiteKey] = set()
        for site in sites:
            key = _key(site)
            listed.add(key)
            state = self._sites.get(key)
            if state is None:
                state = self._sites[key] = _Site()
                # A site first listed now may have lived before in "other":
                # its earlier profiles are unknown, not zero.
                state.history.extend([None] * min(seq - 1, SITE_HISTORY))
            state.rec = site
            state.history.append(_f(site.bytes))  # n/a: unknown, as when the site was not listed
            state.seen_seq = seq
        for key, state in self._sites.items():
            if key not in listed:
                # Not listed: gone (0) when the record lists every site, else unknown.
                state.history.append(0.0 if complete else None)
        if len(self._sites) > MAX_SITES:
            ranked = sorted(self._sites.items(), key=lambda kv: (kv[1].seen_seq, _n(kv[1].rec.bytes)), reverse=True)
            self._sites = dict(ranked[:MAX_SITES])

    def _take_syncs(self, rec: HostSyncs) -> None:
        t = rec.t
        for site in rec.sites or []:
            key = _key(site)
            count = _n(site.count)
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

    def _site_view(self, key: SiteKey, state: _Site, denominator: float | None, marked: bool) -> SiteView:
        rec = state.rec
        nbytes = _n(rec.bytes)
        growth = rec.growth
        mark = rec.mark if marked else None
        return SiteView(
            key=key,
            site=rec.site or key[2],
            function=key[2],
            file=key[0],
            line=key[1],
            bytes=nbytes,
            count=_n(rec.count),
            share=(nbytes / denominator) if denominator else None,
            devices=_devices(rec.devices),
            history=tuple(state.history),
            mark_bytes=_n(mark.bytes) if mark is not None else None,
            mark_count=_n(mark.count) if mark is not None else None,
            suspect=rec.suspect is True,
            growth=Growth(
                rises=_n(growth.rises),
                for_s=_f(growth.for_s) or 0.0,
                bytes_per_min=_f(growth.bytes_per_min),
                count_per_min=_f(growth.count_per_min),
                since_t=growth.since_t,
            ) if growth is not None else None,
            library=rec.library is True,
        )

    def _build(self) -> HoldersView:
        latest = self._latest
        sites: list[SiteView] = []
        if latest is not None:
            in_use = latest.in_use_bytes
            total = _n(latest.bytes)
            denominator = float(in_use) if in_use else (float(total) if total else None)
            listed_now = {_key(s) for s in latest.sites or []}
            for key, state in self._sites.items():
                if key in listed_now:  # the latest profile's sites (the agent adds those gone since the mark)
                    sites.append(self._site_view(key, state, denominator, latest.mark is not None))
        sites.sort(key=lambda s: (-s.bytes, -s.count, s.site, s.function))

        labels = self._labels
        trees = tuple(
            LabelView(
                name=tree.name if tree.name is not None else "?",
                bytes=_n(tree.bytes),
                arrays=_n(tree.arrays),
                alive=_n(tree.alive),
                labelled_t=tree.labelled_t,
                followed=tree.followed is True,
            )
            for tree in (labels.trees if labels is not None else None) or []
        )
        syncs = self._syncs
        sync_sites = []
        for site in (syncs.sites if syncs is not None else None) or []:
            key = _key(site)
            sync_sites.append(SyncSiteView(
                site=site.site or key[2],
                function=key[2],
                file=key[0],
                line=key[1],
                count=_n(site.count),
                kinds={kind: _n(n) for kind, n in (site.kinds or {}).items()},
                per_s=self._sync_rate.get(key),
                last_t=site.last_t,
            ))
        view = HoldersView(
            profiles=self._profiles,
            sites=tuple(sites),
            sites_total=len(sites),
            error=self._error,
            labels=trees,
            labels_t=labels.t if labels is not None else None,
            syncs=tuple(sync_sites),
            syncs_sites_total=len(sync_sites),
            last_t=self._last_t,
        )
        if latest is not None:
            other, mark = latest.other, latest.mark
            view = dataclasses.replace(
                view,
                t=latest.t,
                seq=_n(latest.seq),
                seconds=_f(latest.seconds),
                interval_s=_f(latest.interval_s),
                reason=latest.reason,
                bytes=_n(latest.bytes),
                count=_n(latest.count),
                in_use_bytes=_n(latest.in_use_bytes) if latest.in_use_bytes is not None else None,
                by_device=_devices(latest.by_device),
                sites_total=_n(latest.sites_total, len(sites)),
                other_bytes=_n(other.bytes) if other is not None else 0,
                other_count=_n(other.count) if other is not None else 0,
                other_sites=_n(other.sites) if other is not None else 0,
                mark_t=mark.t if mark is not None else None,
                mark_bytes=_n(mark.bytes) if mark is not None else None,
                mark_count=_n(mark.count) if mark is not None else None,
            )
        if syncs is not None:
            view = dataclasses.replace(
                view,
                syncs_total=_n(syncs.count),
                syncs_by_kind={kind: _n(n) for kind, n in (syncs.by_kind or {}).items()},
                syncs_sites_total=_n(syncs.sites_total, len(sync_sites)),
                syncs_available=syncs.available is True,
                syncs_reason=syncs.reason if syncs.reason is not None else syncs.error,  # error: the probe raised
                syncs_uncounted=syncs.uncounted,
                syncs_t=syncs.t,
            )
        return view


def fold_records(records: Iterable[Record | Unknown]) -> HoldersView:
    """Folds one process's typed records into a view (tests, exports);
    records other than samples (and their backfill copies) are skipped."""
    fold = HoldersFold()
    for record in records:
        if isinstance(record, Sample):
            fold.feed(record)
    return fold.view()


def who_said(who: WhoHolds) -> list[str]:
    """The events of a ``holders_who`` reply: per site searched, the
    program's names that keep its arrays (or that none reaches them), or
    the error that stopped the search."""
    out = [f"who holds: {who.error}"] if who.error else []
    for site in who.who or ():
        names = ", ".join(f"{path} ({n:.0f} of {site.arrays or 0:.0f})" for path, n in (site.paths or {}).items()
                          if n is not None)
        where = f"{site.file}:{site.line}"
        out.append(f"who holds {where}: {names}" if names else f"who holds {where}: no name of the program's reaches "
                   "its arrays" + ("" if site.complete is not False else " (the search stopped at its bounds)"))
    return out
