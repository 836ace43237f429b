"""The jit ledger: every live compiled function's memory, cost and recompiles.

Three sources, all inside the user's process:

* ``client.live_executables()`` on the slow cadence: each loaded executable's
  module name, fingerprint, ``get_compiled_memory_stats()`` (argument,
  output, alias, temp and generated-code bytes, device and host side),
  ``cost_analysis()`` (flops, bytes accessed) and the traceback of the call
  that compiled it. An executable is analysed once and cached by identity.
  A pass over an unchanged set costs the list and a comparison of its
  ``id()`` list with the last one, both in C, and passes over an unchanged
  set come less often the more they cost (a CPU share,
  :class:`JitLedgerProbe`); new executables are analysed within a time
  budget per pass (the rest wait for the next pass), so a burst of compiles
  never stalls the agent thread.
* ``jax.monitoring`` backend-compile events: compiles per function name
  (``fun_name`` is passed from jax 0.6.2; before that the ledger counts the
  distinct executables it saw per name, a lower bound). An event also makes
  the next pass come after ``interval_s``, so that new executables show
  promptly.
* JAX's tracing-cache-miss explanations (``jax_explain_cache_misses``): why a
  function was traced and compiled again (which argument, old and new type,
  the call site). jaxtop turns the option on only when the program left it
  alone, and then keeps those records (which exist only because of jaxtop)
  away from the program's own log handlers and stderr.

The live-executable count is followed pass by pass: a count that climbs on
every one of ``leak_passes`` consecutive passes, with nothing freed, by at
least ``leak_min_growth`` executables is flagged as a leak (typically new
``jax.jit`` closures created in a loop and kept alive).

Stdlib and jax only: this runs in the user's job.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import os
import re
import sys
import sysconfig
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

#: The duration event of one XLA compile (``fun_name=`` from jax 0.6.2).
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
#: The duration event of an executable loaded from the persistent compilation
#: cache (no compile event then): the next pass comes soon too.
CACHE_LOAD_EVENT = "/jax/compilation_cache/cache_retrieval_time_sec"
#: The config option, and its environment variable.
EXPLAIN_OPTION = "jax_explain_cache_misses"
EXPLAIN_ENV = "JAX_EXPLAIN_CACHE_MISSES"
#: Loggers that write the tracing-cache-miss explanations: ``jax._src.pjit``
#: up to jax 0.8.3, ``jax._src.interpreters.partial_eval`` from 0.9.2. Both
#: are watched on every version: the move happened between those releases,
#: and a filter on a logger that never writes such a record costs nothing.
MISS_LOGGERS = ("jax._src.pjit", "jax._src.interpreters.partial_eval")
#: Loggers whose persistent-cache records go from DEBUG to WARNING while the
#: option is on (only when the persistent compilation cache is enabled).
PERSISTENT_CACHE_LOGGERS = ("jax._src.compiler", "jax._src.compilation_cache")
#: Those records' format strings start so (jax 0.6.2 to 0.10.2).
_PERSISTENT_PREFIXES = (
    "PERSISTENT COMPILATION CACHE MISS",
    "Not writing persistent cache entry",
    "Writing %s to persistent compilation cache",
)
_MISS_PREFIX = "TRACING CACHE MISS"
#: CPU seconds of analysing executables paid from a credit apart, once: a
#: ledger started beside 5,000 executables analyses them in ~10 passes of
#: up to CATCHUP_PASS_S rather than ~4 ms a second for minutes.
CATCHUP_CREDIT_S = 1.0
#: The most a pass adds to its budget from that credit (the program's
#: threads get the GIL back every 5 ms meanwhile: sys.getswitchinterval()).
CATCHUP_PASS_S = 0.05
#: Executable rows in the ``jit_ledger`` command's reply (the largest).
MAX_TABLE_EXECUTABLES = 20_000

#: Size fields of ``CompiledMemoryStats`` → the ledger's names.
_DEVICE_SIZES = (
    ("argument_bytes", "argument_size_in_bytes"),
    ("output_bytes", "output_size_in_bytes"),
    ("alias_bytes", "alias_size_in_bytes"),
    ("temp_bytes", "temp_size_in_bytes"),
    ("code_bytes", "generated_code_size_in_bytes"),
)
_HOST_SIZES = tuple((ours, "host_" + theirs) for ours, theirs in _DEVICE_SIZES)

_NAME_CHARS = re.compile(r"[^\w.-]")
_MISS_HEAD = re.compile(
    r"^TRACING CACHE MISS at (?P<site>.*) \((?P<fn>[^()]*)\)(?: costing [\d.]+ ms)?(?: because)?:\s*$")
_SITE = re.compile(r"^(?P<file>.*?):(?P<line>\d+)(?::\d+)?$")
_FOR_FN = re.compile(r"^\s*for (?P<name>.+?)(?: defined at (?P<def>\S+))?\s*$")
_NEW_FN = re.compile(r"^\s*(?P<name>.+?) id=\d+(?: defined at (?P<def>\S+))?\s*$")
#: One argument's type change: jax 0.6.2+ and jax 0.4.30–0.5.x wording.
_DIFF_NOW = re.compile(r"\*\s+at (?P<arg>.+?), now (?P<new>.+?) and before (?P<old>.+?)\s*$")
_DIFF_SEEN = re.compile(r"\*\s+at (?P<arg>.+?), seen (?P<old>.+?), but now given (?P<new>.+?)\s*$")


def name_key(name: str) -> str:
    """One spelling for a jitted function's name, whoever reports it.

    ``jax.monitoring`` says ``jit(step)`` or ``jit(<lambda>)``; the compiled
    module is ``jit_step`` or ``jit__lambda`` (``jit__lambda_`` before jax
    0.10): the characters a module name cannot hold become ``_``, and
    trailing ``_`` are dropped, so all of them meet on ``jit_step`` /
    ``jit__lambda``.
    """
    return _NAME_CHARS.sub("_", name).rstrip("_") or name


def parse_cache_miss(message: str) -> dict[str, Any] | None:
    """Read one tracing-cache-miss explanation (any wording of jax 0.4.30–0.10.2).

    Args:
        message: the log record's formatted message.

    Returns:
        None when it is not such a record; else ``kind`` (``types``: an
        argument's shape or dtype changed; ``new_function``: first trace of
        this function object; ``redefined``: a new function object defined on
        a line that was traced before, the mark of jit closures created in a
        loop; ``other``: any other key difference, in ``text``), ``fn`` (the
        function's name as jax prints it), ``key`` (:func:`name_key` of its
        jit), ``call_site`` (``file:line``), ``call_fn``, ``defined_at``,
        ``arg``/``old``/``new`` of the first changed argument and ``diffs``
        (every ``[arg, old, new]`` named, at most 4), ``text`` (the
        explanation without its header, at most 600 characters).
    """
    lines = message.splitlines()
    if not lines or not lines[0].startswith(_MISS_PREFIX):
        return None
    out: dict[str, Any] = {"kind": "other", "fn": None, "key": None, "call_site": None,
                           "call_fn": None, "defined_at": None}
    head = _MISS_HEAD.match(lines[0])
    if head:
        site = _SITE.match(head.group("site"))
        out["call_site"] = f"{site.group('file')}:{site.group('line')}" if site else head.group("site")
        out["call_fn"] = head.group("fn")
    body = lines[1:]
    for i, line in enumerate(body):
        stripped = line.strip()
        if stripped.startswith("never seen function"):
            out["kind"] = "new_function"
            m = _NEW_FN.match(body[i + 1]) if i + 1 < len(body) else None
            if m:
                out["fn"], out["defined_at"] = m.group("name"), m.group("def")
            break
        m = _FOR_FN.match(line)
        if m:
            out["fn"], out["defined_at"] = m.group("name"), m.group("def")
            break
    if out["kind"] == "new_function" and "re-defined repeatedly" in message:
        out["kind"] = "redefined"
    diffs = []
    for line in body:
        m = _DIFF_NOW.search(line) or _DIFF_SEEN.search(line)
        if m and len(diffs) < 4:
            diff = [m.group("arg"), m.group("old"), m.group("new")]
            if diff not in diffs:
                diffs.append(diff)
    if diffs:
        out["kind"] = "types" if out["kind"] == "other" else out["kind"]
        out["arg"], out["old"], out["new"] = diffs[0]
        out["diffs"] = diffs
    if out["fn"]:
        out["key"] = name_key(f"jit({out['fn']})")
    text = "\n".join(line.rstrip() for line in body).strip()
    out["text"] = text[:600]
    return out


def _site_checker() -> Callable[[str], bool]:
    """A predicate: is this file part of jax, jaxlib, jaxtop or Python's stdlib?

    The compile call site is the innermost frame that is not: the program's
    own line (or a library of its own, such as flax) that called the jitted
    function.
    """
    prefixes: list[str] = []
    for name in ("jax", "jaxlib", "jaxtop"):
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            prefixes.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    # This module lives in jaxtop.probes, which a development tree keeps
    # outside the jaxtop package directory.
    prefixes.append(os.path.dirname(os.path.abspath(__file__)) + os.sep)
    stdlib: list[str] = []
    for key in ("stdlib", "platstdlib"):
        try:
            path = sysconfig.get_paths()[key]
        except Exception:
            continue
        if path:
            stdlib.append(os.path.abspath(path) + os.sep)
    ours = tuple(prefixes)
    std = tuple(stdlib)

    def internal(file_name: str) -> bool:
        if not file_name or file_name.startswith("<frozen"):
            return True
        if file_name.startswith(ours):
            return True
        if file_name.startswith(std):
            # A system Python keeps site-packages under its stdlib directory:
            # those are third-party libraries, not the stdlib.
            return "site-packages" not in file_name and "dist-packages" not in file_name
        return False

    return internal


class _Exe:
    """What the ledger knows of one live executable (never the executable itself:
    holding it would keep it loaded)."""

    __slots__ = ("id", "tb", "fingerprint", "key", "row", "weight", "site", "code", "all_code")

    def __init__(self, ident: int, tb: Any, fingerprint: Any, key: str, row: dict[str, Any]) -> None:
        self.id = ident
        # The traceback object outlives nothing but itself; while the ledger
        # holds it, a new executable that reuses a freed one's id() has
        # another traceback, so the cache never mistakes one for the other.
        self.tb = tb
        self.fingerprint = fingerprint
        self.key = key
        self.row = row
        sizes = [row.get(k) for k in ("argument_bytes", "output_bytes", "temp_bytes")]
        alias = row.get("alias_bytes") or 0
        self.weight = sum(s for s in sizes if s) - alias
        self.site = row.get("call_site")
        self.code = row.get("code_bytes") or 0  # device side
        self.all_code = self.code + (row.get("host", {}).get("code_bytes") or 0)

    def same(self, e: Any) -> bool:
        """Is ``e`` (whose id() is this entry's key) the executable analysed here?"""
        tb = getattr(e, "traceback", None)
        return self.tb is tb and (tb is not None or self.fingerprint == getattr(e, "fingerprint", None))


class _Fn:
    """One function name's history: compiles, recompile reasons, sightings.

    ``live`` (ledger id → entry), ``code`` (their device code bytes) and
    ``largest`` follow the live executables incrementally; ``row`` is the
    function's row as last built, None once anything in it changed.
    """

    __slots__ = ("key", "compiles", "compile_s", "seen_exes", "reasons", "reasons_total", "first_t", "last_t",
                 "live", "code", "largest", "call_site", "defined_at", "row")

    def __init__(self, key: str, max_reasons: int) -> None:
        self.key = key
        self.compiles = 0  # from jax.monitoring
        self.compile_s = 0.0
        self.seen_exes = 0  # distinct executables seen by the passes
        self.reasons: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_reasons)
        self.reasons_total = 0
        self.first_t: float | None = None
        self.last_t: float | None = None
        self.live: dict[int, _Exe] = {}
        self.code = 0
        self.largest: _Exe | None = None  # None with live executables: to be found again
        self.call_site: str | None = None
        self.defined_at: str | None = None
        self.row: dict[str, Any] | None = None

    def touch(self, t: float) -> None:
        if self.first_t is None or t < self.first_t:
            self.first_t = t
        if self.last_t is None or t > self.last_t:
            self.last_t = t

    def add(self, entry: _Exe) -> None:
        had = bool(self.live)
        self.live[entry.id] = entry
        self.code += entry.code
        # Ties go to the newest (as in largest_entry).
        if not had or (self.largest is not None and entry.weight >= self.largest.weight):
            self.largest = entry

    def remove(self, entry: _Exe) -> None:
        if self.live.pop(entry.id, None) is None:
            return
        self.code -= entry.code
        if self.largest is entry:
            self.largest = None

    def largest_entry(self) -> _Exe | None:
        if self.largest is None and self.live:
            self.largest = max(reversed(self.live.values()), key=lambda e: e.weight)
        return self.largest


