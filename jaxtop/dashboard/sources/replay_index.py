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
threads share one core for Python code); the index is kept in the user's
cache directory (:func:`cache_dir`), under a name made from the recording's
path, and used again only while the recording is the one it was built
from: same size, modification time, inode and first and last MiB, built by
the same index format and the same model code. Anything else about it,
missing, stale, cut short, corrupt or hostile, means it is built again.

Pickle runs code named by the file it reads, so checkpoints are read with
an unpickler that builds only the model's own classes, numpy arrays and
plain containers (:class:`_ModelUnpickler`), from a directory that must be
the user's own and closed to others, and after the whole file's SHA-256
matched the one stored with it.
"""

from __future__ import annotations

import bisect
import hashlib
import io
import json
import math
import os
import pickle
import stat
import struct
import sys
import tempfile
import time
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterator

import numpy as np

from jaxtop import protocol
from jaxtop.dashboard import history as history_module
from jaxtop.dashboard import holders as holders_module
from jaxtop.dashboard import ledger as ledger_module
from jaxtop.dashboard import model as model_module
from jaxtop.dashboard.history import History, HistoryLog
from jaxtop.dashboard.model import REPLAY, Model
from jaxtop.export.convert import decode, guarded, open_recording

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
#: The cache holds at most this many bytes of indexes; the least recently
#: used go first.
CACHE_MAX_BYTES = 2 << 30
#: Bytes of the recording's start and end whose hash the index keeps.
ENDS_BYTES = 1 << 20

OnProgress = Callable[[int, int], None]


# -- reading records ---------------------------------------------------------------

def iter_records(stream: IO[bytes], stats: protocol.ReadStats) -> Iterator[tuple[int, bytes, dict[str, Any], float]]:
    """``(line number, line, record, time)`` for every playable record.

    A line that is not a record, or has no finite time, is skipped and noted
    in ``stats`` (NaN or inf would make every gap, seek and time shown after
    it NaN); so is an oversized or truncated line (``protocol.iter_lines``).
    The index and a replay playing before its index is ready count records
    with this one function, so their positions agree.
    """
    for lineno, line in protocol.iter_lines(stream, stats):
        try:
            rec = decode(line)
        except protocol.ProtocolError as exc:
            stats.note(lineno, str(exc))
            continue
        t = finite(rec.get("t"))
        if t is None:
            stats.note(lineno, "no finite 't'")
            continue
        stats.records += 1
        yield lineno, line, rec, t


def finite(value: Any) -> float | None:
    """A JSON number as a finite float, or None (NaN, inf, too big, not a number)."""
    if not protocol.is_number(value):
        return None
    try:
        value = float(value)
    except OverflowError:  # an integer beyond a float's range
        return None
    return value if math.isfinite(value) else None


def first_pid(rec: dict[str, Any]) -> int:
    """The pid a replay shows: the first record's, if it is a hello."""
    if rec.get("type") != protocol.HELLO:
        return 0
    pid = finite(rec.get("pid"))
    return int(pid) if pid is not None and 0 < pid < 1 << 62 else 0


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
}
_MODEL_MODULES = {m.__name__: m for m in (model_module, holders_module, ledger_module, history_module)}


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
        self.pending: list[dict[str, Any]] = []
        self.since_bytes = 0
        self.since_records = 0
        self.at: list[int] = []
        self.ends: list[int] = []
        self.chunks: list[bytes] = []
        self.blob_size = 0
        self.records = 0

    def _new_history(self, names: tuple[str, ...]) -> History:
        history = History(names)
        history.log = HistoryLog(len(history.levels))
        history.log_key = len(self.logs)  # type: ignore[attr-defined]
        self.logs.append(history)
        return history

    def add(self, rec: dict[str, Any], nbytes: int) -> None:
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
    copy = open(copy_path, "wb") if compressed and copy_path else None
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
                    offsets.append(copy.tell())
                    copy.write(line)
                times.append(t)
                lines.append(lineno)
                is_sample.append(rec.get("type") == protocol.SAMPLE)
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


# -- keeping it --------------------------------------------------------------------

def cache_dir() -> Path:
    """Where indexes are kept: ``$JAXTOP_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/jaxtop``, else ``~/.cache/jaxtop``; then ``replay-index``."""
    override = os.environ.get("JAXTOP_CACHE_DIR")
    if override:
        base = Path(override)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg) / "jaxtop" if xdg else Path.home() / ".cache" / "jaxtop"
    return base / "replay-index"


def private_cache_dir() -> tuple[Path | None, str | None]:
    """The cache directory, created mode 0700 if missing, or None and why it
    cannot be used: it must be a real directory of ours that group and
    others cannot write (an index is trusted only where nobody else could
    have put it)."""
    path = cache_dir()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        return None, f"cannot create the index cache {path}: {exc.strerror or exc}"
    if not stat.S_ISDIR(st.st_mode):
        return None, f"the index cache {path} is not a directory"
    if st.st_uid != os.getuid():
        return None, f"the index cache {path} is not yours"
    if stat.S_IMODE(st.st_mode) & 0o022:
        return None, f"the index cache {path} can be written by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return path, None


