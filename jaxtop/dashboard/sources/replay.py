"""A recording played back: play/pause, step, seek, speed."""

from __future__ import annotations

import bisect
import gzip
import math
import os
import tempfile
import threading
import weakref
from array import array
from collections.abc import Callable
from typing import IO, Any

from jaxtop import protocol
from jaxtop.dashboard.model import REPLAY, Model
from jaxtop.dashboard.sources.base import OnUpdate, Source
from jaxtop.export.convert import decode, guarded, open_recording

#: ``on_progress(done, total)``: bytes of the file indexed so far, and its size.
OnProgress = Callable[[int, int], None]
#: Uncompressed bytes indexed between two progress reports.
PROGRESS_EVERY_BYTES = 8 << 20
#: Records that fail to play each get a notice, up to this many; the rest are
#: counted in one summary notice when playback reaches the end.
MAX_RECORD_NOTICES = 3


class ReplaySource(Source):
    """Plays a recording, plain or gzip-compressed: play/pause, step, seek, speed.

    The file is indexed once (each record's offset, time and type); records
    are decoded as they are played, so big recordings open fast and cost
    little memory. A gzip stream cannot seek (a seek backwards decompresses
    again from its start), so a compressed recording is read through once
    and its records are written to an uncompressed temporary copy as they
    are indexed: the offsets point into that copy, and seeking costs the
    same as in a plain file. A copy on disk rather than the decoded records
    in memory keeps memory flat whatever the recording's size. The copy goes
    when the source stops, or when the source is collected unstarted.

    Nothing in a recording stops playback: a line that is not a record, or
    has no finite time, or is over :data:`protocol.MAX_RECORD_LINE_BYTES`,
    is skipped when indexing; compressed data cut short or corrupt ends the
    recording where it stops making sense; a record the model fails on is
    skipped when played. Each is counted and said in the model's notices.

    Args:
        path: The recording.
        speed: Playback speed (1: real time).
        start_playing: Play as soon as started (else paused at the start).
        on_progress: Called while indexing with the bytes of the file read
            so far and its size (compressed bytes for a gzip file), about
            every :data:`PROGRESS_EVERY_BYTES` of records and once at the
            end: a big file takes seconds to index.
    """

    kind = "replay"
    replays = True
    live = False

    def __init__(self, path: str, speed: float = 1.0, start_playing: bool = True,
                 on_progress: OnProgress | None = None) -> None:
        super().__init__()
        self.path = path
        self.speed = speed
        self.playing = start_playing
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self.stats = protocol.ReadStats()
        # Per record, in typed arrays: a few bytes each rather than a Python
        # object each, for recordings of millions of records.
        self._offsets = array("q")
        self._times = array("d")
        self._lines = array("q")  # line numbers, for notices
        self._is_sample = bytearray()
        self.position = 0  # index of the next record to play
        self.pid = 0
        # Records the model failed on (indexes), and how many of them the
        # last summary notice counted.
        self._failed: set[int] = set()
        self._failed_said = 0
        self._playback_error_said = False
        # The file the offsets point into: the recording, or its uncompressed copy.
        self._data_path = path
        self._remove_copy: Callable[[], object] = lambda: None
        self._on_progress = on_progress
        self._index()
        self._thread: threading.Thread | None = None

    # -- indexing ------------------------------------------------------------------
    def _index(self) -> None:
        """Find every valid record's offset and time (skips what is broken)."""
        try:
            with open_recording(self.path) as stream:
                copy = self._open_copy() if _compressed(stream) else None
                try:
                    self._index_lines(guarded(stream, self.stats), copy)
                finally:
                    if copy is not None:
                        copy.close()
        except BaseException:
            self._remove_copy()
            raise
        if not self._offsets:
            self._remove_copy()
            why = self.stats.stopped or self.stats.first_error
            raise ValueError(f"{self.path}: no jaxtop records found" + (f" ({why})" if why else ""))

    def _open_copy(self) -> IO[bytes]:
        """Start the uncompressed copy the offsets of a compressed recording point into."""
        fd, self._data_path = tempfile.mkstemp(prefix="jaxtop-replay-", suffix=".jsonl")
        self._remove_copy = weakref.finalize(self, _remove_quietly, self._data_path)
        return os.fdopen(fd, "wb")

    def _index_lines(self, stream: IO[bytes], copy: IO[bytes] | None) -> None:
        """Index every complete line within the size limit (``protocol.iter_lines``).

        ``stream`` is :func:`guarded`: compressed data cut short or corrupt
        ends it, and ``stats.stopped`` says where.
        """
        progress = self._on_progress
        if progress is not None:
            total = os.path.getsize(self.path)
            progress(0, total)
        unreported = 0
        for lineno, line in protocol.iter_lines(stream, self.stats):
            self._index_line(lineno, line, stream, copy)
            if progress is not None:
                unreported += len(line)
                if unreported >= PROGRESS_EVERY_BYTES:
                    unreported = 0
                    progress(min(_position(stream), total), total)
        if progress is not None:
            progress(total, total)

    def _index_line(self, lineno: int, line: bytes, stream: IO[bytes], copy: IO[bytes] | None) -> None:
        """Index one line if it is a record with a finite time; note it in ``stats`` if not."""
        try:
            rec = decode(line)
        except protocol.ProtocolError as exc:
            self.stats.note(lineno, str(exc))
            return
        t = _finite(rec.get("t"))
        if t is None:
            # NaN or inf would make every gap, seek and time shown after it NaN.
            self.stats.note(lineno, "no finite 't'")
            return
        if copy is None:
            # iter_lines has just read this line: the stream stands right after it.
            offset = stream.tell() - len(line)
        else:
            offset = copy.tell()
            copy.write(line)
        if rec.get("type") == protocol.HELLO and not self._offsets:
            pid = _finite(rec.get("pid"))
            self.pid = int(pid) if pid is not None and 0 < pid < 1 << 62 else 0
        self.stats.records += 1
        self._offsets.append(offset)
        self._times.append(t)
        self._lines.append(lineno)
        self._is_sample.append(rec.get("type") == protocol.SAMPLE)

    # -- the source ------------------------------------------------------------------
    @property
    def pids(self) -> list[int]:
        return [self.pid]

    @property
    def length(self) -> int:
        return len(self._offsets)

    def notices(self) -> list[str]:
        out = []
        if self.stats.stopped:
            out.append(f"{self.stats.stopped}; the records before it are shown")
        elif self.stats.truncated:
            out.append("recording ends with a truncated line (writer was killed); it was skipped")
        if self.stats.malformed:
            out.append(f"{self.stats.malformed} malformed line(s) skipped; first: {self.stats.first_error}")
        return out

    def start(self, model: Model, on_update: OnUpdate) -> None:
        super().start(model, on_update)
        for note in self.notices():
            model.add_notice(note)
        model.process(self.pid)
        self._thread = threading.Thread(target=self._run, name="jaxtop-replay", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._remove_copy()

    def _feed_range(self, start: int, stop: int, model: Model | None = None) -> None:
        """Feed records ``start`` to ``stop`` to ``model`` (the shown one by default).

        A record the model fails on (a value of a type it does not expect)
        is skipped and said, so one odd record never stops playback.
        """
        model = model or self.model
        assert model is not None
        with open(self._data_path, "rb") as f:
            for i in range(start, stop):
                try:
                    f.seek(self._offsets[i])
                    # The limit holds even if the file changed since it was indexed.
                    model.feed(self.pid, decode(f.readline(protocol.MAX_RECORD_LINE_BYTES + 1)))
                except Exception as exc:  # noqa: BLE001 - any record, any model bug
                    self._record_failed(i, exc)
        model.set_state(self.pid, REPLAY)
        if stop >= self.length:
            self._summarize_failures()

    def _notice(self, text: str) -> None:
        if self.model is not None:
            self.model.add_notice(text)

    def _record_failed(self, i: int, exc: Exception) -> None:
        """Say that record ``i`` could not be shown: once per record, the first
        few one by one (the rest are counted by :meth:`_summarize_failures`)."""
        if i in self._failed:
            return  # fed again by a seek: said already
        self._failed.add(i)
        if len(self._failed) <= MAX_RECORD_NOTICES:
            self._notice(f"line {self._lines[i]}: the record could not be shown and was skipped "
                         f"({type(exc).__name__}: {exc})")

    def _summarize_failures(self) -> None:
        """At the end of the recording: how many records failed in all, when
        more than one did and that count was not said yet."""
        if len(self._failed) > max(1, self._failed_said):
            self._failed_said = len(self._failed)
            first = self._lines[min(self._failed)]
            self._notice(f"{len(self._failed)} record(s) could not be shown and were skipped (first on line {first})")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._play_next()
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any failure
                if not self._playback_error_said:
                    self._playback_error_said = True
                    self._notice(f"replay: {type(exc).__name__}: {exc}")
                self._wake.wait(0.05)  # never a busy loop, whatever keeps failing
                self._wake.clear()

    def _play_next(self) -> None:
        """Play the next record and wait until the one after is due (or idle a while)."""
        with self._lock:
            playing = self.playing and self.position < self.length
            if playing:
                i = self.position
                self.position = i + 1  # first: a failure below must not replay it forever
                self._feed_range(i, i + 1)
                gap = (self._times[i + 1] - self._times[i]) / self.speed if i + 1 < self.length else None
        if playing:
            self.on_update()
            if gap is not None:
                self._wake.wait(min(max(gap, 0.0), 1.0))
                self._wake.clear()
        else:
            self._wake.wait(0.2)
            self._wake.clear()

    # -- controls (UI thread) ----------------------------------------------------
    def toggle(self) -> bool:
        with self._lock:
            self.playing = not self.playing
        self._wake.set()
        return self.playing

    def set_speed(self, speed: float) -> float:
        """Set the playback speed (clamped to 0.1..1000); returns it."""
        self.speed = max(0.1, min(speed, 1000.0))
        self._wake.set()
        return self.speed

    def scale_speed(self, factor: float) -> float:
        return self.set_speed(self.speed * factor)

    def step(self, samples: int = 1) -> int:
        with self._lock:
            self.playing = False
            seen = 0
            start = self.position
            while self.position < self.length and seen < samples:
                if self._is_sample[self.position]:
                    seen += 1
                self.position += 1
            self._feed_range(start, self.position)
            position = self.position
        self.on_update()
        return position

    def seek(self, t: float) -> float:
        """Jump to recording time ``t`` (rebuilds the model up to there)."""
        with self._lock:
            target = bisect.bisect_right(self._times, t)
            # Never seek to before the first sample: an empty screen says nothing.
            first_sample = next((i + 1 for i, is_sample in enumerate(self._is_sample) if is_sample), 1)
            target = max(first_sample, min(target, self.length))
            if target < self.position:
                assert self.model is not None
                rebuilt = self.model.empty_like()
                self._feed_range(0, target, rebuilt)
                self.model.adopt(self.pid, rebuilt)
            else:
                self._feed_range(self.position, target)
            self.position = target
        self._wake.set()
        self.on_update()
        return self.current_t()

    def current_t(self) -> float:
        return self._times[max(0, self.position - 1)]

    def replay_state(self) -> dict[str, Any]:
        return {
            "playing": self.playing and self.position < self.length,
            "speed": self.speed,
            "position": self.position,
            "length": self.length,
            "t": self.current_t(),
            "t_start": self._times[0],
            "t_end": self._times[-1],
            "path": self.path,
        }

    def save(self, path: str) -> list[str]:
        with open(path, "wb") as out, open(self._data_path, "rb") as f:
            for i in range(self.position):
                f.seek(self._offsets[i])
                out.write(f.readline(protocol.MAX_RECORD_LINE_BYTES + 1))
        return [path]


def _finite(value: Any) -> float | None:
    """A JSON number as a finite float, or None (NaN, inf, too big, not a number)."""
    if not protocol.is_number(value):
        return None
    try:
        value = float(value)
    except OverflowError:  # an integer beyond a float's range
        return None
    return value if math.isfinite(value) else None


def _position(stream: IO[bytes]) -> int:
    """Bytes of the file read so far: a plain file's position, or the
    compressed bytes read of a gzip one (a little ahead of the lines)."""
    position = getattr(stream, "position", None)
    return position() if position is not None else stream.tell()


def _compressed(stream: IO[bytes]) -> bool:
    """Whether ``open_recording`` gave a decompressing stream (it chose by magic bytes)."""
    return isinstance(stream, gzip.GzipFile)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
