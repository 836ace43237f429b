"""Locks that a forked child gets anew.

jaxtop's hooks run on the program's threads (a compile listener, a host-read
counter, log filters, exception hooks, ``jaxtop.label``) and take locks that
the agent's thread takes too. ``os.fork()`` copies a lock held by another
thread as held, and the child has no such thread to release it: the child's
first hooked call would wait forever (measured: 64 to 201 of 500 children of
a program with 8 threads hung at the host-read counter's lock). A
:func:`ForkLock` is a lock whose child copy is a new, free lock.

One lock of Python's own is left held the same way: the import lock of a
module that one of jaxtop's threads (named ``jaxtop...``) was importing at
the fork. The agent imports a few modules only when first needed (a
command's, the Prometheus exposition's); a child importing the same module
waited forever. The child forgets those imports (:func:`_forget_own_imports`)
and imports such a module anew, as after an import that failed.

Stdlib only, and not even typing: the stderr relay (a process of its own,
started with ``python -S``) imports the OOM line scanner, which uses these.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref

__all__ = ["ForkLock", "OWN_THREAD_PREFIX"]

#: jaxtop names each of its threads with this prefix (the agent's, the
#: NVML and TPU pollers, the Prometheus server, the budget meter's reader).
OWN_THREAD_PREFIX = "jaxtop"

_locks: "weakref.WeakSet" = weakref.WeakSet()


def ForkLock(reentrant: bool = False):  # noqa: N802 (it stands for a class: a lock type)
    """A ``threading.Lock`` (or ``RLock`` with ``reentrant``) that is renewed,
    free, in a forked child.

    The lock itself, not a wrapper: the agent takes a dozen of these each
    tick beside a busy program, and ``with`` on a native lock runs no Python
    (a wrapper's ``__enter__``/``__exit__`` cost ~0.15 us each hot, several
    times that with cold caches). The child renews each with the locks' own
    ``_at_fork_reinit``, what ``threading`` does for its own locks on every
    Python jaxtop supports (3.9 and later; tests/test_forksafe.py holds a
    lock across a real fork).
    """
    lock = threading.RLock() if reentrant else threading.Lock()
    _locks.add(lock)
    return lock


def _renew_in_child() -> None:
    for lock in list(_locks):
        try:
            lock._at_fork_reinit()
        except Exception:
            pass  # never disturb the child


#: Thread idents of jaxtop's threads other than the forking one, noted in the
#: parent just before each fork: in the child they are threads that are gone.
_gone_at_fork: frozenset = frozenset()


def _note_own_threads() -> None:
    """Before a fork, in the parent: which of jaxtop's threads the child will
    not have (the child's ``threading`` forgets every thread but its own
    before any handler of ours runs)."""
    global _gone_at_fork
    try:
        me = threading.get_ident()
        _gone_at_fork = frozenset(t.ident for t in threading.enumerate()
                                  if t.ident is not None and t.ident != me and t.name.startswith(OWN_THREAD_PREFIX))
    except Exception:
        _gone_at_fork = frozenset()


def _forget_own_imports() -> None:
    """In the child: drop the import locks (and the half-made modules) of the
    imports jaxtop's threads had under way at the fork.

    importlib keeps one lock per module being imported, taken by the
    importing thread until the module's code has run, and waits on it when
    another thread imports the same module; a module still running its code
    is already in ``sys.modules``. In the child the importing thread is gone:
    its lock would never be released, and the module never finished. Dropped,
    the child's next import of it makes a new lock and runs the module anew,
    as importlib does after an import that failed (it then takes the module
    out of ``sys.modules``). Imports under way on the program's own threads
    are left as they are: those are the program's.
    """
    gone = _gone_at_fork
    if not gone:
        return
    bootstrap = sys.modules.get("importlib._bootstrap") or sys.modules.get("_frozen_importlib")
    locks = getattr(bootstrap, "_module_locks", None)
    if not isinstance(locks, dict):
        return  # a Python whose import machinery differs: nothing we know to do
    for name, ref in list(locks.items()):
        try:
            lock = ref()
            if lock is None or getattr(lock, "owner", None) not in gone:
                continue
            del locks[name]  # the next import of name makes a new lock
            module = sys.modules.get(name)
            if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False):
                del sys.modules[name]
        except Exception:
            continue
    blocking = getattr(bootstrap, "_blocking_on", None)
    for ident in gone:  # what those threads waited for, seen by importlib's deadlock check
        try:
            blocking.pop(ident, None)
        except Exception:
            pass


def _after_fork_in_child() -> None:
    _renew_in_child()
    try:
        _forget_own_imports()
    except Exception:
        pass  # never disturb the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_note_own_threads, after_in_child=_after_fork_in_child)
