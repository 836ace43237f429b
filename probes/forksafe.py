"""Locks that a forked child gets anew.

jaxtop's hooks run on the program's threads (a compile listener, a host-read
counter, log filters, exception hooks, ``jaxtop.label``) and take locks that
the agent's thread takes too. ``os.fork()`` copies a lock held by another
thread as held, and the child has no such thread to release it: the child's
first hooked call would wait forever (measured: 64 to 201 of 500 children of
a program with 8 threads hung at the host-read counter's lock). A
:class:`ForkLock` is a lock whose child copy is a new, free lock.

Stdlib only, and not even typing: the stderr relay (a process of its own,
started with ``python -S``) imports the OOM line scanner, which uses these.
"""

from __future__ import annotations

import os
import threading
import weakref

__all__ = ["ForkLock"]

_locks: "weakref.WeakSet[ForkLock]" = weakref.WeakSet()


class ForkLock:
    """``threading.Lock`` (or ``RLock`` with ``reentrant``) renewed in a
    forked child; used as one (``with``, ``acquire``, ``release``)."""

    __slots__ = ("_lock", "_reentrant", "__weakref__")

    def __init__(self, reentrant: bool = False) -> None:
        self._reentrant = reentrant
        self._lock: object = threading.RLock() if reentrant else threading.Lock()
        _locks.add(self)

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        probe = getattr(self._lock, "locked", None)
        return bool(probe()) if probe is not None else False


def _renew_in_child() -> None:
    for lock in list(_locks):
        lock._lock = threading.RLock() if lock._reentrant else threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_in_child)
