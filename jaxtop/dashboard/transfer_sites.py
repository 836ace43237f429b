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
itself (the model feeds and reads it under its own lock). Every string in it
came through the model's :func:`~jaxtop.wire.safe_text.safe_record`.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from jaxtop.dashboard.counter_window import RATE_WINDOW_S

if TYPE_CHECKING:
    from jaxtop.wire.records import Sample

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

#: What to do about Python scalars passed to a jitted function on every call.
SCALAR_ADVICE = "pass jnp.asarray(x) once or mark static_argnums"

#: ``args_seen`` values: the values were seen passing to the device; or read
#: from a call's arguments at that line after the call (inferred).
SEEN_TRANSFER, SEEN_CALL = "transfer", "call"


def _int(value: Any, default: int = 0) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _opt_int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))


def _key(rec: dict[str, Any]) -> SiteKey:
    return (_str(rec.get("direction")), _str(rec.get("file")), _int(rec.get("line")), _str(rec.get("function")))


@dataclass(frozen=True)
class TransferArgView:
    """One value a call at a site copied to the device (or would have)."""

    name: str  # "batch['x']"; "" where only jax's slow path saw it (unnamed)
    kind: str  # "NumPy array", "Python scalar", "list of Python scalar", "another device's array", …
    shape: str  # "float32[512,4096]"
    bytes: int | None  # None: unknown

    def text(self, kind: bool = True) -> str:
        """``batch['x'] NumPy array float32[8,4]`` (``kind=False``: without the kind)."""
        parts = [self.name or "(unnamed)"]
        if kind and self.kind:
            parts.append(self.kind)
        if self.shape:
            parts.append(self.shape)
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
    bytes_per_s: float | None  # a lower bound; see bytes_estimated
    #: True where ``bytes_per_s`` is the count rate times a size per
    #: transfer (the site's average, else its arguments' known sizes), not
    #: a difference of ``bytes_total``: a lower bound, inferred.
    bytes_estimated: bool
    args: tuple[TransferArgView, ...]
    args_seen: str | None  # "transfer", "call" (inferred) or None (not described)
    scalar: bool  # every transferred value is a Python scalar
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
        names = [a.name for a in site.args if a.name]
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

    @property
    def unattributed_total(self) -> int:
        return sum(self.unattributed.values())

    @property
    def arrays(self) -> tuple[TransferSiteView, ...]:
        """The sites that moved anything but Python scalars alone, busiest now first."""
        return _by_rate(s for s in self.sites if not s.scalar)

    @property
    def scalars(self) -> tuple[TransferSiteView, ...]:
        """The sites that moved Python scalars alone, busiest now first."""
        return _by_rate(s for s in self.sites if s.scalar)

    def scalar_summary(self) -> ScalarSummary | None:
        """The Python-scalar sites together; None when there is none."""
        scalars = self.scalars
        if not scalars:
            return None
        rates = [s.count_per_s for s in scalars if s.count_per_s is not None]
        return ScalarSummary(lines=len(scalars), count_per_s=sum(rates) if rates else None,
                             count_total=sum(s.count_total for s in scalars), busiest=scalars[0])


def _by_rate(sites: Iterable[TransferSiteView]) -> tuple[TransferSiteView, ...]:
    # Busiest now first; a site with no rate yet (or of a process that
    # ended) by its total.
    return tuple(sorted(sites, key=lambda s: (-(s.count_per_s or 0.0), -s.count_total, s.where)))


class _Site:
    """What the fold keeps of one site: its last record and recent totals."""

    __slots__ = ("rec", "totals", "seen")

    def __init__(self) -> None:
        self.rec: dict[str, Any] = {}
        # (sample time, count_total, bytes_total or None), oldest first: the
        # last one before the rate window and those within it.
        self.totals: collections.deque[tuple[float, int, int | None]] = collections.deque(maxlen=TOTALS_KEPT)
        self.seen = 0.0  # the last field that listed it


