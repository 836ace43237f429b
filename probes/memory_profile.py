"""On-demand device memory profile: who allocated what is alive now.

``jax.profiler.device_memory_profile()`` returns a gzip-compressed pprof
``Profile`` protobuf. This module saves those bytes untouched (so ``pprof`` /
``go tool pprof`` open the file) and decodes them with a small protobuf wire
reader of its own: jaxtop's agent may import only stdlib and jax, and the
``protobuf`` package is not a dependency of jax.

What jax 0.10.2 (jaxlib ``heap_profile()``) puts in the profile on CPU, seen
by decoding real output:

- ``sample_type`` is ``[("allocations", "count"), ("space", "bytes")]``: a
  sample's values are ``[n, total bytes of those n]``.
- One sample per live buffer, labelled ``kind=buffer`` and ``device=cpu:0``
  (the device's ``platform:id``), and one per loaded executable, labelled
  ``kind=executable`` with **no** ``device`` label and **0 bytes** on CPU
  (the CPU client reports no code size).
- The stack is the Python traceback captured when the buffer (or
  executable) was created, innermost first, one ``Line`` per ``Location``
  (no inlining, no addresses, no mappings). A buffer made by ``jnp.ones``
  inside ``make()`` reads, innermost first: ``__call__ (pxla.py)``,
  ``wrapper (profiler.py)``, ``cache_miss (pjit.py)``, … ``full``,
  ``ones (array_creation.py)``, ``make (<string>:4)``, ``<module>``. The
  user's frame is there; jax's dispatch frames come before it, which is why
  the allocation site is the innermost frame outside jax/jaxlib/numpy.
- ``Function`` has name (2), system_name (3, equal to name), filename (4) and
  start_line (5); strings are full paths.
- An executable's stack starts in jax's compiler (``backend_compile_and_load``
  in compiler.py) and leads out to the call that compiled it (the first
  call of a jitted function or of an eager primitive), so a user function
  that triggered a compile also collects allocations of kind executable.
- jax 0.4.30 (checked too) differs in the labels' values only: the device
  label reads ``TFRT_CPU_0`` and executables carry their code size (a few
  KiB) on CPU. Treat the device label as an opaque name.
- jaxlib merges allocations with the same stack and labels into one sample
  (values ``[n, total_bytes]``): 10,000 arrays made in one loop give one
  sample, so decoding stays ~1 ms; each shard of a sharded array is its own
  allocation, labelled with its own device.

Timing (CPU, jax 0.10.2, this machine): ``take_profile`` takes ~2-3 ms with
~1000 live arrays and ~14 ms with 10,000, almost all of it jax building and
gzipping the profile: on demand, not every sample. Safe to call from the
agent's thread while the main thread allocates (680 calls, no error).
"""

from __future__ import annotations

import gzip
import os
import re
import stat
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

__all__ = [
    "ProfileDecodeError",
    "read_varint",
    "iter_fields",
    "packed_varints",
    "decode_profile",
    "summarize_profile",
    "take_profile",
    "MAX_PROFILE_FILES",
    "PROFILE_FILE_NAME",
    "LIBRARY_PATH_MARKERS",
    "STACK_DEPTH",
]

#: A frame whose file path contains one of these is library code, not an
#: allocation site the user can act on.
# "site-packages/jax_" covers the plugins (jax_cuda12_plugin, …); a bare
# "site-packages/jax" would also match site-packages/jaxtop, and so hide the
# demo's own allocation sites in a non-editable install.
LIBRARY_PATH_MARKERS = ("/jax/", "/jaxlib/", "/numpy/", "<frozen", "site-packages/jax_")
#: Frames kept in each site's ``stack``.
STACK_DEPTH = 8

_WIRE_VARINT, _WIRE_I64, _WIRE_LEN, _WIRE_SGROUP, _WIRE_EGROUP, _WIRE_I32 = 0, 1, 2, 3, 4, 5
_U64 = 1 << 64
_I64_SIGN = 1 << 63


class ProfileDecodeError(ValueError):
    """The bytes are not a well-formed (gzipped) pprof Profile."""


# --------------------------------------------------------------------------
# Protobuf wire format
# --------------------------------------------------------------------------

