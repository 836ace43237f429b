"""Failed buffer donations: "Some donated buffers were not usable" warnings.

jax raises this ``UserWarning`` while lowering a jitted function whose donated
input could not be reused. A ``warnings.showwarning`` hook would miss repeats
(the default filter shows a message once per location), so the probe wraps
the ``warnings`` module reference inside the jax modules that emit it: every
call is counted, then passed on unchanged (same category and stack level, as
seen by the user's filters).
"""

from __future__ import annotations

import sys
import warnings as _warnings
from typing import Any

from jaxtop.probes.base import Tick
from jaxtop.probes.forksafe import ForkLock

MESSAGE_PREFIX = "Some donated buffers were not usable"
# Where jax emits the warning, across the versions we support.
_EMITTERS = ("jax._src.interpreters.mlir", "jax._src.interpreters.pxla", "jax._src.dispatch")


class _CountingWarnings:
    """Stands in for the ``warnings`` module inside one jax module."""

    def __init__(self, real: Any, probe: "DonationProbe") -> None:
        self._real = real
        self._probe = probe

    def warn(self, message: Any, category: Any = None, stacklevel: int = 1, *args: Any, **kwargs: Any) -> None:
        try:
            text = str(message.args[0]) if isinstance(message, Warning) and message.args else str(message)
            if text.startswith(MESSAGE_PREFIX):
                self._probe._bump(text)
        except Exception:
            pass
        # One extra frame (this method) between the caller and warnings.warn.
        self._real.warn(message, category, stacklevel + 1, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class DonationProbe:
    """Counts jax's "donated buffers were not usable" warnings (sample field
    ``donation``), by wrapping the ``warnings`` module of the jax modules that
    emit them; ``stop`` puts each back."""

    name = "donation"
    needs_jax = True

    def __init__(self) -> None:
        self._lock = ForkLock()
        self._total = 0
        self._last = 0
        self._last_message: str | None = None
        self._patched: list[tuple[Any, Any]] = []
        self.reason: str | None = None

    def _bump(self, text: str) -> None:
        with self._lock:
            self._total += 1
            self._last_message = text.splitlines()[0][:300]

    def start(self) -> None:
        for name in _EMITTERS:
            module = sys.modules.get(name)
            if module is None:
                try:
                    __import__(name)
                    module = sys.modules[name]
                except Exception:
                    continue
            current = getattr(module, "warnings", None)
            if current is _warnings:
                module.warnings = _CountingWarnings(current, self)
                self._patched.append((module, current))
        if not self._patched:
            self.reason = "no jax module emitting donation warnings was found in this jax version"

    def stop(self) -> None:
        for module, real in self._patched:
            if isinstance(getattr(module, "warnings", None), _CountingWarnings):
                module.warnings = real
        self._patched.clear()

    def on_tick(self, tick: Tick) -> dict[str, Any]:
        return self.sample()

    def sample(self) -> dict[str, Any]:
        if self.reason:
            return {"available": False, "reason": self.reason}
        with self._lock:
            out = {
                "failed": self._total - self._last,
                "failed_total": self._total,
                "last_message": self._last_message,
            }
            self._last = self._total
        return out
