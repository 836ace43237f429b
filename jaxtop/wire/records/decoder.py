"""The one place a line (or a dict) from outside becomes a typed record.

Every source decodes here: the live socket, a replay file, a Prometheus
scrape (whose dicts go through :func:`from_dict`), a test. What leaves is a
:data:`~jaxtop.wire.records.core.Record` whose every field has its declared
type and every string is safe to show on a terminal, or a
:class:`~jaxtop.wire.protocol.ProtocolError` that says why the line is no
record. Past this module no reader checks a field again.

Two paths:

* **Fast** (nearly every line): one scan of the raw bytes for anything a
  terminal would obey — a C0 control or DEL, a C1 control or a bidi
  override in UTF-8, or a JSON escape that spells one — and, where there is
  none, msgspec decodes the line straight into the types. Clean ASCII with
  no backslash and no DEL (what the agent writes) is told by three C-speed
  tests of the bytes; only a line with one of those is searched.
* **Careful**: a line the scan flags, or one msgspec refuses (an unknown
  ``type``, a field of the wrong shape, an integer beyond 64 bits, a number
  beyond a float's range, a ``NaN`` or ``Infinity`` literal, which Python's
  json writes), is read with ``json.loads``; its
  strings are shown safely (:func:`~jaxtop.wire.safe_text.safe_record`);
  then each part that does not have its declared type reads n/a (None, or
  is left out of its list) and is noted in the record's ``odd``, which the
  dashboard says once per field. An unknown ``type`` gives an
  :class:`~jaxtop.wire.records.core.Unknown`, which readers skip.

Unknown fields are ignored by both paths (a newer agent adds fields).
"""

from __future__ import annotations

import functools
import json
import math
import re
import types
import typing
from typing import Annotated, Any, TypeVar, Union

import msgspec

from jaxtop.wire import protocol
from jaxtop.wire.protocol import ProtocolError, shown
from jaxtop.wire.records.base import INT64_MAX, INT64_MIN, MAX_TIME_S
from jaxtop.wire.records.core import ODD_KEY, RECORD_TYPES, Backfill, Odd, Record, Reply, Sample, Unknown
from jaxtop.wire.records.core import History as HistoryRecord
from jaxtop.wire.safe_text import safe_record

__all__ = ["buffer_map", "decode", "from_dict", "is_clean", "reply_result"]

_FAST = msgspec.json.Decoder(Record)

#: What makes a line take the careful path: a raw C0 control or DEL (JSON
#: allows DEL raw in a string), a C1 control or a bidi override/isolate in
#: UTF-8, and a JSON escape of any of them or of a lone surrogate (tab and
#: newline escapes too: they are rare, and the careful path keeps them).
_SUSPECT = re.compile(
    rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\xaa-\xae]|\xe2\x81[\xa6-\xa9]"
    rb"|\\u(?:00[0-1]|007[fF]|00[89]|202[a-eA-E]|206[6-9]|[dD][89a-fA-F])"
)


def is_clean(line: bytes) -> bool:
    """Whether ``line`` holds nothing a terminal would obey, raw or escaped."""
    # Three tests in C settle what the agent writes: pure ASCII, no
    # backslash at all (so no escape) and no DEL.
    if line.isascii() and b"\\" not in line and b"\x7f" not in line:
        return True
    return _SUSPECT.search(line) is None


def decode(line: bytes | str) -> Record | Unknown:
    """One line as a typed record.

    Raises:
        ProtocolError: the line is not a JSON object with a string ``type``
            (or is nested too deeply to read).
    """
    raw = line.encode("utf-8", "surrogatepass") if isinstance(line, str) else line
    if is_clean(raw):
        try:
            record = _FAST.decode(raw)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            # The careful path says which part, and keeps the rest; it also
            # reads what Python's json writes and msgspec refuses (NaN and
            # Infinity literals), and says why a line is no JSON at all.
            pass
        else:
            try:
                if not _open_parts_overflow(record):
                    return record
            except RecursionError:
                pass  # an open part nested deeper than a walk goes: the careful path refuses the line
    return from_dict(_loads(raw))


def _open_parts_overflow(record: Record) -> bool:
    """Whether a part typed as open JSON (a sample's ``demo``, a coarse
    history's positional rows, a reply's result) holds an integer beyond 64
    bits: msgspec reads those exactly there, where the careful path reads
    them as floats or refuses the line. Such parts are rare or small."""
    cls = record.__class__
    if cls is Sample or cls is Backfill:
        return record.demo is not None and _big_int(record.demo)
    if cls is HistoryRecord:
        return record.rows is not None and _big_int(record.rows)
    if cls is Reply:
        return _big_int(record.result)
    return False