def index_name(path: str) -> str:
    """The cache file name for the recording at ``path`` (by its real path)."""
    return hashlib.sha256(os.path.realpath(path).encode("utf-8", "surrogateescape")).hexdigest()[:32] + ".npz"


def fingerprint(path: str) -> dict[str, Any]:
    """What tells whether a recording is still the one an index was built from."""
    st = os.stat(path)
    with open(path, "rb") as f:
        head = hashlib.sha256(f.read(ENDS_BYTES)).hexdigest()
        f.seek(max(0, st.st_size - ENDS_BYTES))
        tail = hashlib.sha256(f.read(ENDS_BYTES)).hexdigest()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "dev": st.st_dev, "head": head, "tail": tail,
            "realpath": os.path.realpath(path)}


def code_fingerprint() -> str:
    """A hash of the code whose objects the checkpoints hold: an index built
    by other code is built again rather than misread."""
    h = hashlib.sha256(f"{INDEX_FORMAT}:{protocol.JAXTOP_VERSION}".encode())
    for module in (history_module, model_module, holders_module, ledger_module, sys.modules[__name__]):
        try:
            with open(module.__file__ or "", "rb") as f:
                h.update(f.read())
        except OSError:
            h.update(module.__name__.encode())
    return h.hexdigest()


def save(index: Index, path: str, recording: dict[str, Any]) -> None:
    """Write ``index`` to ``path`` atomically (a reader never sees half a file)."""
    meta = {
        "format": INDEX_FORMAT, "code": code_fingerprint(), "recording": recording, "pid": index.pid,
        "stats": {"records": index.stats.records, "malformed": index.stats.malformed, "truncated": index.stats.truncated,
                  "stopped": index.stats.stopped, "first_error": index.stats.first_error, "errors": index.stats.errors},
        "histories": {str(k): {"names": list(names), "levels": [list(lv) for lv in levels]}
                      for k, (names, levels, _) in index.histories.items()},
    }
    arrays: dict[str, np.ndarray] = {
        "meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
        "offsets": index.offsets, "times": index.times, "lines": index.lines, "is_sample": index.is_sample,
        "checkpoint_at": index.checkpoint_at, "checkpoint_ends": index.checkpoint_ends,
        "blob": np.frombuffer(index.blob, dtype=np.uint8),
    }
    for key, (_, _, rows) in index.histories.items():
        for li, (t, lo, hi) in enumerate(rows):
            arrays[f"h{key}_{li}_t"], arrays[f"h{key}_{li}_lo"] = t, lo
            if hi is not None:
                arrays[f"h{key}_{li}_hi"] = hi
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".building-", suffix=".npz", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        digest = _file_sha256(tmp)
        with open(tmp, "ab") as f:  # the digest of everything before it, after the zip (readers ignore trailing bytes)
            f.write(b"JAXTOPSHA256" + digest.encode())
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise


