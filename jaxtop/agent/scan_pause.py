"""How long a live-array scan may pause the program, and whether the next
scan would pause it longer.

A scan starts with ``jax.live_arrays()``: one call into jaxlib that walks
every array of the backend and builds the list while holding the
interpreter, with no way for a caller to take it in pieces (jaxlib has no
such API; ``client.live_buffers()`` is the same walk). Every other thread of
the program waits meanwhile. Measured on a 2-core VM, jax 0.10.2: 6.3-7.3 ms
at 50,000 arrays (0.13-0.15 us an array); on a TPU v5e's host, 18.5 ms
(0.37 us). A serving loop with a latency objective sees that as a stall.

So by default no scan is taken that would pause the program more than
:data:`DEFAULT_LIMIT_S` (1 ms). Whether it would is predicted, not found
out by pausing: a scan's time is its arrays times a cost per array, and the
cost per array is the least measured over scans of at least
:data:`RATE_FROM_COUNT` arrays (where the call's fixed cost no longer
matters; the least, because the OS taking the thread away for a moment makes
one call slower without saying anything about the next). Before such a
measurement the slowest host measured stands in (:data:`PRIOR_S_PER_ARRAY`).
The count is the last scan's, grown by as much again as it grew since the
scan before (a program that is adding arrays is taken at its pace). Only
the scan that first meets a program already past the limit (the first
scan, typically, of a program that made its arrays before jax's backend was
found) can pause it longer, once.

A scan that is asked for still runs (a live-bytes budget's, the last one
at exit) and its figures move the prediction: if a program's arrays fall
back under the limit, scheduled scans resume.

A program whose memory grows while the scans are held gets one scan every
:data:`GROWTH_EVERY_S` at most (whatever it pauses), once its memory (the
allocators' bytes in use, or the process's resident bytes where the backend
reports none) has grown by :data:`GROWTH_MIN_BYTES` and
:data:`GROWTH_SHARE` of what it was at the last scan: who holds the memory
and which line leaks are read from the scans, and a leak of small arrays is
what grows their count past the limit. A steady program is never paused
past the limit; a growing one once a minute, and its leak is told in
minutes rather than within one. Memory profiles read the arrays of a scan
they have not read yet, so they follow these scans.
``$JAXTOP_MAX_PAUSE_MS`` sets another limit in milliseconds, or ``off``
for none (every scan on its cadence, whatever it pauses).

Standard library only (the agent imports it inside the user's job).
"""

from __future__ import annotations

import os

__all__ = ["DEFAULT_LIMIT_S", "ENV", "GROWTH_EVERY_S", "GROWTH_MIN_BYTES", "GROWTH_SHARE", "PRIOR_S_PER_ARRAY",
           "RATE_FROM_COUNT", "ScanPause", "limit_from_env"]

#: The environment variable that bounds the pause a scan may put on the program.
ENV = "JAXTOP_MAX_PAUSE_MS"
#: The pause a scheduled scan may put on the program's threads by default.
DEFAULT_LIMIT_S = 0.001
#: Scans of fewer arrays tell little of the cost per array (the call's own
#: fixed cost, ~5 us, is a large part of it).
RATE_FROM_COUNT = 1000
#: The cost per array before a scan measured one: a TPU v5e's host's, the
#: slowest measured (0.37 us; a 2-core VM's is ~0.14).
PRIOR_S_PER_ARRAY = 0.37e-6
#: While the scans are held, a program whose memory grows is scanned at most this often,
GROWTH_EVERY_S = 60.0
#: once it grew by this much since the last scan
GROWTH_MIN_BYTES = 64 << 20
#: and by this share of what it was then.
GROWTH_SHARE = 0.10
#: Words that turn the limit off.
OFF_WORDS = ("off", "none", "no")


