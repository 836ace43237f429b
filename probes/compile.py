"""Compile events from ``jax.monitoring``: how many backend compiles, how long.

Recompilation in a loop is a classic memory and speed leak; the count per
interval makes it visible. The listener runs in the compiling thread, so it
only bumps counters under a lock. The events come through
:mod:`jaxtop.probes.compile_events`, which jax sees as one listener per kind
whichever probes subscribe.
"""

from __future__ import annotations

from typing import Any

from jaxtop.probes import compile_events
from jaxtop.probes.compile_events import remove_listener  # noqa: F401  (importable from here)
from jaxtop.probes.forksafe import ForkLock

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


class CompileProbe:
    """Backend compiles (count, seconds) and persistent-cache hits since it
    started (sample field ``compile``; the interface of ``jaxtop.probes.base``)."""

    name = "compile"
    needs_jax = True

    def __init__(self) -> None:
        self._lock = ForkLock()
        self._count_total = 0
        self._seconds_total = 0.0
        self._cache_hits_total = 0
        self._last_count = 0
        self._last: dict[str, Any] | None = None  # the last record, its count 0 (what a quiet tick repeats)
        self.active = False
        self.reason: str | None = None

    def _on_duration(self, event: str, duration: float, *args: Any, **kwargs: Any) -> None:
        if event == BACKEND_COMPILE_EVENT and self.active:
            with self._lock:
                self._count_total += 1
                self._seconds_total += float(duration)

    def _on_event(self, event: str, *args: Any, **kwargs: Any) -> None:
        if event == CACHE_HIT_EVENT and self.active:
            with self._lock:
                self._cache_hits_total += 1

    def start(self) -> None:
        """Register the listeners (call once jax is imported)."""
        try:
            compile_events.subscribe(compile_events.DURATION, self._on_duration)
            compile_events.subscribe(compile_events.EVENT, self._on_event)
            self.active = True
        except Exception as exc:
            compile_events.unsubscribe(compile_events.DURATION, self._on_duration)
            self.reason = f"jax.monitoring unavailable: {exc}"

    def stop(self) -> None:
        if not self.active:
            # Never started (the program never imported jax): importing jax
            # now, at exit, would cost seconds and clears the interpreter's
            # note of an unhandled KeyboardInterrupt (exit 1 instead of
            # death by SIGINT).
            return
        self.active = False
        compile_events.unsubscribe(compile_events.DURATION, self._on_duration)
        compile_events.unsubscribe(compile_events.EVENT, self._on_event)

    def total(self) -> int:
        """Backend compiles since the probe started."""
        with self._lock:
            return self._count_total

    def on_tick(self, tick: Any) -> dict[str, Any]:
        return self.sample()

    def sample(self) -> dict[str, Any]:
        if not self.active and self.reason:
            return {"available": False, "reason": self.reason}
        last = self._last
        # Most ticks see no compile: the last record again (a copy), without
        # the lock (the totals are ints, read whole; a compile counted while
        # this reads is in the next sample).
        if last is not None and last["count_total"] == self._count_total and (
                last["cache_hits_total"] == self._cache_hits_total):
            return dict(last)
        with self._lock:
            count = self._count_total - self._last_count
            self._last_count = self._count_total
            out = {
                "count": count,
                "count_total": self._count_total,
                "seconds_total": round(self._seconds_total, 6),
                "cache_hits_total": self._cache_hits_total,
            }
            self._last = {**out, "count": 0}
            return out
