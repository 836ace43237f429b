"""Run a callback right after a module finishes importing.

The transfer guard must be switched to ``log`` before the program's first
transfer, and jax registers its own ``atexit`` clean-up at import; both need
a hook at the end of ``import jax``, on the importing thread. Polling from the
agent thread would race the first transfers.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from typing import Any, Callable
from jaxtop.probes.forksafe import ForkLock

Callback = Callable[[Any], None]


class _Loader(importlib.abc.Loader):
    """Wraps the real loader: executes the module, then the callbacks."""

    def __init__(self, real: Any, callbacks: list[Callback]) -> None:
        self._real = real
        self._callbacks = callbacks

    def create_module(self, spec: Any) -> Any:
        return self._real.create_module(spec)

    def exec_module(self, module: Any) -> None:
        # Put the real loader back first, so the module looks untouched.
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._real
        module.__loader__ = self._real
        self._real.exec_module(module)
        _fire(self._callbacks, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _fire(callbacks: list[Callback], module: Any) -> None:
    for cb in callbacks:
        try:
            cb(module)
        except Exception:
            pass  # never break the user's import


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.watch: dict[str, list[Callback]] = {}
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        callbacks = self.watch.get(fullname)
        if callbacks is None or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.on = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        del self.watch[fullname]
        spec.loader = _Loader(spec.loader, callbacks)
        return spec


_finder = _Finder()
_lock = ForkLock()


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once ``name`` is imported (now if it already is)."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _finder.watch.setdefault(name, []).append(callback)
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
            return
    _fire([callback], module)
