"""A recording played back: play/pause, step, seek, speed."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import weakref
from collections.abc import Callable
from typing import IO, Any, Iterator

import numpy as np

from jaxtop.wire import paths, protocol
from jaxtop.dashboard.model import REPLAY, Model
from jaxtop.dashboard.sources import replay_cache, replay_index
from jaxtop.dashboard.sources.base import OnUpdate, Source
from jaxtop.wire.records import Record, Sample, Unknown, decode
from jaxtop.dashboard.sources.replay_index import Index
from jaxtop.export.convert import guarded, open_recording

#: Records that fail to play each get a notice, up to this many; the rest are
#: counted in one summary notice when playback reaches the end.
MAX_RECORD_NOTICES = 3
#: Records decoded and folded at a time when seeking or stepping.
FEED_BATCH = 256


class ReplaySource(Source):
    """Plays a recording, plain or gzip-compressed: play/pause, step, seek, speed.

    Playing needs each record's offset and time, seeking the model as it
    stands at any time: both come from a :class:`~replay_index.Index`
    (checkpoints of the model every couple of MB, so a seek folds at most
    that much). A recording under :data:`replay_index.BACKGROUND_MIN_BYTES`
    is indexed when opened (a fraction of a second); a bigger one uses the
    index kept in the cache, or plays at once, read straight from the file,
    while a separate process builds the index (``replay_state()["indexing"]``
    says how far). A seek asked for meanwhile is done when the index is in.

    A gzip stream cannot seek, so a compressed recording's offsets point into
    an uncompressed temporary copy written while indexing (not kept: it
    would be many times the recording's size); the copy goes when the source
    stops, or when it is collected unstarted.

    Nothing in a recording stops playback: a line that is not a record, or
    has no finite time, or is over :data:`protocol.MAX_RECORD_LINE_BYTES`,
    is skipped; compressed data cut short or corrupt ends the recording where
    it stops making sense; a record the model fails on is skipped when
    played. Each is counted and said in the model's notices.

    Args:
        path: The recording.
        speed: Playback speed (1: real time).
        start_playing: Play as soon as started (else paused at the start).
        background_min_bytes: Index recordings at least this big in the
            background (default :data:`replay_index.BACKGROUND_MIN_BYTES`).

    Raises:
        OSError: the recording cannot be read.
        ValueError: it holds no records.
    """

    kind = "replay"
    replays = True
    live = False

    def __init__(self, path: str, speed: float = 1.0, start_playing: bool = True,
                 background_min_bytes: int | None = None) -> None:
        super().__init__()
        self.path = path
        self.speed = speed
        self.playing = start_playing
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.RLock()
        self.stats = protocol.ReadStats()
        self.index: Index | None = None
        self.position = 0  # index of the next record to play
        self.pid = 0
        # Records the model failed on (indexes), and how many of them the
        # last summary notice counted.
        self._failed: set[int] = set()
        self._failed_said = 0
        self._playback_error_said = False
        self._thread: threading.Thread | None = None
        self._temp_dir: str | None = None
        self._cleanup: Callable[[], object] = lambda: None
        # Playing before the index is in: the file read in order.
        self._stream: IO[bytes] | None = None
        self._records: Iterator[tuple[int, bytes, dict[str, Any], float]] | None = None
        self._next: tuple[int, bytes, Record | Unknown, float] | None = None
        self._t_start: float | None = None
        self._last_t: float | None = None
        # The background indexer.
        self._builder: subprocess.Popen[bytes] | None = None
        self.indexing: tuple[int, int] | None = None  # (bytes done, total) while it runs
        self.index_error: str | None = None
        # A seek asked for before the index is in: the time it goes to, from
        # the index, and what the header says of it.
        self._pending: tuple[Callable[[Index], float], str] | None = None
        self.index_note: str | None = None  # where the index came from, for the header and notices
        threshold = replay_index.BACKGROUND_MIN_BYTES if background_min_bytes is None else background_min_bytes
        size = os.path.getsize(path)
        if size < threshold:
            self._index_here()
        else:
            self._open_big()

    # -- indexing ------------------------------------------------------------------
    def _temp(self) -> str:
        """A private temporary directory for this source, removed with it."""
        if self._temp_dir is None:
            self._temp_dir = tempfile.mkdtemp(prefix="jaxtop-replay-")
            self._cleanup = weakref.finalize(self, _cleanup, self._temp_dir, None)
        return self._temp_dir

    def _index_here(self) -> None:
        copy = os.path.join(self._temp(), "data.jsonl") if replay_index.is_compressed(self.path) else None
        try:
            index = replay_index.build(self.path, copy)
        except BaseException:
            self._cleanup()
            raise
        self._use(index)

    def _open_big(self) -> None:
        compressed = replay_index.is_compressed(self.path)
        out = copy = None
        if not compressed:
            cache, why = replay_cache.private_cache_dir()
            if cache is not None:
                out = str(cache / replay_cache.index_name(self.path))
                index, why = replay_cache.load(out, self.path)
                if index is not None:
                    # What it was checked by: a rewrite between the sampled blocks goes unseen.
                    self.index_note = (f"index from the cache ({out}; kept while the recording's size, time stamp, "
                                       f"inode, first and last MiB and {replay_cache.SAMPLED_BLOCKS} sampled blocks "
                                       "are unchanged)")
                    self._use(index)
                    return
            self.index_note = f"indexing ({why})"
        else:
            self.index_note = "indexing (a compressed recording's index is not kept)"
        self._open_stream()
        if out is None:
            out = os.path.join(self._temp(), "index.npz")
        if compressed:
            copy = os.path.join(self._temp(), "data.jsonl")
        try:
            self._start_builder(out, copy)
        except OSError as exc:  # no process to be had (EAGAIN, ENOMEM): play on, without seeking
            self.indexing = None
            self.index_error = f"the indexer could not be started: {exc}"

    def _open_stream(self) -> None:
        """Read the recording in order until the index is in; the first record now."""
        self._stream = open_recording(self.path)
        try:
            self._records = replay_index.iter_records(guarded(self._stream, self.stats), self.stats)
            self._next = next(self._records, None)
        except BaseException:
            self._stream.close()
            raise
        if self._next is None:
            self._stream.close()
            why = self.stats.stopped or self.stats.first_error
            raise ValueError(f"{self.path}: no jaxtop records found" + (f" ({why})" if why else ""))
        self.pid = replay_index.first_pid(self._next[2])
        self._t_start = self._next[3]

    def _start_builder(self, out: str, copy: str | None) -> None:
        # The indexer imports jaxtop as this process does, installed or not,
        # and nothing from the working directory or the recording's (which
        # others may write): paths.python_command, not `python -m`.
        argv = paths.python_command("jaxtop.dashboard.sources.replay_cache", self.path, out, *([copy] if copy else []))
        self.indexing = (0, os.path.getsize(self.path))
        # Its stderr goes to a file, not a pipe: a pipe nobody reads until the
        # end would stop an indexer that writes more than the pipe holds.
        err_path = os.path.join(self._temp(), "indexer.err")
        with paths.create_output(err_path) as err:
            self._builder = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                             stderr=err, start_new_session=True)
        if isinstance(self._cleanup, weakref.finalize):
            self._cleanup.detach()  # replaced by one that stops the indexer too
        self._cleanup = weakref.finalize(self, _cleanup, self._temp_dir, self._builder)
        data = copy or self.path
        threading.Thread(target=self._watch_builder, args=(self._builder, out, data, err_path),
                         name="jaxtop-replay-index", daemon=True).start()

    def _watch_builder(self, builder: subprocess.Popen[bytes], out: str, data: str, err_path: str) -> None:
        """Follow the indexer's progress; take its index when it is done."""
        error = None
        done = False
        assert builder.stdout is not None
        for raw in builder.stdout:
            words = raw.decode("utf-8", "replace").split(" ", 1)
            if words[0] == "progress" and len(words) == 2:
                try:
                    d, total = (int(x) for x in words[1].split())
                except ValueError:
                    continue
                self.indexing = (d, total)
                self._updated()
            elif words[0].strip() == "done":
                done = True
            elif words[0] == "error" and len(words) == 2:
                error = words[1].strip()
        rc = builder.wait()
        builder.stdout.close()
        err = replay_cache.tail_of(err_path)
        if self._stop.is_set():
            return
        index = None
        if done and rc == 0:
            # A recording still being written may have grown meanwhile: the
            # index then covers what was there when it was built.
            index, error = replay_cache.load(out, self.path, data_path=data, allow_growth=True)
        elif error is None:
            error = replay_cache.exit_reason(rc) + (f": {err.splitlines()[-1]}" if err else "")
        if index is None:
            self.indexing = None
            self.index_error = error or "the index could not be built"
            self._notice(f"replay: seeking is not available: {self.index_error}")
            self._updated()
            return
        self._take_index(index)

    def _take_index(self, index: Index) -> None:
        with self._lock:
            if index.length < self.position:
                self.indexing = None
                self.index_error = "the index has fewer records than were played"
                self._notice(f"replay: seeking is not available: {self.index_error}")
                return
            self._use(index)
            self.indexing = None
            if self._stream is not None:
                self._stream.close()
                self._stream = self._records = self._next = None
            for note in self.notices():
                self._notice(note)
            pending, self._pending = self._pending, None
        if pending is not None and self.model is not None:
            self.seek(pending[0](index))
        self._wake.set()
        self._updated()

    def _use(self, index: Index) -> None:
        self.index = index
        self.stats = index.stats
        self.pid = index.pid
        self._t_start = float(index.times[0])

    # -- the source ------------------------------------------------------------------
    @property
    def pids(self) -> list[int]:
        return [self.pid]

    @property
    def length(self) -> int | None:
        """Records in the recording; None until the index is in."""
        return self.index.length if self.index is not None else None

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
        if self.index is not None:
            for note in self.notices():
                model.add_notice(note)
        elif self.index_error is not None:
            model.add_notice(f"replay: seeking is not available: {self.index_error}")
        if self.index_note is not None:  # where the index comes from, and why it is built again
            model.add_notice(f"replay: {self.index_note}")
        model.process(self.pid)
        self._thread = threading.Thread(target=self._run, name="jaxtop-replay", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        with self._lock:
            if self._stream is not None:
                self._stream.close()
        self._cleanup()

    def _updated(self) -> None:
        if self.model is not None:
            self.on_update()

    def _notice(self, text: str) -> None:
        if self.model is not None:
            self.model.add_notice(text)

    # -- feeding -------------------------------------------------------------------
    def _play_one(self, i: int) -> None:
        """Play record ``i`` of the index into the shown model."""
        assert self.index is not None and self.model is not None
        with open(self.index.data_path, "rb") as f:
            f.seek(int(self.index.offsets[i]))
            try:
                # The limit holds even if the file changed since it was indexed.
                self.model.feed(self.pid, decode(f.readline(protocol.MAX_RECORD_LINE_BYTES + 1)))
            except Exception as exc:  # noqa: BLE001 - any record, any model bug
                self._record_failed(i, exc)
        self.model.set_state(self.pid, REPLAY)
        if i + 1 >= self.index.length:
            self._summarize_failures()

    def _feed_range(self, start: int, stop: int, model: Model | None = None) -> None:
        """Fold records ``start`` to ``stop`` into ``model`` (the shown one by
        default), a batch at a time: the model's result is the same as
        record by record (``Model.feed_many``), at a fraction of the cost."""
        model = model or self.model
        assert model is not None and self.index is not None
        offsets = self.index.offsets
        with open(self.index.data_path, "rb") as f:
            i = start
            while i < stop:
                end = min(stop, i + FEED_BATCH)
                lines = []
                for j in range(i, end):
                    offset = int(offsets[j])
                    if f.tell() != offset:
                        f.seek(offset)
                    lines.append(f.readline(protocol.MAX_RECORD_LINE_BYTES + 1))
                records = []
                for j, line in zip(range(i, end), lines):
                    try:
                        records.append(decode(line))
                    except Exception as exc:  # noqa: BLE001 - the file changed since it was indexed
                        self._record_failed(j, exc)
                model.feed_many(self.pid, records)
                i = end
        model.set_state(self.pid, REPLAY)
        if stop >= self.index.length:
            self._summarize_failures()

    def _record_failed(self, i: int, exc: Exception) -> None:
        """Say that record ``i`` could not be shown: once per record, the first
        few one by one (the rest are counted by :meth:`_summarize_failures`)."""
        if i in self._failed:
            return  # fed again by a seek: said already
        self._failed.add(i)
        if len(self._failed) <= MAX_RECORD_NOTICES:
            line = self.index.lines[i] if self.index is not None else "?"
            self._notice(f"line {line}: the record could not be shown and was skipped "
                         f"({type(exc).__name__}: {exc})")

    def _summarize_failures(self) -> None:
        """At the end of the recording: how many records failed in all, when
        more than one did and that count was not said yet."""
        if len(self._failed) > max(1, self._failed_said) and self.index is not None:
            self._failed_said = len(self._failed)
            first = self.index.lines[min(self._failed)]
            self._notice(f"{len(self._failed)} record(s) could not be shown and were skipped (first on line {first})")

    # -- playing before the index is in ------------------------------------------------
    def _stream_one(self) -> float | None:
        """Play the next record read from the file; the gap to the one after
        (None at the end)."""
        assert self._next is not None and self.model is not None and self._records is not None
        _, _, rec, t = self._next
        self._next = next(self._records, None)
        self.position += 1
        self._last_t = t
        try:
            self.model.feed(self.pid, rec)
        except Exception as exc:  # noqa: BLE001 - any record, any model bug
            if not self._playback_error_said:
                self._playback_error_said = True
                self._notice(f"replay: a record could not be shown ({type(exc).__name__}: {exc})")
        self.model.set_state(self.pid, REPLAY)
        return None if self._next is None else self._next[3] - t

    # -- the thread ------------------------------------------------------------------
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
        gap = None
        with self._lock:
            index = self.index
            if index is not None:
                playing = self.playing and self.position < index.length
                if playing:
                    i = self.position
                    self.position = i + 1  # first: a failure below must not replay it forever
                    self._play_one(i)
                    gap = float(index.times[i + 1] - index.times[i]) / self.speed if i + 1 < index.length else None
            else:
                playing = self.playing and self._next is not None
                if playing:
                    step = self._stream_one()
                    gap = step / self.speed if step is not None else None
        if playing:
            self.on_update()
            if gap is not None and not self._sample_shown():
                # What comes before the first sample (hello, backend: a
                # program's start-up, often seconds) plays at once, so a
                # replay opens on its first frame rather than on its gap.
                gap = 0.0
            if gap is not None:
                self._wake.wait(min(max(gap, 0.0), 1.0))
                self._wake.clear()
        else:
            self._wake.wait(0.2)
            self._wake.clear()

    def _sample_shown(self) -> bool:
        """Whether the shown model holds a sample of the replayed process."""
        proc = self.model.processes.get(self.pid) if self.model is not None else None
        return proc is not None and proc.samples > 0

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
            if self.index is None:
                while self._next is not None and seen < samples:
                    seen += self._next[2].__class__ is Sample
                    self._stream_one()
            else:
                start = self.position
                is_sample = self.index.is_sample
                while self.position < self.index.length and seen < samples:
                    seen += bool(is_sample[self.position])
                    self.position += 1
                self._feed_range(start, self.position)
            position = self.position
        self.on_update()
        return position

    def seek(self, t: float) -> float:
        """Jump to recording time ``t``: from the checkpoint before it, or on
        from here when that is nearer. Before the index is in, the seek is
        kept and done when it comes (``replay_state()["pending_seek"]``).

        Returns:
            The recording time reached (the time now, for a kept seek).
        """
        with self._lock:
            if self.index is None:
                if self.index_error is None:  # else no index is coming: the header says seek n/a
                    self._pending = (lambda index: t, _clock(t - (self._t_start or 0.0)))
                return self.current_t()
            self._seek(self.index, t)
        return self._moved()

    def seek_fraction(self, fraction: float, relative: bool = False) -> float:
        with self._lock:
            now = self.current_t()
            if self.index is None:
                if self.index_error is not None:
                    return now
                if relative:
                    self._pending = (lambda index: now + fraction * _span(index), f"{fraction:+.0%} of the recording")
                else:
                    self._pending = (lambda index: float(index.times[0]) + fraction * _span(index), f"{fraction:.0%}")
                return now
            self._seek(self.index, (now if relative else float(self.index.times[0])) + fraction * _span(self.index))
        return self._moved()

    def _moved(self) -> float:
        self._wake.set()
        self.on_update()
        return self.current_t()

    def _seek(self, index: Index, t: float) -> None:
        """Move the shown model to time ``t`` (the lock held)."""
        target = int(np.searchsorted(index.times, t, side="right"))
        # Never seek to before the first sample: an empty screen says nothing.
        target = max(index.first_sample(), min(target, index.length))
        k = index.checkpoint_before(target)
        from_checkpoint = int(index.checkpoint_at[k]) if k is not None else 0
        if from_checkpoint <= self.position <= target:
            self._feed_range(self.position, target)  # going on from here is the shorter way
        else:
            assert self.model is not None
            rebuilt = self.model.empty_like()
            start = 0
            if k is not None:
                try:
                    start, state = index.restore(k)
                    rebuilt.restore_process(self.pid, state)
                except Exception as exc:  # noqa: BLE001 - a damaged checkpoint: fold from the start instead
                    self._notice(f"replay: a checkpoint of the index could not be read ({type(exc).__name__}: {exc}); "
                                 "folding from the start")
                    rebuilt = self.model.empty_like()
                    start = 0
            self._feed_range(start, target, rebuilt)
            self.model.adopt(self.pid, rebuilt)
        self.position = target

    def current_t(self) -> float:
        if self.index is not None:
            return float(self.index.times[max(0, self.position - 1)])
        return self._last_t if self._last_t is not None else (self._t_start or 0.0)

    def replay_state(self) -> dict[str, Any]:
        index = self.index
        return {
            "playing": self.playing and (self.position < index.length if index is not None else self._next is not None),
            "speed": self.speed,
            "position": self.position,
            "length": index.length if index is not None else None,
            "t": self.current_t(),
            "t_start": self._t_start,
            "t_end": float(index.times[-1]) if index is not None else None,
            "path": self.path,
            "indexing": self.indexing,
            "index_error": self.index_error,
            "pending_seek": self._pending[1] if self._pending is not None else None,
        }

    def save(self, path: str) -> list[str]:
        with self._lock:
            position, index = self.position, self.index
        with paths.replacing(path) as out:
            if index is not None:
                with open(index.data_path, "rb") as f:
                    for i in range(position):
                        f.seek(int(index.offsets[i]))
                        out.write(f.readline(protocol.MAX_RECORD_LINE_BYTES + 1))
            else:  # the records played so far, read again in order
                stats = protocol.ReadStats()
                with open_recording(self.path) as stream:
                    for n, (_, line, _, _) in enumerate(replay_index.iter_records(guarded(stream, stats), stats)):
                        if n >= position:
                            break
                        out.write(line)
        return [path]


def _span(index: Index) -> float:
    return float(index.times[-1] - index.times[0])


def _clock(seconds: float) -> str:
    """A recording time for the header: ``1:02:03`` (from the start)."""
    seconds = max(0.0, seconds)
    return f"{int(seconds // 3600)}:{int(seconds % 3600 // 60):02d}:{int(seconds % 60):02d}"


def _cleanup(temp_dir: str | None, builder: subprocess.Popen[bytes] | None) -> None:
    """Stop the indexer, if it still runs, and remove the source's temporary files."""
    if builder is not None and builder.poll() is None:
        try:
            builder.kill()
            builder.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
    if temp_dir is not None:
        shutil.rmtree(temp_dir, ignore_errors=True)
