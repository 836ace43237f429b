"""Where the program stands with jax, asked without changing it.

Every probe asks the same three questions before it touches jax: has the
program imported jax (all of it), has it created a backend, which clients
exist. None of them imports jax or creates a backend: a backend created by
jaxtop would read the allocator settings (``XLA_PYTHON_CLIENT_*``,
``XLA_FLAGS``) before the program has set them.

Stdlib only; jax is looked up in ``sys.modules``, never imported.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["backend_initialised", "backend_ready", "clients", "distributed", "jax_imported", "version_tuple"]


def version_tuple(text: str) -> tuple[int, ...]:
    """``"0.10.1rc1"`` -> ``(0, 10, 1)``, ``"0.5.0.dev2025"`` -> ``(0, 5, 0)``:
    the leading numbers of a version, up to the first part that is not one
    (compare with tuples: ``>= (0, 6, 2)``)."""
    out = []
    for part in text.split("."):
        n = len(part) - len(part.lstrip("0123456789"))
        if not n:
            break
        out.append(int(part[:min(n, 9)]))
        if n != len(part):
            break
    return tuple(out)


def jax_imported() -> bool:
    """True once ``import jax`` has finished in this process.

    The agent thread asks while the program may still be importing jax:
    importing from jax's package then (``from jax._src import xla_bridge``)
    races the program's own import and breaks it with a circular-import
    error. importlib marks a module's spec ``_initializing`` until its code
    has run.
    """
    jax = sys.modules.get("jax")
    return jax is not None and not getattr(getattr(jax, "__spec__", None), "_initializing", False)


def _xla_bridge() -> Any:
    """jax's backend registry, or None. ``import jax`` imports it, so it is
    looked up first; importing it is the fallback for a jax that does not."""
    module = sys.modules.get("jax._src.xla_bridge")
    if module is not None:
        return module
    try:
        from jax._src import xla_bridge
    except Exception:
        return None
    return xla_bridge


def backend_initialised() -> bool | None:
    """Whether the program has created a jax backend.

    Returns:
        True or False where jax says; False too while jax is not (fully)
        imported; None where this jax cannot tell (its registry moved).
    """
    if not jax_imported():
        return False
    xla_bridge = _xla_bridge()
    if xla_bridge is None:
        return None
    try:
        return _initialised_without_waiting(xla_bridge)
    except Exception:
        return None


def _initialised_without_waiting(xla_bridge: Any) -> bool | None:
    """Whether the backends exist, read without taking jax's backend lock.

    ``xla_bridge.backends_are_initialized()`` takes ``_backend_lock``, which
    ``backends()`` holds for the whole of the backend's creation: 6-15 s
    while a TPU opens its chip, so an agent that asked it wrote no sample
    for that long. ``backends()`` fills ``_backends`` one platform at a
    time under that lock, so the registry is read first and the lock
    checked after: a non-empty registry with the lock free was filled by a
    creation that has finished. While the lock is held (a creation under
    way, or a plugin registering) the answer is False, for a tick.
    """
    registry = getattr(xla_bridge, "_backends", None)
    lock = getattr(xla_bridge, "_backend_lock", None)
    if isinstance(registry, dict) and lock is not None and hasattr(lock, "locked"):
        filled = bool(registry)
        return filled and not lock.locked()
    # A jax whose registry moved: its own question (which may wait on a lock).
    if hasattr(xla_bridge, "backends_are_initialized"):
        return bool(xla_bridge.backends_are_initialized())
    if isinstance(registry, dict):
        return bool(registry)
    return None


def backend_ready() -> bool:
    """True once the program has imported jax and created a backend (never
    creates one)."""
    return backend_initialised() is True


def clients() -> list[Any]:
    """Every initialised backend's client, each once; never creates one."""
    if not jax_imported():
        return []
    xla_bridge = _xla_bridge()
    if xla_bridge is None:
        return []
    try:
        if _initialised_without_waiting(xla_bridge) is False:
            return []
        backends = getattr(xla_bridge, "_backends", None) or {}
        found, seen = [], set()
        for client in list(backends.values()):
            if id(client) not in seen:
                seen.add(id(client))
                found.append(client)
        return found
    except Exception:
        return []


def distributed() -> dict[str, Any]:
    """Where this process stands in a multi-process job, once a backend
    exists: ``process_index`` and ``process_count`` (jax's), and the
    ``coordinator`` address given to ``jax.distributed.initialize`` (None
    for a single-process program). Never creates a backend: before one
    exists, an empty dict.
    """
    if not backend_ready():
        return {}
    jax = sys.modules["jax"]
    out: dict[str, Any] = {}
    try:
        out["process_index"] = int(jax.process_index())
        out["process_count"] = int(jax.process_count())
    except Exception:
        return {}
    module = sys.modules.get("jax._src.distributed")
    state = getattr(module, "global_state", None) if module is not None else None
    coordinator = getattr(state, "coordinator_address", None)
    out["coordinator"] = str(coordinator) if coordinator else None
    return out
