"""A recording's index: where each record is, and the model at checkpoints.

Playing a recording needs each record's offset and time (to pace playback
and to find a time); seeking needs the dashboard's model as it stands at
that time, which is a fold over every record before it. Folding half of a
1 GB recording took 8 s, so the index keeps the fold itself, every
:data:`CHECKPOINT_BYTES` of records: a seek restores the checkpoint before
its target and plays at most that much.

A checkpoint is small because the model's bulk, its time series, is not in
it. Each :class:`~jaxtop.dashboard.history.History` of the model that builds
the index logs every row it puts into its rings (the raw samples and the
1 s / 10 s / 60 s buckets); a checkpoint keeps, per history, how many rows
each level had by then and the buckets still being filled. A ring is the
newest ``capacity`` rows of its level, so slicing the log rebuilds it
exactly. The rest of a process's state (latest sample, events, holders,
jit ledger, OOM censuses: some tens of KiB) is pickled and compressed.

A big recording (:data:`BACKGROUND_MIN_BYTES`) is indexed by a separate
process, so indexing neither waits for nor slows the dashboard (Python
threads share one core for Python code); :mod:`replay_cache` keeps the index
for the next time.
"""

from __future__ import annotations

import bisect
import io
import os
import pickle
import shutil
import sys
import zlib
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Iterator

import msgspec
import numpy as np

from jaxtop.wire import paths, protocol
from jaxtop.advice import advisor as advisor_module
from jaxtop.advice import evidence as evidence_module
from jaxtop.advice import series as series_module
from jaxtop.advice import types as advice_types_module
from jaxtop.dashboard import counter_window as counter_window_module
from jaxtop.dashboard import history as history_module
from jaxtop.dashboard import holders as holders_module
from jaxtop.dashboard import ledger as ledger_module
from jaxtop.dashboard import model as model_module
from jaxtop.dashboard import state as state_module
from jaxtop.dashboard import transfer_sites as transfer_sites_module
from jaxtop.dashboard import events as events_module
from jaxtop.dashboard import readings as readings_module
from jaxtop.dashboard import rows as rows_module
from jaxtop.wire import records as records_package
from jaxtop.dashboard.history import History, HistoryLog
from jaxtop.dashboard.model import REPLAY, Model
from jaxtop.wire.records import Hello, Record, Sample, Unknown, decode
from jaxtop.export.convert import guarded, open_recording

#: Bumped whenever what is stored changes meaning.
INDEX_FORMAT = 1
#: Bytes of records between two checkpoints: a seek decodes and folds at
#: most this much after restoring one (about 40 ms on a 2-core VM).
CHECKPOINT_BYTES = 2 << 20
#: ... and at most this many records (small records fold faster per byte,
#: not per record).
CHECKPOINT_RECORDS = 2000
#: Records folded into the index's model at a time.
FOLD_BATCH = 128
#: Recordings at least this big are indexed in a separate process and the
#: index kept in the cache; smaller ones are indexed in memory when opened
#: (a 32 MB recording takes about 0.2 s).
BACKGROUND_MIN_BYTES = 32 << 20

OnProgress = Callable[[int, int], None]


# -- reading records ---------------------------------------------------------------

def iter_records(stream: IO[bytes], stats: protocol.ReadStats) -> Iterator[tuple[int, bytes, Record | Unknown, float]]:
    """``(line number, line, record, time)`` for every playable record.

    A line that is not a record (:func:`jaxtop.wire.records.decode`: an
    integer beyond a float's range makes one), or has no finite time within
    ``protocol.MAX_TIME_S``, is skipped and noted in ``stats`` (NaN or inf
    would make every gap, seek and time shown after it NaN); so is an
    oversized or truncated line (``protocol.iter_lines``).
    The index and a replay playing before its index is ready count records
    with this one function, so their positions agree.
    """
    for lineno, line in protocol.iter_lines(stream, stats):
        try:
            rec = decode(line)
        except protocol.ProtocolError as exc:
            stats.note(lineno, str(exc))
            continue
        t = rec.t
        if t is None:
            # The decoder noted a 't' it could not read (out of range, not a
            # number); without a note there was none, or it was not finite.
            odd = any(o.where == "t" for o in getattr(rec, "odd", ()))
            stats.note(lineno, "'t' out of range" if odd else "no finite 't'")
            continue
        stats.records += 1
        yield lineno, line, rec, t


