"""Compile events from ``jax.monitoring``: how many backend compiles, how long.

Recompilation in a loop is a classic memory and speed leak; the count per
interval makes it visible. The listener runs in the compiling thread, so it
only bumps counters under a lock.
"""

from __future__ import annotations

import threading
from typing import Any

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def remove_listener(kind: str, fn: Any) -> None:
    """Unregister a ``jax.monitoring`` listener (``kind`` "duration" or
    "event") on every jax we support: the public ``unregister_*`` from jax
    0.8.3, the private ``_unregister_*_by_callback`` of 0.4.30 to 0.7.2.
    Where neither works the caller's inactive flag leaves it inert."""
    try:
        from jax._src import monitoring
    except Exception:
        return
    names = {"duration": ("unregister_event_duration_listener", "_unregister_event_duration_listener_by_callback"),
             "event": ("unregister_event_listener", "_unregister_event_listener_by_callback")}[kind]
    for name in names:
        unregister = getattr(monitoring, name, None)
        if unregister is None:
            continue
        try:
            unregister(fn)
        except Exception:
            pass  # not registered (any more)
        return


class CompileProbe:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count_total = 0
        self._seconds_total = 0.0
        self._cache_hits_total = 0
        self._last_count = 0
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
            from jax import monitoring

            monitoring.register_event_duration_secs_listener(self._on_duration)
            monitoring.register_event_listener(self._on_event)
            self.active = True
        except Exception as exc:
            self.reason = f"jax.monitoring unavailable: {exc}"

    def stop(self) -> None:
        if not self.active:
            # Never started (the program never imported jax): importing jax
            # now, at exit, would cost seconds and clears the interpreter's
            # note of an unhandled KeyboardInterrupt (exit 1 instead of
            # death by SIGINT).
            return
        self.active = False
        remove_listener("duration", self._on_duration)
        remove_listener("event", self._on_event)

    def total(self) -> int:
        """Backend compiles since the probe started."""
        with self._lock:
            return self._count_total

    def sample(self) -> dict[str, Any]:
        if not self.active and self.reason:
            return {"available": False, "reason": self.reason}
        with self._lock:
            count = self._count_total - self._last_count
            self._last_count = self._count_total
            return {
                "count": count,
                "count_total": self._count_total,
                "seconds_total": round(self._seconds_total, 6),
                "cache_hits_total": self._cache_hits_total,
            }