def _rate(totals: Iterable[tuple[float, int, int | None]], now: float, index: int) -> float | None:
    """The per-second growth of ``totals[index]`` over the window ending ``now``.

    A field's total counts what happened since the field before it, so the
    growth from the last total at or before the window's start (the base)
    to the newest is over the time between those two fields: a steady
    site reads its rate whatever the agent's batches span (a second, or
    1.2 s while the agent samples less often at its CPU ceiling; divided
    by the window instead, a site read 2.0k/s and 1.0k/s by turns where it
    made 1.7k/s). No field since the window's start: nothing changed, 0; a
    site younger than the window is measured from its oldest total.
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
    return max(0.0, (last[index] - base[index]) / (last[0] - base[0]))


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
        self._field: dict[str, Any] | None = None
        self._field_t: float | None = None
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
        prev_t = self._field_t
        sites = field_.get("sites")
        for rec in sites if isinstance(sites, list) else ():
            if not isinstance(rec, dict):
                continue
            key = _key(rec)
            state = self._sites.get(key)
            count_total = _int(rec.get("count_total"))
            bytes_total = _opt_int(rec.get("bytes_total"))
            if state is None:
                state = self._sites[key] = _Site()
                if prev_t is not None:
                    # Its transfers since the previous field are `count`; before, it had the rest.
                    before = count_total - _int(rec.get("count"))
                    state.totals.append((prev_t, before, 0 if before == 0 else None))
            state.rec = rec
            state.seen = t
            _add(state.totals, (t, count_total, bytes_total))
        total = sum(_int(v) for v in _dict(field_.get("unattributed")).values())
        _add(self._unattributed, (t, total, None))
        if len(self._sites) > MAX_KEPT:
            ranked = sorted(self._sites.items(), key=lambda kv: kv[1].seen, reverse=True)
            self._sites = dict(ranked[:MAX_KEPT])
        self._field, self._field_t = field_, t
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
        self._view = self._build(now if now is not None else self._field_t, interval_s)
        self._view_at = at
        return self._view

    def _build(self, now: float | None, interval_s: float) -> TransferSitesView:
        field_ = self._field or {}
        # A history entry spans the seconds the agent measured, else this
        # many sample intervals (the agent ties its lines in batches of
        # ticks; an older agent sent one per tick).
        period = _num(field_.get("history_s"))
        if period is None or not 0 < period <= 3600:
            period = interval_s * max(1, min(100, _int(field_.get("history_ticks")) or 1))
        now_t = now if now is not None and self._field_t is not None and now >= self._field_t else self._field_t
        quiet_ticks = 0
        if now_t is not None and self._field_t is not None and period > 0:
            quiet_ticks = min(HISTORY_TICKS, int(round((now_t - self._field_t) / period)))
        sites = []
        for rec in field_.get("sites") if isinstance(field_.get("sites"), list) else ():
            if not isinstance(rec, dict):
                continue
            state = self._sites.get(_key(rec))
            totals = state.totals if state is not None else ()
            count_rate = _rate(totals, now_t, 1) if now_t is not None else None
            bytes_rate = _rate(totals, now_t, 2) if now_t is not None else None
            args = tuple(_arg(a) for a in rec.get("args") or () if isinstance(a, dict))
            history = [_int(v) for v in rec.get("history") or () if isinstance(v, (int, float))]
            history += [0] * quiet_ticks
            count_total = _int(rec.get("count_total"))
            bytes_total = _opt_int(rec.get("bytes_total"))
            estimated = False
            if count_rate is None and history and period > 0:
                # One field only (a snapshot's present, the first after
                # attaching): the agent's counts per period say the rate.
                recent = history[-max(1, int(round(RATE_WINDOW_S / period))):]
                count_rate, bytes_rate = sum(recent) / (len(recent) * period), None
            if bytes_rate is None and count_rate is not None:
                if bytes_total is not None and count_total > 0:
                    bytes_rate, estimated = count_rate * bytes_total / count_total, True
                elif args:
                    known = [a.bytes for a in args if a.bytes is not None]
                    if known:
                        # Each transfer is one argument of a call: counting the
                        # unknown ones as 0 bytes keeps it a lower bound.
                        bytes_rate, estimated = count_rate * sum(known) / len(args), True
            args_seen = rec.get("args_seen")
            sites.append(TransferSiteView(
                direction=_str(rec.get("direction")),
                file=_str(rec.get("file")),
                line=_int(rec.get("line")),
                function=_str(rec.get("function")),
                callee=_str(rec.get("callee")),
                count_total=count_total,
                calls_total=_int(rec.get("calls_total")),
                bytes_total=bytes_total,
                count_per_s=count_rate,
                bytes_per_s=bytes_rate,
                bytes_estimated=estimated,
                args=args,
                args_seen=args_seen if args_seen in (SEEN_TRANSFER, SEEN_CALL) else None,
                scalar=rec.get("scalar") is True,
                history=tuple(history[-HISTORY_TICKS:]),
            ))
        other = _dict(field_.get("other"))
        return TransferSitesView(
            t=self._field_t,
            sites=tuple(sites),
            sites_total=_int(field_.get("sites_total"), len(sites)),
            other_count_total=_opt_int(other.get("count_total")) if other else None,
            unattributed={_str(k): _int(v) for k, v in _dict(field_.get("unattributed")).items()},
            unattributed_reasons={_str(k): _int(v) for k, v in _dict(field_.get("unattributed_reasons")).items()},
            unattributed_per_s=_rate(self._unattributed, now_t, 1) if now_t is not None else None,
            pending=_int(field_.get("pending")),
            history_s=period,
        )


_EMPTY: dict[str, Any] = {}


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else _EMPTY


def _arg(rec: dict[str, Any]) -> TransferArgView:
    return TransferArgView(name=_str(rec.get("name")), kind=_str(rec.get("kind")), shape=_str(rec.get("shape")),
                           bytes=_opt_int(rec.get("bytes")))


def fold_transfer_sites(records: Iterable[dict[str, Any]], interval_s: float = 0.1) -> TransferSitesView | None:
    """Folds one process's records into a view as of its last sample (tests, exports)."""
    fold = TransferSitesFold()
    last_t = None
    for record in records:
        if record.get("type") in ("sample", "backfill"):
            t = _num(record.get("t"))
            last_t = t if t is not None else last_t
            fold.feed(record)
    return fold.view(last_t, interval_s)
