"""On-demand device memory profile: who allocated what is alive now.

``jax.profiler.device_memory_profile()`` returns a gzip-compressed pprof
``Profile`` protobuf. :func:`take_profile` saves those bytes untouched (so
``pprof`` / ``go tool pprof`` open the file) and summarises them
(:func:`summarize_profile`) with the decoder and the site fold of
:mod:`jaxtop.probes.pprof` (whose docstring says what jax puts in a
profile). The decoder's names are importable from here too.

Timing (CPU, jax 0.10.2, this machine): ``take_profile`` takes ~2-3 ms with
~1000 live arrays and ~14 ms with 10,000, almost all of it jax building and
gzipping the profile: on demand, not every sample. Safe to call from the
agent's thread while the main thread allocates (680 calls, no error).
"""

from __future__ import annotations

import os
import re
import stat
import sys
import time
from typing import Any

from jaxtop.probes.frames import SiteKey
from jaxtop.probes.jaxstate import backend_initialised as _backend_initialised
from jaxtop.probes.pprof import (  # noqa: F401  (the decoder's names, importable from here)
    NO_DEVICE,
    Profile,
    ProfileDecodeError,
    Sample,
    aggregate_profile,
    decode_profile,
    frame_resolver,
    iter_fields,
    load_profile,
    packed_varints,
    read_varint,
    value_indices,
)
# Beside, then renamed: a reader never sees half a profile, and a link planted
# at its name in a shared working directory is replaced, not written through.
from jaxtop.wire.paths import write_atomic

__all__ = [
    "ProfileDirError",
    "ProfileDecodeError",
    "read_varint",
    "iter_fields",
    "packed_varints",
    "decode_profile",
    "summarize_profile",
    "take_profile",
    "default_profile_dir",
    "private_profile_dir",
    "MAX_PROFILE_FILES",
    "PROFILE_FILE_NAME",
    "STACK_DEPTH",
]

#: Frames kept in each site's ``stack``.
STACK_DEPTH = 8


def _frame_text(name: str, filename: str, line: int) -> str:
    return f"{name or '?'} ({os.path.basename(filename) or '?'}:{line})"


def summarize_profile(raw_gzip_bytes: bytes, top: int = 10) -> dict[str, Any]:
    """Aggregates a gzipped pprof device memory profile. Pure: no jax, no I/O.

    Args:
        raw_gzip_bytes: what ``jax.profiler.device_memory_profile()`` returns.
            Uncompressed protobuf is accepted too.
        top: how many allocation sites to keep.

    Returns:
        ``{"total_bytes", "total_allocations", "by_kind", "by_device",
        "top_sites", "sample_types"}``. ``by_kind`` always has ``buffer`` and
        ``executable``; ``by_device`` counts only samples that carry a
        ``device`` label (executables carry none on CPU). Each site is
        ``{"site", "file", "bytes", "allocations", "kinds", "stack"}``:
        ``site`` is the frame :func:`jaxtop.probes.frames.pick_site` picks
        (the innermost frame of the user's code, else the innermost outside
        jax/jaxlib/numpy/jaxtop, else the innermost), ``"<no stack>"``
        without a stack; executables are charged to their site too;
        ``file`` its full path; ``kinds`` the allocation count per ``kind``
        label; ``stack`` up to :data:`STACK_DEPTH` frames from the site
        outwards (innermost first), taken from the site's largest sample.
        Sites sort by bytes, then allocations, then name.

    Raises:
        ProfileDecodeError: the bytes are not a gzipped pprof Profile or lack
            a bytes sample type.
    """
    profile = load_profile(raw_gzip_bytes)
    totals = aggregate_profile(profile, executables=True, detail=True)

    def text(key: SiteKey) -> str:
        filename, line, name = key
        return _frame_text(name, filename, line) if filename or line else name  # "<no stack>"

    ordered = sorted(totals.sites.items(), key=lambda item: (-item[1].bytes, -item[1].count,
                                                             _frame_text(item[0][2], item[0][0], item[0][1])))
    top_sites = []
    for key, site in ordered[:max(0, top)]:
        stack = site.stack or []
        top_sites.append({
            "site": text(key),
            "file": key[0],
            "bytes": site.bytes,
            "allocations": site.count,
            "kinds": dict(site.kinds or {}),
            "stack": [_frame_text(*f) for f in stack[site.at:site.at + STACK_DEPTH]],
        })
    by_kind = {"buffer": 0, "executable": 0}
    by_kind.update(totals.by_kind)
    return {
        "total_bytes": totals.bytes,
        "total_allocations": totals.count,
        "by_kind": by_kind,
        "by_device": {d: v[0] for d, v in sorted(totals.by_device.items()) if d != NO_DEVICE},
        "top_sites": top_sites,
        "sample_types": [list(t) for t in profile.sample_types],
    }