def read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Decodes one base-128 varint.

    Args:
        buf: the message bytes.
        pos: offset of the varint's first byte.

    Returns:
        (unsigned value, offset just past the varint). Values wider than 64
        bits are truncated to 64, as protobuf itself does.

    Raises:
        ProfileDecodeError: the varint runs past the end or past 10 bytes.
    """
    result = 0
    shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise ProfileDecodeError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & (_U64 - 1), pos
        shift += 7
        if shift >= 70:
            raise ProfileDecodeError("varint longer than 10 bytes")


def _signed64(value: int) -> int:
    """int64 fields arrive as two's-complement 64-bit varints."""
    return value - _U64 if value & _I64_SIGN else value


def _skip_group(buf: memoryview, pos: int, number: int, depth: int) -> int:
    """Skips a deprecated group up to its matching end tag; returns the offset after it."""
    if depth > 64:
        raise ProfileDecodeError("groups nested too deep")
    end = len(buf)
    while pos < end:
        key, pos = read_varint(buf, pos)
        wire, num = key & 7, key >> 3
        if wire == _WIRE_EGROUP:
            if num != number:
                raise ProfileDecodeError("mismatched end-group tag")
            return pos
        pos = _skip_value(buf, pos, wire, num, depth + 1)
    raise ProfileDecodeError("unterminated group")


def _skip_value(buf: memoryview, pos: int, wire: int, number: int, depth: int = 0) -> int:
    if wire == _WIRE_VARINT:
        return read_varint(buf, pos)[1]
    if wire == _WIRE_I64:
        pos += 8
    elif wire == _WIRE_I32:
        pos += 4
    elif wire == _WIRE_LEN:
        size, pos = read_varint(buf, pos)
        pos += size
    elif wire == _WIRE_SGROUP:
        return _skip_group(buf, pos, number, depth)
    else:
        raise ProfileDecodeError(f"unexpected wire type {wire} for field {number}")
    if pos > len(buf):
        raise ProfileDecodeError(f"field {number} runs past the end of its message")
    return pos


def iter_fields(buf: bytes | memoryview) -> Iterator[tuple[int, int, Any]]:
    """Walks the top-level fields of one message.

    Yields:
        ``(field_number, wire_type, value)``: value is an int for varints
        (wire 0), a memoryview of the payload for length-delimited fields
        (wire 2). Fixed-width fields (wires 1 and 5) and groups (3) are
        skipped: no field pprof defines uses them, so they can only be
        unknown fields from a newer producer.

    Raises:
        ProfileDecodeError: on malformed input.
    """
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    pos = 0
    end = len(view)
    while pos < end:
        key, pos = read_varint(view, pos)
        wire, number = key & 7, key >> 3
        if number == 0:
            raise ProfileDecodeError("field number 0")
        if wire == _WIRE_VARINT:
            value, pos = read_varint(view, pos)
            yield number, wire, value
        elif wire == _WIRE_LEN:
            size, pos = read_varint(view, pos)
            if pos + size > end:
                raise ProfileDecodeError(f"field {number} runs past the end of its message")
            yield number, wire, view[pos:pos + size]
            pos += size
        else:
            pos = _skip_value(view, pos, wire, number)


def packed_varints(payload: bytes | memoryview) -> list[int]:
    """Decodes a packed repeated varint field's payload into unsigned ints."""
    out = []
    pos = 0
    end = len(payload)
    while pos < end:
        value, pos = read_varint(payload, pos)
        out.append(value)
    return out


def _repeated_varint(wire: int, value: Any, into: list[int]) -> None:
    # Parsers must accept both encodings of a repeated scalar: packed (one
    # length-delimited run, what proto3 writers emit) and one varint each.
    if wire == _WIRE_LEN:
        into.extend(packed_varints(value))
    elif wire == _WIRE_VARINT:
        into.append(value)


def _varint_fields(message: bytes | memoryview) -> dict[int, int]:
    """The varint fields of a small message, by field number (the last of a
    repeated number wins; fields of other wire types are skipped)."""
    return {n: v for n, w, v in iter_fields(message) if w == _WIRE_VARINT}


# --------------------------------------------------------------------------
# pprof Profile (only the fields jaxtop reads)
# --------------------------------------------------------------------------

@dataclass
class Sample:
    location_ids: list[int] = field(default_factory=list)  # leaf (innermost) first
    values: list[int] = field(default_factory=list)  # one per sample_type
    labels: dict[str, Any] = field(default_factory=dict)  # key -> str (or num when no str)


@dataclass
class Profile:
    sample_types: list[tuple[str, str]]  # (type, unit)
    samples: list[Sample]
    locations: dict[int, list[tuple[int, int]]]  # id -> [(function_id, line)], innermost first
    functions: dict[int, tuple[str, str]]  # id -> (name, filename)


