"""Where memory was allocated: the innermost frame of the user's code in a
stack or a traceback, and the allocation sites of a device memory profile.

Which frame is "the user's" is decided here alone (:func:`is_user_file`),
for the exception hooks (where an OOM was raised) and for the census's
allocation sites alike.

Stdlib only at import time; the profile decoder is imported when used.
"""

from __future__ import annotations

import os
import sys

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

_LIBRARY_MARKERS = ("/jax/", "/jaxlib/", "/numpy/", "/site-packages/jax", "<frozen")
_THIRD_PARTY_MARKERS = ("/site-packages/", "/dist-packages/")
_dirs: tuple[tuple[str, ...], str] | None = None


def _own_and_stdlib_dirs() -> tuple[tuple[str, ...], str]:
    """jaxtop's own directories, and the standard library's: never the user's."""
    global _dirs
    if _dirs is None:
        # The probes folder, this package's parent: every probe is jaxtop's.
        own = {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
        pkg = sys.modules.get("jaxtop")
        if pkg is not None and getattr(pkg, "__file__", None):
            own.add(os.path.dirname(os.path.abspath(pkg.__file__)))
        stdlib = os.path.dirname(os.path.abspath(os.__file__)).rstrip(os.sep) + os.sep
        _dirs = (tuple(d.rstrip(os.sep) + os.sep for d in own), stdlib)
    return _dirs


def _is_stdlib(filename: str) -> bool:
    # An installed package may live below the standard library's directory
    # (/usr/local/lib/python3.X/site-packages): it is not the standard library.
    return filename.startswith(_own_and_stdlib_dirs()[1]) and not any(m in filename for m in _THIRD_PARTY_MARKERS)


def is_library_file(filename: str) -> bool:
    """jax, jaxlib, numpy, jaxtop, the standard library, or Python's import
    machinery: frames that are never an allocation site."""
    if not filename:
        return True
    if any(m in filename for m in _LIBRARY_MARKERS):
        return True
    return filename.startswith(_own_and_stdlib_dirs()[0]) or _is_stdlib(filename)


def is_user_file(filename: str) -> bool:
    """Code the user wrote: not jax/numpy/jaxtop, not an installed package,
    not the standard library. ``<string>``, ``<stdin>`` and notebook cells
    are the user's; ``<frozen …>`` is not."""
    if not filename:
        return False
    if filename.startswith("<"):
        return not filename.startswith("<frozen")
    if any(m in filename for m in _THIRD_PARTY_MARKERS):
        return False
    return not is_library_file(filename)


def _site_text(filename: str, line: int, function: str) -> str:
    """"train.py:88 in step": a frame as the census names a site."""
    return f"{os.path.basename(filename) or filename}:{line} in {function or '?'}"


def user_frame_of_stack(frame: Any) -> dict[str, Any] | None:
    """The innermost frame of the user's code from ``frame`` outwards."""
    depth = 0
    while frame is not None and depth < 200:
        code = frame.f_code
        if is_user_file(code.co_filename):
            return {"file": code.co_filename, "line": frame.f_lineno, "function": code.co_name,
                    "site": _site_text(code.co_filename, frame.f_lineno, code.co_name)}
        frame = frame.f_back
        depth += 1
    return None


def user_frame_of_traceback(tb: Any) -> dict[str, Any] | None:
    """The innermost frame of the user's code in a traceback."""
    found = None
    depth = 0
    while tb is not None and depth < 1000:
        code = tb.tb_frame.f_code
        if is_user_file(code.co_filename):
            found = {"file": code.co_filename, "line": tb.tb_lineno, "function": code.co_name,
                     "site": _site_text(code.co_filename, tb.tb_lineno, code.co_name)}
        tb = tb.tb_next
        depth += 1
    return found


# --------------------------------------------------------------------------
# Allocation sites of a device memory profile
# --------------------------------------------------------------------------

_COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")


def _fold_comprehensions(stack: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    """Name a comprehension's frame after the function it is written in.

    Before Python 3.12 a comprehension runs in a frame of its own, called
    ``<listcomp>``; the site "train.py:88 in <listcomp>" should read as the
    function the line is in, as it does on 3.12 and later.
    """
    if not any(name in _COMPREHENSIONS for name, _, _ in stack):
        return stack
    out = []
    skip = False
    for i, (name, filename, line) in enumerate(stack):
        if skip:
            skip = False
            continue
        if name in _COMPREHENSIONS and i + 1 < len(stack) and stack[i + 1][1] == filename:
            out.append((stack[i + 1][0], filename, line))
            skip = stack[i + 1][2] == line  # the same line twice: keep one
            continue
        out.append((name, filename, line))
    return out


def allocation_sites(raw: bytes, top: int = TOP_SITES) -> dict[str, Any]:
    """Allocation sites of the live device buffers in a memory profile.

    Each buffer is charged to the innermost frame of the user's code in the
    Python stack jax recorded when it was made (:func:`is_user_file`); a
    buffer made from library code only (a flax initialiser called from an
    installed package) falls back to the innermost frame outside jax,
    numpy and jaxtop, marked ``"user": false``. Executables are left out
    (their bytes are code, not data) and only totalled.

    Args:
        raw: ``jax.profiler.device_memory_profile()``'s bytes (gzipped pprof).
        top: sites kept.

    Returns:
        ``{"top": [{site, file, line, function, bytes, count, user, via,
        stack, devices}], "bytes", "count", "sites_total",
        "executable_bytes"}``; ``via`` is the innermost non-jax frame when
        it is not the site itself (the library call that made the buffer).

    Raises:
        jaxtop.probes.memory_profile.ProfileDecodeError: not a profile.
    """
    import gzip

    from jaxtop.probes.memory_profile import ProfileDecodeError, decode_profile

    data = raw
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise ProfileDecodeError(f"bad gzip data: {exc}") from exc
    profile = decode_profile(data)
    names = [t for t, _ in profile.sample_types]
    units = [u for _, u in profile.sample_types]
    bytes_i = next((i for i, n in enumerate(names) if n in ("space", "inuse_space")),
                   next((i for i, u in enumerate(units) if u == "bytes"), None))
    count_i = next((i for i, n in enumerate(names) if n in ("allocations", "inuse_objects")), None)
    if bytes_i is None:
        raise ProfileDecodeError(f"no bytes sample type in {profile.sample_types}")

    frames_cache: dict[int, list[tuple[str, str, int]]] = {}
    sites: dict[tuple[str, str, int], dict[str, Any]] = {}
    total = n_total = exe = 0
    for sample in profile.samples:
        values = sample.values
        nbytes = values[bytes_i] if bytes_i < len(values) else 0
        n = (values[count_i] if count_i is not None and count_i < len(values) else 1) or 0
        if str(sample.labels.get("kind", "buffer")) == "executable":
            exe += nbytes
            continue
        total += nbytes
        n_total += n
        stack: list[tuple[str, str, int]] = []
        for loc in sample.location_ids:
            frames = frames_cache.get(loc)
            if frames is None:
                frames = []
                for func_id, line in profile.locations.get(loc, ()):
                    name, filename = profile.functions.get(func_id, ("", ""))
                    frames.append((name, filename, line))
                frames_cache[loc] = frames
            stack.extend(frames)
        stack = _fold_comprehensions(stack)
        user_i = next((i for i, (_, f, _) in enumerate(stack) if is_user_file(f)), None)
        lib_i = next((i for i, (_, f, _) in enumerate(stack) if not is_library_file(f)), None)
        site_i = user_i if user_i is not None else lib_i
        key = stack[site_i] if site_i is not None else ("<no stack>", "", 0)
        entry = sites.get(key)
        if entry is None:
            entry = sites[key] = {"bytes": 0, "count": 0, "user": user_i is not None, "devices": set(),
                                  "_best": -1, "stack": [], "via": None}
        entry["bytes"] += nbytes
        entry["count"] += n
        device = sample.labels.get("device")
        if device is not None:
            entry["devices"].add(str(device))
        if nbytes > entry["_best"]:
            entry["_best"] = nbytes
            start = site_i if site_i is not None else 0
            entry["stack"] = [_site_text(f, ln, name) for name, f, ln in stack[start:start + SITE_STACK]]
            if lib_i is not None and site_i is not None and lib_i < site_i:
                name, f, ln = stack[lib_i]
                entry["via"] = _site_text(f, ln, name)
    ordered = sorted(sites.items(), key=lambda kv: (-kv[1]["bytes"], -kv[1]["count"], str(kv[0])))
    out_top = []
    for (name, filename, line), entry in ordered[:max(0, top)]:
        out_top.append({
            "site": _site_text(filename, line, name) if filename else name,
            "file": filename,
            "line": line,
            "function": name,
            "bytes": entry["bytes"],
            "count": entry["count"],
            "user": entry["user"],
            "via": entry["via"],
            "stack": entry["stack"],
            "devices": sorted(entry["devices"]),
        })
    return {"top": out_top, "bytes": total, "count": n_total, "sites_total": len(sites), "executable_bytes": exe}

