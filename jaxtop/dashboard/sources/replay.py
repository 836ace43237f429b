"""A recording played back: play/pause, step, seek, speed."""

from __future__ import annotations

import bisect
import gzip
import os
import tempfile
import threading
import weakref
from collections.abc import Callable
from typing import IO, Any

from jaxtop import protocol
from jaxtop.dashboard.model import REPLAY, Model
from jaxtop.dashboard.sources.base import OnUpdate, Source
from jaxtop.export.convert import open_recording


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
    """

    kind = "replay"
    replays = True
    live = False

    def __init__(self, path: str, speed: float = 1.0, start_playing: bool = True) -> None:
        super().__init__()
        self.path = path
        self.speed = speed
        self.playing = start_playing
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self.stats = protocol.ReadStats()
        self._offsets: list[int] = []
        self._times: list[float] = []
        self._is_sample: list[bool] = []
        self.position = 0  # index of the next record to play
        self.pid = 0
        # The file the offsets point into: the recording, or its uncompressed copy.
        self._data_path = path
        self._remove_copy: Callable[[], object] = lambda: None
        self._index()
        self._thread: threading.Thread | None = None

    # -- indexing ------------------------------------------------------------------
    def _index(self) -> None:
        """Find every valid record's offset and time (skips what is broken)."""
        try:
            with open_recording(self.path) as stream:
                copy = self._open_copy() if _compressed(stream) else None
                try:
                    self._index_lines(stream, copy)
                finally:
                    if copy is not None:
                        copy.close()
        except BaseException:
            self._remove_copy()
            raise
        if not self._offsets:
            self._remove_copy()
            raise ValueError(f"{self.path}: no jaxtop records found" + (f" ({self.stats.first_error})" if self.stats.first_error else ""))

    def _open_copy(self) -> IO[bytes]:
        """Start the uncompressed copy the offsets of a compressed recording point into."""
        fd, self._data_path = tempfile.mkstemp(prefix="jaxtop-replay-", suffix=".jsonl")
        self._remove_copy = weakref.finalize(self, _remove_quietly, self._data_path)
        return os.fdopen(fd, "wb")

    def _index_lines(self, stream: IO[bytes], copy: IO[bytes] | None) -> None:
        """Index every complete line within the size limit (``protocol.iter_lines``)."""
        try:
            for lineno, line in protocol.iter_lines(stream, self.stats):
                self._index_line(lineno, line, stream, copy)
        except EOFError:
            # A gzip stream cut short (its writer was killed): keep what was whole.
            self.stats.truncated = True

    def _index_line(self, lineno: int, line: bytes, stream: IO[bytes], copy: IO[bytes] | None) -> None:
        """Index one line if it is a record with a time; note it in ``stats`` if not."""
        try:
            rec = protocol.decode(line)
            t = float(rec.get("t"))
        except (protocol.ProtocolError, TypeError, ValueError) as exc:
            self.stats.note(lineno, str(exc) if isinstance(exc, protocol.ProtocolError) else "no numeric 't'")
            return
        if copy is None:
            # iter_lines has just read this line: the stream stands right after it.
            offset = stream.tell() - len(line)
        else:
            offset = copy.tell()
            copy.write(line)
        if rec.get("type") == protocol.HELLO and not self._offsets:
            self.pid = int(rec.get("pid") or 0)
        self.stats.records += 1
        self._offsets.append(offset)
        self._times.append(t)
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
        if self.stats.truncated:
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
        model = model or self.model
        assert model is not None
        with open(self._data_path, "rb") as f:
            for i in range(start, stop):
                f.seek(self._offsets[i])
                model.feed(self.pid, protocol.decode(f.readline()))
        model.set_state(self.pid, REPLAY)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                playing = self.playing and self.position < self.length
                if playing:
                    i = self.position
                    self._feed_range(i, i + 1)
                    self.position = i + 1
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
                out.write(f.readline())
        return [path]


def _compressed(stream: IO[bytes]) -> bool:
    """Whether ``open_recording`` gave a decompressing stream (it chose by magic bytes)."""
    return isinstance(stream, gzip.GzipFile)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