def _string(table: list[str], index: int) -> str:
    return table[index] if 0 <= index < len(table) else ""


def decode_profile(data: bytes | memoryview) -> Profile:
    """Decodes an uncompressed pprof ``Profile`` message.

    Raises:
        ProfileDecodeError: on malformed input.
    """
    raw_types: list[tuple[int, int]] = []
    raw_samples: list[tuple[list[int], list[int], list[tuple[int, int, int]]]] = []
    locations: dict[int, list[tuple[int, int]]] = {}
    raw_functions: dict[int, tuple[int, int]] = {}
    strings: list[str] = []

    for number, wire, value in iter_fields(data):
        if wire != _WIRE_LEN:
            continue  # scalar Profile fields (time_nanos, period, …) are not needed
        if number == 1:  # ValueType sample_type
            f = _varint_fields(value)
            raw_types.append((f.get(1, 0), f.get(2, 0)))  # type, unit
        elif number == 2:  # Sample
            loc_ids: list[int] = []
            values: list[int] = []
            labels: list[tuple[int, int, int]] = []
            for n, w, v in iter_fields(value):
                if n == 1:
                    _repeated_varint(w, v, loc_ids)
                elif n == 2:
                    _repeated_varint(w, v, values)
                elif n == 3 and w == _WIRE_LEN:  # Label: key, str, num
                    f = _varint_fields(v)
                    labels.append((f.get(1, 0), f.get(2, 0), _signed64(f.get(3, 0))))
            raw_samples.append((loc_ids, [_signed64(v) for v in values], labels))
        elif number == 4:  # Location
            loc_id = 0
            lines: list[tuple[int, int]] = []
            for n, w, v in iter_fields(value):
                if n == 1 and w == _WIRE_VARINT:
                    loc_id = v
                elif n == 4 and w == _WIRE_LEN:  # Line: function_id, line
                    f = _varint_fields(v)
                    lines.append((f.get(1, 0), _signed64(f.get(2, 0))))
            locations[loc_id] = lines
        elif number == 5:  # Function
            f = _varint_fields(value)  # id, name, system_name, filename
            raw_functions[f.get(1, 0)] = (f.get(2, 0), f.get(4, 0))
        elif number == 6:  # string_table
            strings.append(bytes(value).decode("utf-8", "replace"))

    # Strings are resolved last: string_table may come after the messages
    # that index into it (field order is not guaranteed on the wire).
    samples = []
    for loc_ids, values, labels in raw_samples:
        label_map: dict[str, Any] = {}
        for key, str_i, num in labels:
            label_map[_string(strings, key)] = _string(strings, str_i) if str_i else num
        samples.append(Sample(loc_ids, values, label_map))
    return Profile(
        sample_types=[(_string(strings, t), _string(strings, u)) for t, u in raw_types],
        samples=samples,
        locations=locations,
        functions={fid: (_string(strings, n), _string(strings, f)) for fid, (n, f) in raw_functions.items()},
    )


# --------------------------------------------------------------------------
# Aggregation
# --------------------------------------------------------------------------

def _value_index(types: list[tuple[str, str]], names: tuple[str, ...], unit: str) -> int | None:
    for i, (type_name, _) in enumerate(types):
        if type_name in names:
            return i
    for i, (_, type_unit) in enumerate(types):
        if type_unit == unit:
            return i
    return None


def _is_library(filename: str) -> bool:
    return any(marker in filename for marker in LIBRARY_PATH_MARKERS)


def _frame_text(name: str, filename: str, line: int) -> str:
    return f"{name or '?'} ({os.path.basename(filename) or '?'}:{line})"


def load_profile(data: bytes | memoryview) -> Profile:
    """A pprof Profile from its bytes, gzipped (as jax returns them) or not.

    Raises:
        ProfileDecodeError: bad gzip data or not a Profile message.
    """
    raw = bytes(data)
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise ProfileDecodeError(f"bad gzip data: {exc}") from exc
    return decode_profile(raw)


def value_indices(profile: Profile) -> tuple[int, int | None]:
    """Where a sample's bytes and allocation count are in its values.

    Raises:
        ProfileDecodeError: the profile has no bytes sample type.
    """
    bytes_i = _value_index(profile.sample_types, ("space", "inuse_space"), "bytes")
    count_i = _value_index(profile.sample_types, ("allocations", "inuse_objects"), "count")
    if bytes_i is None:
        raise ProfileDecodeError(f"no bytes sample type in {profile.sample_types}")
    return bytes_i, count_i


