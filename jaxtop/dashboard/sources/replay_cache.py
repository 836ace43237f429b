"""Keeping a recording's index (:mod:`replay_index`) between openings.

The index is kept in the user's cache directory (:func:`cache_dir`), under a
name made from the recording's path, and used again only while the
recording is the one it was built from: same size, modification time, inode,
first and last MiB and :data:`SAMPLED_BLOCKS` blocks spread over the rest
(:func:`fingerprint`), built by the same index format and the same model
code. Anything else about it, missing, stale, cut short, corrupt or hostile,
means it is built again.

Pickle runs code named by the file it reads, so checkpoints are read with
an unpickler that builds only the model's own classes, numpy arrays and
plain containers (``replay_index._ModelUnpickler``), from a directory that
must be the user's own and closed to others, and after the whole file's
SHA-256 matched the one stored with it.

Run as ``python -m jaxtop.dashboard.sources.replay_cache`` it is the
separate process that builds an index (:func:`main`).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import signal
import stat
import struct
import sys
import time
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from jaxtop import advice
from jaxtop.wire import paths, protocol, records
from jaxtop.dashboard import model as model_module
from jaxtop.dashboard.sources import replay_index
from jaxtop.dashboard.sources.replay_index import INDEX_FORMAT, Index, build

#: The cache holds at most this many bytes of indexes; the least recently
#: used go first.
CACHE_MAX_BYTES = 2 << 30
#: Bytes of the recording's start and end whose hash the index keeps.
ENDS_BYTES = 1 << 20
#: Blocks at fixed places between them whose hash it keeps too: a recording
#: rewritten in the middle (same size; time stamp and inode put back) is
#: seen as changed, where the rewrite covers one of them. For a 1 GiB
#: recording the 64 blocks took 0.4 ms with its pages cached and 2.5-4 ms
#: read from disk (pages dropped with posix_fadvise), the whole fingerprint
#: (the two MiB of its ends too) 2-3 ms and 8-14 ms (5 Dec, a 2-core VM).
#: A rewrite of a few bytes between two blocks is not seen: the notice of a
#: kept index says what it was checked by.
SAMPLED_BLOCKS = 64
SAMPLED_BLOCK_BYTES = 4096


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
    try:
        path = cache_dir()
    except (RuntimeError, KeyError) as exc:  # no $HOME and no passwd entry
        return None, f"no cache directory ({exc}): set JAXTOP_CACHE_DIR"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        return None, f"cannot create the index cache {path}: {exc.strerror or exc}"
    if not stat.S_ISDIR(st.st_mode):
        return None, f"the index cache {path} is not a real directory (a symbolic link or a file)"
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
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        head = hashlib.sha256(f.read(ENDS_BYTES)).hexdigest()
        f.seek(max(0, st.st_size - ENDS_BYTES))
        tail = hashlib.sha256(f.read(ENDS_BYTES)).hexdigest()
        blocks = sampled_blocks(f, st.st_size)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "dev": st.st_dev, "head": head, "tail": tail,
            "blocks": blocks, "realpath": os.path.realpath(path)}


def sampled_blocks(f: Any, size: int) -> str:
    """The hash of :data:`SAMPLED_BLOCKS` blocks of the first ``size`` bytes of
    the open file ``f``, at offsets spread evenly from its start to its end
    (the same offsets for the same size: a grown recording is checked at
    the offsets of the size it was indexed at)."""
    h = hashlib.sha256()
    last = max(0, size - SAMPLED_BLOCK_BYTES)
    for i in range(SAMPLED_BLOCKS):
        offset = last * i // (SAMPLED_BLOCKS - 1)
        f.seek(offset)
        h.update(f.read(min(SAMPLED_BLOCK_BYTES, size - offset)))
    return h.hexdigest()


def code_fingerprint() -> str:
    """A hash of the code whose objects the checkpoints hold: an index built
    by other code is built again rather than misread."""
    h = hashlib.sha256(f"{INDEX_FORMAT}:{protocol.JAXTOP_VERSION}".encode())
    # Every module of the model's package, of the wire and of its record
    # types (the model is
    # split over views, readings, backlog, batch, events...: a change to any
    # of them may change what a checkpoint holds), and the indexer itself.
    files: list[str] = []
    for module in (model_module, protocol, records, advice):
        folder = os.path.dirname(module.__file__ or "")
        try:
            files += sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".py"))
        except OSError:
            h.update(module.__name__.encode())
    files += [replay_index.__file__ or "", __file__]
    for path in files:
        try:
            with open(path, "rb") as f:
                h.update(f.read())
        except OSError:
            h.update(path.encode())
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
    # Named .building-*: prune() removes one an indexer killed midway left.
    with paths.replacing(path, "w+b", temp_prefix=".building-", perms=0o600) as f:
        np.savez(f, **arrays)
        f.flush()
        f.seek(0)
        crc = 0
        for chunk in iter(lambda: f.read(1 << 22), b""):
            crc = _crc32(chunk, crc)
        # The checksum of everything before it, after the zip (readers ignore trailing bytes).
        f.write(_MARK + b"%08x" % crc)


def _crc32(data: Any, value: int = 0) -> int:
    """CRC-32 of ``data`` (bytes or a buffer): ISA-L's (the ``isal``
    package) where installed, ~10 GB/s; zlib's, ~4 GB/s, where not."""
    try:
        from isal.isal_zlib import crc32
    except ImportError:
        return zlib.crc32(data, value)
    return crc32(data, value)


