"""The jit ledger's passes over the live executables.

:class:`LedgerPasses` is the half of
:class:`jaxtop.probes.executables.JitLedgerProbe` that finds what changed:
it lists every client's live executables, tells the new and the freed ones
from the last pass's (mostly in C: a comparison of ``id()`` lists), analyses
the new ones within a time budget and sets when the next pass is due (the
adaptive cadence the probe's docstring describes). What a pass found goes to
:meth:`jaxtop.probes.jit_tables.LedgerTables._apply_pass`. The state lives on
the probe (its ``__init__`` sets every attribute used here).

Stdlib and jax only: this runs in the user's job.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from jaxtop.probes import jaxstate
from jaxtop.probes.jit_entries import _Exe, analyse

__all__ = ["CATCHUP_CREDIT_S", "CATCHUP_PASS_S", "LedgerPasses"]

#: CPU seconds of analysing executables paid from a credit apart, once: a
#: ledger started beside 5,000 executables analyses them in ~10 passes of
#: up to CATCHUP_PASS_S rather than ~4 ms a second for minutes.
CATCHUP_CREDIT_S = 1.0
#: The most a pass adds to its budget from that credit (the program's
#: threads get the GIL back every 5 ms meanwhile: sys.getswitchinterval()).
CATCHUP_PASS_S = 0.05


class LedgerPasses:
    """Passes over the live executables (see the module docstring)."""

    def _clients(self) -> list[Any]:
        """Every initialised backend's client; never creates one."""
        return jaxstate.clients()

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

    def _analyse(self, e: Any, now: float) -> _Exe:
        """Everything the ledger keeps of one executable (:func:`analyse`)."""
        ident = self._next_id
        self._next_id += 1
        return analyse(e, ident, now)
