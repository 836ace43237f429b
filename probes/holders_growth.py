"""Which allocation sites keep growing, from profile to profile.

:class:`GrowthTracker` takes each profile's ``{site: (bytes, count)}`` and
flags the sites whose bytes or count keep rising as **leak suspects**, with
their growth rate; a site that has started rising is **watched** before
that; :func:`describe_growth` and :func:`describe_watch` word them for an
event. :meth:`GrowthTracker.climbing` tells the probe's cadence when growth
is steep enough that the next profiles should not wait.

Stdlib only: this runs inside the user's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from jaxtop.probes.frames import SiteKey, site_text
from jaxtop.wire.units import fmt_bytes, fmt_count_rate

__all__ = ["FORGET_AFTER", "GrowthTracker", "LEAK_RISES", "MAX_TRACKED_SITES", "STEEP_BYTES_PER_MIN",
           "STEEP_MIN_SPAN_S", "STEEP_RISES", "WATCH_RISES", "describe_growth", "describe_watch"]

#: A site becomes a leak suspect after this many rises with no fall between them.
LEAK_RISES = 5
#: Steep growth is flagged sooner: this many rises of a site's bytes ...
STEEP_RISES = 3
#: ... at this rate or more (bytes per minute: 0.47 GiB an hour, a 16 GiB
#: device filled in a day and a half) ...
STEEP_BYTES_PER_MIN = 8 << 20
#: ... over at least this many seconds. The rises are of the floor of three
#: profiles each, so 3 rises already span 5 profiles; the span keeps a burst of
#: profiles asked for by commands (one a second) from making a rate out of a
#: few seconds of a program filling its caches.
STEEP_MIN_SPAN_S = 10.0
#: A site is watched (not yet a suspect) once a run holds this many rises:
#: one rise of the floor happens by chance to a site whose batches come and
#: go; two in a row seldom do.
WATCH_RISES = 2
#: The unflagged total's level is the least of this many profiles (a single
#: mid-step profile must not read as a climb; two hide it) ...
TOTAL_FLOOR_PROFILES = 2
#: ... and its rate is measured over this many profile intervals: over one, a
#: floor of batches that come and go climbs in steps of two profiles' growth.
TOTAL_RATE_PROFILES = 2
#: Sites followed for growth at most (the largest are kept).
MAX_TRACKED_SITES = 5000
#: A site gone (0 bytes) this many profiles in a row is forgotten (unless the mark holds it).
FORGET_AFTER = 10
#: A site's level is the least of its last this many profiles (see GrowthTracker).
FLOOR_PROFILES = 3


@dataclass
class _Run:
    """Rises of one measure of a site (its bytes, or its buffer count)."""

    rises: int = 0  # rises since the last fall
    base: tuple[float, int, int] | None = None  # (t, level, seq) just before the first rise
    last_rise: tuple[float, int, int] | None = None  # (t, level, seq) at the latest rise
    peak: int = 0  # the highest level the measure has had
    high: bool = False  # the latest rise went above every level before it

    def step(self, t: float, prev_t: float, old: int, new: int, seq: int) -> None:
        if new < old:
            self.rises = 0
            self.base = self.last_rise = None
        elif new > old:
            if self.rises == 0:
                self.base = (prev_t, old, seq - 1)
            self.rises += 1
            self.last_rise = (t, new, seq)
            self.high = new > self.peak
        self.peak = max(self.peak, new)

    def growing(self, rises: int, seq: int, high: bool = False) -> bool:
        """``rises`` rises or more, the last one recent (see GrowthTracker);
        with ``high``, the last one above every level before it too."""
        if self.rises < rises or self.base is None or self.last_rise is None or (high and not self.high):
            return False
        mean_gap = (self.last_rise[2] - self.base[2]) / self.rises
        return seq - self.last_rise[2] <= max(rises, 2.0 * mean_gap)

    def per_min(self) -> tuple[float, float | None]:
        """(seconds from base to last rise, growth per minute over them)."""
        if self.base is None or self.last_rise is None:
            return 0.0, None
        span = self.last_rise[0] - self.base[0]
        return span, (round((self.last_rise[1] - self.base[1]) * 60.0 / span, 3) if span > 0 else None)


@dataclass
class _Trend:
    """The growth state of one site, updated once per profile."""

    bytes: int = 0  # the level: the floor of the last FLOOR_PROFILES profiles
    count: int = 0
    bytes_t: float = 0.0  # when the profile that set each level was taken
    count_t: float = 0.0
    recent: list[tuple[int, int]] | None = None  # (bytes, count) of those profiles
    zero_run: int = 0  # profiles in a row at 0 bytes and 0 buffers
    seen: int = 1  # profiles since it appeared
    raw_peak: int = 0  # the most bytes any one profile saw
    raw_high: bool = False  # the latest profile saw more than any before
    bytes_run: _Run | None = None
    count_run: _Run | None = None
    suspect: bool = False
    watching: bool = False

    @property
    def rises(self) -> int:
        return max(self.bytes_run.rises if self.bytes_run else 0, self.count_run.rises if self.count_run else 0)


class GrowthTracker:
    """Flags the sites that keep growing.

    A site's level is the floor of its last :data:`FLOOR_PROFILES`
    profiles (the least bytes and the least count among them): a profile
    taken in the middle of a step sees the step's new state beside the old
    one (NNX and optax allocate a model's next parameters and optimizer
    state on the line that calls the step, so that line's bytes double for
    an instant), and a single such profile must neither look like growth
    nor, once gone, like a fall that clears a real leak (a 1 KiB/step leak
    on the step's own line was un-flagged for 5 profiles after each one).

    Bytes and buffer count are followed apart, each profile compared with
    the previous level: a **rise** when it went up, a **fall** when it went
    down, else flat. A fall ends that measure's run; a site is a **leak
    suspect** once either run holds ``rises`` rises and is still growing:
    its last rise is no older than ``max(rises, 2 x`` the mean gap between
    its rises) profiles, so a slow leak (one rise every ten profiles) stays
    flagged and a warm-up that stopped growing is cleared. Apart, because
    state can move between sites: NNX's eval step returns the model's
    parameters, which then belong to the eval line until the next train
    step, and the train line's bytes dip while its leaked arrays keep
    counting up.

    A steady program (every site flat) flags nothing, and neither does one
    whose sites go up and down (in-flight batches, async dispatch). The rate
    is measured from the level before the first rise to the level of the
    last rise, each timed by the profile that holds it.

    **Steep** growth does not wait for ``rises``: a bytes run of
    ``steep_rises`` rises, still growing, at ``steep_bytes_per_min`` or more
    over ``steep_min_span_s`` or more makes a suspect too (a 38 MiB/min leak
    waited 5 rises, and the profiles' back-off stretched them to minutes).
    Before either, a site whose run holds ``watch_rises`` rises and still
    grows is **watched**: the screen and the stream say so while the
    evidence builds. Both need the last rise to have set the site's highest
    level yet: a leak keeps reaching new highs, while batches that come and
    go (1 to 3 in flight) can raise their floor twice or thrice in a row by
    chance, but seldom above everything they held before. The steep rule
    also needs the site's bytes to have grown between each two of its last
    :data:`FLOOR_PROFILES` profiles, as a steep leak's do.

    Args:
        rises: rises with no fall between them that make a suspect.
        steep_rises: rises that make a suspect of steep growth.
        steep_bytes_per_min: what is steep; None: no steep rule.
        steep_min_span_s: least seconds the steep rises must span.
        watch_rises: rises that make a watched site.
    """

    def __init__(self, rises: int = LEAK_RISES, steep_rises: int = STEEP_RISES,
                 steep_bytes_per_min: float | None = STEEP_BYTES_PER_MIN,
                 steep_min_span_s: float = STEEP_MIN_SPAN_S, watch_rises: int = WATCH_RISES) -> None:
        if rises < 1 or steep_rises < 1 or watch_rises < 1:
            raise ValueError("rises must be at least 1")
        self.rises = rises
        self.steep_rises = steep_rises
        self.steep_bytes_per_min = steep_bytes_per_min
        self.steep_min_span_s = float(steep_min_span_s)
        self.watch_rises = watch_rises
        self.trends: dict[SiteKey, _Trend] = {}
        self.seq = 0
        self.t: float | None = None
        #: Sites that started being watched with the last profile.
        self.new_watching: list[SiteKey] = []
        # The bytes of the sites not flagged, summed: its floor, profile by
        # profile, says whether memory climbs where no suspect explains it.
        self._total_recent: list[int] = []
        self._total_levels: list[tuple[float, int]] = []  # (t, floor) of the last TOTAL_RATE_PROFILES + 1
        self._times: list[float] = []  # of the last FLOOR_PROFILES profiles (a trend's `recent`)

    def update(self, t: float, sites: dict[SiteKey, tuple[int, int]], keep: Iterable[SiteKey] = ()) -> list[SiteKey]:
        """Takes one profile's ``{site: (bytes, count)}``.

        Args:
            t: when the profile was taken.
            sites: every site of the profile (a site missing from it has 0).
            keep: sites never to forget (held by the mark).

        Returns:
            The sites that became suspects with this profile (the ones that
            started being watched are in :attr:`new_watching`).
        """
        self.seq += 1
        seq = self.seq
        self.t = t
        became: list[SiteKey] = []
        self.new_watching = []
        self._times.append(t)
        del self._times[:-FLOOR_PROFILES]
        for key in set(self.trends) | set(sites):
            raw_bytes, raw_count = sites.get(key, (0, 0))
            trend = self.trends.get(key)
            if trend is None:
                # A site's first profile is its base, not a rise: a program
                # allocating its parameters is not leaking them.
                self.trends[key] = _Trend(bytes=raw_bytes, count=raw_count, bytes_t=t, count_t=t,
                                          recent=[(raw_bytes, raw_count)], bytes_run=_Run(peak=raw_bytes),
                                          count_run=_Run(peak=raw_count), raw_peak=raw_bytes)
                continue
            trend.seen += 1
            trend.raw_high = raw_bytes > trend.raw_peak
            trend.raw_peak = max(trend.raw_peak, raw_bytes)
            recent = trend.recent if trend.recent is not None else []
            recent.append((raw_bytes, raw_count))
            del recent[:-FLOOR_PROFILES]
            trend.recent = recent
            nbytes, count = min(b for b, _ in recent), min(c for _, c in recent)
            # A level is timed by the (latest) profile that holds it: the floor
            # of a rising site is its oldest profile's, and timed now its rate
            # doubled when the cadence halved (+55 MiB/min for a 38 MiB/min leak).
            times = self._times[-len(recent):]
            bytes_t = max(tt for tt, (b, _) in zip(times, recent) if b == nbytes)
            count_t = max(tt for tt, (_, c) in zip(times, recent) if c == count)
            trend.bytes_run = trend.bytes_run or _Run()
            trend.count_run = trend.count_run or _Run()
            trend.bytes_run.step(bytes_t, trend.bytes_t, trend.bytes, nbytes, seq)
            trend.count_run.step(count_t, trend.count_t, trend.count, count, seq)
            trend.bytes, trend.count, trend.bytes_t, trend.count_t = nbytes, count, bytes_t, count_t
            trend.zero_run = trend.zero_run + 1 if (raw_bytes == 0 and raw_count == 0) else 0
            was, was_watching = trend.suspect, trend.watching
            trend.suspect = (trend.bytes_run.growing(self.rises, seq) or trend.count_run.growing(self.rises, seq)
                             or self._steep(trend, seq, was))
            # A suspect is no longer watched; one cleared is not watched again
            # in the same run (it stopped growing: growing(watch) is false too).
            trend.watching = not trend.suspect and (trend.bytes_run.growing(self.watch_rises, seq, high=True)
                                                    or trend.count_run.growing(self.watch_rises, seq, high=True))
            if trend.suspect and not was:
                became.append(key)
            if trend.watching and not was_watching and not was:
                self.new_watching.append(key)
        keep = set(keep)
        for key in [k for k, tr in self.trends.items() if tr.zero_run >= FORGET_AFTER and k not in keep]:
            del self.trends[key]
        if len(self.trends) > MAX_TRACKED_SITES:
            # Keep the largest and every suspect; small sites come back as new ones.
            ranked = sorted(self.trends.items(), key=lambda kv: (not kv[1].suspect, -kv[1].bytes))
            self.trends = dict(ranked[:MAX_TRACKED_SITES])
        self._update_total(t, sum(b for k, (b, _) in sites.items() if not (k in self.trends and self.trends[k].suspect)))
        return became

    def _steep(self, trend: _Trend, seq: int, was_suspect: bool) -> bool:
        """Whether a site's bytes grow steeply: see the class."""
        run = trend.bytes_run
        if self.steep_bytes_per_min is None or run is None \
                or not run.growing(self.steep_rises, seq, high=not was_suspect):
            return False
        if was_suspect:
            return True  # flagged in this run and still growing: the rate may ease without un-flagging it
        recent = trend.recent or []
        if any(b[0] <= a[0] for a, b in zip(recent, recent[1:])):
            return False  # a steep leak grows between any two profiles; batches that swing widely do not
        span, rate = run.per_min()
        return span >= self.steep_min_span_s and rate is not None and rate >= self.steep_bytes_per_min

    def _update_total(self, t: float, total: int) -> None:
        """Follows the floor of the bytes no suspect holds."""
        self._total_recent.append(total)
        del self._total_recent[:-TOTAL_FLOOR_PROFILES]
        self._total_levels.append((t, min(self._total_recent)))
        del self._total_levels[:-(TOTAL_RATE_PROFILES + 1)]

    def young(self) -> bool:
        """Whether a site not flagged has been seen in fewer than
        :data:`FLOOR_PROFILES` profiles: nothing can be told of its growth
        yet (every site, at the program's start; a line that starts
        allocating, later)."""
        return any(tr.seen < FLOOR_PROFILES and not tr.suspect for tr in self.trends.values())

    def climbing(self, bytes_per_min: float | None = None) -> bool:
        """Whether memory climbs steeply now where no suspect explains it.

        True when, at ``bytes_per_min`` or more, a site not flagged rose in
        each of its last :data:`FLOOR_PROFILES` profiles (batches in flight
        seldom rise twice in a row, a mid-step profile rises then falls), or
        is watched (its bytes run still growing); or the floor of the bytes
        of the sites not flagged rose in each of the last
        :data:`TOTAL_RATE_PROFILES` intervals (a leak spread over many small
        sites).
        Cheap (no profile), for the cadence: a site's raw bytes show a climb
        two profiles before its floor can rise.

        Args:
            bytes_per_min: the rate that counts; the steep rate by default.
        """
        rate_min = self.steep_bytes_per_min if bytes_per_min is None else bytes_per_min
        if rate_min is None:
            return False
        levels = self._total_levels
        # Up in every interval: one batch more in flight is one step, not a climb.
        if len(levels) > TOTAL_RATE_PROFILES and all(b > a for (_, a), (_, b) in zip(levels, levels[1:])):
            (t0, b0), (t1, b1) = levels[0], levels[-1]
            if t1 > t0 and (b1 - b0) * 60.0 / (t1 - t0) >= rate_min:
                return True
        times = self._times
        for trend in self.trends.values():
            if trend.suspect:
                continue
            recent = trend.recent or []
            if trend.raw_high and len(recent) == len(times) == FLOOR_PROFILES and times[-1] > times[0] \
                    and all(b[0] > a[0] for a, b in zip(recent, recent[1:])) \
                    and (recent[-1][0] - recent[0][0]) * 60.0 / (times[-1] - times[0]) >= rate_min:
                return True
            run = trend.bytes_run
            if run is not None and run.growing(self.watch_rises, self.seq, high=True):
                _, rate = run.per_min()
                if rate is not None and rate >= rate_min:
                    return True
        return False

    def growth(self, key: SiteKey) -> dict[str, Any] | None:
        """The growth of a site in its current runs, or None when it has no rise.

        Returns:
            ``{rises, since_t, last_rise_t, for_s, bytes_per_min,
            count_per_min}``: ``for_s`` from the profile before the first
            rise to the last rise of the longer run, each rate over its
            own run's span (None: that measure is not rising now).
        """
        trend = self.trends.get(key)
        if trend is None or not trend.rises:
            return None
        runs = [r for r in (trend.bytes_run, trend.count_run) if r is not None and r.rises and r.base and r.last_rise]
        if not runs:
            return None
        longest = max(runs, key=lambda r: (r.rises, -r.base[0]))
        span, _ = longest.per_min()
        return {
            "rises": longest.rises,
            "since_t": longest.base[0],
            "last_rise_t": longest.last_rise[0],
            "for_s": round(span, 3),
            "bytes_per_min": trend.bytes_run.per_min()[1] if trend.bytes_run and trend.bytes_run.rises else None,
            "count_per_min": trend.count_run.per_min()[1] if trend.count_run and trend.count_run.rises else None,
        }

    def suspects(self) -> list[SiteKey]:
        """The sites flagged now."""
        return [k for k, tr in self.trends.items() if tr.suspect]

    def watching(self) -> list[SiteKey]:
        """The sites watched now (rising, not yet suspects)."""
        return [k for k, tr in self.trends.items() if tr.watching]


def _signed_bytes(n: float) -> str:
    """``+2.00 MiB``, ``-512 B``: a change, signed."""
    return fmt_bytes(n) if n < 0 else "+" + fmt_bytes(n)


def _fmt_span(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{s / 60:.0f} min"
    return f"{s:.0f} s"


def _rates(growth: dict[str, Any], bytes_first: bool = False) -> list[str]:
    parts = []
    count_rate = growth.get("count_per_min")
    if count_rate:
        parts.append(f"{fmt_count_rate(count_rate)} arrays/min")
    bytes_rate = growth.get("bytes_per_min")
    if bytes_rate:
        parts.insert(0 if bytes_first else len(parts), f"{_signed_bytes(bytes_rate)}/min")
    return parts


def describe_watch(key: SiteKey, growth: dict[str, Any]) -> str:
    """One line: ``watching: train.py:120 log_metrics: +38.0 MiB/min, +600 arrays/min over 10 s``."""
    rates = ", ".join(_rates(growth, bytes_first=True)) or f"{growth.get('rises', 0)} rises"
    return f"watching: {site_text(key)} {key[2]}: {rates} over {_fmt_span(growth.get('for_s') or 0.0)}"


def describe_growth(key: SiteKey, growth: dict[str, Any]) -> str:
    """One line: ``train.py:120 log_metrics: +64 arrays/min, +2.00 MiB/min, for 31 min``."""
    parts = _rates(growth)
    parts.append(f"for {_fmt_span(growth.get('for_s') or 0.0)}")
    return f"{site_text(key)} {key[2]}: " + ", ".join(parts)