def _file_crc32(path: str, limit: int) -> int:
    """CRC-32 of the first ``limit`` bytes of ``path``, read mapped."""
    if limit <= 0:
        return 0
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        with memoryview(mapped) as view:
            return _crc32(view[:limit])


#: The trailer: a marker and the CRC-32 of the file before it, 8 hex digits.
#: A damage check (a file cut short, a bad block: rebuilt, not read), as
#: the SHA-256 before it was, at a tenth of the time: it is read at every
#: open, and a day's index is ~1 GB (SHA-256 took 0.58 s of a 0.6 s open).
#: No checksum says who wrote a file: what it holds is checked as it is read.
_MARK = b"JAXTOPCRC32:"
_TRAILER = len(_MARK) + 8
#: The trailer of jaxtop versions before it: an index to build again.
_OLD_MARK = b"JAXTOPSHA256"


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
            f.seek(max(0, size - 76))
            tail = f.read()
        if tail[-76:].startswith(_OLD_MARK):
            return None, "the index was built by another version of jaxtop"
        trailer = tail[-_TRAILER:]
        if not trailer.startswith(_MARK) or b"%08x" % _file_crc32(path, size - _TRAILER) != trailer[len(_MARK):]:
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
    with open(path, "rb") as f:  # the bytes that ended the file then, and the blocks of then, are still there
        f.seek(max(0, size - ENDS_BYTES))
        if hashlib.sha256(f.read(size - max(0, size - ENDS_BYTES))).hexdigest() != then.get("tail"):
            return False
        return sampled_blocks(f, size) == then.get("blocks")


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


def tail_of(path: str, limit: int = 4096) -> str:
    """The end of a text file, stripped ('' if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - limit))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def exit_reason(rc: int) -> str:
    """How the indexer ended, in words (a signal by its name: SIGXFSZ is a
    file size limit, SIGKILL often the out-of-memory killer)."""
    if rc < 0:
        try:
            return f"the indexer was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"the indexer was killed by signal {-rc}"
    return f"the indexer exited with status {rc}"


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


# -- the separate process ----------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """``python -m jaxtop.dashboard.sources.replay_cache RECORDING OUT [COPY]``:
    index RECORDING into OUT (an index file), printing ``progress DONE TOTAL``
    lines; a compressed recording's uncompressed copy goes to COPY."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        print("usage: python -m jaxtop.dashboard.sources.replay_cache RECORDING OUT [COPY]", file=sys.stderr)
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
