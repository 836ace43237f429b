"""jax.monitoring events, one listener per kind for every probe.

jax keeps its monitoring listeners in plain lists and calls each of them on
the compiling thread for every event it records. Probes that want those
events (the compile counter, the jit ledger) subscribe here instead of
registering listeners of their own: jax sees at most one jaxtop listener
per kind (``duration`` and ``event``), which hands each event to the
subscribers of that kind. The last subscriber to leave takes the listener
out again where this jax can (see :func:`remove_listener`).

Subscribers run on the compiling thread: they must be quick, and an
exception from one is dropped (never raised into the program, never
keeping the others from the event).

Stdlib only; jax is imported only by :func:`subscribe`, which the probes
call once the program has imported jax.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

__all__ = ["DURATION", "EVENT", "listener", "remove_listener", "subscribe", "subscribers", "unsubscribe"]

#: ``listener(event, duration_secs, **kwargs)``: timed events, such as one backend compile.
DURATION = "duration"
#: ``listener(event, **kwargs)``: plain events, such as a persistent-cache hit.
EVENT = "event"

_lock = threading.Lock()
# Replaced, never changed in place: the listeners read them without the lock.
_subscribers: dict[str, tuple[Callable[..., Any], ...]] = {DURATION: (), EVENT: ()}
_registered = {DURATION: False, EVENT: False}


def _on_duration(event: str, duration: float, *args: Any, **kwargs: Any) -> None:
    for fn in _subscribers[DURATION]:
        try:
            fn(event, duration, *args, **kwargs)
        except Exception:
            pass  # the compiling thread is the program's


def _on_event(event: str, *args: Any, **kwargs: Any) -> None:
    for fn in _subscribers[EVENT]:
        try:
            fn(event, *args, **kwargs)
        except Exception:
            pass


_LISTENERS = {DURATION: _on_duration, EVENT: _on_event}


def _renew_lock_in_child() -> None:
    # Another thread may have held the lock when the program forked: the
    # child must not wait for a thread it does not have.
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_lock_in_child)


def subscribe(kind: str, fn: Callable[..., Any]) -> None:
    """Hand ``fn`` every event of ``kind`` (:data:`DURATION` or :data:`EVENT`).

    Registers jaxtop's listener for that kind with ``jax.monitoring`` when
    it is not registered yet. Subscribing the same callable twice changes
    nothing.

    Raises:
        Exception: jax.monitoring cannot be imported or hooked (the caller
            reports why); ``fn`` is then not subscribed.
    """
    with _lock:
        if not _registered[kind]:
            from jax import monitoring

            if kind == DURATION:
                monitoring.register_event_duration_secs_listener(_on_duration)
            else:
                monitoring.register_event_listener(_on_event)
            _registered[kind] = True
        if fn not in _subscribers[kind]:
            _subscribers[kind] = _subscribers[kind] + (fn,)


def unsubscribe(kind: str, fn: Callable[..., Any]) -> None:
    """Stop handing ``fn`` the events of ``kind``; the last one to leave takes
    jaxtop's listener out of jax where it can. Never raises."""
    with _lock:
        _subscribers[kind] = tuple(s for s in _subscribers[kind] if s != fn)
        if not _subscribers[kind] and _registered[kind]:
            # Where this jax cannot remove it, the listener stays, handing
            # events to nobody, and a later subscriber reuses it.
            _registered[kind] = not remove_listener(kind, _LISTENERS[kind])


def subscribers(kind: str) -> tuple[Callable[..., Any], ...]:
    """The callables subscribed to ``kind`` now."""
    return _subscribers[kind]


def listener(kind: str) -> Callable[..., Any]:
    """jaxtop's listener of ``kind``, as jax's lists hold it (tests)."""
    return _LISTENERS[kind]


def remove_listener(kind: str, fn: Any) -> bool:
    """Unregister a ``jax.monitoring`` listener (``kind`` "duration" or
    "event") on every jax we support: the public ``unregister_*`` from jax
    0.8.3, the private ``_unregister_*_by_callback`` of 0.4.30 to 0.7.2.

    Returns:
        False where neither exists (the listener stays registered).
    """
    try:
        from jax._src import monitoring
    except Exception:
        return False
    names = {DURATION: ("unregister_event_duration_listener", "_unregister_event_duration_listener_by_callback"),
             EVENT: ("unregister_event_listener", "_unregister_event_listener_by_callback")}[kind]
    for name in names:
        unregister = getattr(monitoring, name, None)
        if unregister is None:
            continue
        try:
            unregister(fn)
        except Exception:
            pass  # not registered (any more)
        return True
    return False
