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
least ``leak_min_growth`` executables is flagged as a leak, with its cause
where the ledger knows it (new ``jax.jit`` closures created in a loop and
kept alive; a jitted function recompiled for ever-new shapes). Compiles are
followed per function: one function that keeps compiling is flagged as a
compile storm (:mod:`jaxtop.probes.compile_storm`), whether or not its
executables stay alive (an op run eagerly over new shapes, a step fed
unpadded batches, closures re-created in a loop).

The parts live beside this module, and every name is importable from here:
the cache-miss records in :mod:`jaxtop.probes.cache_misses`, one
executable's analysis in :mod:`jaxtop.probes.jit_entries`, the passes in
:mod:`jaxtop.probes.jit_passes`, the tables and rows in
:mod:`jaxtop.probes.jit_tables`, the compile events in
:mod:`jaxtop.probes.compile_events`, compile storms in
:mod:`jaxtop.probes.compile_storm`.

Stdlib and jax only: this runs in the user's job.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from jaxtop.probes import compile_events, jaxstate
from jaxtop.probes.frames import eager_dispatch, jitted_name
from jaxtop.probes.cache_misses import (  # noqa: F401  (importable from here)
    _MISS_PREFIX,
    _PERSISTENT_PREFIXES,
    EXPLAIN_ENV,
    EXPLAIN_OPTION,
    MISS_LOGGERS,
    PERSISTENT_CACHE_LOGGERS,
    CacheMissFilter,
    ExplainSwitch,
    MissBook,
    name_key,
    publish_reason,
    user_call_site,
    parse_cache_miss,
)
from jaxtop.probes.compile_storm import StormDetector
from jaxtop.probes.jit_entries import _DEVICE_SIZES, _HOST_SIZES, _Exe, _Fn, analyse  # noqa: F401
from jaxtop.probes.jit_passes import CATCHUP_CREDIT_S, CATCHUP_PASS_S, LedgerPasses  # noqa: F401
from jaxtop.probes.jit_tables import MAX_TABLE_EXECUTABLES, LedgerTables  # noqa: F401

#: The duration event of one XLA compile (``fun_name=`` from jax 0.6.2).
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
#: Names of jax's ops kept from unnamed compile events (jax < 0.6.2).
MAX_OP_KEYS = 4096
#: The duration event of an executable loaded from the persistent compilation
#: cache (no compile event then): the next pass comes soon too.
CACHE_LOAD_EVENT = "/jax/compilation_cache/cache_retrieval_time_sec"


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


