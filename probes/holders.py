"""Who holds the device memory: live bytes per allocation site, what grows.

A device memory profile (``jax.profiler.device_memory_profile()``) lists every
live buffer with the Python stack that created it. This probe takes one on
its own slow cadence, folds it into **allocation sites** (the innermost frame
of the user's own code), and follows each site from profile to profile:

* bytes and buffer count per site, per device;
* growth: a site whose bytes or count keep rising across profiles is a
  **leak suspect**, reported with its growth rate;
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

The cadence adapts so that profiling never takes more than ``budget`` (0.04 %)
of the wall time: after a profile that took 80 ms the next waits at least
200 s. Stdlib + jax only; jax is never imported here, and no profile is taken
before the program has created its backend (creating one would change the
program's allocator settings).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from jaxtop.probes.memory_profile import Profile, frame_resolver, load_profile, value_indices

__all__ = [
    "LibraryFilter",
    "SiteKey",
    "SiteStats",
    "ProfileTotals",
    "aggregate_profile",
    "GrowthTracker",
    "HoldersProbe",
    "site_text",
    "describe_growth",
    "fmt_count_rate",
    "jax_imported",
    "DEFAULT_INTERVAL_S",
    "DEFAULT_BUDGET",
    "LEAK_RISES",
]

#: Base period between two profiles (seconds), before the cost backs it off.
DEFAULT_INTERVAL_S = 5.0
#: Largest share of wall time profiling may take: interval >= cost / budget.
DEFAULT_BUDGET = 0.0004
#: A site becomes a leak suspect after this many rises with no fall between them.
LEAK_RISES = 5
#: Sites listed in each record (largest first); suspects and the largest
#: changes since the mark are listed beyond it. The rest is summed in ``other``.
MAX_SITES = 50
#: Sites followed for growth at most (the largest are kept).
MAX_TRACKED_SITES = 5000
#: A site gone (0 bytes) this many profiles in a row is forgotten (unless the mark holds it).
FORGET_AFTER = 10
#: Least time between two profiles asked for by commands (``holders_mark``,
#: ``holders_profile``), whoever asks: a flood of requests costs one profile per this.
DEMAND_MIN_INTERVAL_S = 1.0


# --------------------------------------------------------------------------
# Which frames are the user's
# --------------------------------------------------------------------------

class LibraryFilter:
    """Tells the user's code from library code by a frame's file name.

    Library code is jax, jaxlib, numpy and jaxtop (wherever installed), the
    standard library, and anything under ``site-packages`` / ``dist-packages``
    or frozen. Answers are cached per file name: a profile or a stack walk
    asks about the same few dozen files again and again.
    """

    _CORE = ("jax", "jaxlib", "numpy", "jaxtop", "ml_dtypes")

    def __init__(self) -> None:
        self._cache: dict[str, bool] = {}
        self._core_cache: dict[str, bool] = {}
        self._lock = threading.Lock()

    def _core_prefixes(self) -> tuple[str, ...]:
        # Recomputed on a cache miss only: jax may be imported after the
        # first question, and a miss is one new file name.
        prefixes = {os.path.dirname(os.path.abspath(__file__)) + os.sep}  # jaxtop.probes
        for name in self._CORE:
            module = sys.modules.get(name)
            path = getattr(module, "__file__", None) if module is not None else None
            if path:
                prefixes.add(os.path.dirname(os.path.abspath(path)) + os.sep)
        return tuple(prefixes)

    @staticmethod
    def _stdlib_prefixes() -> tuple[str, ...]:
        out = set()
        paths = sysconfig.get_paths()
        for key in ("stdlib", "platstdlib"):
            p = paths.get(key)
            if p:
                out.add(os.path.join(p, ""))
                out.add(os.path.join(os.path.realpath(p), ""))
        return tuple(out)

    def is_core(self, filename: str) -> bool:
        """True for jax, jaxlib, numpy and jaxtop's own files."""
        hit = self._core_cache.get(filename)
        if hit is None:
            hit = filename.startswith(self._core_prefixes()) or self._installed_core(filename)
            with self._lock:
                self._core_cache[filename] = hit
        return hit

    def _installed_core(self, filename: str) -> bool:
        """A file of jax, jaxlib, numpy or jaxtop in some installation (a
        profile may name paths of an environment other than this one's)."""
        parts = filename.replace("\\", "/").split("/")
        for marker in ("site-packages", "dist-packages"):
            if marker in parts:
                i = parts.index(marker)
                return i + 1 < len(parts) and parts[i + 1] in self._CORE
        return False

    def is_library(self, filename: str) -> bool:
        """True unless ``filename`` is the user's own code."""
        hit = self._cache.get(filename)
        if hit is None:
            hit = self._classify(filename)
            with self._lock:
                if len(self._cache) > 100_000:
                    self._cache.clear()  # bounded: exec'd code can make endless names
                self._cache[filename] = hit
        return hit

    def _classify(self, filename: str) -> bool:
        if not filename:
            return True
        if filename.startswith("<frozen") or filename.startswith("<built-in"):
            return True
        if filename.startswith("<"):
            return False  # <string>, <stdin>, notebooks' <ipython-input-…>: the user's
        parts = filename.replace("\\", "/").split("/")
        if "site-packages" in parts or "dist-packages" in parts:
            return True
        if self.is_core(filename):
            return True
        return filename.startswith(self._stdlib_prefixes())