def frame_resolver(profile: Profile):
    """``loc_id -> [(function, file, line), …]`` (innermost first), each
    location resolved once: a real profile reuses a few dozen locations
    across thousands of samples."""
    cache: dict[int, list[tuple[str, str, int]]] = {}

    def frames_of(loc_id: int) -> list[tuple[str, str, int]]:
        frames = cache.get(loc_id)
        if frames is None:
            frames = [(*profile.functions.get(func_id, ("", "")), line)
                      for func_id, line in profile.locations.get(loc_id, ())]
            cache[loc_id] = frames
        return frames

    return frames_of


def write_atomic(path: str, data: bytes) -> None:
    """Write beside, then rename: a reader (or a full disk) never sees a
    half-written file under the final name, and no temp file stays."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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
        ``site`` is the innermost frame outside jax/jaxlib/numpy
        (:data:`LIBRARY_PATH_MARKERS`), else the innermost frame, else
        ``"<no stack>"``; ``file`` its full path; ``kinds`` the allocation
        count per ``kind`` label; ``stack`` up to :data:`STACK_DEPTH` frames
        from the site outwards (innermost first), taken from the site's
        largest sample. Sites sort by bytes, then allocations, then name.

    Raises:
        ProfileDecodeError: the bytes are not a gzipped pprof Profile or lack
            a bytes sample type.
    """
    profile = load_profile(raw_gzip_bytes)
    bytes_i, count_i = value_indices(profile)

    frames_of = frame_resolver(profile)

    total_bytes = 0
    total_allocs = 0
    by_kind: dict[str, int] = {"buffer": 0, "executable": 0}
    by_device: dict[str, int] = {}
    sites: dict[tuple[str, str, int], dict[str, Any]] = {}

    for sample in profile.samples:
        values = sample.values
        nbytes = values[bytes_i] if bytes_i < len(values) else 0
        if count_i is None:
            count = 1
        else:
            count = values[count_i] if count_i < len(values) else 0
        total_bytes += nbytes
        total_allocs += count
        kind = str(sample.labels.get("kind", "unknown"))
        by_kind[kind] = by_kind.get(kind, 0) + nbytes
        device = sample.labels.get("device")
        if device is not None:
            by_device[str(device)] = by_device.get(str(device), 0) + nbytes

        stack: list[tuple[str, str, int]] = []
        for loc_id in sample.location_ids:
            stack.extend(frames_of(loc_id))
        site_i = next((i for i, (_, fn, _) in enumerate(stack) if not _is_library(fn)), 0)
        key = stack[site_i] if stack else ("<no stack>", "", 0)
        entry = sites.get(key)
        if entry is None:
            entry = sites[key] = {"bytes": 0, "allocations": 0, "kinds": {}, "_best": -1, "stack": []}
        entry["bytes"] += nbytes
        entry["allocations"] += count
        entry["kinds"][kind] = entry["kinds"].get(kind, 0) + count
        if nbytes > entry["_best"]:
            entry["_best"] = nbytes
            entry["stack"] = [_frame_text(*f) for f in stack[site_i:site_i + STACK_DEPTH]]

    ordered = sorted(
        sites.items(),
        key=lambda item: (-item[1]["bytes"], -item[1]["allocations"], _frame_text(*item[0])),
    )
    top_sites = []
    for (name, filename, line), entry in ordered[:max(0, top)]:
        top_sites.append({
            "site": _frame_text(name, filename, line) if filename or line else name,
            "file": filename,
            "bytes": entry["bytes"],
            "allocations": entry["allocations"],
            "kinds": entry["kinds"],
            "stack": entry["stack"],
        })
    return {
        "total_bytes": total_bytes,
        "total_allocations": total_allocs,
        "by_kind": by_kind,
        "by_device": dict(sorted(by_device.items())),
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


def _backend_initialised() -> bool | None:
    """True/False when jax says whether a backend exists; None when it can't tell."""
    try:
        from jax._src import xla_bridge
    except Exception:
        return None
    try:
        if hasattr(xla_bridge, "backends_are_initialized"):
            return bool(xla_bridge.backends_are_initialized())
        if hasattr(xla_bridge, "_backends"):
            return bool(xla_bridge._backends)
    except Exception:
        return None
    return None


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
