"""Allocation sites read from the live arrays themselves, a few hundred at a
time: the holders profile of a program with many arrays.

``jax.profiler.device_memory_profile()`` is one call into jaxlib that holds
the interpreter while it walks every live buffer and builds its pprof
(measured on a 2-core VM, jax 0.10.2: 35 ms of CPU at 50,000 arrays, and a
thread of the program woken meanwhile waited 44 ms). A serving loop with a
latency objective sees that as a stall, every profile. The same sites come
from each array's own ``traceback`` (the stack jax recorded when the array
was made: what the profile's samples carry), read here in chunks of
:data:`CHUNK` arrays with the interpreter handed back between them
(:class:`jaxtop.probes.base.HandBack`: once the pieces held it half a
millisecond): about 0.5 us an array, no piece longer than a few hundred
microseconds.

What it reads is the memory probe's last scan (:class:`jaxtop.probes.
live_arrays.LiveArrays`: each buffer once, per device); arrays made since
that scan come with the next one. Loaded executables are not arrays: their
totals are n/a in such a profile (the record says so), where jaxlib's
profile counts them.

Stdlib only; the arrays are jax's, handed in.
"""

from __future__ import annotations

from typing import Any, Callable

from jaxtop.probes.base import HandBack
from jaxtop.probes.frames import LIBRARY, NO_STACK, LibraryFilter, pick_site
from jaxtop.probes.buffer_detail import NBYTES
from jaxtop.probes.live_arrays import LiveArrays
from jaxtop.probes.pprof import ProfileTotals, SiteStats

__all__ = ["CHUNK", "MIN_ARRAYS", "arrays_at", "totals_from_arrays"]

#: Arrays read between two hand-backs of the interpreter (~0.15 ms; at 500
#: a thread of the program waited up to 1.1 ms on a 2-core VM).
CHUNK = 250
#: From this many live arrays on, a holders profile reads the arrays in
#: chunks instead of asking jaxlib for one (whose call would hold the
#: interpreter ~0.7 us an array: 0.7 ms here).
MIN_ARRAYS = 1000


def _frames(tb: Any) -> list[tuple[str, str, int]]:
    """A jax Traceback's frames as ``(function, file, line)``, innermost
    first, each function by its own name as jaxlib's profile gives it
    (``<listcomp>``, not the qualified ``make.<locals>.<listcomp>`` the
    traceback carries on Python 3.11+)."""
    return [(f.function_name.rsplit(".", 1)[-1], f.file_name, f.line_num) for f in tb.frames]


def totals_from_arrays(arrays: LiveArrays, labels: dict[int, str], filt: LibraryFilter = LIBRARY,
                       chunk: int = CHUNK, pause: Callable[[float], Any] | None = None) -> ProfileTotals:
    """The live arrays of the last scan folded into allocation sites, as
    :func:`jaxtop.probes.pprof.aggregate_profile` folds a profile.

    Args:
        arrays: the memory probe's live arrays (each buffer once per device).
        labels: device id -> the profile's device label (``cpu:0``).
        filt: what counts as library code.
        chunk: arrays read between two calls of ``pause(0)``.
        pause: hands the interpreter back to the program's threads (default:
            a :class:`~jaxtop.probes.base.HandBack`).
    """
    pause = pause or HandBack()
    refs = arrays.refs
    groups: dict[tuple[Any, str], list[int]] = {}  # (traceback, device label) -> [bytes, count]
    untraced: dict[str, list[int]] = {}  # arrays without a traceback, by device label
    for dev_id, dev in list(arrays.devices.items()):
        label = labels.get(dev_id, f"?:{dev_id}")
        rows = dev.rows
        keys = tuple(rows)
        for start in range(0, len(keys), chunk):
            for key in keys[start:start + chunk]:
                row = rows.get(key)
                ref = refs.get(key)
                arr = ref() if ref is not None else None
                if row is None or arr is None:
                    continue  # freed since the scan
                tb = getattr(arr, "traceback", None)
                slot = untraced.setdefault(label, [0, 0]) if tb is None else groups.get((tb, label))
                if slot is None:
                    slot = groups[(tb, label)] = [0, 0]
                slot[0] += row[NBYTES]
                slot[1] += 1
            pause(0)
    totals = ProfileTotals(sites={})
    sites_of: dict[Any, tuple[Any, bool]] = {}
    for n, ((tb, label), (nbytes, count)) in enumerate(groups.items(), 1):
        site = sites_of.get(tb)
        if site is None:
            site = sites_of[tb] = pick_site(_frames(tb), filt)
        _add(totals, site[0], site[1], label, nbytes, count)
        if n % chunk == 0:
            pause(0)
    for label, (nbytes, count) in untraced.items():
        _add(totals, NO_STACK, True, label, nbytes, count)
    return totals


def _add(totals: ProfileTotals, key: Any, library: bool, label: str, nbytes: int, count: int) -> None:
    stats = totals.sites.get(key)
    if stats is None:
        stats = totals.sites[key] = SiteStats(library=library)
    stats.bytes += nbytes
    stats.count += count
    per = stats.devices.setdefault(label, [0, 0])
    per[0] += nbytes
    per[1] += count
    totals.bytes += nbytes
    totals.count += count
    dev = totals.by_device.setdefault(label, [0, 0])
    dev[0] += nbytes
    dev[1] += count


def arrays_at(arrays: LiveArrays, sites: set[tuple[str, int]], per_site: int = 3, filt: LibraryFilter = LIBRARY,
              chunk: int = CHUNK, pause: Callable[[float], Any] | None = None) -> dict[tuple[str, int], list[Any]]:
    """Up to ``per_site`` live arrays of the last scan made at each of
    ``sites`` (``(file, line)``, as a profile's sites name them), read
    ``chunk`` arrays between two hand-backs of the interpreter; the newest
    of the scan first (a growing site's newest arrays are the ones it keeps
    adding). Stops once every site has its arrays."""
    pause = pause or HandBack()
    out: dict[tuple[str, int], list[Any]] = {site: [] for site in sites}
    wanted = len(sites) * per_site
    got = 0
    site_of: dict[Any, tuple[str, int] | None] = {}
    refs = arrays.refs
    for dev in list(arrays.devices.values()):
        keys = tuple(dev.rows)[::-1]
        for start in range(0, len(keys), chunk):
            for key in keys[start:start + chunk]:
                ref = refs.get(key)
                arr = ref() if ref is not None else None
                tb = getattr(arr, "traceback", None) if arr is not None else None
                if tb is None:
                    continue
                site = site_of.get(tb, False)
                if site is False:
                    (file, line, _), _ = pick_site(_frames(tb), filt)
                    site = site_of[tb] = (file, line) if (file, line) in out else None
                if site is not None and len(out[site]) < per_site:
                    out[site].append(arr)
                    got += 1
                    if got >= wanted:
                        return out
            pause(0)
    return out