#: The filter every probe of this process shares (its cache is the point).
LIBRARY = LibraryFilter()

#: (file, line, function): an allocation site or a call site.
SiteKey = tuple[str, int, str]

NO_STACK: SiteKey = ("", 0, "<no stack>")
#: Code objects of comprehensions (Python < 3.12): named after their enclosing function.
COMPREHENSIONS = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"})


def pick_site(frames: Iterable[tuple[str, str, int]], filt: LibraryFilter = LIBRARY) -> tuple[SiteKey, bool]:
    """The allocation site of one stack.

    Args:
        frames: ``(function, filename, line)``, innermost first.
        filt: what counts as library code.

    Returns:
        ``((file, line, function), library)``: the innermost frame of the
        user's code and False; else (everything is library code: jax's own
        constants, a library's buffers) the innermost frame outside
        jax/jaxlib/numpy/jaxtop and True, else the innermost frame and True;
        :data:`NO_STACK` for an empty stack.
    """
    frames = list(frames)
    for i, (name, filename, line) in enumerate(frames):
        if not filt.is_library(filename):
            if name in COMPREHENSIONS and i + 1 < len(frames) and frames[i + 1][1] == filename:
                name = f"{frames[i + 1][0]}.{name}"  # "make_tables.<listcomp>" says more than "<listcomp>"
            return (filename, line, name), False
    for name, filename, line in frames:
        if not filt.is_core(filename):
            return (filename, line, name), True
    if frames:
        name, filename, line = frames[0]
        return (filename, line, name), True
    return NO_STACK, True


def site_text(key: SiteKey) -> str:
    """``train.py:120`` for a site (the function is given separately)."""
    filename, line, name = key
    if not filename:
        return name
    return f"{os.path.basename(filename)}:{line}"


# --------------------------------------------------------------------------
# One profile -> sites
# --------------------------------------------------------------------------

@dataclass
class SiteStats:
    """Live buffers of one allocation site in one profile."""

    bytes: int = 0
    count: int = 0
    devices: dict[str, list[int]] = field(default_factory=dict)  # device label -> [bytes, count]
    library: bool = False
    labels: dict[str, dict[str, int]] = field(default_factory=dict)  # extra label -> value -> count


@dataclass
class ProfileTotals:
    """Everything one profile says, folded by site."""

    sites: dict[SiteKey, SiteStats]
    bytes: int = 0  # buffers only
    count: int = 0
    by_device: dict[str, list[int]] = field(default_factory=dict)  # label -> [bytes, count]
    executable_bytes: int = 0
    executable_count: int = 0


