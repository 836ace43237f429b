"""The wire format: newline-delimited JSON, shared by sockets and recordings.

Every record is one JSON object on one line with at least ``type`` and ``t``
(Unix seconds). An agent stream starts with ``hello``; a recording is exactly
the stream written to a file, so one reader serves both. See docs/protocol.md.

This module is stdlib only: the agent, the recorder and the dashboard all use it.
"""

from __future__ import annotations

import json
import math
import reprlib
import zlib
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Iterator

PROTOCOL_VERSION = 1
#: jaxtop's own version, written once: the package, ``--version`` and every
#: ``hello`` read it from here (pyproject.toml too, through setuptools).
JAXTOP_VERSION = "0.1.0"

# The wire's vocabulary. Every producer (the agent, the synthetic stream, the
# dashboard's external view) and every reader uses these names, so a record
# type or a direction is spelt in one place.

#: Record types an agent writes (docs/protocol.md describes each).
HELLO = "hello"  # first line of every stream: who, what, which devices
BACKEND = "backend"  # the program created its JAX backend
SAMPLE = "sample"  # one per sampling interval
DROPPED = "dropped"  # a slow client missed records
ERROR = "error"
EXIT = "exit"  # the last record of a process that ended normally
REPLY = "reply"  # the answer to a command
PONG = "pong"  # the answer to a ping
OOM_CENSUS = "oom_census"  # what held the memory when the program ran out
#: History sent to a client that connects, after the present (a ``sample``
#: marked ``present: true``): the coarse level (one row per bucket), then
#: the fine one (the kept samples, oldest first, each typed ``backfill``
#: instead of ``sample``), then ``history_end``. A reader that knows none of
#: them skips them and shows the present and what follows it.
HISTORY = "history"  # rows of min/max per bucket of the timeline series
BACKFILL = "backfill"  # a kept sample, sent as history: older than the present
HISTORY_END = "history_end"  # the history sent on connecting is complete
#: Request types a client sends.
PING = "ping"
COMMAND = "command"

#: Transfer directions: host-to-device, device-to-host, device-to-device.
H2D, D2H, D2D = "h2d", "d2h", "d2d"
DIRECTIONS = (H2D, D2H, D2D)
#: The transfer guard's own name for each direction, as its log lines spell
#: it ("host-to-device transfer: …").
GUARD_DIRECTIONS = {"host-to-device": H2D, "device-to-host": D2H, "device-to-device": D2D}

#: Largest line a peer may send to the agent (commands are small).
MAX_COMMAND_LINE_BYTES = 64 * 1024
#: Largest line a reader accepts from an agent or a recording.
MAX_RECORD_LINE_BYTES = 16 * 1024 * 1024


#: Why a TPU device's fragmentation is n/a (the agent sends it; the
#: dashboard applies it to recordings of agents that sent a figure).
#: Measured on a TPU v5e (jax 0.10.2, libtpu 0.0.42.1) after jitted MLP
#: steps: the runtime reported a largest free block of 9.69 GiB with 14.72 GiB
#: free, and one 14.73 GiB buffer was then allocated (the first size that
#: failed was 14.79 GiB; benchmarks/largest_free_block.py bisects it). The
#: reported block is no bound on a request, so ``1 - largest free block /
#: free`` (34 % there, 45-55 % in a training loop) is not fragmentation; the
#: block is still shown, as the runtime's, marked as no bound.
TPU_FRAGMENTATION_NA = ("not shown on TPU: the runtime's largest free block is no bound on a request "
                        "(on a v5e one 14.7 GiB buffer fit while it reported 9.69 GiB)")
#: The short form beside the runtime's largest free block on a TPU.
TPU_FREE_BLOCK_NOTE = "no bound"


def fragmentation_na(platform: Any) -> str | None:
    """The reason a device of ``platform`` has no fragmentation figure,
    whatever its allocator reports (None: the figure stands)."""
    return TPU_FRAGMENTATION_NA if platform == "tpu" else None


def _clean(value: Any) -> Any:
    """Replace NaN/inf (not valid JSON) by None, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def encode(record: dict[str, Any]) -> bytes:
    """Serialise one record as a single JSON line (bytes, ending in newline).

    Args:
        record: A dict with at least ``type`` and ``t``.

    Returns:
        UTF-8 bytes of compact JSON plus ``b"\\n"``.
    """
    try:
        text = _ENCODER.encode(record)
    except ValueError:
        text = _ENCODER.encode(_clean(record))
    return text.encode() + b"\n"


# One encoder for every record: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _encode_value(value: Any) -> str:
    try:
        return _ENCODER.encode(value)
    except ValueError:
        return _ENCODER.encode(_clean(value))


class StreamEncoder:
    """:func:`encode` for one stream of records, each field encoded again
    only when its value changed.

    The agent encodes a sample ten times a second, and most of its fields
    (devices between scans, transfers when there were none, the capture's
    status, compile and donation counts) equal the last sample's. Comparing
    two small dicts is done in C and costs a fraction of encoding one, so a
    field equal to the one encoded last time reuses its bytes. A value that
    *is* the object encoded last time is encoded again: its owner may have
    changed it in place since. The output is byte for byte :func:`encode`'s.
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[Any, str]] = {}
        self._keys: dict[str, str] = {}  # key -> '"key":'

    def encode(self, record: dict[str, Any]) -> bytes:
        last, keys = self._last, self._keys
        parts = []
        for key, value in record.items():
            prefix = keys.get(key)
            if prefix is None:
                prefix = keys[key] = _ENCODER.encode(key) + ":"
            cls = value.__class__
            if cls is dict or cls is list:
                hit = last.get(key)
                if hit is not None and hit[0] is not value and hit[0] == value:
                    text = hit[1]
                else:
                    text = prefix + _encode_value(value)
                    last[key] = (value, text)
            elif cls is int or (cls is float and math.isfinite(value)):
                text = prefix + repr(value)  # what json writes for them
            else:
                text = prefix + _encode_value(value)
            parts.append(text)
        return ("{" + ",".join(parts) + "}\n").encode()


