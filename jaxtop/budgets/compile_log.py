"""Backend compiles per function and call site (:class:`CompileLog`), for
``recompiles``: jax reports each compile through ``jax.monitoring``, the
program's frame that caused it names the call site, and the jit ledger's
recompile reason (jax's tracing-cache-miss explanation, read just before
the compile on the same thread) says what changed.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from jaxtop.budgets.fold import CompileSite
from jaxtop.probes.cache_misses import name_key
from jaxtop.probes.frames import eager_dispatch
from jaxtop.probes.forksafe import ForkLock

_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
#: Reasons kept per call site: the first few (where the changes started) and the newest.
MAX_SITE_REASONS = 8
#: Functions whose reason waits for their compile (a function traced inside
#: another's trace never compiles on its own: its reason is never taken).
MAX_WAITING = 256


class CompileLog:
    """Backend compiles, each with jax's function name and the program's
    call site, for the windows open at the time.

    jax names the compiled function (``fun_name``) from 0.6.2 on; the call
    site is picked by the one frame filter every probe uses
    (``jaxtop.probes.frames``: the innermost frame of the user's code, else
    of an installed package). Compile events come through the one
    listener jaxtop keeps with jax.monitoring (``jaxtop.probes.compile_events``),
    idle while no window is open. The jit ledger hands over each
    recompile reason it reads (``jaxtop.probes.cache_misses.subscribe_reasons``);
    the next compile of that function on the same thread takes it.
    """

    _instance: "CompileLog | None" = None
    _lock = ForkLock()

    def __init__(self) -> None:
        self.windows: list[dict[tuple[str, str], CompileSite]] = []
        self.names_seen: bool | None = None  # None until the first compile
        self.registered = False
        self.reason: str | None = "jax not imported yet"
        self._mu = ForkLock()
        self._waiting: dict[tuple[int, str], dict[str, Any]] = {}  # (thread, key) -> reason

    @classmethod
    def get(cls) -> "CompileLog":
        """The process's log, registered with jax.monitoring once jax is imported."""
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
                from jaxtop.agent.import_hook import when_imported

                when_imported("jax", cls._instance._register)
            return cls._instance

    def _register(self, _module: Any = None) -> None:
        try:
            from jaxtop.probes import compile_events

            compile_events.subscribe(compile_events.DURATION, self._on_duration)
            self.registered = True
            from jaxtop.probes.cache_misses import subscribe_reasons

            subscribe_reasons(self._on_reason)
            self.reason = None
        except Exception as exc:
            self.reason = f"jax.monitoring unavailable: {type(exc).__name__}: {exc}"

    def _site(self) -> str:
        from jaxtop.probes.frames import LIBRARY, NO_STACK, walk

        (filename, line, name), _library, _ = walk(sys._getframe(2))
        if (filename, line, name) == NO_STACK or LIBRARY.is_core(filename):
            return "<no call site outside jax>"
        try:
            shown = os.path.relpath(filename)
        except ValueError:
            shown = filename
        if shown.startswith(".."):
            shown = filename
        return f"{shown}:{line} ({name})"

    def _on_reason(self, key: str, reason: dict[str, Any] | None) -> None:
        # On the tracing thread, before the compile it explains; a first
        # trace (None) clears what an inlined trace left.
        if not self.windows:
            return
        slot = (threading.get_ident(), key)
        with self._mu:
            self._waiting.pop(slot, None)
            if reason is not None:
                self._waiting[slot] = reason
                if len(self._waiting) > MAX_WAITING:
                    del self._waiting[next(iter(self._waiting))]  # the oldest

    def _on_duration(self, event: str, duration: float, *args: Any, **kwargs: Any) -> None:
        # Runs on the compiling thread: quick, and never raises into jax.
        if event != _BACKEND_COMPILE_EVENT or not self.windows:
            return
        try:
            name = kwargs.get("fun_name")
            self.names_seen = name is not None
            if name is None:
                return
            key = (str(name), self._site())
            eager = eager_dispatch(sys._getframe(1))
            now = time.time()
            with self._mu:
                reason = self._waiting.pop((threading.get_ident(), name_key(str(name))), None)
                for sites in self.windows:
                    c = sites.get(key)
                    if c is None:
                        c = sites[key] = CompileSite(*key, eager=eager)
                    c.count += 1
                    if c.count == 2:
                        c.recompiled_t = now
                    if reason is not None and not eager:
                        _keep(c.reasons, reason)
        except Exception:
            pass

    def open(self) -> dict[tuple[str, str], CompileSite]:
        sites: dict[tuple[str, str], CompileSite] = {}
        with self._mu:
            self.windows.append(sites)
        return sites

    def close(self, sites: dict[tuple[str, str], CompileSite]) -> tuple[list[CompileSite] | None, str | None]:
        """Stop filling ``sites``; returns them, or None and why they are not known."""
        with self._mu:
            if sites in self.windows:
                self.windows.remove(sites)
            found = list(sites.values())
        if not self.registered:
            if "jax" not in sys.modules:
                return [], None  # no jax, no compile
            return None, self.reason or "jax.monitoring not hooked"
        if self.names_seen is False:
            return None, "this jax does not name compiled functions (jax.monitoring fun_name, jax 0.6.2+)"
        return found, None


def _keep(reasons: list[dict[str, Any]], reason: dict[str, Any]) -> None:
    """Keep the first reasons of a site (where its changes started) and the
    newest one, at most :data:`MAX_SITE_REASONS`."""
    if len(reasons) >= MAX_SITE_REASONS:
        reasons[-1] = reason
    else:
        reasons.append(reason)