def first_pid(rec: Record | Unknown) -> int:
    """The pid a replay shows: the first record's, if it is a hello."""
    if not isinstance(rec, Hello):
        return 0
    pid = rec.pid
    return pid if isinstance(pid, int) and 0 < pid < 1 << 62 else 0


def stream_position(stream: IO[bytes]) -> int:
    """Bytes of the file read so far: a plain file's position, or the
    compressed bytes read of a gzip one (a little ahead of the lines)."""
    position = getattr(stream, "position", None)
    return position() if position is not None else stream.tell()


def is_compressed(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


# -- the index -------------------------------------------------------------------

@dataclass
class Index:
    """Offsets, times and checkpoints of one recording (see the module docstring)."""

    data_path: str  # the file the offsets point into: the recording, or its uncompressed copy
    pid: int
    offsets: np.ndarray  # int64, per record
    times: np.ndarray  # float64
    lines: np.ndarray  # int64, line numbers for notices
    is_sample: np.ndarray  # bool
    stats: protocol.ReadStats
    checkpoint_at: np.ndarray  # int64: checkpoint k is the state after records [0, checkpoint_at[k])
    checkpoint_ends: np.ndarray  # int64: checkpoint k is blob[ends[k-1]:ends[k]]
    blob: bytes | np.ndarray  # the checkpoints, compressed, one after another (uint8 when mapped)
    #: Per history key: (series names, levels, per level (t, lo, hi or None)).
    histories: dict[int, tuple[tuple[str, ...], tuple[tuple[float, int], ...], list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]]] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return len(self.offsets)

    def first_sample(self) -> int:
        """The position just after the first sample (a seek never goes before it)."""
        hits = np.flatnonzero(self.is_sample)
        return int(hits[0]) + 1 if len(hits) else 1

    def checkpoint_before(self, position: int) -> int | None:
        """The newest checkpoint at or before ``position`` (None: start from nothing)."""
        k = bisect.bisect_right(self.checkpoint_at.tolist(), position) - 1
        return k if k >= 0 else None

    def restore(self, k: int) -> tuple[int, tuple[Any, list[Any], Any]]:
        """Checkpoint ``k``: the position it stands at, and the process state
        (as :meth:`Model.process_state` gives it) with its histories rebuilt."""
        start = int(self.checkpoint_ends[k - 1]) if k else 0
        raw = zlib.decompress(bytes(self.blob[start:int(self.checkpoint_ends[k])]))
        state = _ModelUnpickler(io.BytesIO(raw), self).load()
        return int(self.checkpoint_at[k]), state

    def history(self, key: int, counts: tuple[int, ...], open_buckets: list, last_t: float | None) -> History:
        names, levels, rows = self.histories[key]
        kept = []
        for (_, capacity), (t, lo, hi), count in zip(levels, rows, counts):
            first = max(0, count - capacity)
            lo_part = lo[first:count]
            kept.append((t[first:count], lo_part, lo_part if hi is None else hi[first:count]))
        return History.restore(names, levels, kept, open_buckets, last_t)


class _CheckpointPickler(pickle.Pickler):
    """Pickles a process state with each history as a reference into the log."""

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, History):
            counts, open_buckets, last_t = obj.state()
            return ("history", obj.log_key, counts, open_buckets, last_t)  # type: ignore[attr-defined]
        return None