def _big_int(value: Any) -> bool:
    cls = value.__class__
    if cls is int:
        return not INT64_MIN <= value <= INT64_MAX
    if cls is dict:
        return any(_big_int(v) for v in value.values())
    if cls is list:
        return any(_big_int(v) for v in value)
    return False


def _int64(text: str) -> int | float:
    """``parse_int``: integers beyond 64 bits read as floats (as orjson
    reads them), and a line with one beyond a float's range is refused."""
    value = int(text) if len(text) < 19 else None
    if value is not None:
        return value
    if len(text) <= 21:  # int() of so few digits never meets Python's digit limit
        value = int(text)
        if INT64_MIN <= value <= INT64_MAX:
            return value
    number = float(text)
    if not math.isfinite(number):
        raise ProtocolError(f"an integer beyond a float's range ({len(text.lstrip('-'))} digits)")
    return number


def _finite(text: str) -> float | None:
    """``parse_float``: a number beyond a float's range (``1e400``) reads n/a."""
    value = float(text)
    return value if math.isfinite(value) else None


def _no_constant(name: str) -> None:
    """``parse_constant``: NaN and Infinity (not JSON, but Python writes
    them) read n/a."""
    return None


def _loads(line: bytes) -> dict[str, Any]:
    """The careful path's reading of a line: every integer beyond 64 bits a
    float (one beyond a float's range refuses the line), NaN, Infinity and
    ``1e400`` n/a."""
    return protocol.decode(line, parse_int=_int64, parse_float=_finite, parse_constant=_no_constant)


def from_dict(obj: dict[str, Any]) -> Record | Unknown:
    """A decoded JSON object (a careful path's line, a Prometheus scrape's
    record, a test's) as a typed record: the careful path above.

    Raises:
        ProtocolError: ``obj`` has no string ``type``.
    """
    kind = obj.get("type") if obj.__class__ is dict else None
    if kind.__class__ is not str:
        raise ProtocolError("not a record: expected an object with a 'type' string")
    try:
        obj = _bounded(safe_record(obj))
    except RecursionError:
        raise ProtocolError("not JSON: nested too deeply") from None
    cls = RECORD_TYPES.get(obj["type"])
    if cls is None:
        t = obj.get("t")
        # Its t reads as any record's does (base.Time): a number within MAX_TIME_S of 0, else n/a.
        ok = (t.__class__ is float or t.__class__ is int) and -MAX_TIME_S <= t <= MAX_TIME_S
        return Unknown(type=obj["type"], t=t if ok else None)
    if ODD_KEY in obj:
        obj = {k: v for k, v in obj.items() if k != ODD_KEY}
    try:
        return msgspec.convert(obj, cls)
    except msgspec.ValidationError:
        pass
    except RecursionError:
        raise ProtocolError("not JSON: nested too deeply") from None
    notes: list[Odd] = []
    try:
        fields = _struct_fields(obj, cls, "", notes)
    except RecursionError:
        raise ProtocolError("not JSON: nested too deeply") from None
    return cls(**fields, odd=tuple(notes))


T = TypeVar("T")


def reply_result(reply: Reply, tp: type[T]) -> T | None:
    """A reply's ``result`` read as ``tp``: each command's result has a shape
    of its own, known to whoever asked, so it is decoded here when it is
    read. Parts of the wrong type read n/a; None when the result is no
    object of that shape at all (or holds a number beyond a float)."""
    try:
        ok, value = _convert(_bounded(reply.result), tp, "result", [])
    except (ProtocolError, RecursionError):
        return None
    return value if ok else None


_Pairs = list[tuple[Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)],
                   Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]]]
_PAIRS = msgspec.json.Decoder(_Pairs)


def buffer_map(raw: msgspec.Raw) -> tuple[tuple[int, int], ...]:
    """A device's buffer map (``live_arrays.map``, kept undecoded) as pairs
    of (address, size), each an int within int64; an entry of another shape
    is left out, and a map that is no array (or none) reads as empty.

    The agent's maps (a few thousand pairs of ints) decode in one call, in C.
    """
    if not raw:
        return ()
    try:
        return tuple(_PAIRS.decode(raw))
    except (msgspec.ValidationError, msgspec.DecodeError):
        pass
    try:
        entries = json.loads(bytes(raw), parse_int=_int64, parse_float=_finite, parse_constant=_no_constant)
    except (ValueError, RecursionError, ProtocolError):
        return ()
    out = []
    for entry in entries if entries.__class__ is list else ():
        if entry.__class__ is list and len(entry) == 2 and all(
                v.__class__ is int and INT64_MIN <= v <= INT64_MAX for v in entry):
            out.append((entry[0], entry[1]))
    return tuple(out)