#: How often a compressed recording is made readable up to its last line
#: (a zlib sync flush): what a killed writer can lose, in seconds.
GZIP_SYNC_S = 1.0


class GzipLines:
    """Compresses a recording as it is written: a gzip file any reader opens
    (``gzip.open``, ``zcat``), about 20 times smaller than the JSON lines.

    Samples repeat their neighbours almost field for field, so a stream at
    10 Hz that is 160 MB an hour as text (8 devices, 10,000 arrays) is ~5 MB
    compressed. The writer calls :meth:`sync` now and then: everything
    compressed before it can then be read, even if the writer is killed
    before :meth:`finish` (a reader sees a gzip stream cut short after the
    last whole line, and jaxtop's readers keep what came before).
    """

    def __init__(self, level: int = 6) -> None:
        self._z = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # 16+: the gzip container

    def compress(self, data: bytes) -> bytes:
        return self._z.compress(data)

    def sync(self) -> bytes:
        return self._z.flush(zlib.Z_SYNC_FLUSH)

    def finish(self) -> bytes:
        return self._z.flush(zlib.Z_FINISH)


def is_number(value: Any) -> bool:
    """True for a JSON number as decoded (int or float), not for a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# -- numbers from outside: one set of rules for every reader that shows them ----------

#: The largest time a record may carry (Unix seconds, about the year 5138):
#: a time beyond it is no time a program ran at, and ``time.localtime``
#: and the timelines' bucket numbers (int64) would fail on it.
MAX_TIME_S = 1e11


#: Ints within this convert to a float (bigger ones may not: OverflowError).
_FLOAT_INT = 1 << 1023


def number(value: Any) -> int | float | None:
    """A JSON number as it came (int or float) where a float holds it, None
    for anything else: NaN and inf (not measured), an int beyond a float
    (fed straight to a model: a line with one is refused by a bounded
    :func:`decode`), a string, a bool, an object. Every figure the
    dashboard draws is one of these."""
    # The decoder makes exactly int or float (a bool is neither): a class
    # check, since every snapshot reads a few dozen of these.
    kind = value.__class__
    if kind is int:
        return value if -_FLOAT_INT < value < _FLOAT_INT else None
    return value if kind is float and value - value == 0.0 else None  # inf - inf and NaN - NaN are NaN


def finite(value: Any) -> float | None:
    """A JSON number as a finite float, or None (NaN, inf, an int beyond a
    float's range, a bool, not a number)."""
    cls = value.__class__
    if cls is float:  # the common case first: the model reads a few dozen a sample
        return value if value - value == 0.0 else None  # inf - inf and NaN - NaN are NaN
    if cls is not int and not is_number(value):
        return None
    try:
        value = float(value)
    except OverflowError:  # an integer beyond a float's range
        return None
    return value if math.isfinite(value) else None


def timestamp(value: Any) -> float | None:
    """A record's time (Unix seconds) as a float, or None when it is not a
    finite number within :data:`MAX_TIME_S` of 0."""
    t = finite(value)
    return t if t is not None and -MAX_TIME_S <= t <= MAX_TIME_S else None


def obj_of(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def list_of(value: Any) -> list[Any]:
    """``value`` if it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


def text_of(value: Any) -> str | None:
    """A non-empty string, else None."""
    return value if isinstance(value, str) and value else None


#: What :func:`shown` writes of a value: a few levels and items, strings cut.
_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 80
_SHOWN.maxlevel = 3


def shown(value: Any) -> str:
    """A value from a record, as a message quotes it: a string as it is (cut
    at 200 characters), anything else as a short repr. ``str()`` of an
    array nested a thousand deep (orjson reads 1,024 levels) raises
    RecursionError; of a long one, it fills the screen."""
    if isinstance(value, str):
        return value if len(value) <= 200 else value[:199] + "…"
    if value.__class__ is int and value.bit_length() > 64:  # repr() refuses one of over 4,300 digits
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    return _SHOWN.repr(value)


class ProtocolError(ValueError):
    """A line that is not a valid record."""


def decode(line: bytes | str, **hooks: Callable[[str], Any]) -> dict[str, Any]:
    """Parse one line into a record (a dict, every integer exact: what the
    agent, exports and raw readers take; the dashboard's typed reading is
    ``jaxtop.wire.records.decode``, which passes its number rules here as
    ``json.loads`` hooks).

    Whatever the input, the only exception is :class:`ProtocolError`: the
    agent decodes lines from any peer, and a 2 KB line of ``[`` makes
    ``json.loads`` raise RecursionError, which is not a ValueError.

    Args:
        line: One JSON line.
        hooks: ``parse_int``, ``parse_float``, ``parse_constant`` for
            ``json.loads`` (a hook may raise ProtocolError to refuse the line).

    Raises:
        ProtocolError: the line is not a JSON object with a string ``type``.
    """
    try:
        obj = json.loads(line, **hooks) if hooks else json.loads(line)
    except ProtocolError:
        raise
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError("not JSON: nested too deeply") from None
    except Exception as exc:  # anything else a decoder may raise on odd input
        raise ProtocolError(f"not JSON: {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        raise ProtocolError("not a record: expected an object with a 'type' string")
    return obj


@dataclass
class ReadStats:
    """What a reader skipped, so a viewer can say so instead of hiding it."""

    records: int = 0
    malformed: int = 0  # lines that were not valid records
    truncated: bool = False  # the last line had no newline (killed writer)
    #: Why and where reading ended before the end of the file (compressed
    #: data cut short or corrupt), None when it read to the end.
    stopped: str | None = None
    first_error: str | None = None
    errors: list[str] = field(default_factory=list)

    def note(self, lineno: int, message: str) -> None:
        self.malformed += 1
        if len(self.errors) < 20:
            self.errors.append(f"line {lineno}: {message}")
        if self.first_error is None:
            self.first_error = f"line {lineno}: {message}"


def iter_lines(stream: IO[bytes], stats: ReadStats) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line number, line)`` for every complete, non-blank line.

    A truncated last line is skipped and flagged in ``stats.truncated``; a
    line over :data:`MAX_RECORD_LINE_BYTES` is skipped and counted.
    """
    lineno = 0
    while True:
        line = stream.readline(MAX_RECORD_LINE_BYTES + 1)
        if not line:
            return
        lineno += 1
        if not line.endswith(b"\n"):
            if len(line) > MAX_RECORD_LINE_BYTES:
                stats.note(lineno, "line too long")
                # Skip the rest of the oversized line.
                while line and not line.endswith(b"\n"):
                    line = stream.readline(MAX_RECORD_LINE_BYTES)
                continue
            stats.truncated = True
            return
        if not line.strip():
            continue
        yield lineno, line


#: Bytes read at a time by :func:`iter_blocks`.
BLOCK_BYTES = 1 << 20


def iter_blocks(stream: IO[bytes], stats: ReadStats) -> Iterator[bytes | None]:
    """Yield a file's complete lines, many at a time.

    Each block ends with a newline. For files read in bulk (export), where a
    line at a time costs more than the work on it. A line may be blank, but
    none is over :data:`MAX_RECORD_LINE_BYTES`: such a line is skipped here
    and None stands for it, so the caller can count it and note its number.
    A truncated last line is skipped and flagged in ``stats.truncated``.
    """
    rest = b""
    skipping = False  # inside a line too long to hold
    size = min(BLOCK_BYTES, MAX_RECORD_LINE_BYTES + 1)  # a line within one read is never too long
    while True:
        chunk = stream.read(size)
        if not chunk:
            if rest and not skipping:
                stats.truncated = True
            return
        if skipping:
            newline = chunk.find(b"\n")
            if newline < 0:
                continue
            chunk, skipping = chunk[newline + 1:], False
        data = rest + chunk if rest else chunk
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            rest = data
            if len(rest) > MAX_RECORD_LINE_BYTES:
                yield None
                rest, skipping = b"", True
            continue
        rest, data = data[cut:], data[:cut]
        # Only the line carried over from earlier reads can be too long.
        first = data.find(b"\n") + 1
        if first > MAX_RECORD_LINE_BYTES + 1:  # the limit excludes the newline
            yield None
            data = data[first:]
        if data:
            yield data


def iter_records(stream: IO[bytes], stats: ReadStats | None = None,
                 decode_line: Callable[[bytes], Any] = decode) -> Iterator[Any]:
    """Yield records from a binary stream (file or ``socket.makefile('rb')``).

    Tolerates what real streams contain: a truncated last line (skipped and
    flagged in ``stats.truncated``), malformed or oversized lines (skipped and
    counted), and unknown fields or record types (passed through untouched).

    Args:
        stream: Binary, line-iterable stream.
        stats: Optional counters updated as lines are read.
        decode_line: What makes a record of a line (:func:`decode`: a dict;
            ``jaxtop.wire.records.decode``: a typed record).
    """
    stats = stats if stats is not None else ReadStats()
    for lineno, line in iter_lines(stream, stats):
        try:
            record = decode_line(line)
        except ProtocolError as exc:
            stats.note(lineno, str(exc))
            continue
        stats.records += 1
        yield record