#: What a checkpoint may build: the model's own classes, numpy arrays and
#: plain containers. Nothing that runs a command or opens a file.
_ALLOWED = {
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "complex"),
    ("collections", "deque"), ("collections", "OrderedDict"), ("collections", "defaultdict"), ("collections", "Counter"),
    ("numpy", "dtype"), ("numpy", "ndarray"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    # A decoded record (the latest sample, a device's reading) is pickled as
    # ``rebuild(cls, fields)``, which is ``cls(**fields)``: cls must itself
    # be one of the record classes below.
    ("msgspec._utils", "rebuild"),
    # A field an older agent did not send at all (the jit ledger's storm flag).
    ("msgspec._core", "UNSET"),
    # A device's buffer map, kept as its JSON text: Raw(bytes) holds bytes.
    ("msgspec", "Raw"),
}
_MODEL_MODULES = {m.__name__: m for m in (model_module, state_module, events_module, holders_module, ledger_module,
                                          history_module, transfer_sites_module, counter_window_module,
                                          readings_module, rows_module, advisor_module, evidence_module,
                                          series_module, advice_types_module)}
#: The package of the wire's record types (jaxtop.wire.records.core, .holders, …).
_RECORDS_PACKAGE = records_package.__name__ + "."


class _ModelUnpickler(pickle.Unpickler):
    def __init__(self, file: IO[bytes], index: Index) -> None:
        super().__init__(file)
        self._index = index

    def find_class(self, module: str, name: str) -> Any:
        owner = _MODEL_MODULES.get(module)
        if owner is not None:
            obj = getattr(owner, name, None)
            if isinstance(obj, type) and obj.__module__ == module:
                return obj
        elif module.startswith(_RECORDS_PACKAGE):
            # A decoded record's classes: frozen structs of data (any of the
            # package's modules: the sparse parts have their own).
            obj = getattr(sys.modules.get(module), name, None)
            if isinstance(obj, type) and issubclass(obj, msgspec.Struct) and obj.__module__ == module:
                return obj
        elif (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a replay index may not build {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "history"):
            raise pickle.UnpicklingError("unknown reference in a replay index")
        _, key, counts, open_buckets, last_t = pid
        return self._index.history(key, tuple(counts), list(open_buckets), last_t)


# -- building ----------------------------------------------------------------------

class _Builder:
    """Folds records into a model whose histories log their rows, taking checkpoints."""

    def __init__(self) -> None:
        self.logs: list[History] = []
        self.model = Model(clock=lambda: 0.0, new_history=self._new_history)
        self.pid = 0
        self.pending: list[Record | Unknown] = []
        self.since_bytes = 0
        self.since_records = 0
        self.at: list[int] = []
        self.ends: list[int] = []
        self.chunks: list[bytes] = []
        self.blob_size = 0
        self.records = 0

    def _new_history(self, names: tuple[str, ...]) -> History:
        history = History(names)
        history.log = HistoryLog(len(history.levels), tuple(i for i, (step, _) in enumerate(history.levels) if step == 0))
        history.log_key = len(self.logs)  # type: ignore[attr-defined]
        self.logs.append(history)
        return history

    def add(self, rec: Record | Unknown, nbytes: int) -> None:
        if self.records == 0:
            self.pid = first_pid(rec)
        self.records += 1
        self.pending.append(rec)
        if len(self.pending) >= FOLD_BATCH:
            self._fold()
        self.since_bytes += nbytes
        self.since_records += 1
        if self.since_bytes >= CHECKPOINT_BYTES or self.since_records >= CHECKPOINT_RECORDS:
            self.checkpoint()

    def _fold(self) -> None:
        if self.pending:
            self.model.feed_many(self.pid, self.pending)
            self.model.set_state(self.pid, REPLAY)  # as a replay does after what it plays
            self.pending = []

    def checkpoint(self) -> None:
        self._fold()
        self.since_bytes = self.since_records = 0
        buf = io.BytesIO()
        _CheckpointPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(self.model.process_state(self.pid))
        chunk = zlib.compress(buf.getvalue(), 1)
        self.chunks.append(chunk)
        self.blob_size += len(chunk)
        self.at.append(self.records)
        self.ends.append(self.blob_size)

    def histories(self) -> dict[int, Any]:
        out = {}
        for history in self.logs:
            k = len(history.names)
            rows = [history.log.arrays(li, k) for li in range(len(history.levels))]  # type: ignore[union-attr]
            out[history.log_key] = (history.names, history.levels, rows)  # type: ignore[attr-defined]
        return out


#: A compressed recording's uncompressed copy may grow to this many times its
#: size: jaxtop's own recordings compress about 30x (5 MB an hour against
#: 160 MB of text); a gzip of one repeated line reaches 1000x.
COPY_MAX_RATIO = 100
#: Free space the copy leaves on its file system, whatever the ratio allows.
COPY_KEEP_FREE_BYTES = 1 << 30


def copy_room(copy_path: str | None, compressed_bytes: int) -> tuple[int, str] | None:
    """The most bytes the uncompressed copy may take, and why that much."""
    if copy_path is None:
        return None
    by_ratio = max(64 << 20, COPY_MAX_RATIO * compressed_bytes)
    try:
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(copy_path))).free
    except OSError:
        return by_ratio, f"{COPY_MAX_RATIO}x the compressed recording"
    by_disk = max(0, free - COPY_KEEP_FREE_BYTES)
    if by_disk < by_ratio:
        return by_disk, f"it would leave less than {COPY_KEEP_FREE_BYTES >> 30} GiB free where it is written"
    return by_ratio, f"{COPY_MAX_RATIO}x the compressed recording"


