"""Which allocation sites keep growing, from profile to profile.

:class:`GrowthTracker` takes each profile's ``{site: (bytes, count)}`` and
flags the sites whose bytes or count keep rising as **leak suspects**, with
their growth rate; :func:`describe_growth` words one for an event.

Stdlib only: this runs inside the user's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from jaxtop.probes.frames import SiteKey, site_text
from jaxtop.wire.units import fmt_bytes, fmt_count_rate

__all__ = ["FORGET_AFTER", "GrowthTracker", "LEAK_RISES", "MAX_TRACKED_SITES", "describe_growth"]

#: A site becomes a leak suspect after this many rises with no fall between them.
LEAK_RISES = 5
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

    def step(self, t: float, prev_t: float, old: int, new: int, seq: int) -> None:
        if new < old:
            self.rises = 0
            self.base = self.last_rise = None
        elif new > old:
            if self.rises == 0:
                self.base = (prev_t, old, seq - 1)
            self.rises += 1
            self.last_rise = (t, new, seq)

    def growing(self, rises: int, seq: int) -> bool:
        if self.rises < rises or self.base is None or self.last_rise is None:
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
    recent: list[tuple[int, int]] | None = None  # (bytes, count) of those profiles
    zero_run: int = 0  # profiles in a row at 0 bytes and 0 buffers
    bytes_run: _Run | None = None
    count_run: _Run | None = None
    suspect: bool = False

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
    is measured from the profile before the first rise to the last rise.

    Args:
        rises: rises with no fall between them that make a suspect.
    """

    def __init__(self, rises: int = LEAK_RISES) -> None:
        if rises < 1:
            raise ValueError("rises must be at least 1")
        self.rises = rises
        self.trends: dict[SiteKey, _Trend] = {}
        self.seq = 0
        self.t: float | None = None

    def update(self, t: float, sites: dict[SiteKey, tuple[int, int]], keep: Iterable[SiteKey] = ()) -> list[SiteKey]:
        """Takes one profile's ``{site: (bytes, count)}``.

        Args:
            t: when the profile was taken.
            sites: every site of the profile (a site missing from it has 0).
            keep: sites never to forget (held by the mark).

        Returns:
            The sites that became suspects with this profile.
        """
        self.seq += 1
        seq = self.seq
        prev_t = self.t if self.t is not None else t
        self.t = t
        became: list[SiteKey] = []
        for key in set(self.trends) | set(sites):
            raw_bytes, raw_count = sites.get(key, (0, 0))
            trend = self.trends.get(key)
            if trend is None:
                # A site's first profile is its base, not a rise: a program
                # allocating its parameters is not leaking them.
                self.trends[key] = _Trend(bytes=raw_bytes, count=raw_count, recent=[(raw_bytes, raw_count)],
                                          bytes_run=_Run(), count_run=_Run())
                continue
            recent = trend.recent if trend.recent is not None else []
            recent.append((raw_bytes, raw_count))
            del recent[:-FLOOR_PROFILES]
            trend.recent = recent
            nbytes, count = min(b for b, _ in recent), min(c for _, c in recent)
            trend.bytes_run = trend.bytes_run or _Run()
            trend.count_run = trend.count_run or _Run()
            trend.bytes_run.step(t, prev_t, trend.bytes, nbytes, seq)
            trend.count_run.step(t, prev_t, trend.count, count, seq)
            trend.bytes, trend.count = nbytes, count
            trend.zero_run = trend.zero_run + 1 if (raw_bytes == 0 and raw_count == 0) else 0
            was = trend.suspect
            trend.suspect = trend.bytes_run.growing(self.rises, seq) or trend.count_run.growing(self.rises, seq)
            if trend.suspect and not was:
                became.append(key)
        keep = set(keep)
        for key in [k for k, tr in self.trends.items() if tr.zero_run >= FORGET_AFTER and k not in keep]:
            del self.trends[key]
        if len(self.trends) > MAX_TRACKED_SITES:
            # Keep the largest and every suspect; small sites come back as new ones.
            ranked = sorted(self.trends.items(), key=lambda kv: (not kv[1].suspect, -kv[1].bytes))
            self.trends = dict(ranked[:MAX_TRACKED_SITES])
        return became

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


def _signed_bytes(n: float) -> str:
    """``+2.00 MiB``, ``-512 B``: a change, signed."""
    return fmt_bytes(n) if n < 0 else "+" + fmt_bytes(n)


def _fmt_span(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{s / 60:.0f} min"
    return f"{s:.0f} s"


def describe_growth(key: SiteKey, growth: dict[str, Any]) -> str:
    """One line: ``train.py:120 log_metrics: +64 arrays/min, +2.00 MiB/min, for 31 min``."""
    parts = []
    count_rate = growth.get("count_per_min")
    if count_rate:
        parts.append(f"{fmt_count_rate(count_rate)} arrays/min")
    bytes_rate = growth.get("bytes_per_min")
    if bytes_rate:
        parts.append(f"{_signed_bytes(bytes_rate)}/min")
    parts.append(f"for {_fmt_span(growth.get('for_s') or 0.0)}")
    return f"{site_text(key)} {key[2]}: " + ", ".join(parts)

