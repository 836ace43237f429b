"""Where memory was allocated, for the census: the user's frame where the
OOM was raised, and the allocation sites of a device memory profile.

Which frame is "the user's" is the one rule of ``jaxtop.probes.frames``, and
the profile is folded by ``jaxtop.probes.pprof``, as for Holders and the
``s`` profile: the three name the same site for the same buffer. Both are
imported when used: the stderr relay (a ``python -S`` child with only the
probes folder on its path) imports this package and must start in
milliseconds, without ``typing`` or jaxtop.
"""

from __future__ import annotations

import os

# The stderr relay imports this package without ``site``: no ``typing`` at
# run time. Type checkers read the import; Python skips it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "SITE_STACK",
    "TOP_SITES",
    "allocation_sites",
    "is_library_file",
    "is_user_file",
    "user_frame_of_stack",
    "user_frame_of_traceback",
]

#: How many allocation sites a census keeps.
TOP_SITES = 10
#: Frames kept in each site's stack.
SITE_STACK = 6
#: Frames of a traceback looked at (a deep recursion is cut, innermost kept).
TRACEBACK_DEPTH = 1000


def is_user_file(filename: str) -> bool:
    """Code the user wrote (``jaxtop.probes.frames.LIBRARY`` says it is not library code)."""
    from jaxtop.probes.frames import LIBRARY

    return not LIBRARY.is_library(filename)


def is_library_file(filename: str) -> bool:
    """jax, jaxlib, numpy, jaxtop, ml_dtypes or the standard library: never an
    allocation site, not even a library's (an installed package's frame may be)."""
    from jaxtop.probes.frames import LIBRARY

    return LIBRARY.is_library(filename) and not LIBRARY.is_installed(filename)


def _site_text(filename: str, line: int, function: str) -> str:
    """"train.py:88 in step": a frame as the census names a site."""
    return f"{os.path.basename(filename) or filename}:{line} in {function or '?'}"


def _where(key: Any) -> dict[str, Any] | None:
    if key is None:
        return None
    filename, line, function = key
    return {"file": filename, "line": line, "function": function, "site": _site_text(filename, line, function)}


def user_frame_of_stack(frame: Any) -> dict[str, Any] | None:
    """The innermost frame of the user's code from ``frame`` outwards."""
    from jaxtop.probes.frames import user_frame_of

    return _where(user_frame_of(frame, limit=200))


def user_frame_of_traceback(tb: Any) -> dict[str, Any] | None:
    """The innermost frame of the user's code in a traceback."""
    from jaxtop.probes.frames import user_frame_of

    return _where(user_frame_of(tb, limit=TRACEBACK_DEPTH))


def allocation_sites(raw: bytes, top: int = TOP_SITES) -> dict[str, Any]:
    """Allocation sites of the live device buffers in a memory profile.

    Each buffer is charged to its site as ``jaxtop.probes.pprof`` folds it
    (the innermost frame of the user's code in the Python stack jax
    recorded when the buffer was made); a buffer made from library code
    only falls back to the innermost frame outside jax, numpy and jaxtop,
    marked ``"user": false``. Executables are left out (their bytes are
    code, not data) and only totalled.

    Args:
        raw: ``jax.profiler.device_memory_profile()``'s bytes (gzipped pprof).
        top: sites kept.

    Returns:
        ``{"top": [{site, file, line, function, bytes, count, user, via,
        stack, devices}], "bytes", "count", "sites_total",
        "executable_bytes"}``; ``via`` is the innermost frame of an
        installed package below the site (the library call that made the
        buffer), when there is one.

    Raises:
        jaxtop.probes.pprof.ProfileDecodeError: not a profile.
    """
    from jaxtop.probes.frames import LIBRARY
    from jaxtop.probes.pprof import NO_DEVICE, aggregate_profile

    totals = aggregate_profile(raw, detail=True)
    ordered = sorted(totals.sites.items(), key=lambda kv: (-kv[1].bytes, -kv[1].count, str(kv[0])))
    out_top = []
    for (filename, line, function), site in ordered[:max(0, top)]:
        stack, at = site.stack or [], site.at
        via = None
        if not site.library:
            inner = next((f for f in stack[:at] if LIBRARY.is_installed(f[1])), None)
            if inner is not None:
                via = _site_text(inner[1], inner[2], inner[0])
        out_top.append({
            "site": _site_text(filename, line, function) if filename else function,
            "file": filename,
            "line": line,
            "function": function,
            "bytes": site.bytes,
            "count": site.count,
            "user": not site.library,
            "via": via,
            "stack": [_site_text(f, ln, name) for name, f, ln in stack[at:at + SITE_STACK]],
            "devices": sorted(d for d in site.devices if d != NO_DEVICE),
        })
    return {"top": out_top, "bytes": totals.bytes, "count": totals.count, "sites_total": len(totals.sites),
            "executable_bytes": totals.executable_bytes}
