"""A recording played back: play/pause, step, seek, speed."""

from __future__ import annotations

import threading
from typing import Any

from jaxtop import protocol
from jaxtop.dashboard.model import REPLAY, Model
from jaxtop.dashboard.sources.base import OnUpdate, Source


class ReplaySource(Source):
    """Plays a recording: play/pause, step, seek, speed.

    The file is indexed once (line offsets); records are decoded as they are
    played, so big recordings open fast and cost little memory.
    """

    kind = "replay"

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
        self._index()
        self._thread: threading.Thread | None = None

    def _index(self) -> None:
        """Find every valid record's offset and time (skips what is broken)."""
        with open(self.path, "rb") as f:
            offset = 0
            lineno = 0
            for line in f:
                lineno += 1
                start, offset = offset, offset + len(line)
                if not line.endswith(b"\n"):
                    self.stats.truncated = True
                    break
                if not line.strip():
                    continue
                try:
                    rec = protocol.decode(line)
                    t = float(rec.get("t"))
                except (protocol.ProtocolError, TypeError, ValueError) as exc:
                    self.stats.note(lineno, str(exc) if isinstance(exc, protocol.ProtocolError) else "no numeric 't'")
                    continue
                if rec.get("type") == "hello" and not self._offsets:
                    self.pid = int(rec.get("pid") or 0)
                self.stats.records += 1
                self._offsets.append(start)
                self._times.append(t)
                self._is_sample.append(rec.get("type") == "sample")
        if not self._offsets:
            raise ValueError(f"{self.path}: no jaxtop records found" + (f" ({self.stats.first_error})" if self.stats.first_error else ""))

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

    def _read_at(self, index: int) -> dict[str, Any]:
        with open(self.path, "rb") as f:
            f.seek(self._offsets[index])
            return protocol.decode(f.readline())

    def _feed_range(self, start: int, stop: int, model: Model | None = None) -> None:
        model = model or self.model
        assert model is not None
        with open(self.path, "rb") as f:
            f.seek(self._offsets[start]) if start < len(self._offsets) else None
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

    def set_speed(self, speed: float) -> None:
        self.speed = max(0.1, min(speed, 1000.0))
        self._wake.set()

    def step(self, samples: int = 1) -> None:
        """Advance by whole samples (and the records between them), paused."""
        with self._lock:
            self.playing = False
            seen = 0
            start = self.position
            while self.position < self.length and seen < samples:
                if self._is_sample[self.position]:
                    seen += 1
                self.position += 1
            self._feed_range(start, self.position)
        self.on_update()

    def seek(self, t: float) -> None:
        """Jump to recording time ``t`` (rebuilds the model up to there)."""
        import bisect

        with self._lock:
            target = bisect.bisect_right(self._times, t)
            # Never seek to before the first sample: an empty screen says nothing.
            first_sample = next((i + 1 for i, is_sample in enumerate(self._is_sample) if is_sample), 1)
            target = max(first_sample, min(target, self.length))
            if target < self.position:
                assert self.model is not None
                rebuilt = Model(clock=self.model._clock)
                self._feed_range(0, target, rebuilt)
                self.model.adopt(self.pid, rebuilt)
            else:
                self._feed_range(self.position, target)
            self.position = target
        self._wake.set()
        self.on_update()

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
        with open(path, "wb") as out, open(self.path, "rb") as f:
            for i in range(self.position):
                f.seek(self._offsets[i])
                out.write(f.readline())
        return [path]