def _file_sha256(path: str, limit: int | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        left = limit
        while left is None or left > 0:
            block = f.read(1 << 20 if left is None else min(1 << 20, left))
            if not block:
                break
            h.update(block)
            if left is not None:
                left -= len(block)
    return h.hexdigest()


#: The digest's trailer: marker and 64 hex digits.
_TRAILER = len(b"JAXTOPSHA256") + 64


def load(path: str, recording: str, data_path: str | None = None,
         allow_growth: bool = False) -> tuple[Index | None, str | None]:
    """The index at ``path`` for ``recording``, or None and why it cannot be used.

    Never raises for what the file holds: a missing, stale, cut short,
    corrupt or hostile index is only a reason to build it again.

    Args:
        allow_growth: Take the index of a recording that has only grown
            since (written to while it was indexed, by ``jaxtop log``): the
            index covers what was there. A kept index is never taken so: it
            would never show what came after.
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            f.seek(max(0, size - _TRAILER))
            trailer = f.read()
        if not trailer.startswith(b"JAXTOPSHA256") or _file_sha256(path, size - _TRAILER).encode() != trailer[12:]:
            return None, "the index is damaged (its checksum does not match)"
        npz = _mapped_members(path)
        meta = json.loads(bytes(npz["meta"]).decode())
        if meta.get("format") != INDEX_FORMAT or meta.get("code") != code_fingerprint():
            return None, "the index was built by another version of jaxtop"
        if not _same_recording(meta.get("recording"), recording, allow_growth):
            return None, "the recording changed since it was indexed"
        s = meta["stats"]
        stats = protocol.ReadStats(records=int(s["records"]), malformed=int(s["malformed"]), truncated=bool(s["truncated"]),
                                   stopped=s["stopped"], first_error=s["first_error"], errors=list(s["errors"]))
        histories = {}
        for key, h in meta["histories"].items():
            levels = tuple((float(step), int(cap)) for step, cap in h["levels"])
            rows = [(npz[f"h{key}_{li}_t"], npz[f"h{key}_{li}_lo"], npz.get(f"h{key}_{li}_hi")) for li in range(len(levels))]
            histories[int(key)] = (tuple(h["names"]), levels, rows)
        index = Index(
            data_path=data_path or recording, pid=int(meta["pid"]),
            offsets=npz["offsets"], times=npz["times"], lines=npz["lines"], is_sample=npz["is_sample"], stats=stats,
            checkpoint_at=npz["checkpoint_at"], checkpoint_ends=npz["checkpoint_ends"], blob=npz["blob"],
            histories=histories)
    except FileNotFoundError:
        return None, "not indexed yet"
    except (OSError, ValueError, KeyError, TypeError, struct.error, zipfile.BadZipFile, json.JSONDecodeError) as exc:
        return None, f"the index cannot be read ({type(exc).__name__}: {exc})"
    if not (len(index.offsets) == len(index.times) == len(index.lines) == len(index.is_sample) > 0
            and len(index.checkpoint_at) == len(index.checkpoint_ends)):
        return None, "the index is inconsistent"
    return index, None


def _mapped_members(path: str) -> dict[str, np.ndarray]:
    """The arrays of an uncompressed ``.npz``, mapped from the file rather
    than read: a seek touches a few pages of the histories' logs, and the
    dashboard's memory does not grow by the index's size. (The file is only
    ever replaced, never rewritten in place, so a mapping stays valid.)"""
    out: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            if info.compress_type != zipfile.ZIP_STORED or not info.filename.endswith(".npy"):
                raise ValueError(f"unexpected member {info.filename!r}")
            f.seek(info.header_offset)
            local = f.read(30)
            if local[:4] != b"PK\x03\x04":
                raise ValueError("bad zip member header")
            name_len, extra_len = struct.unpack("<HH", local[26:30])
            f.seek(info.header_offset + 30 + name_len + extra_len)
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            if dtype.hasobject:
                raise ValueError("object arrays are not read")
            count = int(np.prod(shape)) if shape else 1
            if f.tell() + count * dtype.itemsize > info.header_offset + 30 + name_len + extra_len + info.file_size:
                raise ValueError(f"member {info.filename!r} is shorter than its header says")
            key = info.filename[:-4]
            if count == 0:
                out[key] = np.empty(shape, dtype)
            else:
                out[key] = np.memmap(path, dtype=dtype, mode="r", offset=f.tell(), shape=shape, order="F" if fortran else "C")
    return out


def _same_recording(then: Any, path: str, allow_growth: bool) -> bool:
    now = fingerprint(path)
    if then == now:
        return True
    if not (allow_growth and isinstance(then, dict) and then.get("head") == now["head"]
            and then.get("ino") == now["ino"] and then.get("dev") == now["dev"]):
        return False
    size = then.get("size")
    if not isinstance(size, int) or not 0 <= size <= now["size"]:
        return False
    with open(path, "rb") as f:  # the bytes that ended the file then are still there
        f.seek(max(0, size - ENDS_BYTES))
        return hashlib.sha256(f.read(size - max(0, size - ENDS_BYTES))).hexdigest() == then.get("tail")


def prune(directory: Path, keep: str, max_bytes: int = CACHE_MAX_BYTES) -> None:
    """Keep the cache under ``max_bytes``: the least recently used indexes go
    first (never ``keep``); half-written files older than an hour go too."""
    try:
        entries = []
        now = time.time()
        for entry in os.scandir(directory):
            st = entry.stat(follow_symlinks=False)
            if entry.name.startswith(".building-") and now - st.st_mtime > 3600:
                _remove_quietly(entry.path)
            elif entry.name.endswith(".npz") and stat.S_ISREG(st.st_mode):
                entries.append((max(st.st_atime, st.st_mtime), st.st_size, entry.path))
        total = sum(size for _, size, _ in entries)
        for _, size, p in sorted(entries):
            if total <= max_bytes:
                break
            if os.path.basename(p) != keep:
                _remove_quietly(p)
                total -= size
    except OSError:
        pass


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


# -- the separate process ----------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """``python -m jaxtop.dashboard.sources.replay_index RECORDING OUT [COPY]``:
    index RECORDING into OUT (an index file), printing ``progress DONE TOTAL``
    lines; a compressed recording's uncompressed copy goes to COPY."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        print("usage: python -m jaxtop.dashboard.sources.replay_index RECORDING OUT [COPY]", file=sys.stderr)
        return 2
    recording, out = args[0], args[1]
    copy = args[2] if len(args) == 3 else None

    def progress(done: int, total: int) -> None:
        print(f"progress {done} {total}", flush=True)

    try:
        # Taken first: a recording that grows while it is indexed (still
        # being written) is then seen as changed when it is opened again.
        before = fingerprint(recording)
        index = build(recording, copy, progress)
        save(index, out, before)
    except (OSError, ValueError) as exc:
        print(f"error {exc}", flush=True)
        return 1
    prune(Path(os.path.dirname(out) or "."), os.path.basename(out))
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