def build(path: str, copy_path: str | None = None, on_progress: OnProgress | None = None,
          progress_every: int = 8 << 20) -> Index:
    """Index the recording at ``path``.

    Args:
        path: The recording, plain or gzip-compressed.
        copy_path: For a compressed recording, where to write the
            uncompressed copy that the offsets will point into (a gzip
            stream cannot seek). Required for one.
        on_progress: Called with the bytes read so far and the file's size
            about every ``progress_every`` bytes, and at the end.

    Raises:
        OSError: the recording cannot be read, or the copy written.
        ValueError: it holds no records.
    """
    stats = protocol.ReadStats()
    builder = _Builder()
    offsets, times, lines, is_sample = [], [], [], []
    total = os.path.getsize(path)
    compressed = is_compressed(path)
    if compressed and copy_path is None:
        raise ValueError("a compressed recording needs a path for its uncompressed copy")
    copy = paths.create_output(copy_path) if compressed and copy_path else None
    room = copy_room(copy_path, total) if copy is not None else None
    try:
        with open_recording(path) as raw:
            stream = guarded(raw, stats)
            if on_progress is not None:
                on_progress(0, total)
            unreported = 0
            for lineno, line, rec, t in iter_records(stream, stats):
                if copy is None:
                    offsets.append(stream.tell() - len(line))  # iter_lines has just read this line
                else:
                    at = copy.tell()
                    if room is not None and at + len(line) > room[0]:
                        # A decompression bomb (or a recording too big for
                        # this disk): play what came before, say why not more.
                        stats.stopped = f"its uncompressed copy was stopped at {at >> 20} MiB ({room[1]})"
                        break
                    offsets.append(at)
                    copy.write(line)
                times.append(t)
                lines.append(lineno)
                is_sample.append(rec.__class__ is Sample)
                builder.add(rec, len(line))
                unreported += len(line)
                if on_progress is not None and unreported >= progress_every:
                    unreported = 0
                    on_progress(min(stream_position(stream), total), total)
    finally:
        if copy is not None:
            copy.close()
    if not offsets:
        why = stats.stopped or stats.first_error
        raise ValueError(f"{path}: no jaxtop records found" + (f" ({why})" if why else ""))
    if on_progress is not None:
        on_progress(total, total)
    return Index(
        data_path=copy_path if compressed and copy_path else path, pid=builder.pid,
        offsets=np.array(offsets, dtype=np.int64), times=np.array(times, dtype=np.float64),
        lines=np.array(lines, dtype=np.int64), is_sample=np.array(is_sample, dtype=bool), stats=stats,
        checkpoint_at=np.array(builder.at, dtype=np.int64), checkpoint_ends=np.array(builder.ends, dtype=np.int64),
        blob=b"".join(builder.chunks), histories=builder.histories())