# --------------------------------------------------------------------------
# Taking a profile in the user's process
# --------------------------------------------------------------------------

def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


#: Profile files :func:`take_profile` leaves in a directory: after saving one,
#: it deletes the oldest files of its own naming beyond this many.
MAX_PROFILE_FILES = 20
#: The names :func:`take_profile` gives its files; it never deletes others.
PROFILE_FILE_NAME = re.compile(r"jaxtop-memprof-\d+-\d{8}-\d{6}(?:-\d+)?\.prof")


def _prune_profiles(directory: str, keep: int) -> None:
    """Delete all but the ``keep`` newest profile files in ``directory``.

    Only regular files whose whole name matches :data:`PROFILE_FILE_NAME`
    count (any pid: profiles of earlier runs too); symlinks, directories and
    every other name are left alone. Best effort: errors are ignored.
    """
    found: list[tuple[int, str]] = []
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if not PROFILE_FILE_NAME.fullmatch(entry.name):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    found.append((st.st_mtime_ns, entry.name))
    except OSError:
        return
    found.sort()
    for _mtime, name in found[:max(0, len(found) - keep)]:
        try:
            os.unlink(os.path.join(directory, name))
        except OSError:
            pass


class ProfileDirError(OSError):
    """jaxtop's own profile directory cannot be made or is not private; the
    message is one line naming the path and what to do."""


def default_profile_dir() -> str:
    """Where memory profiles go by default (not created): jaxtop's state
    directory, ``$XDG_STATE_HOME/jaxtop/profiles``, else
    ``~/.local/state/jaxtop/profiles``.

    Not the program's working directory: profiles piled up in the user's
    project (and in a directory others share, anyone could read which
    functions allocated what).

    Raises:
        ProfileDirError: neither ``$XDG_STATE_HOME`` nor a home directory is known.
    """
    state = os.environ.get("XDG_STATE_HOME")
    if not state or not os.path.isabs(state):  # the XDG spec: a relative value is to be ignored
        home = os.path.expanduser("~")
        if home == "~" or not os.path.isabs(home):
            raise ProfileDirError("no home directory to keep memory profiles in: set JAXTOP_PROFILE_DIR")
        state = os.path.join(home, ".local", "state")
    return os.path.join(state, "jaxtop", "profiles")


