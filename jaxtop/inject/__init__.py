"""Start the agent inside a running Python process that did not start it.

How (docs/attach.md):

* Python >= 3.14 on both sides: ``sys.remote_exec(pid, bootstrap)``, which
  runs the file in the target's main thread at its next eval-loop check
  (:mod:`.remote`).
* Older Pythons: gdb (:mod:`.gdb`). gdb stops the target only long enough
  to call two functions that are safe at any instruction: ``mmap`` (a bare
  system call: no allocator lock) for a page holding one line of Python,
  and ``Py_AddPendingCall(PyRun_SimpleString, page)``, which CPython
  provides to be called from any thread without the GIL. gdb then detaches;
  the target's main thread runs that line itself at its next eval-loop
  check, holding the GIL, between two bytecodes: the same safe point as
  ``sys.remote_exec``.

The line runs the bootstrap file (:mod:`.bootstrap`) with ``runpy`` in its
own namespace (nothing is added to ``__main__``) and swallows every
exception, so a missing bootstrap (the CLI gave up and removed it) does
nothing at all. The bootstrap makes this jaxtop importable in the target
(only the packages the agent needs), calls ``jaxtop.instrument()`` and
writes the outcome to a result file the CLI waits for (:mod:`.start`).
What is checked before anything stops the target is :mod:`.target`;
:func:`detach` (:mod:`.stop`) undoes it all.
"""

from __future__ import annotations

from jaxtop.inject.gdb import GDB_TIMEOUT_S
from jaxtop.inject.start import DEFAULT_TIMEOUT_S, inject
from jaxtop.inject.stop import detach
# _version_from_maps is read from here by the tests of the version check.
from jaxtop.inject.target import InjectError, Target, _version_from_maps, check_target

__all__ = ["DEFAULT_TIMEOUT_S", "GDB_TIMEOUT_S", "InjectError", "Target", "check_target", "detach", "inject"]
