"""pprof device memory profiles: decoding, and folding them into sites.

``jax.profiler.device_memory_profile()`` returns a gzip-compressed pprof
``Profile`` protobuf. This module decodes it with a small protobuf wire
reader of its own (jaxtop's agent may import only stdlib and jax, and the
``protobuf`` package is not a dependency of jax), and folds it into
**allocation sites** (:func:`aggregate_profile`): every probe that reads a
profile (holders, the on-demand profile, the OOM census) gets its sites
from the one fold, so that they agree.

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
  the site is picked by :mod:`jaxtop.probes.frames`.
- ``Function`` has name (2), system_name (3, equal to name), filename (4) and
  start_line (5); strings are full paths.
- An executable's stack starts in jax's compiler (``backend_compile_and_load``
  in compiler.py) and leads out to the call that compiled it (the first
  call of a jitted function or of an eager primitive).
- jax 0.4.30 (checked too) differs in the labels' values only: the device
  label reads ``TFRT_CPU_0`` and executables carry their code size (a few
  KiB) on CPU. Treat the device label as an opaque name. There is no shape
  or dtype label; any further string label a newer jaxlib adds is kept per
  site under ``labels``.
- jaxlib merges allocations with the same stack and labels into one sample
  (values ``[n, total_bytes]``): 10,000 arrays made in one loop give one
  sample, so decoding stays ~1 ms; each shard of a sharded array is its own
  allocation, labelled with its own device.

Stdlib only: this runs inside the user's job.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from jaxtop.probes.frames import LIBRARY, Frame, LibraryFilter, SiteKey, pick_index, pick_site

__all__ = [
    "NO_DEVICE",
    "Profile",
    "ProfileDecodeError",
    "ProfileTotals",
    "Sample",
    "SiteStats",
    "aggregate_profile",
    "decode_profile",
    "frame_resolver",
    "iter_fields",
    "load_profile",
    "packed_varints",
    "read_varint",
    "value_indices",
]

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
    """One sample: a stack, its values (one per sample type) and labels."""

    location_ids: list[int] = field(default_factory=list)  # leaf (innermost) first
    values: list[int] = field(default_factory=list)  # one per sample_type
    labels: dict[str, Any] = field(default_factory=dict)  # key -> str (or num when no str)


@dataclass
class Profile:
    """A decoded profile, its strings resolved."""

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
# Reading a decoded profile
# --------------------------------------------------------------------------

def _value_index(types: list[tuple[str, str]], names: tuple[str, ...], unit: str) -> int | None:
    for i, (type_name, _) in enumerate(types):
        if type_name in names:
            return i
    for i, (_, type_unit) in enumerate(types):
        if type_unit == unit:
            return i
    return None


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


def frame_resolver(profile: Profile) -> Callable[[int], list[Frame]]:
    """``loc_id -> [(function, file, line), …]`` (innermost first), each
    location resolved once: a real profile reuses a few dozen locations
    across thousands of samples."""
    cache: dict[int, list[Frame]] = {}

    def frames_of(loc_id: int) -> list[Frame]:
        frames = cache.get(loc_id)
        if frames is None:
            frames = [(*profile.functions.get(func_id, ("", "")), line)
                      for func_id, line in profile.locations.get(loc_id, ())]
            cache[loc_id] = frames
        return frames

    return frames_of



# --------------------------------------------------------------------------
# One profile -> sites
# --------------------------------------------------------------------------

#: The device of a sample that carries no ``device`` label (executables on CPU).
NO_DEVICE = "?"


@dataclass(slots=True)
class SiteStats:
    """Live allocations of one site in one profile."""

    bytes: int = 0
    count: int = 0
    devices: dict[str, list[int]] = field(default_factory=dict)  # device label -> [bytes, count]
    library: bool = False  # no frame of the user's code: the site is a library's
    labels: dict[str, dict[str, int]] = field(default_factory=dict)  # extra label -> value -> count
    # Kept only when the fold is asked for detail (None otherwise):
    kinds: dict[str, int] | None = None  # kind label ("unknown" without one) -> count
    stack: list[Frame] | None = None  # the stack of the site's largest sample, innermost first
    at: int = 0  # the site's index in ``stack``
    largest: int = -1  # bytes of that sample


@dataclass
class ProfileTotals:
    """Everything one profile says, folded by site."""

    sites: dict[SiteKey, SiteStats]
    bytes: int = 0  # of what the sites hold: buffers (and executables when they are charged too)
    count: int = 0
    by_device: dict[str, list[int]] = field(default_factory=dict)  # label -> [bytes, count]
    executable_bytes: int = 0
    executable_count: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)  # with detail: kind label -> bytes, every sample


def aggregate_profile(data: bytes | Profile, filt: LibraryFilter = LIBRARY, *, executables: bool = False,
                      detail: bool = False) -> ProfileTotals:
    """Folds a device memory profile into allocation sites. Pure: no jax.

    Args:
        data: the gzipped (or plain) pprof bytes of
            ``jax.profiler.device_memory_profile()``, or a decoded profile.
        filt: what counts as library code.
        executables: charge executables to their site like buffers (a site
            then holds the code its calls compiled); by default they are
            only totalled (they have no device on CPU and are not arrays).
        detail: also keep, per site, its count per kind label and the
            stack of its largest sample (:class:`SiteStats`), and the bytes
            per kind label over the whole profile.

    Returns:
        Per site (:func:`jaxtop.probes.frames.pick_site` of each sample's
        stack) the bytes and count of its live allocations, per device
        label (:data:`NO_DEVICE` for a sample without one).

    Raises:
        ProfileDecodeError: not a pprof profile with a bytes sample type.
    """
    profile = data if isinstance(data, Profile) else load_profile(data)
    bytes_i, count_i = value_indices(profile)

    # A profile reuses few locations across many samples: resolve each once,
    # and pick the site once per distinct stack.
    frames_of = frame_resolver(profile)
    site_cache: dict[tuple[int, ...], tuple[SiteKey, bool, list[Frame] | None, int]] = {}

    out = ProfileTotals(sites={})
    by_kind = out.by_kind
    kind_name = ""
    for sample in profile.samples:
        values = sample.values
        nbytes = values[bytes_i] if bytes_i < len(values) else 0
        count = 1 if count_i is None else (values[count_i] if count_i < len(values) else 0)
        labels = sample.labels
        if detail:
            kind = labels.get("kind")
            kind_name = "unknown" if kind is None else str(kind)
            by_kind[kind_name] = by_kind.get(kind_name, 0) + nbytes
        if str(labels.get("kind", "buffer")) == "executable":
            out.executable_bytes += nbytes
            out.executable_count += count
            if not executables:
                continue
        stack_key = tuple(sample.location_ids)
        picked = site_cache.get(stack_key)
        if picked is None:
            stack: list[Frame] = []
            for loc_id in sample.location_ids:
                stack.extend(frames_of(loc_id))
            key, library = pick_site(stack, filt)
            # The stack is kept for detail only: thousands of lists held
            # through the fold slow the holders' fold by about a tenth.
            picked = site_cache[stack_key] = (key, library, stack, pick_index(stack, filt)[0]) if detail else (
                key, library, None, 0)
        key, library, stack, at = picked
        site = out.sites.get(key)
        if site is None:
            site = out.sites[key] = SiteStats(library=library)
        site.bytes += nbytes
        site.count += count
        device = labels.get("device")
        dev = str(device) if device is not None else NO_DEVICE
        per = site.devices.setdefault(dev, [0, 0])
        per[0] += nbytes
        per[1] += count
        tot = out.by_device.setdefault(dev, [0, 0])
        tot[0] += nbytes
        tot[1] += count
        for label, value in labels.items():
            if label in ("kind", "device"):
                continue  # any other label (shape, dtype from a newer jaxlib) is kept
            values_seen = site.labels.setdefault(str(label), {})
            values_seen[str(value)] = values_seen.get(str(value), 0) + count
        out.bytes += nbytes
        out.count += count
        if detail:
            if site.kinds is None:
                site.kinds = {}
            site.kinds[kind_name] = site.kinds.get(kind_name, 0) + count
            if nbytes > site.largest:
                site.largest, site.stack, site.at = nbytes, stack, max(0, at)
    return out
