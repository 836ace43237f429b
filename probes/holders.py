"""Who holds the device memory: live bytes per allocation site, what grows.

A device memory profile (``jax.profiler.device_memory_profile()``) lists every
live buffer with the Python stack that created it. This probe takes one on
its own slow cadence, folds it into **allocation sites** (the innermost frame
of the user's own code), and follows each site from profile to profile:

* bytes and buffer count per site, per device;
* growth: a site whose bytes or count keep rising across profiles is a
  **leak suspect**, reported with its growth rate; one that has started
  rising is **watched** first (``watching``, an event ``leak_watch``);
* a **mark** (command ``holders_mark``): every later record says how each
  site changed since then.

What jaxlib's heap profile carries (checked on CPU with jax 0.4.30 and
0.10.2): labels ``kind`` (``buffer`` / ``executable``) and ``device`` (an
opaque name, ``cpu:0`` or ``TFRT_CPU_0``) only. There is no shape or dtype, so
no per-(shape, dtype) breakdown can come from it; any further string label a
newer jaxlib adds is kept per site under ``labels``. jaxlib merges buffers
with the same stack and labels into one sample of ``[count, bytes]``, so the
profile of a program holding 10,000 arrays made by one line is small; its
cost is mostly jax building and gzipping it.

The parts live beside this probe: the fold into sites in
:mod:`jaxtop.probes.pprof`, the choice of the user's frame in
:mod:`jaxtop.probes.frames`, growth in :mod:`jaxtop.probes.holders_growth`.

The cadence adapts so that profiling takes no more than ``budget`` (0.04 %)
of the wall time: after a profile that took 80 ms the next waits at least
200 s. That back-off is what let a 38 MiB/min leak go unflagged for minutes
(5, 21, 49 s between profiles as each profile grew costlier), so while
memory climbs steeply where no suspect explains it, or while a site is too
new for its growth to be told (:meth:`GrowthTracker.young`: every site at
the start, a line that starts allocating later), the cadence does not
back off: profiles come every ``interval_s`` (every half of it while
climbing), up to :data:`WATCH_BUDGET` of the time, paid from an allowance
of profile seconds that fills at :data:`WATCH_SHARE` of the time up to
:data:`WATCH_CREDIT_S`. So a program costs at most ``budget + WATCH_SHARE``
of its time in profiles over a long run, whatever its memory does.

Stdlib + jax only; jax is never imported here, and no profile is taken
before the program has created its backend (creating one would change the
program's allocator settings).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

from jaxtop.probes.base import HandBack
from jaxtop.probes.frames import (  # noqa: F401  (importable from here)
    COMPREHENSIONS,
    LIBRARY,
    NO_STACK,
    LibraryFilter,
    SiteKey,
    pick_site,
    site_text,
)
from jaxtop.probes.holders_growth import (  # noqa: F401  (importable from here)
    FORGET_AFTER,
    LEAK_RISES,
    MAX_TRACKED_SITES,
    GrowthTracker,
    describe_growth,
    describe_watch,
)
from jaxtop.probes.jaxstate import backend_ready as _backend_ready
from jaxtop.probes.jaxstate import jax_imported
from jaxtop.probes.holders_scan import MIN_ARRAYS, totals_from_arrays
from jaxtop.probes.live_arrays import LiveArrays
from jaxtop.probes.pprof import ProfileTotals, SiteStats, aggregate_profile
from jaxtop.probes.who_holds import WhoCommand
from jaxtop.probes.forksafe import ForkLock

__all__ = [
    "NotNow",
    "LibraryFilter",
    "SiteKey",
    "SiteStats",
    "ProfileTotals",
    "aggregate_profile",
    "GrowthTracker",
    "HoldersProbe",
    "site_text",
    "describe_growth",
    "describe_watch",
    "jax_imported",
    "DEFAULT_INTERVAL_S",
    "DEFAULT_BUDGET",
    "LEAK_RISES",
]

#: Base period between two profiles (seconds), before the cost backs it off.
DEFAULT_INTERVAL_S = 5.0
#: Largest share of wall time profiling may take: interval >= cost / budget.
DEFAULT_BUDGET = 0.0004
#: Sites listed in each record (largest first); suspects and the largest
#: changes since the mark are listed beyond it. The rest is summed in ``other``.
MAX_SITES = 50
#: Least time between two profiles asked for by commands (``holders_mark``,
#: ``holders_profile``), whoever asks: a flood of requests costs one profile per this.
DEMAND_MIN_INTERVAL_S = 1.0

#: While memory climbs (or the program is young) profiles may take this
#: share of the time instead of ``budget``: a 20 ms profile every 5 s ...
WATCH_BUDGET = 0.004
#: ... coming every this much of ``interval_s`` while memory climbs steeply
#: (a steep leak is flagged after 3 rises of a floor of 3 profiles: halving
#: the period brings the verdict 5 s sooner at the default 5 s) ...
WATCH_INTERVAL_FACTOR = 0.5
#: ... paid from an allowance of profile seconds that fills at this share of
#: the time (as much again as ``budget``: over a long run profiling costs at
#: most twice its budget, however often memory seems to climb) ...
WATCH_SHARE = 0.0004
#: ... and holds at most (and at first) this many seconds: 12 profiles of 20
#: ms, enough to flag one steep leak or to see that a climb stopped.
WATCH_CREDIT_S = 0.25


def _capture_profile() -> bytes:
    import jax.profiler

    return bytes(jax.profiler.device_memory_profile())


def _in_use_bytes() -> int | None:
    """Allocator bytes in use over the local devices, or None where the
    backend keeps no statistics (CPU): then shares are of the profile's total."""
    jax = sys.modules.get("jax")
    if jax is None or not jax_imported():
        return None  # never import jax from here
    try:
        total = 0
        for device in jax.local_devices():
            stats = device.memory_stats()
            if not stats or stats.get("bytes_in_use") is None or stats.get("bytes_in_use") < 0:
                return None
            total += int(stats["bytes_in_use"])
        return total
    except Exception:
        return None