class CacheMissFilter(logging.Filter):
    """Reads JAX's cache-miss records; hides the ones jaxtop caused.

    A filter on the exact logger rather than a handler: it sees each record
    of that logger before any handler, and can drop one without changing
    what happens to any other. A handler could not: it runs after the
    logger's other handlers, the ``jax`` logger's own StreamHandler and the
    root's would print the record anyway, and its mere presence would stop
    Python's last-resort handler from printing the program's own warnings.

    Args:
        on_miss: called with the record's message for every tracing-cache-miss
            record (on the thread that logged it; must not raise).
        jaxtop_owns: whether the option is on only because jaxtop turned it
            on (called per record: the program may take it over later).
        user_local: whether the program turned the option on for this thread
            only (``with jax.explain_cache_misses(True)``): its records are
            the program's.
    """

    def __init__(self, on_miss: Callable[[str, float], None], jaxtop_owns: Callable[[], bool],
                 user_local: Callable[[], bool]) -> None:
        super().__init__()
        self._on_miss = on_miss
        self._jaxtop_owns = jaxtop_owns
        self._user_local = user_local
        self.hidden = 0

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        if not isinstance(msg, str):
            return True
        if msg.startswith(_MISS_PREFIX):
            try:
                self._on_miss(record.getMessage(), record.created)
            except Exception:
                pass
            if self._ours():
                # Without jaxtop this record would not exist.
                self.hidden += 1
                return False
            return True
        if record.levelno == logging.WARNING and msg.startswith(_PERSISTENT_PREFIXES) and self._ours():
            # Without jaxtop jax would have logged it at DEBUG: do so, and
            # let it through only where the program's logging takes DEBUG.
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            logger = logging.getLogger(record.name)
            if not logger.isEnabledFor(logging.DEBUG):
                self.hidden += 1
                return False
        return True

    def _ours(self) -> bool:
        try:
            return self._jaxtop_owns() and not self._user_local()
        except Exception:
            return False


