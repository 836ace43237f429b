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


@dataclass
class _Trend:
    """The growth state of one site, updated once per profile."""

    bytes: int = 0
    count: int = 0
    zero_run: int = 0  # profiles in a row at 0 bytes and 0 buffers
    rises: int = 0  # rises since the last fall
    base: tuple[float, int, int, int] | None = None  # (t, bytes, count, seq) just before the first rise
    last_rise: tuple[float, int, int, int] | None = None  # (t, bytes, count, seq) at the latest rise
    suspect: bool = False


class GrowthTracker:
    """Flags the sites that keep growing.

    Each profile, a site's bytes and buffer count are compared with the
    previous profile's: a **rise** when one went up and neither went down, a
    **fall** when either went down, else flat. A fall ends the run; a site is
    a **leak suspect** once its run holds ``rises`` rises and it is still
    growing: its last rise is no older than ``max(rises, 2 x`` the mean gap
    between its rises) profiles, so a slow leak (one rise every ten
    profiles) stays flagged and a warm-up that stopped growing is cleared.

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
            nbytes, count = sites.get(key, (0, 0))
            trend = self.trends.get(key)
            if trend is None:
                # A site's first profile is its base, not a rise: a program
                # allocating its parameters is not leaking them.
                trend = self.trends[key] = _Trend(bytes=nbytes, count=count)
                continue
            db, dc = nbytes - trend.bytes, count - trend.count
            if db < 0 or dc < 0:
                trend.rises = 0
                trend.base = trend.last_rise = None
            elif db > 0 or dc > 0:
                if trend.rises == 0:
                    trend.base = (prev_t, trend.bytes, trend.count, seq - 1)
                trend.rises += 1
                trend.last_rise = (t, nbytes, count, seq)
            trend.bytes, trend.count = nbytes, count
            trend.zero_run = trend.zero_run + 1 if (nbytes == 0 and count == 0) else 0
            was = trend.suspect
            trend.suspect = self._is_suspect(trend, seq)
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

    def _is_suspect(self, trend: _Trend, seq: int) -> bool:
        if trend.rises < self.rises or trend.base is None or trend.last_rise is None:
            return False
        span = trend.last_rise[3] - trend.base[3]
        mean_gap = span / trend.rises
        return seq - trend.last_rise[3] <= max(self.rises, 2.0 * mean_gap)

    def growth(self, key: SiteKey) -> dict[str, Any] | None:
        """The growth of a site in its current run, or None when it has no rise.

        Returns:
            ``{rises, since_t, last_rise_t, for_s, bytes_per_min,
            count_per_min}``: ``for_s`` from the profile before the first
            rise to the last rise, the rates over that span.
        """
        trend = self.trends.get(key)
        if trend is None or not trend.rises or trend.base is None or trend.last_rise is None:
            return None
        t0, b0, c0, _ = trend.base
        t1, b1, c1, _ = trend.last_rise
        span = t1 - t0
        return {
            "rises": trend.rises,
            "since_t": t0,
            "last_rise_t": t1,
            "for_s": round(span, 3),
            "bytes_per_min": round((b1 - b0) * 60.0 / span, 3) if span > 0 else None,
            "count_per_min": round((c1 - c0) * 60.0 / span, 3) if span > 0 else None,
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