def aggregate_profile(data: bytes | Profile, filt: LibraryFilter = LIBRARY) -> ProfileTotals:
    """Folds a device memory profile into allocation sites. Pure: no jax.

    Args:
        data: the gzipped (or plain) pprof bytes of
            ``jax.profiler.device_memory_profile()``, or a decoded profile.
        filt: what counts as library code.

    Returns:
        Per site (the innermost user frame, :func:`pick_site`) the bytes and
        count of its live **buffers**, per device label; executables are
        only totalled (they have no device on CPU and are not arrays).

    Raises:
        ProfileDecodeError: not a pprof profile with a bytes sample type.
    """
    profile = data if isinstance(data, Profile) else load_profile(data)
    bytes_i, count_i = value_indices(profile)

    # A profile reuses few locations across many samples: resolve each once,
    # and pick the site once per distinct stack.
    frames_of = frame_resolver(profile)
    site_cache: dict[tuple[int, ...], tuple[SiteKey, bool]] = {}

    out = ProfileTotals(sites={})
    for sample in profile.samples:
        values = sample.values
        nbytes = values[bytes_i] if bytes_i < len(values) else 0
        count = 1 if count_i is None else (values[count_i] if count_i < len(values) else 0)
        kind = str(sample.labels.get("kind", "buffer"))
        if kind == "executable":
            out.executable_bytes += nbytes
            out.executable_count += count
            continue
        stack_key = tuple(sample.location_ids)
        picked = site_cache.get(stack_key)
        if picked is None:
            stack: list[tuple[str, str, int]] = []
            for loc_id in sample.location_ids:
                stack.extend(frames_of(loc_id))
            picked = site_cache[stack_key] = pick_site(stack, filt)
        key, library = picked
        site = out.sites.get(key)
        if site is None:
            site = out.sites[key] = SiteStats(library=library)
        site.bytes += nbytes
        site.count += count
        device = sample.labels.get("device")
        dev = str(device) if device is not None else "?"
        per = site.devices.setdefault(dev, [0, 0])
        per[0] += nbytes
        per[1] += count
        tot = out.by_device.setdefault(dev, [0, 0])
        tot[0] += nbytes
        tot[1] += count
        for label, value in sample.labels.items():
            if label in ("kind", "device"):
                continue  # any other label (shape, dtype from a newer jaxlib) is kept
            values_seen = site.labels.setdefault(str(label), {})
            values_seen[str(value)] = values_seen.get(str(value), 0) + count
        out.bytes += nbytes
        out.count += count
    return out


# --------------------------------------------------------------------------
# Growth: what rises from profile to profile
# --------------------------------------------------------------------------

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
        return [k for k, tr in self.trends.items() if tr.suspect]


def _fmt_bytes(n: float) -> str:
    value = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            text = f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
            return ("-" if n < 0 else "+") + text
        value /= 1024
    return str(n)


def fmt_count_rate(rate: float) -> str:
    """``+1,200``, ``+64``, ``+0.5``: whole numbers from 10 on."""
    return f"{rate:+,.0f}" if abs(rate) >= 10 else f"{rate:+.2g}"


