"""Drive an export writer over a recording, fast.

Used by :mod:`jaxtop.export`. A writer has ``SAMPLE`` (the lean type of
:mod:`jaxtop.export.typed` its samples are decoded into), ``sample(s)`` and
``other(r)`` (a lean sample, and any other record as
:class:`~jaxtop.export.typed.Other`), ``state()``/``set_state()`` (what the
next sample's output depends on besides the sample), ``first`` (nothing
written yet) and ``close()``; it is made as ``make(out)``, or
``make(out, part=True)`` for a piece of a file.

Lines are read in blocks of about 1 MiB. Each sample line is decoded by
msgspec straight into the writer's ``SAMPLE``; a line it refuses, and every
other record, goes the careful way: decoded whole by :func:`decode` (orjson,
or json.loads where orjson would read the line otherwise, so a record is
always what json.loads makes of it), then taken field by field
(:func:`jaxtop.export.typed.from_dict`). Both give the writer the same
record. ``fast=False`` sends every line the careful way (the same output,
slower). A big plain recording is also cut into pieces converted by forked
processes (the same output again).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import shutil
import signal
import tempfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import msgspec
import orjson

from jaxtop.export import typed
from jaxtop.wire import protocol

# orjson reads an integer beyond 64 bits as a float, without an error, where
# json.loads keeps the exact int. Such an integer is a run of at least 19
# digits: a line with one is decoded by json.loads. (Mapping every digit to
# "0" and searching for 19 of them is the cheapest such test found; a regular
# expression is ten times slower.)
_DIGIT_RUN = 19
_BYTES_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_STR_DIGITS = str.maketrans("123456789", "000000000")
_BYTES_RUN = b"0" * _DIGIT_RUN
_STR_RUN = "0" * _DIGIT_RUN


def decode(line: bytes | str) -> dict[str, Any]:
    """One line as a record: what :func:`protocol.decode` returns, mostly
    read by orjson (about 2.5x faster than json.loads).

    A line orjson refuses (``NaN``, ``1e400``, a lone surrogate, a byte order
    mark, nesting deeper than 1,024, not JSON) or might read otherwise (a long
    run of digits), and a line that is not a record, is left to
    :func:`protocol.decode`, so values, refusals and messages are its own.

    Raises:
        protocol.ProtocolError: the line is not a record, or is nested too
            deeply for json.loads.
    """
    if isinstance(line, bytes):
        plain = _BYTES_RUN not in line.translate(_BYTES_DIGITS)
    else:
        plain = _STR_RUN not in line.translate(_STR_DIGITS)
    if plain:
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            pass
        else:
            if type(obj) is dict and type(obj.get("type")) is str:
                return obj
    try:
        return protocol.decode(line)
    except RecursionError:  # json.loads refuses deep nesting by raising this
        raise protocol.ProtocolError("not JSON: nested too deeply") from None


def open_recording(path: str) -> IO[bytes]:
    """A recording, plain or gzip-compressed (as `w` in the dashboard may write)."""
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


#: What a gzip stream raises where its data is cut short (EOFError) or
#: corrupt (a bad header or CRC: BadGzipFile; a bad block: zlib.error).
_BROKEN_GZIP = (EOFError, zlib.error, gzip.BadGzipFile)


#: A gzip recording whose data expands more than EXPANSION_MAX_RATIO times
#: for EXPANSION_RUN_BYTES in a row is no recording (jaxtop's own compress 13
#: to 30x; one byte repeated, 1000x): reading stops there. Looked at every
#: EXPANSION_MIN_BYTES that come out. One long odd line (200 MB of padding,
#: which a reader skips as too long) passes; a bomb that would write 8 GiB
#: stops at half a GiB.
EXPANSION_MAX_RATIO = 100
EXPANSION_MIN_BYTES = 64 << 20
EXPANSION_RUN_BYTES = 512 << 20


class GuardedStream:
    """A gzip recording that ends where its compressed data stops making sense.

    A read that meets compressed data cut short (a killed writer) or corrupt
    returns ``b""``, as at the end of the file, and ``stats.stopped`` says
    why, at which line and near which byte of the file: readers keep every
    whole line before it instead of a traceback. Reads go through ``read1``, one step
    of decompression at a time, so a failing read loses only the data that
    step was decompressing, not all a larger read had gathered.
    """

    def __init__(self, stream: gzip.GzipFile, stats: protocol.ReadStats) -> None:
        self.stream = stream
        self.stats = stats
        self.ended = False
        self.newlines = 0  # in what was read: where it stopped, in lines
        self.out_bytes = 0  # decompressed so far
        self._mark = (0, 0)  # (decompressed, compressed) at the last look
        self._run = (0, 0)  # (decompressed, compressed) since expansion went past the ratio

    def position(self) -> int:
        """Compressed bytes read so far (read ahead a little): for progress."""
        try:
            return self.stream.fileobj.tell()  # type: ignore[union-attr]
        except (AttributeError, OSError, ValueError):
            return 0

    def read(self, size: int = -1) -> bytes:
        if self.ended:
            return b""
        try:
            data = self.stream.read1(size)
        except _BROKEN_GZIP as exc:
            self._stop(exc)
            return b""
        self.newlines += data.count(b"\n")
        self._count(len(data))
        return data

    def readline(self, size: int = -1) -> bytes:
        if self.ended:
            return b""
        try:
            line = self.stream.readline(size)
        except _BROKEN_GZIP as exc:
            self._stop(exc)
            return b""
        self.newlines += line.endswith(b"\n")
        self._count(len(line))
        return line

    def _count(self, n: int) -> None:
        """The expansion of each EXPANSION_MIN_BYTES read: past
        EXPANSION_MAX_RATIO for EXPANSION_RUN_BYTES in a row, the rest is
        no recording of jaxtop's (they compress 13–30x) but a decompression
        bomb, and reading ends there, with what came before kept."""
        self.out_bytes += n
        out_then, read_then = self._mark
        if self.out_bytes - out_then < EXPANSION_MIN_BYTES:
            return
        read = self.position()
        self._mark = (self.out_bytes, read)
        if self.out_bytes - out_then <= EXPANSION_MAX_RATIO * max(1, read - read_then):
            self._run = (0, 0)
            return
        out_run, read_run = self._run
        self._run = (out_run + self.out_bytes - out_then, read_run + read - read_then)
        if self._run[0] >= EXPANSION_RUN_BYTES:
            self.ended = True
            self.stats.stopped = (f"reading stopped at line {self.newlines + 1:,}: the last {self._run[0] >> 20:,} MiB "
                                  f"came out of {self._run[1] >> 10:,} KiB of the file, over {EXPANSION_MAX_RATIO}x "
                                  f"(a decompression bomb, not a recording: jaxtop's compress 13 to 30x)")

    def _stop(self, exc: BaseException) -> None:
        self.ended = True
        if isinstance(exc, EOFError):
            why = "the compressed data is cut short (truncated file)"
            self.stats.truncated = True
        else:
            why = f"the compressed data is corrupt ({exc})"
        size = ""
        with contextlib.suppress(AttributeError, OSError, ValueError):
            size = f" of {os.fstat(self.stream.fileobj.fileno()).st_size:,}"  # type: ignore[union-attr]
        where = f"line {self.newlines + 1:,} (near byte {self.position():,}{size} of the file)"
        self.stats.stopped = f"reading stopped at {where}: {why}"


def guarded(stream: IO[bytes], stats: protocol.ReadStats) -> IO[bytes]:
    """``stream`` as :func:`open_recording` gave it, a gzip one wrapped in
    :class:`GuardedStream` (a plain file ends where it ends)."""
    if isinstance(stream, gzip.GzipFile):
        return GuardedStream(stream, stats)  # type: ignore[return-value]
    return stream


def feed(writer: Any, rec: Any) -> str | None:
    """One lean record to the writer: a sample (the writer's ``SAMPLE``) to
    ``sample``, any other (:class:`~jaxtop.export.typed.Other`) to ``other``.

    Returns None, or why the writer could not format the record. orjson
    reads nesting up to 1,024 deep, but str() and json.dumps raise
    RecursionError a little below 1,000, as json.loads does: such a line is
    a bad line, as if json.loads had read it, instead of a traceback. Any
    other failure (a value of a type no writer expects) is a bad line too:
    one odd record must not cost the rest of the export. What the writer did
    before it failed stays: its state may have moved on, and of a CSV sample
    with several devices the rows before the failing one are written.
    """
    try:
        if rec.__class__ is typed.Other:
            writer.other(rec)
        else:
            writer.sample(rec)
    except RecursionError:
        return "not JSON: nested too deeply"
    except Exception as exc:  # noqa: BLE001 - the writers check types; this is the backstop
        return f"cannot be exported: {type(exc).__name__}: {exc}"
    return None


def blocks(stream: IO[bytes], stats: protocol.ReadStats) -> Iterator[list[bytes | memoryview] | None]:
    """A file's complete lines (without their newline), a list per read of
    about :data:`~jaxtop.wire.protocol.BLOCK_BYTES`.

    The lines :func:`jaxtop.wire.protocol.iter_blocks` reads, uncopied:
    each read goes into one buffer, and a line is a view of it (a line that
    began in an earlier read is joined into bytes). A view is valid until
    the next list is asked for. A line may be blank, but none is over
    :data:`~jaxtop.wire.protocol.MAX_RECORD_LINE_BYTES`: such a line is
    skipped here and None stands for it, so the caller can count it and
    note its number. A truncated last line is skipped and flagged in
    ``stats.truncated``.
    """
    limit = protocol.MAX_RECORD_LINE_BYTES
    size = min(protocol.BLOCK_BYTES, limit + 1)  # a line within one read is never too long
    buffer = bytearray(size)
    view = memoryview(buffer)
    find = buffer.find
    readinto = getattr(stream, "readinto", None)
    head: list[bytes | memoryview] = []  # the start of a line that earlier reads cut (never an empty part)
    held = 0  # its length
    skipping = False  # inside a line too long to hold
    while True:
        if readinto is not None:
            n = readinto(buffer) or 0
        else:
            data = stream.read(size)
            n = len(data)
            buffer[:n] = data
        if not n:
            if head and not skipping:
                stats.truncated = True
            return
        start = 0
        if skipping:
            newline = find(b"\n", 0, n)
            if newline < 0:
                continue
            start, skipping = newline + 1, False
        newline = find(b"\n", start, n)
        if newline < 0:  # no newline: the line goes on
            if start < n:
                head.append(bytes(view[start:n]))
                held += n - start
                if held > limit:
                    yield None
                    head, held, skipping = [], 0, True
            continue
        lines: list[bytes | memoryview] = []
        if head:
            head.append(view[start:newline])
            line = b"".join(head)
            head, held = [], 0
            if len(line) > limit:  # only a line begun in earlier reads can be too long
                yield None
            else:
                lines.append(line)
            start = newline + 1
            newline = find(b"\n", start, n)
        while newline >= 0:
            lines.append(view[start:newline])
            start = newline + 1
            newline = find(b"\n", start, n)
        if start < n:
            head, held = [bytes(view[start:n])], n - start
        if lines:
            yield lines


_FAST: dict[type, Callable[[bytes], Any]] = {}


def fast_decoder(lean: type) -> Callable[[bytes], Any]:
    """msgspec's decoder of a line into the lean type ``lean`` (made once)."""
    decoder = _FAST.get(lean)
    if decoder is None:
        decoder = _FAST[lean] = msgspec.json.Decoder(lean).decode
    return decoder


def convert(stream: IO[bytes], writer: Any, fast: bool, stats: protocol.ReadStats, lines: int = 0) -> int:
    """Feed every record of ``stream`` to ``writer``; return the line count.

    With ``fast``, each line is decoded by msgspec into the writer's
    ``SAMPLE``; a line that decoding refuses, and every record that is no
    sample, goes the careful way (:func:`decode`, then
    :func:`jaxtop.export.typed.record`). ``lines``: lines before the
    stream's first, for line numbers in notes.
    """
    lineno = lines
    lean = writer.SAMPLE

    def careful(lineno: int, line: bytes) -> None:
        if not line.strip():
            return
        try:
            rec = decode(line)
        except protocol.ProtocolError as exc:
            stats.note(lineno, str(exc))
            return
        failed = feed(writer, typed.record(rec, lean))
        if failed is not None:
            stats.note(lineno, failed)
            return
        stats.records += 1

    decode_fast = fast_decoder(lean) if fast else None
    sample = writer.sample
    errors = typed.ERRORS
    for block in blocks(stream, stats):
        if block is None:
            lineno += 1
            stats.note(lineno, "line too long")
            continue
        served = 0
        for line in block:
            lineno += 1
            if decode_fast is not None:
                try:
                    rec = decode_fast(line)
                except errors:
                    pass
                else:
                    if rec.type == "sample":
                        try:
                            sample(rec)
                        except RecursionError:
                            stats.note(lineno, "not JSON: nested too deeply")
                        except Exception as exc:  # noqa: BLE001 - as feed()
                            stats.note(lineno, f"cannot be exported: {type(exc).__name__}: {exc}")
                        else:
                            served += 1
                        continue
            # Another record, a line msgspec refuses: the careful way (with
            # its newline, as json.loads's messages count it).
            careful(lineno, bytes(line) + b"\n")
        stats.records += served
    return lineno


# ------------------------------------------------------------ parallel pieces
#
# A big plain recording is cut at line boundaries into one piece per job.
# The first piece is converted here; each other piece by a forked child, into
# a temporary file, starting from a guess of the writer's state at its start
# (the pid of the first hello, the previous sample's time and totals). Pieces
# are then appended in order; a piece whose guess differs from the true state
# there (a second hello, say) is converted again here, so the output is always
# what one pass over the file writes.

#: Below this size a recording is converted in one process.
PARALLEL_MIN_BYTES = 16 << 20
_GUESS_BYTES = 64 << 10


def default_jobs() -> int:
    """Processes for an export: the CPUs this process may run on, at most 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 8))


class Window:
    """The bytes ``[start, stop)`` of a binary file, as a readable stream."""

    def __init__(self, f: IO[bytes], start: int, stop: int) -> None:
        f.seek(start)
        self.f = f
        self.left = stop - start

    def read(self, n: int) -> bytes:
        n = min(n, self.left)
        if n <= 0:
            return b""
        data = self.f.read(n)
        self.left -= len(data)
        return data

    def readinto(self, buffer: bytearray) -> int:
        n = min(len(buffer), self.left)
        if n <= 0:
            return 0
        with memoryview(buffer) as view:
            got = self.f.readinto(view[:n])
        self.left -= got
        return got


def pieces(path: str, jobs: int) -> list[tuple[int, int]]:
    """Byte ranges of whole lines that cover the file, about one per job."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if jobs < 2 or size < PARALLEL_MIN_BYTES or f.read(2) == b"\x1f\x8b":
            return [(0, size)]
        cuts = [0]
        for k in range(1, jobs):
            at = max(size * k // jobs, cuts[-1])
            f.seek(at)
            newline = f.read(_GUESS_BYTES).find(b"\n")
            if newline < 0 or at + newline + 1 >= size:
                break
            cuts.append(at + newline + 1)
    cuts.append(size)
    return list(zip(cuts, cuts[1:]))


@dataclass
class PieceStats(protocol.ReadStats):
    """A piece's counts, with its first notes kept as (line, message) so the
    parent can number them from the file's start."""

    notes: list[tuple[int, str]] = field(default_factory=list)

    def note(self, lineno: int, message: str) -> None:
        super().note(lineno, message)
        if len(self.notes) < 20:
            self.notes.append((lineno, message))


def guess_state(path: str, make: Callable[..., Any], start: int) -> list[Any]:
    """The writer's state at byte ``start``, from the file's first hello and
    the lines just before ``start``."""
    writer = make(io.StringIO(), part=True)
    with open(path, "rb") as f:
        head = f.read(_GUESS_BYTES).split(b"\n")[:16]
        f.seek(max(0, start - _GUESS_BYTES))
        tail = f.read(start - f.tell()).split(b"\n")[:-1]
    if start > _GUESS_BYTES:
        tail = tail[1:]  # its first line began before the window
    records = []
    for line in head:
        with contextlib.suppress(protocol.ProtocolError):
            rec = typed.record(decode(line), typed.Other)
            if rec.type == "hello":
                records.append(rec)
                break
    for line in tail[-16:]:
        with contextlib.suppress(protocol.ProtocolError):
            records.append(typed.record(decode(line), writer.SAMPLE))
    for rec in records:
        feed(writer, rec)
    return writer.state()


def append(part: IO[bytes], out: IO[str]) -> None:
    """Copy UTF-8 bytes to ``out``: straight to its buffer when it has one."""
    buffer = getattr(out, "buffer", None)
    if buffer is not None and str(getattr(out, "encoding", "")).lower().replace("-", "") == "utf8":
        out.flush()
        shutil.copyfileobj(part, buffer, 1 << 20)
        return
    text = io.TextIOWrapper(part, encoding="utf-8", newline="")
    while chunk := text.read(1 << 20):
        out.write(chunk)


class Piece:
    """One byte range converted by a forked child into a temporary file."""

    def __init__(self, path: str, make: Callable[..., Any], fast: bool, start: int, stop: int) -> None:
        self.path, self.start, self.stop = path, start, stop
        self.redone = False  # converted again here: the guessed start state was wrong
        self.guess = guess_state(path, make, start)
        fd, self.tmp = tempfile.mkstemp(prefix="jaxtop-export-", suffix=".part")
        read, write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: convert, report, exit without cleanup
            code = 1
            try:
                os.close(read)
                stats = PieceStats()  # line numbers count from the piece's start
                with open(fd, "w", newline="", encoding="utf-8") as out, open(path, "rb") as src:
                    writer = make(out, part=True)
                    writer.set_state(self.guess)
                    lines = convert(Window(src, start, stop), writer, fast, stats)
                report = json.dumps({"state": writer.state(), "lines": lines, "records": stats.records,
                                     "malformed": stats.malformed, "truncated": stats.truncated,
                                     "notes": stats.notes}).encode()
                with open(write, "wb") as pipe:
                    pipe.write(report)
                code = 0
            finally:
                os._exit(code)
        os.close(fd)
        os.close(write)
        self.report = os.fdopen(read, "rb")

    def finish(self, writer: Any, out: IO[str], stats: protocol.ReadStats, lines: int, fast: bool) -> int:
        """Append this piece to ``out`` (or convert it again here); return the line count."""
        raw = self.report.read()
        _, status = os.waitpid(self.pid, 0)
        self.pid = 0
        report = json.loads(raw) if status == 0 and raw else None
        self.redone = report is None or json.dumps(self.guess) != json.dumps(writer.state())
        if self.redone:
            with open(self.path, "rb") as src:
                return convert(Window(src, self.start, self.stop), writer, fast, stats, lines)
        with open(self.tmp, "rb") as part:
            if writer.first and part.read(1):  # nothing written before: no leading comma
                writer.first = False
            else:
                part.seek(0)
            append(part, out)
        writer.set_state(report["state"])
        stats.records += report["records"]
        for lineno, message in report["notes"]:
            stats.note(lines + lineno, message)
        stats.malformed += report["malformed"] - len(report["notes"])
        stats.truncated = report["truncated"]
        return lines + report["lines"]

    def discard(self) -> None:
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except OSError:
                pass
        self.report.close()
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)


def run(path: str, make: Callable[..., Any], out: IO[str], fast: bool, jobs: int) -> protocol.ReadStats:
    """Write the recording at ``path`` to ``out`` with a writer ``make(out)``,
    in up to ``jobs`` processes; return what was read and skipped."""
    stats = protocol.ReadStats()
    writer = make(out)
    ranges = pieces(path, jobs) if hasattr(os, "fork") else [(0, 0)]
    if len(ranges) == 1:
        with open_recording(path) as stream:
            convert(guarded(stream, stats), writer, fast, stats)
        writer.close()
        return stats
    out.flush()  # a forked child must not inherit unwritten output
    children: list[Piece] = []
    try:
        for start, stop in ranges[1:]:
            children.append(Piece(path, make, fast, start, stop))
        with open(path, "rb") as src:
            lines = convert(Window(src, 0, ranges[0][1]), writer, fast, stats)
        for child in children:
            lines = child.finish(writer, out, stats, lines, fast)
    finally:
        for child in children:
            child.discard()
    writer.close()
    return stats
