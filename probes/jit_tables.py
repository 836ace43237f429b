"""The jit ledger's tables: functions, live executables, the leak and storm flags, rows.

:class:`LedgerTables` is the half of
:class:`jaxtop.probes.executables.JitLedgerProbe` that keeps what the passes
found and builds what goes out; the probe's other half finds it (passes over
the live executables, compile events, cache-miss records). The state lives on
the probe (its ``__init__`` sets every attribute used here); callers hold
the probe's ``_lock`` where a method's name ends in ``_locked`` and in
:meth:`LedgerTables._apply_pass`.

Stdlib only: this runs in the user's job.
"""

from __future__ import annotations

import heapq
import os
import time
from collections.abc import Iterable
from typing import Any

from jaxtop.probes.compile_storm import display_name, storm_cause
from jaxtop.probes.jit_entries import _Exe, _Fn

__all__ = ["LedgerTables", "MAX_TABLE_EXECUTABLES"]

#: Executable rows in the ``jit_ledger`` command's reply (the largest).
MAX_TABLE_EXECUTABLES = 20_000


class LedgerTables:
    """Functions and executables as the passes found them, and their rows."""

    # -- functions ---------------------------------------------------------------------
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

    # -- a pass's findings ------------------------------------------------------------------
    def _apply_pass(self, now: float, count: int, pending: int, gone_keys: list[int],
                    new: list[tuple[int, _Exe]]) -> None:
        """Take in one pass: the freed executables, the new ones analysed,
        the live count and what waits for analysis (under the probe's lock)."""
        cache = self._cache
        # Forget the freed ones first: a new executable may reuse a freed
        # one's id() and take its slot in the cache below.
        gone = [cache.pop(key) for key in gone_keys]
        for key, entry in new:
            cache[key] = entry
        new_entries = [entry for _, entry in new]
        self._mark_ops(new_entries)
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
        if new_entries and not (self._fun_names_seen or self._names_expected):
            # No compile event names a function (jax < 0.6.2): the new
            # executables say which functions compiled (those freed between
            # two passes are missed).
            for e in new_entries:
                self._storms.note(now, e.key)
        # Ops run outside jit compile once per primitive and shape (a model's
        # eager setup: hundreds in its first seconds): not closures.
        self._eager_live += sum(e.eager for e in new_entries) - sum(g.eager for g in gone)
        self._track_growth(now, count - self._eager_live, freed=len(gone), new_entries=new_entries)
        self._update_storm(now)
        if count != self._live_count or changed:
            self._changed = True
        if (self._changed or self._dirty or self._new_rows or self._gone or self._leak != self._leak_reported
                or self._storm != self._storm_reported):
            self._news = True
        self._live_count = count
        self._pass_t = now
        # The trend is the live count the samples carry (``live_count``, ops
        # included) at the time they carry (``t``, to the microsecond): one
        # point per pass, whichever field a reader takes it from.
        self._trend.append((round(now, 6), count))

    def _mark_ops(self, entries: list[_Exe]) -> None:
        """Executables of a function every compile of which was an op run
        outside jit are ops too, and so are those of an op named by an
        unnamed compile event's stack (jax < 0.6.2): a recorded traceback
        cannot tell a program's own call of ``jnp.sin`` (a jax.jit-wrapped
        function of jax) from a call of its own jitted function; the compile
        event's live stack can."""
        for e in entries:
            if e.eager:
                continue
            fn = self._fns.get(e.key)
            if (fn is not None and fn.eager_compiles and fn.eager_compiles >= fn.compiles) or e.key in self._op_keys:
                e.eager = True
                e.row["eager"] = True  # not sent yet: rows go out with the next sample

    def _rebuild_functions(self, now: float, new_entries: list[_Exe], gone: list[_Exe]) -> None:
        """The functions of the new and freed executables: their live sets, incrementally."""
        unnamed = not (self._fun_names_seen or self._names_expected)
        for entry in new_entries:
            fn = self._fn(entry.key)
            fn.seen_exes += 1
            if unnamed and entry.eager:
                fn.eager_compiles += 1  # no compile event names it (jax < 0.6.2): its executables count
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
        """The leak flag: growth on ``leak_passes`` passes in a row, nothing
        freed; ``count`` leaves out executables of ops run outside jit. The
        flag goes down when the executables are released, or when the count
        has not grown for ``2 * leak_passes`` passes (a burst of compiles that
        ended: a loop making closures does not stop)."""
        prev, self._growth_last = self._growth_last, (now, count)
        if prev is None:
            return
        if count > prev[1] and freed == 0:
            if self._streak == 0:
                self._streak_start = prev
                self._streak_sites.clear()
                self._streak_keys.clear()
            self._streak += 1
            self._quiet_passes = 0
            for entry in new_entries:
                if not entry.eager:
                    self._streak_keys[entry.key] += 1
                    if entry.site:
                        self._streak_sites[entry.site] += 1
        else:
            self._streak = 0
            if count <= prev[1]:
                self._quiet_passes += 1
        if self._leak is not None and self._quiet_passes >= 2 * self.leak_passes:
            self._leak = None  # it stopped growing
            return
        start = self._streak_start
        if self._streak >= self.leak_passes and start is not None and count - start[1] >= self.leak_min_growth:
            site = self._streak_sites.most_common(1)[0][0] if self._streak_sites else None
            growth = count - start[1]
            seconds = now - start[0]
            where = f" ({os.path.basename(site.rsplit(':', 1)[0])}:{site.rsplit(':', 1)[1]})" if site else ""
            key = self._streak_keys.most_common(1)[0][0] if self._streak_keys else None
            self._leak = {
                "since_t": round(start[0], 3),
                "from_count": start[1],
                "count": count,
                "growth": growth,
                "seconds": round(seconds, 3),
                "passes": self._streak,
                "site": site,
                "function": key,
                "message": f"live executables +{growth} in {seconds:.0f} s: {self._leak_cause(key)}{where}",
            }
        elif self._leak is not None and count <= self._leak["from_count"]:
            self._leak = None  # the executables were released

    def _leak_cause(self, key: str | None) -> str:
        """Why the live count grows: the recompiles of ``key`` (the function
        most of the new executables belong to) where the ledger has their
        reasons (argument types, a static argument), else new jit closures."""
        fn = self._fns.get(key) if key is not None else None
        if fn is not None and fn.reasons and fn.reasons[-1].get("kind") in ("types", "static", "other"):
            return storm_cause(fn.key, max(fn.compiles, fn.seen_exes), False, fn.story(), self._explain_on())[1]
        return "jit closures created in a loop?"

    def _explain_on(self) -> bool:
        return bool(self._explain.status(self._misses_total).get("enabled"))

    def _update_storm(self, now: float) -> None:
        """The storm flag (:mod:`jaxtop.probes.compile_storm`): up while one
        function keeps compiling, its cause from the function's row; down
        once its function has been quiet for the detector's ``quiet_s``."""
        storms = self._storms
        # A leak flag's function grew pass after pass: compiles that keep
        # coming, whatever their span so far. The two flags then come
        # together (one event on the dashboard, not a leak then a storm).
        found = storms.storming(now, sustained=self._leak.get("function") if self._leak else None)
        storm = self._storm
        if found is None:
            # A storm that slows below the thresholds stays one storm while
            # its function still compiles (no second flag, no second event).
            if storm is not None and not storms.still_going(storm["function"], now):
                self._storm = None
            return
        key, compiles, first, last = found
        fn = self._fns.get(key)
        if fn is None:
            return
        total = max(fn.compiles, fn.seen_exes)
        eager = bool(fn.eager_compiles) and fn.eager_compiles >= fn.compiles
        if not eager and not fn.compiles and fn.live:
            eager = all(e.eager for e in fn.live.values())  # no compile events (jax < 0.6.2): the executables say
        kind, cause = storm_cause(key, total, eager, fn.story(), self._explain_on())
        window = storms.window_s
        span = max(1.0, float(last - first + 1))
        where = f" ({os.path.basename(fn.call_site)})" if fn.call_site else ""
        self._storm = {
            "since_t": storm["since_t"] if storm is not None else float(first),
            "t": round(storms.last_compile(key) or now, 3),
            "function": key,
            "name": display_name(key),
            "kind": kind,
            "compiles": compiles,
            "compiles_total": total,
            "window_s": window,
            "rate_per_s": round(compiles / span, 2),
            "site": fn.call_site,
            "message": f"compile storm: {cause}; {compiles} compiles in the last {window:.0f} s{where}",
        }

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
        if fn.eager_compiles:
            # Compiled by jax's eager dispatch (an op outside jit): once per
            # shape and dtype, and none of them is a recompile.
            row["eager_compiles"] = fn.eager_compiles
        largest = fn.largest_entry()
        for k in ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "peak_bytes", "flops",
                  "bytes_accessed"):
            row[k] = largest.row.get(k) if largest is not None else None
        row["code_bytes"] = fn.code if fn.live else None
        if largest is not None and largest.row.get("donatable"):
            # The arguments its outputs could be written into (jaxtop.probes.jit_donatable).
            row["donatable"] = largest.row["donatable"]
            row["donatable_nnx"] = largest.row.get("donatable_nnx", False)
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
            "explain": self._explain.status(self._misses_total),
            "leak": dict(self._leak) if self._leak else None,
            "storm": dict(self._storm) if self._storm else None,
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

    def table(self) -> dict[str, Any]:
        """The whole ledger: every live executable, recently freed ones, the trend."""
        with self._lock:
            out = self._full_locked(all_executables=True)
            out["gone_recent"] = list(self._recent_gone)
            return out

    def live_count(self) -> int:
        """Live executables at the last pass."""
        return self._live_count

    def functions(self) -> Iterable[str]:
        """Function names in the ledger (tests, benchmarks)."""
        with self._lock:
            return list(self._fns)