def _private_dir(path: str) -> None:
    """Make ``path`` (its parent exists) a directory of ours, mode 0700, or
    check the one there: a real directory, ours, no access for group or
    others. One made here is given its mode through a descriptor (the umask
    may have narrowed it), so a link swapped in meanwhile is never chmod'ed."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    else:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                if os.fstat(fd).st_uid == os.getuid():
                    os.fchmod(fd, 0o700)
            finally:
                os.close(fd)
    st = os.lstat(path)
    fix = "remove it (jaxtop makes it again, mode 0700) or set JAXTOP_PROFILE_DIR"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ProfileDirError(f"profile directory {path} is not a real directory (a symbolic link or a file): {fix}")
    if st.st_uid != os.getuid():
        raise ProfileDirError(f"profile directory {path} is not yours (uid {st.st_uid}): {fix}")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise ProfileDirError(f"profile directory {path} has mode {stat.S_IMODE(st.st_mode):04o}: group or "
                              f"others could read or change the profiles in it; {fix}")


def private_profile_dir() -> str:
    """:func:`default_profile_dir`, made if missing (``jaxtop`` and
    ``profiles`` mode 0700; the state directory above them as ``mkdir -p``
    would) and checked private.

    Returns:
        The directory's path.

    Raises:
        ProfileDirError: it cannot be made, or it (or ``jaxtop`` above it) is
            not a real directory of this user's that only this user may use.
    """
    path = default_profile_dir()
    parent = os.path.dirname(path)
    try:
        os.makedirs(os.path.dirname(parent), exist_ok=True)
        _private_dir(parent)
        _private_dir(path)
    except ProfileDirError:
        raise
    except OSError as exc:
        raise ProfileDirError(f"cannot make the profile directory {path}: {exc.strerror or exc}; "
                              "set JAXTOP_PROFILE_DIR") from None
    return path


def take_profile(
    directory: str | os.PathLike,
    top: int = 10,
    backend: str | None = None,
    keep: int | None = MAX_PROFILE_FILES,
) -> dict[str, Any]:
    """Captures, saves and summarises a device memory profile of this process.

    Never raises (``KeyboardInterrupt``/``SystemExit`` aside): every failure
    comes back as ``{"error": "<one line>"}``. It does not import jax or
    create a backend: both would change the user's program (allocator
    settings are read when the backend is created).

    Args:
        directory: where to write ``jaxtop-memprof-<pid>-<YYYYmmdd-HHMMSS>.prof``
            (created if missing). The file holds jax's gzipped bytes as they
            came, so ``pprof`` / ``go tool pprof`` open it.
        top: how many allocation sites to return.
        backend: passed to ``jax.profiler.device_memory_profile``.
        keep: after saving, keep only this many of the newest files named
            like jaxtop's profiles (:data:`PROFILE_FILE_NAME`, any pid) in
            ``directory`` and delete the older ones, so that repeated
            requests cannot fill the disk; None keeps all. Nothing else in
            the directory is ever deleted.

    Returns:
        :func:`summarize_profile`'s dict plus ``"path"`` (the file),
        ``"t"`` (wall-clock time of capture, epoch seconds) and ``"seconds"``
        (time taken by capture, write and decoding).
    """
    started = time.perf_counter()
    t = time.time()
    try:
        jax = sys.modules.get("jax")
        if jax is None:
            return {"error": "jax is not imported in this process"}
        if _backend_initialised() is False:
            return {"error": "no jax backend initialised yet (profiling now would create one)"}
        try:
            import jax.profiler as jax_profiler
        except Exception as exc:
            return {"error": f"jax.profiler unavailable: {_one_line(exc)}"}
        capture = getattr(jax_profiler, "device_memory_profile", None)
        if capture is None:
            version = getattr(jax, "__version__", "?")
            return {"error": f"jax {version} has no jax.profiler.device_memory_profile"}
        try:
            raw = capture(backend)
        except Exception as exc:
            return {"error": f"device_memory_profile failed: {_one_line(exc)}"}
        if not isinstance(raw, (bytes, bytearray)):
            return {"error": f"device_memory_profile returned {type(raw).__name__}, not bytes"}
        raw = bytes(raw)

        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(t))
        base = os.path.join(os.fspath(directory), f"jaxtop-memprof-{os.getpid()}-{stamp}")
        path = f"{base}.prof"
        n = 1
        while os.path.exists(path):  # two profiles in one second keep both
            path = f"{base}-{n}.prof"
            n += 1
        try:
            os.makedirs(os.fspath(directory), exist_ok=True)
            write_atomic(path, raw)
        except OSError as exc:
            return {"error": f"cannot write profile to {path}: {_one_line(exc)}"}
        if keep is not None:
            _prune_profiles(os.fspath(directory), max(1, keep))

        try:
            summary = summarize_profile(raw, top=top)
        except Exception as exc:
            return {"error": f"cannot decode profile saved at {path}: {_one_line(exc)}"}
        result: dict[str, Any] = {"path": path, "t": t}
        result.update(summary)
        result["seconds"] = time.perf_counter() - started
        return result
    except Exception as exc:  # the user's program must never see our failure
        return {"error": f"take_profile failed: {_one_line(exc)}"}
