"""Out-of-memory census: what held the memory when the program ran out.

When an allocation fails, JAX's error names only the failed request
(``RESOURCE_EXHAUSTED: Out of memory allocating 2147483648 bytes.``), and by
the time someone attaches a monitor the process is gone. The agent lives in
the process, so it can look before anything is freed: this module builds a
**census** at that moment and writes it to a file and to the stream.

A census (a JSON object, ``type: "oom_census"``) holds:

* ``request``: the failed request parsed from the error text (CPU, GPU, TPU
  forms) and, on GPU, from the BFC allocator's own log lines;
* ``devices``: each device's ``memory_stats()`` at that instant (in use,
  pool, limit, largest free block, fragmentation) with a one-line verdict,
  and ``host``: RSS, address space, ``RLIMIT_AS``, cgroup limit, MemTotal;
* ``arrays``: the live arrays grouped by (shape, dtype, placement), each
  device buffer counted once, with count and bytes, and their total;
* ``sites``: the allocation sites holding the most bytes, each the innermost
  frame of the user's code in the device memory profile;
* ``timeline``: the last samples' bytes in use, so the climb is visible.

When (see :class:`OomMonitor`):

1. ``JaxRuntimeError.__init__``: jaxlib makes the exception by calling its
   class, so a patched ``__init__`` sees every RESOURCE_EXHAUSTED the moment
   it is created, caught later or not, while the program's arrays are all
   still referenced. Nothing runs on any other path: no tracing or
   profiling hook, no wrapper around the program's calls.
2. ``sys.excepthook`` / ``threading.excepthook``: an uncaught exception
   whose text (or a chained cause's) says RESOURCE_EXHAUSTED or "Out of
   memory". The census taken at creation is marked uncaught; without one
   (another exception type, or the patch was not possible) it is taken
   here, while the traceback's frames still hold the arrays. The previous
   hooks then run with the same arguments: traceback and exit status are
   those of a plain run.
3. The GPU allocator's stderr line, passed on by the stderr relay as an
   ``O <line>`` report (:class:`OomLineScanner` finds them): its request,
   op name and dump statistics join the census, and a census is taken on
   the agent's thread if no exception brought one within :data:`GRACE_S`.

Every census finishes within its time budget (:data:`DEFAULT_BUDGET_S`):
the cheap parts come first, the live-array scan checks the clock every 256
arrays, the memory profile runs only when its estimated cost fits what is
left, and whatever was cut short is listed under ``skipped``.

The modules, one job each: :mod:`.lines` (the error and allocator text,
and the relay's line scanner), :mod:`.sites` (the user's frame, and the
allocation sites of a memory profile), :mod:`.parts` (host memory, live
arrays, timeline), :mod:`.verdict`, :mod:`.census` (putting a census
together), :mod:`.write` (its file), :mod:`.exceptions` and :mod:`.monitor`
(the hooks, :func:`install`).

Stdlib only at import time: the stderr relay, a ``python -S`` child with
only the probes folder on its path, imports this package as the top-level
``oom`` for :class:`OomLineScanner`. jax and the other probes are imported
inside the functions that need them.
"""

from __future__ import annotations

from .census import CENSUS_VERSION, DEFAULT_BUDGET_S, OOM_CENSUS, build_census
from .exceptions import find_oom_exception
from .lines import (
    ALLOCATOR_MATCH_S, MESSAGE_CHARS, AllocatorLog, OomLineScanner, is_oom_text, parse_allocator_line,
    parse_oom_message, parse_size,
)
from .monitor import GRACE_S, MAX_CENSUSES, MIN_INTERVAL_S, SYNC_S, OomMonitor, OomProbe, current, install, uninstall
from .parts import TIMELINE_POINTS, TIMELINE_SPAN_S, TOP_GROUPS, group_live_arrays, host_memory, timeline_from_records
from .sites import SITE_STACK, TOP_SITES, allocation_sites, is_library_file, is_user_file
from .verdict import device_verdict, host_verdict
from .write import FILE_NAME, census_directory, write_census

__all__ = [
    "ALLOCATOR_MATCH_S",
    "CENSUS_VERSION",
    "DEFAULT_BUDGET_S",
    "FILE_NAME",
    "GRACE_S",
    "MAX_CENSUSES",
    "MESSAGE_CHARS",
    "MIN_INTERVAL_S",
    "OOM_CENSUS",
    "SITE_STACK",
    "SYNC_S",
    "TIMELINE_POINTS",
    "TIMELINE_SPAN_S",
    "TOP_GROUPS",
    "TOP_SITES",
    "AllocatorLog",
    "OomLineScanner",
    "OomMonitor",
    "OomProbe",
    "allocation_sites",
    "build_census",
    "census_directory",
    "current",
    "device_verdict",
    "find_oom_exception",
    "group_live_arrays",
    "host_memory",
    "host_verdict",
    "install",
    "is_library_file",
    "is_oom_text",
    "is_user_file",
    "parse_allocator_line",
    "parse_oom_message",
    "parse_size",
    "timeline_from_records",
    "uninstall",
    "write_census",
]