# Probes started in this process, for the fork handler below.
_probes: weakref.WeakSet[JitLedgerProbe] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A child made by ``os.fork()``: its copy of each probe goes inert.

    The lock may have been held by the agent thread, which the child does
    not have: the compile listener and the log filter of the child would
    wait on it forever. The filter keeps hiding the records jaxtop caused.
    """
    for probe in list(_probes):
        probe._lock = threading.Lock()
        probe.active = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class JitLedgerProbe:
    """The jit ledger of this process (see the module docstring).

    Call :meth:`start` once jax is imported, :meth:`sample` from the agent's
    sampling thread (every tick: it runs a pass when one is due and returns
    None when there is nothing new to say), :meth:`command` for the
    ``jit_ledger`` request, :meth:`stop` to undo everything.

    Passes follow an adaptive cadence, so that what the probe costs follows
    what changes, not how many executables are alive:

    * A pass lists the live executables and compares their ``id()`` list
      with the last pass's (C loops, no Python per executable); the same
      list whose newest executable is still the one analysed is an unchanged
      set (new executables come first in the list, so one that took a freed
      one's ``id()`` shows there). Otherwise only the executables before the
      newest known one are looked at one by one; when the rest of the list
      is the last pass's, nothing was freed, else a set difference finds
      the freed ones.
    * The next pass waits the pass's CPU time (analysis excluded) over
      ``cpu_share``: at least ``interval_s``, at most ``max_interval_s``.
      While executables are compiled (a ``jax.monitoring`` compile event
      since the last pass, executables waiting for analysis, or a pass that
      found changes) passes come every ``interval_s``, and their analysis is
      bounded by ``budget_s`` per pass.
    * Every ``verify_every_s`` (or more, by the same CPU share), and on
      :meth:`command` and a forced sample, a pass checks every executable's
      identity. A jaxlib found listing new executables elsewhere than first
      gets that on every pass.
    * The sample's parts are cached: a quiet tick reads a few attributes; a
      whole table with nothing changed reuses the last one's ``functions``
      and ``executables`` lists; a change rebuilds only the rows it touched.

    Args:
        interval_s: least time between two passes over the live executables.
        full_every_s: a whole table goes out at least this often (readers
            that joined late, a recording read from the middle); in between
            only changes do.
        leak_passes: consecutive passes of growth that make a leak.
        leak_min_growth: least growth over those passes that makes a leak.
        max_reasons: recompile reasons kept per function (the newest).
        budget_s: analysis time per pass for executables not seen before; at
            least one is analysed per pass, the rest wait for the next.
        max_functions: function names kept (those with live executables
            first, then the most recent).
        max_full_executables: executable rows in a sample's whole table (the
            largest; :meth:`command` lists all).
        max_delta_executables: new executable rows in one sample's changes.
        explain: turn ``jax_explain_cache_misses`` on when the program did
            not set it (False: only read records the program asked for).
        cpu_share: share of one core that passes over an unchanged set may
            take (their CPU time, analysis excluded, over this share is the
            least time to the next pass).
        max_interval_s: most time between two passes, whatever they cost
            (a change without a compile event, e.g. executables freed, shows
            within it).
        verify_every_s: least time between two passes that check every
            executable's identity.
        catchup_credit_s: CPU seconds of analysis a pass may take beyond
            ``budget_s`` (up to :data:`CATCHUP_PASS_S` each), once in all.
    """

    def __init__(self, interval_s: float = 1.0, full_every_s: float = 10.0, leak_passes: int = 5,
                 leak_min_growth: int = 10, max_reasons: int = 8, budget_s: float = 0.004,
                 max_functions: int = 500, max_full_executables: int = 64, max_delta_executables: int = 100,
                 trend_len: int = 120, explain: bool = True, cpu_share: float = 0.0005,
                 max_interval_s: float = 10.0, verify_every_s: float = 60.0,
                 catchup_credit_s: float = CATCHUP_CREDIT_S) -> None:
        self.interval_s = float(interval_s)
        self.full_every_s = float(full_every_s)
        self.leak_passes = int(leak_passes)
        self.leak_min_growth = int(leak_min_growth)
        self.max_reasons = int(max_reasons)
        self.budget_s = float(budget_s)
        self.max_functions = int(max_functions)
        self.max_full_executables = int(max_full_executables)
        self.max_delta_executables = int(max_delta_executables)
        self.cpu_share = float(cpu_share)
        self.max_interval_s = float(max_interval_s)
        self.verify_every_s = float(verify_every_s)
        self._explain_wanted = explain
        self._catchup_credit_s = float(catchup_credit_s)
        self.active = False
        self.reason: str | None = None
        self._lock = threading.Lock()
        self._fns: dict[str, _Fn] = {}
        self._cache: dict[int, _Exe] = {}  # id(executable) -> analysis
        self._next_id = 1
        self._internal: Callable[[str], bool] | None = None
        self._executables_reason: str | None = None
        # compile events
        self._compiles_total = 0
        self._compiles_unattributed = 0
        self._fun_names_seen = False
        # changes since the last sample
        self._dirty: set[str] = set()
        self._new_rows: list[dict[str, Any]] = []
        self._new_rows_dropped = 0
        self._gone: list[int] = []
        self._recent_gone: collections.deque[dict[str, Any]] = collections.deque(maxlen=64)
        # Anything of the above, a changed count or leak flag: a quiet tick
        # reads this (and two times) without the lock.
        self._news = False
        # what the last whole table was built from, reused while unchanged
        self._fn_version = 0  # bumped when a function's row or the set of functions changes
        self._exe_version = 0  # bumped when the analysed executables change
        self._full_functions: tuple[int, list[dict[str, Any]]] | None = None
        self._full_executables: dict[int, tuple[int, list[dict[str, Any]]]] = {}  # by row limit
        # passes
        self._clock: Callable[[], float] = time.monotonic  # cadence (tests replace it)
        self._last_pass_mono: float | None = None
        self._next_pass_mono = float("-inf")  # the adaptive cadence's next pass
        self._prompt_mono = float("-inf")  # the earliest pass after a compile event
        self._hint = False  # a compile event since the last pass began
        self._last_verify_mono: float | None = None
        self._verify_gap = self.verify_every_s
        self._check_s = 0.0  # CPU time of the last pass, analysis excluded
        self._gap = self.interval_s  # least time from that pass to the next
        self._ids: list[list[int]] | None = None  # id() of each live executable at the last pass, per client
        self._ordered = True  # the jaxlib lists new executables first, the others in order
        self._last_full_mono: float | None = None
        self._pass_t: float | None = None
        self._pass_s: float | None = None
        self._live_count = 0
        self._code_bytes = 0
        self._pending = 0
        self._changed = False
        self._trend: collections.deque[tuple[float, int]] = collections.deque(maxlen=max(2, int(trend_len)))
        self._streak = 0
        self._streak_start: tuple[float, int] | None = None
        self._streak_sites: collections.Counter[str] = collections.Counter()
        self._leak: dict[str, Any] | None = None
        self._leak_reported: dict[str, Any] | None = None
        # jax_explain_cache_misses
        self._explain_by: str | None = None  # "user" | "jaxtop" | None (off)
        self._explain_reason: str | None = None
        self._we_enabled = False
        self._config: Any = None
        self._orig_update: Any = None
        self._our_update: Any = None
        self._state: Any = None
        self._filter: CacheMissFilter | None = None
        self._filtered: list[logging.Logger] = []
        self._misses_total = 0
        self._listener_registered = False
        self._compile_reason: str | None = None

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        """Hook compile events and cache-miss records (call once jax is imported).

        Never raises: what cannot be hooked is reported in the samples.
        """
        if self.active:
            return
        try:
            import jax  # noqa: F401  (is it importable at all?)
        except Exception as exc:
            self.reason = f"jax cannot be imported: {exc}"
            return
        self.active = True
        _probes.add(self)
        try:
            from jax import monitoring

            monitoring.register_event_duration_secs_listener(self._on_duration)
            self._listener_registered = True
        except Exception as exc:
            self._compile_reason = f"jax.monitoring unavailable: {exc}"
        try:
            self._start_explain()
        except Exception as exc:
            self._explain_by, self._explain_reason = None, f"could not hook cache-miss explanations: {exc}"

    def stop(self) -> None:
        """Undo every change: listener, log filters, the option, ``jax.config.update``."""
        if not self.active:
            return
        self.active = False
        _probes.discard(self)
        if self._listener_registered:
            self._listener_registered = False
            from jaxtop.probes.compile import remove_listener

            remove_listener("duration", self._on_duration)  # where it cannot, the inactive flag makes it inert
        for logger in self._filtered:
            try:
                logger.removeFilter(self._filter)
            except Exception:
                pass
        self._filtered = []
        config, self._config = self._config, None
        if config is not None and self._our_update is not None:
            try:
                if config.__dict__.get("update") is self._our_update:
                    del config.update  # the class's method again
            except Exception:
                pass
        try:
            if self._we_enabled and self._explain_by == "jaxtop" and config is not None:
                if getattr(config, EXPLAIN_OPTION, False):
                    (self._orig_update or config.update)(EXPLAIN_OPTION, False)
        except Exception:
            pass
        self._we_enabled = False
        with self._lock:
            # Drop the tracebacks held for identity.
            self._cache.clear()
            for fn in self._fns.values():
                if fn.live:
                    fn.live, fn.largest, fn.code, fn.row = {}, None, 0, None
            self._ids = None
            self._code_bytes = 0
            self._fn_version += 1
            self._exe_version += 1

    # -- hooks on the program's threads -----------------------------------------
    def _on_duration(self, event: str, duration: float, *args: Any, **kwargs: Any) -> None:
        if event != BACKEND_COMPILE_EVENT:
            if event == CACHE_LOAD_EVENT and self.active:
                self._hint = True  # an executable loaded from the persistent cache: look soon
            return
        if not self.active:
            return
        name = kwargs.get("fun_name")
        now = time.time()
        with self._lock:
            self._hint = True  # a new executable: the next pass comes after interval_s
            self._compiles_total += 1
            if not isinstance(name, str):
                self._compiles_unattributed += 1
                return
            if not self._fun_names_seen:
                self._fun_names_seen = True
                self._stale_all()  # compiles_source and compile_s of every row
            fn = self._fn(name_key(name))
            fn.compiles += 1
            fn.compile_s += float(duration)
            fn.touch(now)
            self._stale(fn)
            self._dirty.add(fn.key)
            self._news = True

    def _on_miss(self, message: str, created: float) -> None:
        parsed = parse_cache_miss(message)
        if parsed is None or not self.active:
            return
        with self._lock:
            self._misses_total += 1
            key = parsed.get("key")
            if not key:
                return
            fn = self._fn(key)
            fn.touch(created)
            if parsed.get("defined_at"):
                fn.defined_at = parsed["defined_at"]
            self._stale(fn)
            if parsed["kind"] == "new_function":
                return  # the first trace of a function: not a recompile
            # The function row carries its name and definition; the explanation's
            # text only says more than arg/old/new when the kind is not "types".
            skip = {"key", "fn", "defined_at"} | ({"text"} if parsed["kind"] == "types" else set())
            reason = {k: v for k, v in parsed.items() if k not in skip and v is not None}
            if len(reason.get("diffs", ())) < 2:
                reason.pop("diffs", None)
            reason["t"] = round(created, 6)
            fn.reasons.append(reason)
            fn.reasons_total += 1
            self._dirty.add(key)
            self._news = True

    # -- jax_explain_cache_misses --------------------------------------------------
    def _start_explain(self) -> None:
        import jax

        config = jax.config
        self._config = config
        try:
            from jax._src import config as config_module

            self._state = getattr(config_module, "explain_cache_misses", None)
        except Exception:
            self._state = None
        user_value = bool(getattr(config, EXPLAIN_OPTION))
        if EXPLAIN_ENV in os.environ or user_value:
            self._explain_by = "user" if user_value else None
            if not user_value:
                self._explain_reason = f"the program set {EXPLAIN_ENV}={os.environ.get(EXPLAIN_ENV)!r}"
        elif self._explain_wanted:
            self._wrap_config_update(config)
            (self._orig_update or config.update)(EXPLAIN_OPTION, True)
            self._we_enabled = True
            self._explain_by = "jaxtop"
        else:
            self._explain_reason = f"{EXPLAIN_OPTION} is off (jaxtop left it alone)"
        self._filter = CacheMissFilter(self._on_miss, self._jaxtop_owns, self._user_local)
        for name in MISS_LOGGERS + PERSISTENT_CACHE_LOGGERS:
            logger = logging.getLogger(name)
            logger.addFilter(self._filter)
            self._filtered.append(logger)

    def _wrap_config_update(self, config: Any) -> None:
        """Notice the program's own ``jax.config.update(EXPLAIN_OPTION, ...)``.

        The option is a plain boolean: once jaxtop has set it, the program
        setting it too changes nothing visible, yet from then on the records
        are the program's and must reach it (and stay on after jaxtop
        stops). The wrapper passes every call through unchanged.
        """
        original = config.update
        probe = self

        def update(name: Any, val: Any) -> Any:
            if name == EXPLAIN_OPTION and probe.active:
                probe._user_took_over(val)
            return original(name, val)

        update.__wrapped__ = original  # type: ignore[attr-defined]
        update.__doc__ = getattr(original, "__doc__", None)
        self._orig_update = original
        self._our_update = update
        config.update = update

    def _user_took_over(self, value: Any) -> None:
        self._we_enabled = False
        self._explain_by = "user" if value else None
        self._explain_reason = None if value else f"the program set {EXPLAIN_OPTION} to {value!r}"

    def _jaxtop_owns(self) -> bool:
        return self._we_enabled and self._explain_by == "jaxtop"

    def _user_local(self) -> bool:
        state = self._state
        get_local = getattr(state, "get_local", None)
        if get_local is None:
            return False
        return get_local() is True

    def _explain_status(self) -> dict[str, Any]:
        config = self._config
        enabled = bool(getattr(config, EXPLAIN_OPTION, False)) if config is not None else False
        out: dict[str, Any] = {"enabled": enabled, "by": self._explain_by if enabled else None,
                               "misses_total": self._misses_total}
        reason = self._explain_reason
        if enabled and reason is None:
            for logger in self._filtered[:len(MISS_LOGGERS)]:
                if logger.disabled:
                    reason = f"logger {logger.name!r} is disabled (logging configuration): no explanations"
                elif not logger.isEnabledFor(logging.WARNING):
                    reason = (f"logger {logger.name!r} is set above WARNING by the program's logging "
                              "configuration: no explanations")
                else:
                    reason = None
                    break
        if reason:
            out["reason"] = reason
        if self._filter is not None:
            out["hidden_total"] = self._filter.hidden
        return out

    # -- passes ----------------------------------------------------------------------
    def _fn(self, key: str) -> _Fn:
        fn = self._fns.get(key)
        if fn is None:
            fn = self._fns[key] = _Fn(key, self.max_reasons)
            self._fn_version += 1
            if len(self._fns) > self.max_functions:
                self._evict_functions(keep=key)
        return fn

    def _evict_functions(self, keep: str) -> None:
        # Never the one just added (it has no time yet, and would go first).
        idle = sorted((f for f in self._fns.values() if not f.live and f.key != keep), key=lambda f: f.last_t or 0.0)
        for f in idle[: max(1, len(self._fns) - self.max_functions)]:
            del self._fns[f.key]
            self._dirty.discard(f.key)
        self._fn_version += 1

    def _stale(self, fn: _Fn) -> None:
        """``fn``'s row changed: built again when next sent."""
        fn.row = None
        self._fn_version += 1

    def _stale_all(self) -> None:
        for fn in self._fns.values():
            fn.row = None
        self._fn_version += 1

    def _clients(self) -> list[Any]:
        """Every initialised backend's client; never creates one."""
        if "jax" not in sys.modules:
            return []
        try:
            from jax._src import xla_bridge
        except Exception:
            return []
        if hasattr(xla_bridge, "backends_are_initialized") and not xla_bridge.backends_are_initialized():
            return []
        backends = getattr(xla_bridge, "_backends", None) or {}
        clients, seen = [], set()
        for client in list(backends.values()):
            if id(client) not in seen:
                seen.add(id(client))
                clients.append(client)
        return clients

    def shift_deadlines(self, gap: float) -> None:
        """The process was stopped for ``gap`` seconds (nothing compiled or
        was freed meanwhile): every pass, whole table and check falls due
        that much later."""
        self._next_pass_mono += gap
        self._prompt_mono += gap
        if self._last_verify_mono is not None:
            self._last_verify_mono += gap
        if self._last_full_mono is not None:
            self._last_full_mono += gap

    def _pass_due(self, now: float) -> bool:
        """Is a pass due at ``now`` (monotonic)? A few attribute reads."""
        return now >= self._next_pass_mono or (self._hint and now >= self._prompt_mono)

    def scan(self, verify: bool = False) -> None:
        """One pass over the live executables (slow cadence; one thread at a time).

        Lists them, finds the new and the freed ones (see the class
        docstring), analyses new ones within ``budget_s``, and sets when the
        next pass is due. The executables are listed and the new ones
        analysed without the lock that the program's threads take in the
        compile listener and the log filter: jaxlib calls never run while a
        compiling thread waits.

        Args:
            verify: check every executable's identity (the ``jit_ledger``
                command, the final sample; else every ``verify_every_s``).
        """
        t0 = time.perf_counter()
        c0 = time.thread_time()
        now = time.time()
        mono = self._clock()
        hinted, self._hint = self._hint, False
        self._last_pass_mono = mono
        if self._last_verify_mono is None or mono - self._last_verify_mono >= self._verify_gap:
            verify = True
        if not self._ordered:
            verify = True
        lists: list[list[Any]] = []  # per client, newest first
        for client in self._clients():
            lister = getattr(client, "live_executables", None)
            if lister is None:
                self._executables_reason = "this jaxlib's client has no live_executables()"
                continue
            try:
                found = lister()
            except Exception as exc:
                self._executables_reason = f"live_executables() failed: {type(exc).__name__}: {exc}"
                continue
            if found:
                lists.append(found if isinstance(found, list) else list(found))
        id_lists = [list(map(id, found)) for found in lists]
        prev = self._ids
        cache = self._cache
        fresh: list[Any] = []  # to analyse, in list order (newest first)
        replaced: list[int] = []  # cached ids now another executable's
        gone_keys: list[int] = []
        changed = verify or self._pending > 0 or id_lists != prev
        if not changed:
            # The same id()s in the same order: an executable that took a
            # freed one's id() would be the newest, first of its list.
            for found in lists:
                head = found[0]
                entry = cache.get(id(head))
                if entry is None or not entry.same(head):
                    changed = True
                    break
        if changed:
            if verify:
                self._check_all(lists, fresh, replaced)
                additive = False
            else:
                # New executables come first: the ones before the newest
                # one already analysed.
                heads = []
                for found in lists:
                    n = 0
                    for e in found:
                        entry = cache.get(id(e))
                        if entry is not None and entry.same(e):
                            break
                        fresh.append(e)
                        if entry is not None:
                            replaced.append(id(e))
                        n += 1
                    heads.append(n)
                # Only new ones before the lists of the last pass (nothing
                # waited for analysis then, so those are the cache): nothing freed.
                additive = (prev is not None and self._pending == 0 and len(prev) == len(id_lists)
                            and all(ids[n:] == p for ids, n, p in zip(id_lists, heads, prev)))
            if not additive:
                id_set = set(itertools.chain.from_iterable(id_lists))
                if not verify and len(id_set.difference(cache)) != len(fresh) - len(replaced):
                    # Unknown ids after known ones: not the order assumed.
                    # From now on every pass checks every executable.
                    self._ordered = False
                    fresh, replaced = [], []
                    self._check_all(lists, fresh, replaced)
                gone_keys = list(cache.keys() - id_set)
            gone_keys.extend(replaced)
        new: list[tuple[int, _Exe]] = []
        analysis_cpu = 0.0
        if fresh:
            a0 = time.thread_time()
            # Analysing an executable is paid once, when a pass first sees
            # it (~40-90 us each): a program that holds thousands when the
            # ledger starts, or makes them faster than one pass's budget,
            # has them analysed from a credit of their own, in larger
            # passes, rather than at the budget for minutes afterwards.
            extra = min(self._catchup_credit_s, CATCHUP_PASS_S) if len(fresh) > 1 else 0.0
            deadline = t0 + self.budget_s + extra
            # live_executables() lists the newest first: analyse the oldest
            # first, so that ids follow the order of compiles.
            for e in reversed(fresh):
                if new and time.perf_counter() > deadline:
                    break
                new.append((id(e), self._analyse(e, now)))
            analysis_cpu = time.thread_time() - a0
            if extra:
                self._catchup_credit_s = max(0.0, self._catchup_credit_s - max(0.0, analysis_cpu - self.budget_s))
        count, pending = sum(map(len, id_lists)), len(fresh) - len(new)
        del lists, fresh  # never keep an executable past the pass
        with self._lock:
            self._apply_pass(now, count, pending, gone_keys, new)
        self._ids = id_lists
        if verify:
            self._last_verify_mono = mono
        # The cadence: CPU time (analysis excluded, it has its own budget)
        # over the share allowed; every interval_s while things change.
        self._check_s = max(1e-6, time.thread_time() - c0 - analysis_cpu)  # a clock too coarse reads 0
        self._gap = max(self.interval_s, min(self.max_interval_s, self._check_s / self.cpu_share))
        if verify:
            self._verify_gap = max(self.verify_every_s, self._gap)
        self._prompt_mono = mono + self.interval_s
        busy = hinted or pending > 0 or bool(new) or bool(gone_keys)
        self._next_pass_mono = mono + (self.interval_s if busy else self._gap)
        self._pass_s = time.perf_counter() - t0

    def _check_all(self, lists: list[list[Any]], fresh: list[Any], replaced: list[int]) -> None:
        """Every executable's identity: the unknown ones into ``fresh``, and
        those whose id() a cached one had into ``replaced`` too."""
        cache = self._cache
        for e in itertools.chain.from_iterable(lists):
            entry = cache.get(id(e))
            if entry is None or not entry.same(e):
                fresh.append(e)
                if entry is not None:
                    replaced.append(id(e))

    def _apply_pass(self, now: float, count: int, pending: int, gone_keys: list[int],
                    new: list[tuple[int, _Exe]]) -> None:
        cache = self._cache
        # Forget the freed ones first: a new executable may reuse a freed
        # one's id() and take its slot in the cache below.
        gone = [cache.pop(key) for key in gone_keys]
        for key, entry in new:
            cache[key] = entry
        new_entries = [entry for _, entry in new]
        self._pending = pending
        if gone:
            self._gone.extend(g.id for g in gone)
            for g in gone:
                self._recent_gone.append(dict(g.row, last_t=round(now, 3)))
        changed = bool(gone or new_entries)
        if changed:
            self._exe_version += 1
            self._rebuild_functions(now, new_entries, gone)
            self._code_bytes += sum(e.all_code for e in new_entries) - sum(g.all_code for g in gone)
        self._track_growth(now, count, freed=len(gone), new_entries=new_entries)
        if count != self._live_count or changed:
            self._changed = True
        if self._changed or self._dirty or self._new_rows or self._gone or self._leak != self._leak_reported:
            self._news = True
        self._live_count = count
        self._pass_t = now
        self._trend.append((round(now, 3), count))

    def _analyse(self, e: Any, now: float) -> _Exe:
        """Everything the ledger keeps of one executable: called once per executable."""
        ident = self._next_id
        self._next_id += 1
        row: dict[str, Any] = {"id": ident}
        try:
            name = e.hlo_modules()[0].name
        except Exception:
            name = "?"
        row["name"] = name
        fingerprint = getattr(e, "fingerprint", None)
        if isinstance(fingerprint, bytes):
            row["fingerprint"] = fingerprint.decode("ascii", "replace")
        elif fingerprint is not None:
            row["fingerprint"] = str(fingerprint)
        else:
            row["fingerprint"] = None
        try:
            stats = e.get_compiled_memory_stats()
        except Exception as exc:
            stats = None
            row["stats_reason"] = f"get_compiled_memory_stats() failed: {type(exc).__name__}: {exc}"
        for ours, theirs in _DEVICE_SIZES:
            value = getattr(stats, theirs, None) if stats is not None else None
            row[ours] = int(value) if isinstance(value, int) and value >= 0 else None
        host = {}
        for ours, theirs in _HOST_SIZES:
            value = getattr(stats, theirs, None) if stats is not None else None
            if isinstance(value, int) and value > 0:
                host[ours] = int(value)
        if host:
            row["host"] = host
        peak = getattr(stats, "peak_memory_in_bytes", None) if stats is not None else None
        row["peak_bytes"] = int(peak) if isinstance(peak, int) and peak >= 0 else None
        try:
            cost = e.cost_analysis()
            if isinstance(cost, (list, tuple)):  # older jaxlibs: one dict per module
                cost = cost[0] if cost else {}
            if not isinstance(cost, dict):
                raise TypeError(f"cost_analysis() returned {type(cost).__name__}")
            # XLA lists only the properties that are not zero.
            row["flops"] = float(cost.get("flops", 0.0))
            row["bytes_accessed"] = float(cost.get("bytes accessed", 0.0))
        except Exception as exc:
            row["flops"] = row["bytes_accessed"] = None
            row["cost_reason"] = f"cost_analysis() failed: {type(exc).__name__}: {exc}"
        tb = getattr(e, "traceback", None)
        row["call_site"] = row["call_fn"] = None
        if tb is None:
            row["call_site_reason"] = "no traceback recorded for this executable"
        else:
            if self._internal is None:
                self._internal = _site_checker()
            try:
                for frame in tb.frames:  # innermost first
                    if not self._internal(frame.file_name):
                        row["call_site"] = f"{frame.file_name}:{frame.line_num}"
                        row["call_fn"] = frame.function_name
                        break
                else:
                    row["call_site_reason"] = "compiled from jax, jaxtop or the standard library only"
            except Exception as exc:
                row["call_site_reason"] = f"traceback unreadable: {type(exc).__name__}: {exc}"
        row["first_t"] = round(now, 3)
        key = name_key(name)
        return _Exe(ident, tb, fingerprint, key, row)

    def _rebuild_functions(self, now: float, new_entries: list[_Exe], gone: list[_Exe]) -> None:
        """The functions of the new and freed executables: their live sets, incrementally."""
        for entry in new_entries:
            fn = self._fn(entry.key)
            fn.seen_exes += 1
            fn.touch(now)
            if entry.site:
                fn.call_site = entry.site
            fn.add(entry)
            self._stale(fn)
            self._dirty.add(fn.key)
            if len(self._new_rows) < self.max_delta_executables:
                self._new_rows.append(entry.row)
            else:
                self._new_rows_dropped += 1
        for entry in gone:
            fn = self._fns.get(entry.key)
            if fn is not None:
                fn.remove(entry)
                self._stale(fn)
                self._dirty.add(fn.key)

    def _track_growth(self, now: float, count: int, freed: int, new_entries: list[_Exe]) -> None:
        """The leak flag: growth on ``leak_passes`` passes in a row, nothing freed."""
        prev = self._trend[-1] if self._trend else None
        if prev is None:
            return
        if count > prev[1] and freed == 0:
            if self._streak == 0:
                self._streak_start = prev
                self._streak_sites.clear()
            self._streak += 1
            for entry in new_entries:
                if entry.site:
                    self._streak_sites[entry.site] += 1
        else:
            self._streak = 0
        start = self._streak_start
        if self._streak >= self.leak_passes and start is not None and count - start[1] >= self.leak_min_growth:
            site = self._streak_sites.most_common(1)[0][0] if self._streak_sites else None
            growth = count - start[1]
            seconds = now - start[0]
            where = f" ({os.path.basename(site.rsplit(':', 1)[0])}:{site.rsplit(':', 1)[1]})" if site else ""
            self._leak = {
                "since_t": round(start[0], 3),
                "from_count": start[1],
                "count": count,
                "growth": growth,
                "seconds": round(seconds, 3),
                "passes": self._streak,
                "site": site,
                "message": f"live executables +{growth} in {seconds:.0f} s: jit closures created in a loop?{where}",
            }
        elif self._leak is not None and count <= self._leak["from_count"]:
            self._leak = None  # the executables were released

    # -- what goes out -------------------------------------------------------------------
    def _row(self, fn: _Fn) -> dict[str, Any]:
        """``fn``'s row, built again only after it changed (rows are never
        changed once sent: a whole table may send the same dict again)."""
        row = fn.row
        if row is None:
            row = fn.row = self._fn_row(fn)
        return row

    def _fn_row(self, fn: _Fn) -> dict[str, Any]:
        # Executables the passes saw without a compile event (compiled before
        # jaxtop started, or loaded from the persistent cache) count too: the
        # count is then a lower bound, and says so.
        exact = self._fun_names_seen and fn.compiles >= fn.seen_exes
        row: dict[str, Any] = {
            "name": fn.key,
            "compiles": max(fn.compiles, fn.seen_exes),
            "compiles_source": "monitoring" if exact else "executables",
            "compile_s": round(fn.compile_s, 6) if self._fun_names_seen else None,
            "live": len(fn.live),
            "call_site": fn.call_site,
            "defined_at": fn.defined_at,
            "first_t": round(fn.first_t, 6) if fn.first_t is not None else None,
            "last_t": round(fn.last_t, 6) if fn.last_t is not None else None,
            "reasons": list(fn.reasons),
            "reasons_total": fn.reasons_total,
        }
        largest = fn.largest_entry()
        for k in ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "peak_bytes", "flops",
                  "bytes_accessed"):
            row[k] = largest.row.get(k) if largest is not None else None
        row["code_bytes"] = fn.code if fn.live else None
        return row

    def _totals(self) -> dict[str, Any]:
        out = {
            "t": round(self._pass_t, 6) if self._pass_t is not None else round(time.time(), 6),
            "live_count": self._live_count,
            "code_bytes": self._code_bytes,
            "pending": self._pending,
            "pass_s": round(self._pass_s, 6) if self._pass_s is not None else None,
            "pass_every_s": round(self._gap, 3),
            "compiles_total": self._compiles_total,
            "compiles_unattributed": self._compiles_unattributed,
            "explain": self._explain_status(),
            "leak": dict(self._leak) if self._leak else None,
        }
        if self._executables_reason:
            out["executables_reason"] = self._executables_reason
        if not self._listener_registered:
            out["compiles_reason"] = self._compile_reason or "jax.monitoring not hooked"
        return out

    def _functions_locked(self) -> list[dict[str, Any]]:
        """Every function's row, those with live executables first, then the
        most recent; the same list while nothing in it changed."""
        cached = self._full_functions
        if cached is not None and cached[0] == self._fn_version:
            return cached[1]
        fns = sorted(self._fns.values(), key=lambda f: (not f.live, -(f.last_t or 0.0)))
        rows = [self._row(f) for f in fns]
        self._full_functions = (self._fn_version, rows)
        return rows

    def _largest_locked(self, limit: int) -> list[dict[str, Any]]:
        """The rows of the ``limit`` largest analysed executables; the same
        list while the executables did not change."""
        cached = self._full_executables.get(limit)
        if cached is not None and cached[0] == self._exe_version:
            return cached[1]
        # As sorted(..., reverse=True)[:limit]: ties stay in analysis order.
        rows = [e.row for e in heapq.nlargest(limit, self._cache.values(), key=lambda e: e.weight)]
        self._full_executables[limit] = (self._exe_version, rows)
        return rows

    def _full_locked(self, all_executables: bool) -> dict[str, Any]:
        out = self._totals()
        out["full"] = True
        out["functions"] = self._functions_locked()
        # The command's reply is one line: readers skip lines over 16 MiB,
        # and an executable's row is a few hundred bytes.
        limit = MAX_TABLE_EXECUTABLES if all_executables else self.max_full_executables
        out["executables"] = self._largest_locked(limit)
        if len(self._cache) > limit:
            out["executables_left_out"] = len(self._cache) - limit
        out["trend"] = [list(p) for p in self._trend]
        return out

    def sample(self, force: bool = False, full: bool = False) -> dict[str, Any] | None:
        """The sample field ``jit``: changes since the last one, or the whole table.

        A tick with no pass due and nothing new reads a few attributes and
        returns None.

        Args:
            force: run a pass now, checking every executable, even if none
                is due (the final sample at exit).
            full: send the whole table (the final sample).

        Returns:
            None when there is nothing new (the agent then leaves the field
            out), else the field (docs/protocol.md, "jit"). Not started: None;
            unavailable: ``{"available": false, "reason"}`` with each whole table.
            A whole table while nothing changed shares its ``functions`` and
            ``executables`` lists with the previous one: callers must not
            change what they get.
        """
        now = self._clock()
        if not self.active:
            if self.reason is None:
                return None
            if full or self._last_full_mono is None or now - self._last_full_mono >= self.full_every_s:
                self._last_full_mono = now
                return {"available": False, "reason": self.reason}
            return None
        if force or self._pass_due(now):
            self.scan(verify=force)
        due = full or self._last_full_mono is None or now - self._last_full_mono >= self.full_every_s
        if not (due or self._news):
            return None
        with self._lock:
            self._news = False
            if due:
                self._last_full_mono = now
                out = self._full_locked(all_executables=False)
            else:
                leak_changed = self._leak != self._leak_reported
                if not (self._dirty or self._new_rows or self._gone or self._changed or leak_changed):
                    return None
                out = self._totals()
                out["full"] = False
                out["functions"] = [self._row(self._fns[k]) for k in sorted(self._dirty) if k in self._fns]
                out["executables"] = list(self._new_rows)
                out["gone"] = list(self._gone)
                if self._new_rows_dropped:
                    out["executables_left_out"] = self._new_rows_dropped
            self._dirty.clear()
            self._new_rows = []
            self._new_rows_dropped = 0
            self._gone = []
            self._changed = False
            self._leak_reported = dict(self._leak) if self._leak else None
            return out

    def table(self) -> dict[str, Any]:
        """The whole ledger: every live executable, recently freed ones, the trend."""
        with self._lock:
            out = self._full_locked(all_executables=True)
            out["gone_recent"] = list(self._recent_gone)
            return out

    def command(self, args: dict[str, Any]) -> dict[str, Any]:
        """The ``jit_ledger`` command: a fresh pass, then :meth:`table`."""
        if not self.active:
            return {"jit_ledger": {"available": False, "reason": self.reason or "not started (jax not imported yet)"}}
        self.scan(verify=True)
        return {"jit_ledger": self.table()}

    def live_count(self) -> int:
        """Live executables at the last pass."""
        return self._live_count

    def functions(self) -> Iterable[str]:
        """Function names in the ledger (tests, benchmarks)."""
        with self._lock:
            return list(self._fns)