class JitLedgerProbe(LedgerPasses, LedgerTables):
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
        storms: the compile-storm thresholds (default: one function compiled
            30 times in 60 s, over at least 5 s).
    """

    def __init__(self, interval_s: float = 1.0, full_every_s: float = 10.0, leak_passes: int = 5,
                 leak_min_growth: int = 10, max_reasons: int = 8, budget_s: float = 0.004,
                 max_functions: int = 500, max_full_executables: int = 64, max_delta_executables: int = 100,
                 trend_len: int = 120, explain: bool = True, cpu_share: float = 0.0005,
                 max_interval_s: float = 10.0, verify_every_s: float = 60.0,
                 catchup_credit_s: float = CATCHUP_CREDIT_S, storms: StormDetector | None = None) -> None:
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
        self._catchup_credit_s = float(catchup_credit_s)
        self.active = False
        self.reason: str | None = None
        self._lock = threading.Lock()
        self._fns: dict[str, _Fn] = {}
        self._cache: dict[int, _Exe] = {}  # id(executable) -> analysis
        self._next_id = 1
        self._executables_reason: str | None = None
        # compile events
        self._compiles_total = 0
        self._compiles_unattributed = 0
        self._fun_names_seen = False
        self._names_expected = False  # set by start(): this jax names them
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
        self._streak_keys: collections.Counter[str] = collections.Counter()  # functions of the streak's executables
        self._growth_last: tuple[float, int] | None = None  # the last pass's count, ops left out
        self._leak: dict[str, Any] | None = None
        self._leak_reported: dict[str, Any] | None = None
        self._explain = ExplainSwitch(wanted=explain)
        self._misses_total = 0
        self._misses = MissBook()
        self._eager_live = 0  # live executables compiled by jax's eager dispatch
        self._op_keys: dict[str, None] = {}  # jax < 0.6.2: names of ops compiled eagerly (an ordered set)
        self._storms = storms if storms is not None else StormDetector()
        self._storm: dict[str, Any] | None = None
        self._storm_reported: dict[str, Any] | None = None
        self._quiet_passes = 0  # passes without growth since the leak flag went up
        self._listener_registered = False
        self._compile_reason: str | None = None

    # -- the probe interface (jaxtop.probes.base): sample field ``jit`` ----------
    name = "jit"
    needs_jax = True

    @property
    def commands(self) -> dict[str, Any]:
        return {"jit_ledger": self.command}

    def on_tick(self, tick: Any) -> dict[str, Any] | None:
        # The last sample carries the whole ledger, every executable verified.
        return self.sample(force=tick.final, full=tick.final)

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        """Hook compile events and cache-miss records (call once jax is imported).

        Never raises: what cannot be hooked is reported in the samples.
        """
        if self.active:
            return
        try:
            import jax  # (is it importable at all?)
        except Exception as exc:
            self.reason = f"jax cannot be imported: {exc}"
            return
        try:
            # jax names the compiled function in its compile events from 0.6.2.
            self._names_expected = jaxstate.version_tuple(jax.__version__) >= (0, 6, 2)
        except Exception:
            self._names_expected = False
        self.active = True
        _probes.add(self)
        try:
            compile_events.subscribe(compile_events.DURATION, self._on_duration)
            self._listener_registered = True
        except Exception as exc:
            self._compile_reason = f"jax.monitoring unavailable: {exc}"
        try:
            self._explain.start(self._on_miss, lambda: self.active)
        except Exception as exc:
            self._explain.failed(f"could not hook cache-miss explanations: {exc}")

    def stop(self) -> None:
        """Undo every change: listener, log filters, the option, ``jax.config.update``."""
        if not self.active:
            return
        self.active = False
        _probes.discard(self)
        if self._listener_registered:
            self._listener_registered = False
            compile_events.unsubscribe(compile_events.DURATION, self._on_duration)
        self._explain.stop()
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
                self._storms.note(now, None)
                frame = sys._getframe(1)
                if eager_dispatch(frame):
                    # jax < 0.6.2: the op's name from the stack, so that its
                    # executables count as ops when a pass finds them.
                    op = jitted_name(frame)
                    if op:
                        self._op_keys[name_key(f"jit({op})")] = None
                        if len(self._op_keys) > MAX_OP_KEYS:
                            del self._op_keys[next(iter(self._op_keys))]
                return
            if not self._fun_names_seen:
                self._fun_names_seen = True
                self._stale_all()  # compiles_source and compile_s of every row
            fn = self._fn(name_key(name))
            fn.compiles += 1
            fn.compile_s += float(duration)
            fn.touch(now)
            if eager_dispatch(sys._getframe(1)):
                fn.eager_compiles += 1
            self._storms.note(now, fn.key)
            self._misses.settle(fn)  # the misses that led to this compile: recompile reasons now
            self._stale(fn)
            self._dirty.add(fn.key)
            self._news = True

    def _on_miss(self, message: str, created: float) -> None:
        parsed = parse_cache_miss(message)
        if parsed is None or not self.active:
            return
        caller = sys._getframe(1)
        with self._lock:
            key, reason = self._take_miss(parsed, created, caller)
        if key:
            # The budget's compile log, on this (the compiling) thread and
            # outside the ledger's lock.
            publish_reason(key, reason)

    def _take_miss(self, parsed: dict[str, Any], created: float, caller: Any) -> tuple[str | None, Any]:
        """One parsed cache-miss record into the ledger (under the lock);
        returns the function's key and its recompile reason (None for a
        first trace)."""
        self._misses_total += 1
        key = parsed.get("key")
        if not key:
            return None, None
        reason = self._misses.reason(parsed, created)
        if reason is not None:
            user_call_site(reason, caller)
        fn = self._fns.get(key)
        if self._fun_names_seen or self._names_expected:
            # A reason becomes a recompile when its compile comes: a
            # function traced inside another's trace (a jitted helper
            # called in a jitted step) is inlined and never compiles on
            # its own, and is no row of the ledger either.
            self._misses.wait(key, parsed.get("defined_at"), reason, self.max_reasons)
            if fn is not None:
                fn.touch(created)
            return key, reason
        # jax < 0.6.2 names no function in its compile events: every
        # reason is kept at once, as a function's row.
        fn = self._fn(key)
        fn.touch(created)
        if parsed.get("defined_at"):
            fn.defined_at = parsed["defined_at"]
        self._stale(fn)
        if reason is not None:
            fn.add_reason(reason)
            self._dirty.add(key)
            self._news = True
        return key, reason

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
                flags_changed = self._leak != self._leak_reported or self._storm != self._storm_reported
                if not (self._dirty or self._new_rows or self._gone or self._changed or flags_changed):
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
            self._storm_reported = dict(self._storm) if self._storm else None
            return out

    def command(self, args: dict[str, Any]) -> dict[str, Any]:
        """The ``jit_ledger`` command: a fresh pass, then :meth:`table`."""
        if not self.active:
            return {"jit_ledger": {"available": False, "reason": self.reason or "not started (jax not imported yet)"}}
        self.scan(verify=True)
        return {"jit_ledger": self.table()}