def _bounded(value: Any) -> Any:
    """``value`` with the number rules of a line applied (a dict built in
    Python, a scrape's, may hold what JSON cannot spell): NaN and infinity
    read None, an integer beyond 64 bits a float, and one beyond a float's
    range refuses the record. Containers are copied only where something
    changed."""
    cls = value.__class__
    if cls is float:
        return value if value - value == 0.0 else None
    if cls is int:
        if INT64_MIN <= value <= INT64_MAX:
            return value
        try:
            return float(value)
        except OverflowError:
            raise ProtocolError("an integer beyond a float's range") from None
    if cls is dict:
        out = {k: _bounded(v) for k, v in value.items()}
        return value if all(out[k] is v for k, v in value.items()) else out
    if cls is list:
        items = [_bounded(v) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else items
    return value


# -- the careful path: each part of its declared type, or n/a -----------------------------------

_NONE = type(None)
_UNION_TYPES = (Union, types.UnionType)


def _members(tp: Any) -> tuple[Any, ...]:
    """The types a field may hold, None left out (``X | None`` -> ``(X,)``)."""
    if typing.get_origin(tp) in _UNION_TYPES:
        return tuple(m for m in typing.get_args(tp) if m is not _NONE and m is not msgspec.UnsetType)
    return (tp,)


def _bare(tp: Any) -> Any:
    """``Annotated[X, ...]`` -> ``X``."""
    return typing.get_args(tp)[0] if typing.get_origin(tp) is typing.Annotated else tp


def _should(tp: Any) -> str:
    """What a field of type ``tp`` should have been, as a message says it."""
    names = []
    for m in map(_bare, _members(tp)):
        origin = typing.get_origin(m)
        if isinstance(m, type) and issubclass(m, msgspec.Struct) or origin is dict or m is dict:
            names.append("an object")
        elif origin is list or m is list or origin is tuple:
            names.append("an array")
        elif m is int or m is float:
            names.append("a number")
        elif m is str:
            names.append("a string")
        elif m is bool:
            names.append("true or false")
        else:
            names.append("a JSON value")
    if names == ["a number", "a number"]:
        return "a number"
    if names == ["a number", "a string"]:
        return "an integer or a name"
    return " or ".join(dict.fromkeys(names))


def _struct_fields(obj: dict[str, Any], cls: Any, where: str, notes: list[Odd]) -> dict[str, Any]:
    """The fields of ``cls`` that ``obj`` holds with their declared types;
    each other one noted (it keeps its default: n/a)."""
    out: dict[str, Any] = {}
    for name, key, tp in _fields_of(cls):
        if key not in obj or key == "type":
            continue
        ok, value = _convert(obj[key], tp, f"{where}{key}", notes)
        if ok:
            out[name] = value
    return out


@functools.lru_cache(maxsize=None)
def _fields_of(cls: Any) -> tuple[tuple[str, str, Any], ...]:
    """A struct's fields as (name, key on the wire, type): msgspec works them
    out from the annotations at each call."""
    return tuple((f.name, f.encode_name, f.type) for f in msgspec.structs.fields(cls))


def _convert(value: Any, tp: Any, where: str, notes: list[Odd]) -> tuple[bool, Any]:
    """``value`` as ``tp``: whole where it fits; else the parts of a
    container that fit (an object's fields, an array's items); else noted."""
    try:
        return True, msgspec.convert(value, tp)
    except msgspec.ValidationError:
        pass
    if tp is msgspec.Raw:  # a part kept as its JSON text (already made safe and bounded)
        return True, msgspec.Raw(msgspec.json.encode(value))
    for m in map(_bare, _members(tp)):
        origin = typing.get_origin(m)
        if value.__class__ is dict and isinstance(m, type) and issubclass(m, msgspec.Struct):
            return True, m(**_struct_fields(value, m, f"{where}.", notes))
        if value.__class__ is list and origin is list:
            (item,) = typing.get_args(m)
            items = []
            for i, x in enumerate(value):
                ok, v = _convert(x, item, f"{where}[]" if _is_container(item) and x.__class__ is dict else f"{where}[{i}]",
                                 notes)
                if ok:
                    items.append(v)
            return True, items
        if value.__class__ is dict and origin is dict:
            _, vt = typing.get_args(m)
            kept = {}
            for key, x in value.items():
                ok, v = _convert(x, vt, f"{where}.{key}", notes)
                if ok:
                    kept[key] = v
            return True, kept
    notes.append(Odd(where=where, value=shown(value), should=_should(tp)))
    return False, None


def _is_container(tp: Any) -> bool:
    return any(isinstance(m, type) and issubclass(m, msgspec.Struct) for m in map(_bare, _members(tp)))