def _site_record(key: SiteKey, stats: SiteStats | None) -> dict[str, Any]:
    filename, line, name = key
    rec: dict[str, Any] = {
        "site": site_text(key),
        "function": name,
        "file": filename,
        "line": line,
        "bytes": stats.bytes if stats else 0,
        "count": stats.count if stats else 0,
        "devices": {d: list(v) for d, v in sorted(stats.devices.items())} if stats else {},
    }
    if stats is not None and stats.library:
        rec["library"] = True
    if stats is not None and stats.labels:
        rec["labels"] = stats.labels
    return rec


class NotNow(Exception):
    """No profile can be taken now without costing what the program does not
    allow (its message says why, and is the record's ``error``)."""


class HoldersProbe:
    """Profiles on its own cadence and on demand; one ``holders`` record per profile.

    Wire it into an agent with :meth:`install` (sample field ``holders``,
    commands ``holders_mark`` and ``holders_profile``). Everything runs on the
    agent's thread; :meth:`sample` returns None between profiles, so a
    sample carries ``holders`` only when a profile was taken for it.

    Args:
        interval_s: base period between profiles.
        budget: largest share of wall time profiling may take; the period
            backs off to ``cost / budget`` after a costly profile.
        rises: rises with no fall that make a leak suspect (:class:`GrowthTracker`).
        max_sites: sites listed per record (see :data:`MAX_SITES`).
        capture: returns the profile bytes (tests pass recorded ones);
            default ``jax.profiler.device_memory_profile``.
        ready: whether a profile may be taken now; default: the program
            has created its JAX backend.
        clock: wall clock for record times; ``monotonic`` for the cadence;
            ``timer`` measures what a profile costs.
        on_suspect: called with a one-line description when a site becomes
            a leak suspect (``install`` posts it as an agent event).
        on_watch: called with a one-line description (``watching: ...``)
            when a site starts being watched (``install`` posts it as a
            ``leak_watch`` event).
        arrays: the memory probe's live arrays and the devices' labels
            (None before a backend): from :data:`jaxtop.probes.holders_scan.
            MIN_ARRAYS` arrays on, a profile reads them in chunks
            (:func:`~jaxtop.probes.holders_scan.totals_from_arrays`) instead
            of asking jaxlib for one, which holds the interpreter throughout.
    """

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        budget: float = DEFAULT_BUDGET,
        rises: int = LEAK_RISES,
        max_sites: int = MAX_SITES,
        capture: Callable[[], bytes] | None = None,
        ready: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        timer: Callable[[], float] = time.perf_counter,
        on_suspect: Callable[[str], None] | None = None,
        on_watch: Callable[[str], None] | None = None,
        arrays: Callable[[], tuple[LiveArrays, dict[int, str]] | None] | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ValueError("interval_s must be positive")
        if not 0 < budget <= 1:
            raise ValueError("budget must be in (0, 1]")
        self.base_interval_s = float(interval_s)
        self.budget = float(budget)
        self.max_sites = max(1, int(max_sites))
        self.tracker = GrowthTracker(rises)
        self._capture = capture or _capture_profile
        self._ready = ready or _backend_ready
        self._clock = clock
        self._mono = monotonic
        self._timer = timer
        self._on_suspect = on_suspect
        self._on_watch = on_watch
        self._arrays = arrays
        self.method = "profile"  # how the last profile was read: profile, or arrays (holders_scan)
        self._lock = ForkLock()
        self._take_lock = ForkLock()
        self.interval_s = self.base_interval_s  # current, after back-off
        self._next_t = 0.0  # monotonic time of the next cadence profile
        self._last_demand_t = -1e18
        self._who = WhoCommand(lambda: self._arrays() if self._arrays is not None else None, monotonic)
        self._pending: dict[str, Any] | None = None  # a record not yet sent
        self._want: str | None = None  # a profile asked for by a command: its reason
        self.last: ProfileTotals | None = None
        self.last_t: float | None = None
        self.last_seconds: float | None = None
        self.seq = 0
        self.errors = 0
        self._error: str | None = None
        self._mark: dict[str, Any] | None = None  # {"t", "seq", "sites": {key: (b, c)}, "bytes", "count"}
        self.cpu_s_total = 0.0
        self.wall_s_total = 0.0
        # The allowance of profile seconds the cadence may spend without
        # backing off (see the module docstring), and what it paid so far.
        self.watch_held_s = WATCH_CREDIT_S
        self._watch_fill_t: float | None = None
        self._watch_next = False  # the next cadence profile is paid from it
        self.watch_profiles = 0
        self.watch_s_total = 0.0
        self.cadence = "base"  # what set the current interval: base, young, climbing

    # -- wiring ---------------------------------------------------------------
    # -- the probe interface (jaxtop.probes.base): sample field ``holders`` -----
    name = "holders"
    needs_jax = False  # nothing to install: each profile waits for a backend itself
    reason: str | None = None

    @property
    def commands(self) -> dict[str, Any]:
        return {"holders_mark": self.cmd_mark, "holders_profile": self.cmd_profile, "holders_who": self.cmd_who}

    def start(self) -> None:
        """Nothing to install (profiles are taken on the agent's ticks)."""

    def stop(self) -> None:
        """Nothing installed; the kept mark and pending record are dropped."""
        with self._lock:
            self._pending = None
            self._want = None

    def on_tick(self, tick: Any) -> dict[str, Any] | None:
        return self.sample()

    def install(self, agent: Any) -> "HoldersProbe":
        """Make this the agent's holders probe (in place of the one it has):
        its leak suspicions go to the agent as ``leak_suspect`` events, the
        sites it starts watching as ``leak_watch`` events."""
        if self._on_suspect is None and hasattr(agent, "post_event"):
            self._on_suspect = lambda text: agent.post_event("leak_suspect", text=text)
        if self._on_watch is None and hasattr(agent, "post_event"):
            self._on_watch = lambda text: agent.post_event("leak_watch", text=text)
        if self._arrays is None:  # the agent's live-array scans: what holders_who searches for
            self._arrays = getattr(agent, "_holders_arrays", None)
        agent.add_probe(self)
        return self

    # -- the agent thread -------------------------------------------------------
    def sample(self) -> dict[str, Any] | None:
        """The sample field: a record when a profile is due (or was taken by a
        command since the last sample), else None. Never raises."""
        try:
            now = self._mono()
            if self._want is None and self._pending is None and now < self._next_t:
                return None  # most ticks: nothing asked, nothing due (read without the lock: whole values)
            with self._lock:
                want = self._want
            # A command's profile that had to wait (rate limit, no backend
            # yet) is taken as soon as it may be, not on every tick.
            demanded = want is not None and now - self._last_demand_t >= self._demand_wait()
            if (demanded or now >= self._next_t) and self._ready():
                if demanded:
                    self._last_demand_t = now
                    with self._lock:
                        self._want = None
                self._take(want if demanded else "cadence")
            with self._lock:
                record, self._pending = self._pending, None
            return record
        except Exception as exc:  # a probe must not break the agent's sample
            self.errors += 1
            return {"error": f"{type(exc).__name__}: {exc}"}

    def shift_deadlines(self, gap: float) -> None:
        """The process was stopped for ``gap`` seconds (its memory did not
        change): the next cadence profile falls due that much later."""
        self._next_t += gap
        if self._watch_fill_t is not None:
            self._watch_fill_t += gap  # a stopped process earns no allowance

    def _demand_wait(self) -> float:
        """Least time between two profiles taken for commands."""
        return max(DEMAND_MIN_INTERVAL_S, 0.1 * (self.last_seconds or 0.0) / self.budget)

    def _take(self, reason: str) -> dict[str, Any] | None:
        """Takes one profile, updates growth and the mark; queues its record."""
        with self._take_lock:  # profile_now() may come from another thread than the agent's
            return self._take_locked(reason)

    def _take_locked(self, reason: str) -> dict[str, Any] | None:
        started_wall = self._timer()
        started_cpu = time.thread_time()
        t = self._clock()
        # The read from the arrays hands the interpreter back between pieces:
        # its sleeps are no cost of the profile (the cadence follows the cost).
        pause = HandBack()
        try:
            source = self._arrays() if self._arrays is not None and self._capture is _capture_profile else None
            if source is not None and len(source[0]) >= MIN_ARRAYS:
                totals, self.method = totals_from_arrays(*source, pause=pause), "arrays"
            else:
                totals, self.method = aggregate_profile(self._capture()), "profile"
        except Exception as exc:
            # Backed off like a costly profile: a failing capture is not retried every tick.
            self._error = str(exc) if isinstance(exc, NotNow) else f"{type(exc).__name__}: {exc}"
            self.errors += 1
            self._next_t = self._mono() + self.interval_s
            record = {"t": t, "error": self._error, "interval_s": self.interval_s}
            with self._lock:
                self._pending = record
            return record
        in_use = _in_use_bytes()
        self.seq += 1
        sizes = {k: (s.bytes, s.count) for k, s in totals.sites.items()}
        with self._lock:
            mark = self._mark
            if reason == "mark" or (mark is not None and mark.get("pending")):
                mark = self._mark = {"t": t, "seq": self.seq, "sites": dict(sizes), "bytes": totals.bytes,
                                     "count": totals.count}
        became = self.tracker.update(t, sizes, keep=mark["sites"] if mark else ())
        seconds = max(0.0, self._timer() - started_wall - pause.slept_s)
        self.cpu_s_total += time.thread_time() - started_cpu
        self.wall_s_total += seconds
        self.last, self.last_t, self.last_seconds = totals, t, seconds
        self._schedule(seconds, paid=reason == "cadence" and self._watch_next, marked=reason == "mark")
        record = self._record(totals, t, seconds, reason, in_use, mark)
        with self._lock:
            self._pending = record
        self._tell(self._on_watch, self.tracker.new_watching, describe_watch, "")
        self._tell(self._on_suspect, became, describe_growth, "leak suspect: ")
        return record

    def _tell(self, callback: Callable[[str], None] | None, keys: list[SiteKey],
              describe: Callable[[SiteKey, dict[str, Any]], str], prefix: str) -> None:
        """One line per site to ``callback`` (the agent's event); never raises."""
        if callback is None:
            return
        for key in keys:
            growth = self.tracker.growth(key)
            if growth is not None:
                try:
                    callback(prefix + describe(key, growth))
                except Exception:
                    pass

    def _schedule(self, seconds: float, paid: bool, marked: bool = False) -> None:
        """When the next cadence profile is due, after one that took ``seconds``.

        It backs off so that profiling takes at most ``budget`` of the time,
        unless a site is too new to tell or memory climbs steeply where no
        suspect explains it (:meth:`GrowthTracker.climbing`): then it comes
        at the base period (half of it while climbing), up to
        :data:`WATCH_BUDGET` of the time, while the allowance lasts.

        Right after a mark the next profile comes at the base period too
        when the budget had backed it off: the mark itself is a profile
        (every site ±0 against itself), and the user who pressed it wants to
        see what changes since, not wait out a backed-off interval (13 s and
        more) looking at zeros.

        Args:
            seconds: what the profile just taken cost.
            paid: it was taken at the watch cadence: the allowance pays it.
            marked: the profile just taken is the mark.
        """
        now = self._mono()
        if self._watch_fill_t is not None:
            self.watch_held_s = min(WATCH_CREDIT_S,
                                    self.watch_held_s + max(0.0, now - self._watch_fill_t) * WATCH_SHARE)
        self._watch_fill_t = now
        if paid:
            self.watch_held_s -= seconds
            self.watch_profiles += 1
            self.watch_s_total += seconds
        backed_off = max(self.base_interval_s, seconds / self.budget)
        self.cadence = "base"
        self._watch_next = False
        if self.watch_held_s > 0:
            if marked and backed_off > self.base_interval_s:
                self.cadence = "marked"
                period = self.base_interval_s
            elif self.tracker.climbing():
                self.cadence = "climbing"
                period = self.base_interval_s * WATCH_INTERVAL_FACTOR
            elif self.tracker.young():
                self.cadence = "young"
                period = self.base_interval_s
            if self.cadence != "base":
                watch = max(period, seconds / WATCH_BUDGET)
                if watch < backed_off:
                    self.interval_s, self._watch_next = watch, True
                    self._next_t = now + self.interval_s
                    return
                self.cadence = "base"
        self.interval_s = backed_off
        self._next_t = now + self.interval_s

    def _record(self, totals: ProfileTotals, t: float, seconds: float, reason: str,
                in_use: int | None, mark: dict[str, Any] | None) -> dict[str, Any]:
        ranked = sorted(totals.sites.items(), key=lambda kv: (-kv[1].bytes, -kv[1].count, site_text(kv[0]), kv[0][2]))
        listed = [k for k, _ in ranked[:self.max_sites]]
        chosen = set(listed)
        suspects = self.tracker.suspects()
        watching = self.tracker.watching()
        extra = [k for k in suspects + watching if k not in chosen]
        if mark is not None:
            # The largest changes since the mark are listed even when small now.
            base = mark["sites"]
            moved = sorted(
                (k for k in set(base) | set(totals.sites) if k not in chosen),
                key=lambda k: -abs((totals.sites[k].bytes if k in totals.sites else 0) - base.get(k, (0, 0))[0]),
            )
            extra += [k for k in moved[:20] if k not in extra]
        listed += [k for k in extra if k not in chosen]
        in_list = set(listed)
        sites = []
        listed_bytes = listed_count = 0
        for key in listed:
            stats = totals.sites.get(key)
            rec = _site_record(key, stats)
            if stats is not None:
                listed_bytes += stats.bytes
                listed_count += stats.count
            growth = self.tracker.growth(key)
            if growth is not None:
                rec["growth"] = growth
            trend = self.tracker.trends.get(key)
            if trend is not None and trend.suspect:
                rec["suspect"] = True
            elif trend is not None and trend.watching:
                rec["watching"] = True
            if mark is not None:
                b0, c0 = mark["sites"].get(key, (0, 0))
                rec["mark"] = {"bytes": rec["bytes"] - b0, "count": rec["count"] - c0}
            sites.append(rec)
        record: dict[str, Any] = {
            "t": t,
            "seq": self.seq,
            "reason": reason,
            "seconds": round(seconds, 6),
            "interval_s": round(self.interval_s, 3),
            "bytes": totals.bytes,
            "count": totals.count,
            "in_use_bytes": in_use,
            "by_device": {d: list(v) for d, v in sorted(totals.by_device.items())},
            # Read from the arrays, a profile has no executables: n/a, not 0.
            "executables": ({"bytes": totals.executable_bytes, "count": totals.executable_count}
                            if self.method == "profile" else None),
            "method": self.method,
            "sites_total": len(totals.sites),
            "sites": sites,
            "other": {"bytes": totals.bytes - listed_bytes, "count": totals.count - listed_count,
                      "sites": sum(1 for k in totals.sites if k not in in_list)},
            "suspects": len(suspects),
            "watching": len(watching),
            "cadence": self.cadence,
            "cpu_s_total": round(self.cpu_s_total, 6),
        }
        if mark is not None:
            record["mark"] = {
                "t": mark["t"],
                "seq": mark["seq"],
                "bytes": totals.bytes - mark["bytes"],
                "count": totals.count - mark["count"],
            }
        return record

    # -- commands (agent thread) --------------------------------------------------
    def _demand(self, reason: str) -> dict[str, Any]:
        """Takes a profile now for a command, at most one per
        :data:`DEMAND_MIN_INTERVAL_S` (or the cost back-off, if longer)."""
        now = self._mono()
        wait = self._demand_wait()
        if now - self._last_demand_t < wait:
            return {"taken": False, "retry_after_s": round(wait - (now - self._last_demand_t), 3)}
        if not self._ready():
            return {"taken": False, "error": "the program has not started a JAX backend yet"}
        self._last_demand_t = now
        record = self._take(reason)
        if record is None or "error" in record:
            return {"taken": False, "error": (record or {}).get("error", "no profile")}
        return {"taken": True, "record": record}

    def cmd_mark(self, args: dict[str, Any]) -> dict[str, Any]:
        """Command ``holders_mark``: take a profile now and make it the mark.

        Every later record reports each site's change since it. ``{"clear":
        true}`` removes the mark. When no profile can be taken now (too soon
        after the last command, or no backend yet) the mark is set by the
        next profile instead.

        Returns:
            ``{"mark_t", "seq", "bytes", "count", "sites"}``, or
            ``{"pending": true}``, or ``{"cleared": true}``.
        """
        if args.get("clear"):
            with self._lock:
                self._mark = None
            return {"cleared": True}
        done = self._demand("mark")
        if done.get("taken"):
            mark = self._mark or {}
            return {"mark_t": mark.get("t"), "seq": mark.get("seq"), "bytes": mark.get("bytes"),
                    "count": mark.get("count"), "sites": len(mark.get("sites") or ())}
        with self._lock:
            self._mark = {"pending": True, "sites": {}, "t": None, "seq": None, "bytes": 0, "count": 0}
            self._want = "mark"
        reply = {"pending": True}
        if done.get("error"):
            reply["error"] = done["error"]
        return reply

    def cmd_profile(self, args: dict[str, Any]) -> dict[str, Any]:
        """Command ``holders_profile``: a profile now (its record goes on the
        stream with the next sample).

        Returns:
            ``{"seq", "bytes", "count", "sites", "seconds"}``, or
            ``{"taken": false, "retry_after_s"}`` when asked again too soon.
        """
        done = self._demand("demand")
        if not done.get("taken"):
            return {k: v for k, v in done.items() if k != "record"}
        rec = done["record"]
        return {"seq": rec["seq"], "bytes": rec["bytes"], "count": rec["count"], "sites": rec["sites_total"],
                "seconds": rec["seconds"]}

    def cmd_who(self, args: dict[str, Any]) -> dict[str, Any]:
        """Command ``holders_who``: :class:`jaxtop.probes.who_holds.WhoCommand`,
        for a site named in ``args`` or this probe's leak suspects."""
        return self._who(args, [(key[0], key[1]) for key in self.tracker.suspects()])

    # -- reading in-process (tests, benchmarks) -----------------------------------
    def profile_now(self) -> dict[str, Any] | None:
        """Takes a profile now, bypassing cadence and rate limits; returns its
        record (which also goes on the stream with the next sample)."""
        if not self._ready():
            return None
        return self._take("demand")
