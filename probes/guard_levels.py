"""The transfer guard's state as jaxlib holds it, read per call without
going through jax's config: whether the calling thread is inside an
explicit ``jax.device_put`` that the guard will not log.

Why: the transfer-sites probe notes every call of jax's shard-argument
handlers (the slow path of a jitted call, where an implicit transfer's line
is found), and ``jax.device_put`` goes through the same handlers. Noting a
call costs ~30 µs (the walk to the user's frame, the arguments described):
it made an explicit ``device_put`` of a small array 65-90 % slower (49 µs
→ 81-94 µs, 2-core VM, jax 0.10.2), for a note no guard line would ever
tie to. jax marks its explicit puts on the thread
(``guard_lib.thread_local_state().explicit_device_put``, set by
``config.explicit_device_put_scope``), and logs them only at the level
``log_explicit`` (per direction; a thread's own level, from
``jax.transfer_guard(...)``, before the process's).

Stdlib only; jax is looked up in ``sys.modules``, never imported.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

__all__ = ["explicit_put_unlogged"]

#: The directions an explicit put can log in (host to device, and device
#: to device for a put of an array onto another device).
_PUT_DIRECTIONS = ("host_to_device", "device_to_device")


def explicit_put_unlogged() -> Callable[[], bool] | None:
    """A function telling whether the calling thread is inside an explicit
    put that the guard will not log (~0.2 µs a call); None where this jax
    keeps no such state (the probe then notes every call, as before)."""
    config = sys.modules.get("jax._src.config")
    # jaxlib's module for it: guard_lib (jax 0.10), transfer_guard_lib (jax 0.4.30).
    lib: Any = getattr(config, "guard_lib", None) or getattr(config, "transfer_guard_lib", None)
    try:
        local, process = lib.thread_local_state, lib.global_state
        log_explicit = lib.TransferGuardLevel.LOG_EXPLICIT
        local().explicit_device_put  # noqa: B018  (the attribute this jaxlib must have)
    except Exception:
        return None

    def unlogged() -> bool:
        state = local()
        if not state.explicit_device_put:
            return False
        for direction in _PUT_DIRECTIONS:
            level: Any = getattr(state, direction)
            if level is None:
                level = getattr(process(), direction)
            if level == log_explicit:
                return False
        return True

    return unlogged
