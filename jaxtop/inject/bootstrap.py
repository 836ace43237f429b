"""What the target runs: the bootstrap file, and the one guarded line that
runs it.

The line runs the bootstrap with ``runpy`` in its own namespace (nothing is
added to ``__main__``) and swallows every exception, so a missing bootstrap
(the CLI gave up and removed it) does nothing at all. The bootstrap makes
this jaxtop importable in the target (only the packages the agent needs),
calls ``jaxtop.instrument()`` and writes the outcome to a result file the
CLI waits for.
"""

from __future__ import annotations

#: The bootstrap file's text; ``__PARAMS__`` is replaced by its parameters.
BOOTSTRAP = r'''
# Written by `jaxtop attach --inject`; runs once in the target's main thread.
import importlib.util
import json
import os
import sys
import traceback

PARAMS = __PARAMS__


def _write(result):
    tmp = PARAMS["result"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, PARAMS["result"])


class _JaxtopFinder:
    """Finds jaxtop (and, if the target lacks them, psutil and pynvml) where
    the attaching jaxtop has them, without putting that whole environment on
    the target's sys.path."""

    def __init__(self, packages, fallbacks):
        self.packages = packages
        self.fallbacks = fallbacks

    def find_spec(self, name, path=None, target=None):
        where = self.packages.get(name)
        if where is None and name in self.fallbacks:
            where = self.fallbacks[name]
        if where is None:
            return None
        if where.endswith(".py"):
            return importlib.util.spec_from_file_location(name, where)
        return importlib.util.spec_from_file_location(
            name, os.path.join(where, "__init__.py"), submodule_search_locations=[where]
        )


def _main():
    if tuple(sys.version_info[:2]) != tuple(PARAMS["python"]):
        _write({"ok": False, "error": "Python version changed: " + sys.version})
        return
    import jaxtop  # noqa: F401 (a jaxtop the target already has wins only if it is ours)

    handle = jaxtop.instrument(**PARAMS["instrument"])
    _write({"ok": True, "socket": str(handle.socket_path), "jax_imported": "jax" in sys.modules,
            "pid": os.getpid()})


_finder = _JaxtopFinder(PARAMS["packages"], {})
sys.meta_path.insert(0, _finder)
fallbacks = {}
for _name, _where in PARAMS["fallbacks"].items():
    if importlib.util.find_spec(_name) is None:
        fallbacks[_name] = _where
_finder.fallbacks = fallbacks
try:
    _main()
except BaseException as exc:
    try:
        _write({"ok": False, "error": type(exc).__name__ + ": " + str(exc),
                "traceback": traceback.format_exc(limit=8)})
    except BaseException:
        pass
'''


def package_locations() -> tuple[dict[str, str], dict[str, str]]:
    """Where this jaxtop's agent packages live, and psutil/pynvml as fallbacks."""
    import importlib.util

    import jaxtop
    import jaxtop.probes

    packages = {"jaxtop": list(jaxtop.__path__)[0], "jaxtop.probes": list(jaxtop.probes.__path__)[0]}
    fallbacks: dict[str, str] = {}
    for name in ("psutil", "pynvml"):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        if spec.submodule_search_locations:
            fallbacks[name] = list(spec.submodule_search_locations)[0]
        else:
            fallbacks[name] = spec.origin
    return packages, fallbacks


def one_line(boot: str) -> str:
    """The Python line the target runs: the bootstrap, or nothing at all."""
    code = f"try:\n __import__('runpy').run_path({boot!r}, run_name='__jaxtop_inject__')\nexcept BaseException:\n pass\n"
    return f"exec({code!r}, {{}})"