def limit_from_env(environ: dict[str, str] | None = None) -> tuple[float | None, bool, str | None]:
    """``$JAXTOP_MAX_PAUSE_MS`` as ``(limit in seconds or None for none,
    whether that is the default, what was wrong with the text)``. Text that
    is no positive number of milliseconds (nor ``off``) leaves the default,
    with the reason."""
    text = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not text:
        return DEFAULT_LIMIT_S, True, None
    if text.lower() in OFF_WORDS:
        return None, False, None
    try:
        ms = float(text)
    except ValueError:
        ms = float("nan")
    if not (0 < ms < 1e6):
        return DEFAULT_LIMIT_S, True, (f"${ENV}={text[:32]!r} is not a number of milliseconds > 0 (nor 'off'): "
                                       f"ignored, the default {DEFAULT_LIMIT_S * 1e3:g} ms holds")
    return ms / 1000.0, False, None


class ScanPause:
    """The limit and what the scans measured.

    Args:
        limit_s: the longest pause a scheduled scan may put on the program
            (None: no limit).
        default: the limit is the default one (the reason says so).
    """

    __slots__ = ("limit_s", "default", "per_array_s", "count", "previous_count", "scan_mono", "memory_at_scan")

    def __init__(self, limit_s: float | None = DEFAULT_LIMIT_S, default: bool = True) -> None:
        self.limit_s = limit_s
        self.default = default
        #: The least cost per array measured over scans of RATE_FROM_COUNT arrays or more.
        self.per_array_s: float | None = None
        self.count: int | None = None  # arrays at the last scan
        self.previous_count: int | None = None  # and at the one before
        self.scan_mono: float | None = None  # when it ran (time.monotonic())
        self.memory_at_scan: int | None = None  # the program's memory then (see the module)

    def measured(self, took_s: float | None, count: int, mono: float | None = None,
                 memory: int | None = None) -> None:
        """A scan's ``jax.live_arrays()`` took ``took_s`` (wall) over
        ``count`` arrays, at ``mono`` (``time.monotonic()``), when the
        program's memory was ``memory`` bytes (None: not known)."""
        if took_s is None or not took_s >= 0.0:
            return
        self.scan_mono, self.memory_at_scan = mono, memory
        self.previous_count, self.count = self.count, count
        if count >= RATE_FROM_COUNT:
            rate = took_s / count
            if self.per_array_s is None or rate < self.per_array_s:
                self.per_array_s = rate

    def growth_due(self, mono: float, memory: int | None) -> bool:
        """While the scans are held: whether the program's memory grew
        enough since the last scan, long enough ago, for one more."""
        base, last = self.memory_at_scan, self.scan_mono
        if memory is None or base is None or last is None or mono - last < GROWTH_EVERY_S:
            return False
        return memory - base >= max(GROWTH_MIN_BYTES, GROWTH_SHARE * base)

    def expected_count(self) -> int:
        """The arrays the next scan is expected to find: the last count,
        grown by its last growth."""
        count = self.count or 0
        previous = self.previous_count
        return count + max(0, count - previous) if previous is not None else count

    def predicted_s(self) -> float:
        """The pause the next scan is expected to put on the program."""
        rate = self.per_array_s if self.per_array_s is not None else PRIOR_S_PER_ARRAY
        return self.expected_count() * rate

    def over(self) -> str | None:
        """Why the next scheduled scan is not taken (it would pause the
        program past the limit), with the figures; None when it may run."""
        limit = self.limit_s
        if limit is None or self.count is None:
            return None
        predicted = self.predicted_s()
        if predicted <= limit:
            return None
        expected = self.expected_count()
        growing = " and growing" if expected > self.count else ""
        rate = self.per_array_s if self.per_array_s is not None else PRIOR_S_PER_ARRAY
        how = "measured" if self.per_array_s is not None else "assumed"
        which = (f"the default ${ENV}={limit * 1e3:g}; set it higher, or to off, to scan" if self.default
                 else f"${ENV}={limit * 1e3:g}")
        return (f"no scans since: jax.live_arrays() would hold the program ~{predicted * 1e3:.1f} ms at "
                f"{self.count:,} arrays{growing} ({rate * 1e6:.2f} us an array, {how}), over {which}; "
                f"one a minute at most while memory grows")
