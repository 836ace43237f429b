"""The dashboard's fold of the ``transfer_sites`` field: which line of the
program makes each implicit transfer.

The agent sends the field only when something changed (a sample without it
means no site counted a transfer since the last one), so one
:class:`TransferSitesFold` per process keeps the last field and, per site,
its recent ``count_total`` and ``bytes_total``: a site's rate is the
difference of its totals over the last :data:`RATE_WINDOW_S` seconds of
samples, as the Transfers panel's rates are differences of the agent's
counters. :meth:`TransferSitesFold.view` returns a frozen
:class:`TransferSitesView`. No Textual, no sockets; not thread-safe by
itself (the model feeds and reads it under its own lock). It reads the
typed field (:class:`~jaxtop.wire.records.TransferSites`): every string in
it is terminal-safe and every figure a number or None, as the decoder
(:mod:`jaxtop.wire.records.decoder`) made them.

What a site is (its line, callee, arguments, totals) is worked out once, as
its field comes in; a view adds only what depends on the moment it is
drawn: rates, and the quiet ticks since the field.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass, field, replace
from typing import Iterable

from jaxtop.dashboard.counter_window import RATE_WINDOW_S
from jaxtop.wire.records import Record, Sample, TransferArg, TransferSite, Unknown

__all__ = [
    "RATE_WINDOW_S", "SCALAR_ADVICE", "ScalarSummary", "TransferArgView", "TransferSiteView", "TransferSitesFold",
    "TransferSitesView", "fold_transfer_sites",
]

#: Totals kept per site at most: a window holds a few fields (the agent
#: sends one per batch of ticks, once a second; older agents up to ten a
#: second, 21 a window); a hostile recording with a clock that creeps by nanoseconds
#: must not grow them without end (the oldest then go, rates read low).
TOTALS_KEPT = 256
#: Sites whose totals are kept at most (the agent lists its 50 busiest; a
#: site can leave that list and come back).
MAX_KEPT = 500
#: Ticks of per-site history the screen draws at most.
HISTORY_TICKS = 120

SiteKey = tuple[str, str, int, str]  # (direction, file, line, function)

#: What to do about Python scalars passed to a jitted function on every
#: call. Not static_argnums: a value that changes every call (a step
#: counter) would compile anew for each one.
SCALAR_ADVICE = "keep them on the device (a jnp array in the step's state), or jnp.asarray once if constant"

#: ``args_seen`` values: the values were seen passing to the device; or read
#: from a call's arguments at that line after the call (inferred).
SEEN_TRANSFER, SEEN_CALL = "transfer", "call"


def _int(value: float | None, default: int = 0) -> int:
    """A count as the views keep it (a float the agent never writes, truncated)."""
    return default if value is None else int(value)


def _opt_int(value: float | None) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class TransferArgView:
    """One value a call at a site copied to the device (or would have)."""

    name: str  # "batch['x']"; "" where only jax's slow path saw it (unnamed)
    kind: str  # "NumPy array", "Python scalar", "list of Python scalar", "another device's array", …
    shape: str  # "float32[512,4096]"
    bytes: int | None  # None: unknown
    #: The same value as at the call read before (True), another (False), unknown (None).
    same: bool | None = None

    def text(self, kind: bool = True) -> str:
        """``batch['x'] NumPy array float32[8,4]`` (``kind=False``: without the kind),
        ``(same value at the calls read)`` or ``(new value at each call read)`` where two calls were compared."""
        parts = [self.name or "(unnamed)"]
        if kind and self.kind:
            parts.append(self.kind)
        if self.shape:
            parts.append(self.shape)
        if self.same is not None:
            parts.append("(same value at the calls read)" if self.same else "(new value at each call read)")
        return " ".join(parts)


@dataclass(frozen=True)
class TransferSiteView:
    """One line of the program and the transfers it made, in one direction."""

    direction: str  # h2d | d2h | d2d
    file: str
    line: int
    function: str  # the user's function at that line ("<module>" at the top level)
    callee: str  # the jitted function or jax op called there: "step", "sin (op)", "host read (float)"
    count_total: int
    calls_total: int
    bytes_total: int | None  # None: some transfer's size is unknown
    #: Over the last RATE_WINDOW_S of samples; from the agent's per-tick
    #: counts where one field only is in (a snapshot); None without either.
    count_per_s: float | None
    bytes_per_s: float | None  # sized by the calls read (inferred); see bytes_estimated
    #: True where ``bytes_per_s`` is the count rate times a size per
    #: transfer (the site's average, else its arguments' known sizes), not
    #: a difference of ``bytes_total``: inferred.
    bytes_estimated: bool
    args: tuple[TransferArgView, ...]
    args_seen: str | None  # "transfer", "call" (inferred) or None (not described)
    scalar: bool  # every transferred value is a Python scalar
    #: The callee whose call ``args`` are, where another than ``callee`` (a
    #: line that calls two things); None: ``callee``'s.
    args_of: str | None = None
    #: Transfers per agent tick, oldest first, up to the latest sample
    #: (ticks after the field's sample, in which nothing changed, are 0).
    history: tuple[int, ...] = ()

    @property
    def key(self) -> SiteKey:
        return (self.direction, self.file, self.line, self.function)

    @property
    def where(self) -> str:
        """``train.py:27`` (the file's base name; the full path is :attr:`file`)."""
        name = os.path.basename(self.file) if self.file else ""
        if not name:
            return "(no line)"
        return f"{name}:{self.line}"

    @property
    def inferred(self) -> bool:
        """The argument description was read from a call at that line, not
        seen passing to the device: the values that moved are inferred."""
        return self.args_seen == SEEN_CALL

    @property
    def main_arg(self) -> TransferArgView | None:
        """The argument to name first: the largest known, else the first."""
        if not self.args:
            return None
        return max(self.args, key=lambda a: -1 if a.bytes is None else a.bytes)

    def args_text(self, kind: bool = True) -> str:
        """Every argument, ``; ``-separated, ``~`` first where inferred."""
        if not self.args:
            return ""
        return ("~" if self.inferred else "") + "; ".join(a.text(kind) for a in self.args)


@dataclass(frozen=True)
class ScalarSummary:
    """The sites whose every transferred value is a Python scalar."""

    lines: int
    count_per_s: float | None
    count_total: int
    busiest: TransferSiteView | None

    @property
    def names(self) -> str:
        """The busiest site's scalar arguments' names (``lr``), or ""."""
        site = self.busiest
        if site is None:
            return ""
        names = [a.name for a in site.args if a.name and (site.scalar or ("scalar" in a.kind and "NumPy" not in a.kind))]
        return ", ".join(dict.fromkeys(names))


@dataclass(frozen=True)
class TransferSitesView:
    """The transfer sites of one process, at its latest sample."""

    t: float | None = None  # the sample that carried the latest field
    sites: tuple[TransferSiteView, ...] = ()  # as the agent ranked them (busiest in total first)
    sites_total: int = 0
    other_count_total: int | None = None  # transfers of the sites beyond the ones sent
    unattributed: dict[str, int] = field(default_factory=dict)  # by direction
    unattributed_reasons: dict[str, int] = field(default_factory=dict)
    unattributed_per_s: float | None = None
    pending: int = 0  # lines waiting for the call that made them
    history_s: float = 0.1  # what one entry of a site's history spans (the agent's batch of ticks)
    #: Why the probe failed on the latest sample that carried the field (it
    #: then sent nothing else: the sites are the last it sent); None when it did not.
    error: str | None = None

    @property
    def unattributed_total(self) -> int:
        return sum(self.unattributed.values())

    def bytes_of(self, direction: str) -> tuple[int | None, int]:
        """The bytes the lines sent carry in ``direction`` since start, as
        the agent sized them from the calls it read (inferred: a line of
        unknown size, and the lines beyond the ones sent, add nothing; None
        where no line has a size), and how many transfers those bytes are of."""
        total: int | None = None
        counted = 0
        for s in self.sites:
            if s.direction == direction and s.bytes_total is not None:
                total = (total or 0) + s.bytes_total
                counted += s.count_total
        return total, counted

    @property
    def arrays(self) -> tuple[TransferSiteView, ...]:
        """The sites that moved anything but Python scalars alone, busiest now first."""
        return _by_rate(s for s in self.sites if not s.scalar)

    @property
    def scalars(self) -> tuple[TransferSiteView, ...]:
        """The sites that moved Python scalars alone, busiest now first."""
        return _by_rate(s for s in self.sites if s.scalar)

    def scalar_summary(self) -> ScalarSummary | None:
        """Every Python scalar the lines copy, together: the lines that copy
        scalars alone, and the scalars among a line's other arguments (a
        step counter passed beside a NumPy batch is a scalar too); None when
        no line copies one. A line's transfers are one per value passed, so
        a mixed line's scalars are its share of them."""
        shares = [(s, share) for s in self.sites if s.direction == "h2d" for share in (_scalar_share(s),) if share]
        if not shares:
            return None
        rates = [s.count_per_s * share for s, share in shares if s.count_per_s is not None]
        busiest = max(shares, key=lambda x: ((x[0].count_per_s or 0.0) * x[1], x[0].count_total * x[1]))[0]
        return ScalarSummary(lines=len(shares), count_per_s=sum(rates) if rates else None,
                             count_total=round(sum(s.count_total * share for s, share in shares)), busiest=busiest)


def _scalar_share(site: TransferSiteView) -> float:
    """The share of a line's transfers that are Python scalars: all of a
    line of scalars alone, its scalar arguments' share of a mixed one."""
    if site.scalar:
        return 1.0
    if not site.args:
        return 0.0
    return sum(1 for a in site.args if "scalar" in a.kind and "NumPy" not in a.kind) / len(site.args)


def _by_rate(sites: Iterable[TransferSiteView]) -> tuple[TransferSiteView, ...]:
    # Busiest now first; a site with no rate yet (or of a process that
    # ended) by its total.
    return tuple(sorted(sites, key=lambda s: (-(s.count_per_s or 0.0), -s.count_total, s.where)))


class _Site:
    """What the fold keeps of one site besides its view: its recent totals."""

    __slots__ = ("totals", "seen", "first_t")

    def __init__(self) -> None:
        # (sample time, count_total, bytes_total or None), oldest first: the
        # last one before the rate window and those within it.
        self.totals: collections.deque[tuple[float, int, int | None]] = collections.deque(maxlen=TOTALS_KEPT)
        self.seen = 0.0  # the last field that listed it
        self.first_t: float | None = None  # its first total's time (a zero before its first field)


def _rate(totals: Iterable[tuple[float, int, int | None]], now: float, index: int,
          floor_s: float = 0.0, first_t: float | None = None) -> float | None:
    """The per-second growth of ``totals[index]`` over the window ending ``now``.

    A field's total counts what happened since the field before it, so the
    growth from the last total at or before the window's start (the base)
    to the newest is over the time between those two fields: a steady
    site reads its rate whatever the agent's batches span (a second, or
    1.2 s while the agent samples less often at its CPU ceiling; divided
    by the window instead, a site read 2.0k/s and 1.0k/s by turns where it
    made 1.7k/s). No field since the window's start: nothing changed, 0; a
    site younger than the window is measured from its first total
    (``first_t``), over ``floor_s`` at least (the window, or the stream's
    age where younger):
    a line first listed in a field is as likely lines the agent tied late,
    all at once, as a line that has just begun (a TPU recording's relay
    reported a loop's 398 transfers at the final sample, 0.05 s after the
    field before: 8.95k/s over those 0.05 s, beside the direction's 200/s
    over its window), so it is averaged over the window as the direction is.
    """
    totals = list(totals)
    if not totals:
        return None
    base = totals[0]
    start = now - RATE_WINDOW_S + 1e-3  # a sample on the window's edge, give or take a float's rounding, is in
    for entry in totals:
        if entry[0] <= start:
            base = entry
        else:
            break
    last = totals[-1]
    if last[index] is None or base[index] is None:
        return None
    if last is base:
        return 0.0 if now > last[0] else None  # one total at the present: no rate yet
    span = last[0] - base[0]
    if first_t is not None and base[0] <= first_t:
        span = max(span, floor_s)
    return max(0.0, (last[index] - base[index]) / span)


def _add(totals: collections.deque, entry: tuple[float, int, int | None]) -> None:
    """A field's total: one of the same moment replaced (a recording whose
    clock stands still must not grow the deque), then the window trimmed."""
    if totals and totals[-1][0] == entry[0]:
        totals[-1] = entry
    else:
        totals.append(entry)
    _trim(totals, entry[0])


def _trim(totals: collections.deque, t: float) -> None:
    """Drop the totals the window ending at ``t`` (or later) no longer needs."""
    while len(totals) >= 2 and totals[1][0] <= t - RATE_WINDOW_S + 1e-3:
        totals.popleft()


class TransferSitesFold:
    """Folds one process's samples into a :class:`TransferSitesView`."""

    def __init__(self) -> None:
        # The last field as a view without rates (its sites' rates and the
        # quiet ticks since it are the moment's: :meth:`view`), the seconds
        # one history entry spans as it says (None: not said, or no time),
        # and its ticks per entry (1 from an older agent).
        self._field: TransferSitesView | None = None
        self._period: float | None = None
        self._ticks = 1
        self._field_t: float | None = None
        self._first_t: float | None = None  # the first field's time
        self._sites: dict[SiteKey, _Site] = {}
        self._unattributed: collections.deque[tuple[float, int, int | None]] = collections.deque(maxlen=TOTALS_KEPT)
        self._view: TransferSitesView | None = None
        self._view_at: tuple[float | None, float] | None = None

    @property
    def empty(self) -> bool:
        """No sample carried the field yet (an older agent sends none)."""
        return self._field is None

    def feed(self, sample: Sample) -> bool:
        """Takes one sample; returns whether it carried the field."""
        field_ = sample.transfer_sites
        t = sample.t
        if field_ is None or t is None:
            return False
        if self._field_t is not None and t < self._field_t:
            return False  # older than what is in (a history fold feeds in order)
        if field_.error is not None and field_.sites is None:
            # The probe raised on this sample: it says nothing of the lines, so
            # the last field stands (its totals are still the latest known).
            if self._field is None:
                return False
            self._field = replace(self._field, error=field_.error)
            self._view = None
            return True
        prev_t = self._field_t
        if self._first_t is None:
            self._first_t = t
        sites = []
        for rec in field_.sites or ():
            site = _site_view(rec)
            sites.append(site)
            state = self._sites.get(site.key)
            if state is None:
                state = self._sites[site.key] = _Site()
                if prev_t is not None:
                    # Its transfers since the previous field are `count`; before, it had the rest.
                    before = site.count_total - _int(rec.count)
                    state.totals.append((prev_t, before, 0 if before == 0 else None))
                state.first_t = state.totals[0][0] if state.totals else t
            state.seen = t
            _add(state.totals, (t, site.count_total, site.bytes_total))
        unattributed = {k: _int(v) for k, v in (field_.unattributed or {}).items()}
        _add(self._unattributed, (t, sum(unattributed.values()), None))
        if len(self._sites) > MAX_KEPT:
            ranked = sorted(self._sites.items(), key=lambda kv: kv[1].seen, reverse=True)
            self._sites = dict(ranked[:MAX_KEPT])
        other = field_.other
        self._field = TransferSitesView(
            t=t,
            sites=tuple(sites),
            sites_total=_int(field_.sites_total, len(sites)),
            other_count_total=_opt_int(other.count_total) if other is not None else None,
            unattributed=unattributed,
            unattributed_reasons={k: _int(v) for k, v in (field_.unattributed_reasons or {}).items()},
            pending=_int(field_.pending),
        )
        period, ticks = field_.history_s, field_.history_ticks
        # An hour at most: a broken or hostile figure reads as the ticks' period.
        self._period = period if period is not None and 0 < period <= 3600 else None
        self._ticks = int(min(100, ticks)) if ticks is not None and ticks >= 1 else 1
        self._field_t = t
        self._view = None
        return True

    # -- reading --------------------------------------------------------------------
    def view(self, now: float | None, interval_s: float = 0.1) -> TransferSitesView | None:
        """The frozen view as of the sample at ``now`` (the process's latest);
        None when no sample carried the field. Cached until either changes."""
        if self._field is None:
            return None
        at = (now, interval_s)
        if self._view is not None and self._view_at == at:
            return self._view
        self._view = self._build(self._field, now if now is not None else self._field_t, interval_s)
        self._view_at = at
        return self._view

    def _build(self, field_: TransferSitesView, now: float | None, interval_s: float) -> TransferSitesView:
        # A history entry spans the seconds the agent measured, else this
        # many sample intervals (the agent ties its lines in batches of
        # ticks; an older agent sent one per tick).
        period = self._period if self._period is not None else interval_s * self._ticks
        now_t = now if now is not None and self._field_t is not None and now >= self._field_t else self._field_t
        quiet_ticks = 0
        if now_t is not None and self._field_t is not None and period > 0:
            quiet_ticks = min(HISTORY_TICKS, int(round((now_t - self._field_t) / period)))
        # A line's rate is over the window at least, or the stream's age where younger (_rate).
        floor = (min(RATE_WINDOW_S, now_t - self._first_t)
                 if now_t is not None and self._first_t is not None else 0.0)
        sites = []
        for site in field_.sites:
            state = self._sites.get(site.key)
            totals = state.totals if state is not None else ()
            first_t = state.first_t if state is not None else None
            count_rate = _rate(totals, now_t, 1, floor, first_t) if now_t is not None else None
            bytes_rate = _rate(totals, now_t, 2, floor, first_t) if now_t is not None else None
            history = [*site.history, *[0] * quiet_ticks]
            estimated = False
            if count_rate is None and history and period > 0:
                # One field only (a snapshot's present, the first after
                # attaching): the agent's counts per period say the rate.
                # Over the window at least, as the direction's rate is: a
                # history shorter than the window is a young line, or lines
                # the agent tied late, all at once (a TPU recording's 398
                # transfers in one entry at its final sample read 8.95k/s
                # beside an h2d of 200/s).
                recent = history[-max(1, int(round(RATE_WINDOW_S / period))):]
                count_rate, bytes_rate = sum(recent) / max(len(recent) * period, RATE_WINDOW_S), None
            if bytes_rate is None and count_rate is not None:
                if site.bytes_total is not None and site.count_total > 0:
                    bytes_rate, estimated = count_rate * site.bytes_total / site.count_total, True
                elif site.args:
                    known = [a.bytes for a in site.args if a.bytes is not None]
                    if known:
                        # Each transfer is one argument of a call: the
                        # unknown ones counted as 0 bytes.
                        bytes_rate, estimated = count_rate * sum(known) / len(site.args), True
            sites.append(replace(site, count_per_s=count_rate, bytes_per_s=bytes_rate, bytes_estimated=estimated,
                                 history=tuple(history[-HISTORY_TICKS:])))
        return replace(field_, sites=tuple(sites), history_s=period,
                       unattributed_per_s=_rate(self._unattributed, now_t, 1) if now_t is not None else None)


def _site_view(rec: TransferSite) -> TransferSiteView:
    """What a field says of a site, without the moment's rates."""
    args_seen = rec.args_seen
    return TransferSiteView(
        direction=rec.direction or "",
        file=rec.file or "",
        line=rec.line or 0,
        function=rec.function or "",
        callee=rec.callee or "",
        count_total=_int(rec.count_total),
        calls_total=_int(rec.calls_total),
        bytes_total=_opt_int(rec.bytes_total),
        count_per_s=None,
        bytes_per_s=None,
        bytes_estimated=False,
        args=tuple(_arg(a) for a in rec.args or ()),
        args_seen=args_seen if args_seen in (SEEN_TRANSFER, SEEN_CALL) else None,
        scalar=rec.scalar is True,
        args_of=rec.args_of or None,
        # A null entry (not counted) is left out, as the decoder leaves out one of the wrong type.
        history=tuple(int(v) for v in rec.history or () if v is not None),
    )


def _arg(rec: TransferArg) -> TransferArgView:
    return TransferArgView(name=rec.name or "", kind=rec.kind or "", shape=rec.shape or "", bytes=_opt_int(rec.bytes),
                           same=rec.same)


def fold_transfer_sites(records: Iterable[Record | Unknown], interval_s: float = 0.1) -> TransferSitesView | None:
    """Folds one process's decoded records into a view as of its last sample (tests, exports)."""
    fold = TransferSitesFold()
    last_t = None
    for record in records:
        if isinstance(record, Sample):  # a backfill is a sample too
            last_t = record.t if record.t is not None else last_t
            fold.feed(record)
    return fold.view(last_t, interval_s)
