"""Backend compiles per function and call site (:class:`CompileLog`), for
``recompiles``: jax reports each compile through ``jax.monitoring``, and
the program's frame that caused it names the call site.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from jaxtop.budgets.fold import CompileSite

_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

# The whole jaxtop package, not just this folder: the plugin, the agent and
# the meter are never the program's call site.
_JAXTOP_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CompileLog:
    """Backend compiles, each with jax's function name and the program's
    call site, for the windows open at the time.

    jax names the compiled function (``fun_name``) from 0.6.2 on; the call
    site is the innermost frame outside jax, jaxlib, jaxtop and the standard
    library. One listener per process (jax.monitoring keeps them for good on
    older versions), idle while no window is open.
    """

    _instance: "CompileLog | None" = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.windows: list[dict[tuple[str, str], CompileSite]] = []
        self.names_seen: bool | None = None  # None until the first compile
        self.registered = False
        self.reason: str | None = "jax not imported yet"
        self._skip: tuple[str, ...] = ()
        self._mu = threading.Lock()

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
            import sysconfig

            import jax
            import jaxlib
            from jax import monitoring

            skip = {os.path.dirname(jax.__file__), os.path.dirname(jaxlib.__file__),
                    _JAXTOP_DIR}
            for key in ("stdlib", "platstdlib"):
                path = sysconfig.get_paths().get(key)
                if path:
                    skip.add(path)
            self._skip = tuple(os.path.join(p, "") for p in skip) + ("<frozen",)
            monitoring.register_event_duration_secs_listener(self._on_duration)
            self.registered = True
            self.reason = None
        except Exception as exc:
            self.reason = f"jax.monitoring unavailable: {type(exc).__name__}: {exc}"

    def _site(self) -> str:
        frame = sys._getframe(2)
        while frame is not None:
            filename = frame.f_code.co_filename
            if not filename.startswith(self._skip):
                try:
                    shown = os.path.relpath(filename)
                except ValueError:
                    shown = filename
                if shown.startswith(".."):
                    shown = filename
                return f"{shown}:{frame.f_lineno} ({frame.f_code.co_name})"
            frame = frame.f_back
        return "<no call site outside jax>"

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
            now = time.time()
            with self._mu:
                for sites in self.windows:
                    c = sites.get(key)
                    if c is None:
                        c = sites[key] = CompileSite(*key)
                    c.count += 1
                    if c.count == 2:
                        c.recompiled_t = now
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
