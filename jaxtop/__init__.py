"""jaxtop: ``top`` for JAX memory.

``import jaxtop; jaxtop.instrument()`` starts the agent in this process; then
``jaxtop attach PID`` (or ``jaxtop log PID``) reads it. Importing this package
imports neither jax nor Textual.

The package follows the data, one way: ``jaxtop.probes`` read jax, stderr,
psutil and NVML inside the user's process; ``jaxtop.agent`` samples them and
serves the stream; ``jaxtop.wire`` (the record format, the socket client,
the Prometheus exposition) carries it; ``jaxtop.dashboard`` turns it into a model and
the Textual app with ``jaxtop.widgets``; ``jaxtop.export`` converts
recordings offline. ``jaxtop.cli`` wires them to commands, ``jaxtop.inject``
starts an agent in a running process, ``jaxtop.budgets`` checks a program or
a test against limits (with the pytest plugin), ``jaxtop.testing`` makes
synthetic streams, ``jaxtop.demo`` is the demo workload.

PYTEST_DONT_REWRITE: pytest rewrites the asserts of the packages that ship a
pytest plugin (jaxtop's budgets), and warns when such a package was imported
before pytest started, as it is under ``jaxtop run -m pytest``. jaxtop's own
asserts need no rewriting; this marker (pytest reads it in the docstring)
says so, and the warning goes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jaxtop.wire.protocol import JAXTOP_VERSION as __version__

if TYPE_CHECKING:
    from jaxtop.agent.handle import Handle, instrument
    from jaxtop.agent.labels import label

__all__ = ["instrument", "label", "Handle", "__version__"]

# The agent is imported when first asked for, not with the package: the
# commands that read recordings (`jaxtop export`, `jaxtop replay`) start
# 80 ms sooner without it.
_LAZY = {"instrument": "jaxtop.agent.handle", "Handle": "jaxtop.agent.handle", "label": "jaxtop.agent.labels"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'jaxtop' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