def _fmt_span(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{s / 60:.0f} min"
    return f"{s:.0f} s"


def describe_growth(key: SiteKey, growth: dict[str, Any]) -> str:
    """One line: ``train.py:120 log_metrics: +64 arrays/min, +2.0 MiB/min, for 31 min``."""
    parts = []
    count_rate = growth.get("count_per_min")
    if count_rate:
        parts.append(f"{fmt_count_rate(count_rate)} arrays/min")
    bytes_rate = growth.get("bytes_per_min")
    if bytes_rate:
        parts.append(f"{_fmt_bytes(bytes_rate)}/min")
    parts.append(f"for {_fmt_span(growth.get('for_s') or 0.0)}")
    return f"{site_text(key)} {key[2]}: " + ", ".join(parts)


# --------------------------------------------------------------------------
# The probe
# --------------------------------------------------------------------------

def jax_imported() -> bool:
    """True once ``import jax`` has finished in this process.

    The agent thread asks while the program may still be importing jax:
    importing from jax's package then (``from jax._src import xla_bridge``)
    races the program's own import and breaks it with a circular-import
    error. importlib marks a module's spec ``_initializing`` until its code
    has run.
    """
    jax = sys.modules.get("jax")
    return jax is not None and not getattr(getattr(jax, "__spec__", None), "_initializing", False)


def _backend_ready() -> bool:
    """True once the program has created its JAX backend (never creates one)."""
    if not jax_imported():
        return False
    from jaxtop.probes.jax_memory import backend_ready

    return backend_ready()


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
        self._lock = threading.Lock()
        self._take_lock = threading.Lock()
        self.interval_s = self.base_interval_s  # current, after back-off
        self._next_t = 0.0  # monotonic time of the next cadence profile
        self._last_demand_t = -1e18
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

    # -- wiring ---------------------------------------------------------------
    def install(self, agent: Any) -> "HoldersProbe":
        """Registers the sample field and the commands on an agent.

        Uses only the agent's public hooks (``register_sample_field``,
        ``register_command``, ``post_event``).
        """
        agent.register_sample_field("holders", self.sample)
        agent.register_command("holders_mark", self.cmd_mark)
        agent.register_command("holders_profile", self.cmd_profile)
        if self._on_suspect is None and hasattr(agent, "post_event"):
            self._on_suspect = lambda text: agent.post_event("leak_suspect", text=text)
        return self

    # -- the agent thread -------------------------------------------------------
    def sample(self) -> dict[str, Any] | None:
        """The sample field: a record when a profile is due (or was taken by a
        command since the last sample), else None. Never raises."""
        try:
            now = self._mono()
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
        try:
            totals = aggregate_profile(self._capture())
        except Exception as exc:
            # Backed off like a costly profile: a failing capture is not retried every tick.
            self._error = f"{type(exc).__name__}: {exc}"
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
        seconds = self._timer() - started_wall
        self.cpu_s_total += time.thread_time() - started_cpu
        self.wall_s_total += seconds
        self.last, self.last_t, self.last_seconds = totals, t, seconds
        # The cadence backs off so that profiling takes at most `budget` of the time.
        self.interval_s = max(self.base_interval_s, seconds / self.budget)
        self._next_t = self._mono() + self.interval_s
        record = self._record(totals, t, seconds, reason, in_use, mark)
        with self._lock:
            self._pending = record
        if self._on_suspect is not None:
            for key in became:
                growth = self.tracker.growth(key)
                if growth is not None:
                    try:
                        self._on_suspect("leak suspect: " + describe_growth(key, growth))
                    except Exception:
                        pass
        return record

    def _record(self, totals: ProfileTotals, t: float, seconds: float, reason: str,
                in_use: int | None, mark: dict[str, Any] | None) -> dict[str, Any]:
        ranked = sorted(totals.sites.items(), key=lambda kv: (-kv[1].bytes, -kv[1].count, site_text(kv[0]), kv[0][2]))
        listed = [k for k, _ in ranked[:self.max_sites]]
        chosen = set(listed)
        suspects = self.tracker.suspects()
        extra = [k for k in suspects if k not in chosen]
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
            "executables": {"bytes": totals.executable_bytes, "count": totals.executable_count},
            "sites_total": len(totals.sites),
            "sites": sites,
            "other": {"bytes": totals.bytes - listed_bytes, "count": totals.count - listed_count,
                      "sites": sum(1 for k in totals.sites if k not in in_list)},
            "suspects": len(suspects),
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

    # -- reading in-process (tests, benchmarks) -----------------------------------
    def profile_now(self) -> dict[str, Any] | None:
        """Takes a profile now, bypassing cadence and rate limits; returns its
        record (which also goes on the stream with the next sample)."""
        if not self._ready():
            return None
        return self._take("demand")
