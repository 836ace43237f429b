"""The replay index: seeks from checkpoints show what playing from the start
shows; a big recording plays before its index is in; the kept index is used
again only for the recording it was built from, and only if nobody else
could have written it."""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import math
import os
import pickle
import random
import stat
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from jaxtop.wire import protocol
from jaxtop.testing import synthetic
from jaxtop.dashboard.model import REPLAY, Model
from jaxtop.dashboard.sources import ReplaySource, replay_cache, replay_index
from jaxtop.export.convert import decode
from jaxtop.widgets.panels import HeaderBar

FIXTURES = Path(__file__).parent / "fixtures"
PID = 5
T0 = 1_700_000_000.0


def clock() -> float:
    return 42.0  # one clock for every model compared: ages and staleness agree


def synthetic_recording(path: Path, count: int = 1200, devices: int = 3) -> Path:
    """Samples with buffer maps, spikes, compiles and a few odd lines."""
    lines = [protocol.encode(synthetic.hello(PID, devices, T0))]
    for i, rec in enumerate(synthetic.samples(PID, devices, T0, count, map_every=7, seed=4)):
        if i % 97 == 0:
            rec["events"] = [{"kind": "note", "text": f"event {i}", "t": rec["t"]}]
        lines.append(protocol.encode(rec))
        if i == count // 3:
            lines.append(b"{not a record\n")
    path.write_bytes(b"".join(lines))
    return path


@pytest.fixture(params=["synthetic", "demo_worker"])
def recording(request, tmp_path) -> Path:
    """A synthetic 3-device recording, and a real one: the demo workload
    recorded by the agent (jit ledger, holders, host syncs)."""
    if request.param == "synthetic":
        return synthetic_recording(tmp_path / "synthetic.jsonl")
    return FIXTURES / "demo_worker.jsonl"


@pytest.fixture
def dense_checkpoints(monkeypatch):
    """Checkpoints every few records, so that a small recording has many."""
    monkeypatch.setattr(replay_index, "CHECKPOINT_BYTES", 30_000)
    monkeypatch.setattr(replay_index, "CHECKPOINT_RECORDS", 23)
    monkeypatch.setattr(replay_index, "FOLD_BATCH", 5)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("JAXTOP_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "replay-index"


def canonical(obj, depth=0):
    """A comparable form of a model's snapshot: NaN equal to NaN, arrays as lists."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: canonical(getattr(obj, f.name), depth + 1) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): canonical(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, collections.deque)):
        return [canonical(v, depth + 1) for v in obj]
    if isinstance(obj, np.ndarray):
        return canonical(obj.tolist(), depth + 1)
    if isinstance(obj, (float, np.floating)):
        return "nan" if math.isnan(obj) else float(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def shown(model: Model, pid: int):
    """Everything the dashboard draws from a model (windows of 10 min and the
    whole run) but the source's own notices."""
    snaps = [canonical(dataclasses.replace(model.snapshot(window_s=w, now=T0), notices=())) for w in (600.0, None)]
    return snaps + [canonical(model.ledgers.view(pid))]


def played_from_the_start(src: ReplaySource, position: int) -> Model:
    """A fresh model given records ``[0, position)`` one by one, as playing does."""
    model = Model(clock=clock)
    index = src.index
    with open(index.data_path, "rb") as f:
        for i in range(position):
            f.seek(int(index.offsets[i]))
            model.feed(src.pid, decode(f.readline()))
            model.set_state(src.pid, REPLAY)
    return model


def wait_for_index(src: ReplaySource, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while src.index is None and src.index_error is None:
        assert time.monotonic() < deadline, "the index did not come"
        time.sleep(0.05)
    assert src.index_error is None, src.index_error


def wait_for_index_error(src: ReplaySource, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while src.index_error is None:
        assert src.index is None and time.monotonic() < deadline, "the indexer did not fail"
        time.sleep(0.05)


def test_a_seek_from_a_checkpoint_shows_what_playing_from_the_start_shows(recording, dense_checkpoints, monkeypatch):
    restored = []
    real_restore = replay_index.Index.restore
    monkeypatch.setattr(replay_index.Index, "restore", lambda self, k: restored.append(k) or real_restore(self, k))
    src = ReplaySource(str(recording), start_playing=False)
    model = Model(clock=clock)
    src.start(model, lambda: None)
    try:
        index = src.index
        assert len(index.checkpoint_at) > 8
        rng = random.Random(1)
        t0, t1 = float(index.times[0]), float(index.times[-1])
        targets = [t1, t0 + (t1 - t0) / 2, t0] + [rng.uniform(t0, t1) for _ in range(6)]
        for t in targets:
            src.seek(t)
            assert shown(model, src.pid) == shown(played_from_the_start(src, src.position), src.pid), t
            src.step(3)  # and playing on from there
            assert shown(model, src.pid) == shown(played_from_the_start(src, src.position), src.pid), t
        assert len(restored) >= 4  # backwards and far forwards went through checkpoints
    finally:
        src.stop()


def test_the_index_logs_rebuild_every_ring_exactly(tmp_path, dense_checkpoints):
    path = synthetic_recording(tmp_path / "r.jsonl", count=9000, devices=1)  # past the raw ring's 6,000 rows
    index = replay_index.build(str(path))
    k = len(index.checkpoint_at) - 1
    position, (proc, _, _) = index.restore(k)
    model = Model(clock=clock)
    records = [decode(line) for line in path.read_bytes().splitlines(keepends=True) if line.startswith(b"{\"")]
    model.feed_many(PID, [r for r in records[:position]])
    want = model.processes[PID].devices[0].history
    got = proc.devices[0].history
    for (_, ring_w), (_, ring_g) in zip(want._levels, got._levels):
        tw, lw, hw = ring_w.ordered()
        tg, lg, hg = ring_g.ordered()
        assert len(tw) == len(tg) and np.array_equal(tw, tg)
        assert np.array_equal(lw, lg, equal_nan=True) and np.array_equal(hw, hg, equal_nan=True)
    assert want._levels[0][1].size == 6000


def test_a_big_recording_plays_before_its_index_is_in_and_a_seek_waits_for_it(tmp_path, cache):
    path = synthetic_recording(tmp_path / "big.jsonl", count=3000)
    src = ReplaySource(str(path), start_playing=True, speed=1000.0, background_min_bytes=0)
    model = Model(clock=clock)
    assert src.index is None and src.length is None  # the indexer process has only just started
    src.start(model, lambda: None)
    try:
        t0 = src.current_t()
        middle = t0 + 150.0
        src.seek(middle)
        state = src.replay_state()
        if src.index is None:
            assert state["pending_seek"] == "0:02:30" and state["t_end"] is None and state["indexing"] is not None
        wait_for_index(src)
        deadline = time.monotonic() + 10
        while src.replay_state()["pending_seek"] is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        src.toggle() if src.playing else None
        assert src.replay_state()["indexing"] is None and src.length == 3001
        with src._lock:
            position = src.position
            assert shown(model, src.pid) == shown(played_from_the_start(src, position), src.pid)
        # It was kept: mode 0700 directory, 0600 file, named after the recording.
        kept = cache / replay_cache.index_name(str(path))
        assert kept.is_file() and stat.S_IMODE(kept.stat().st_mode) == 0o600
        assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    finally:
        src.stop()


def open_again(path: Path) -> ReplaySource:
    src = ReplaySource(str(path), start_playing=False, background_min_bytes=0)
    src.start(Model(clock=clock), lambda: None)
    return src


def test_the_kept_index_is_used_again_until_the_recording_changes(tmp_path, cache):
    path = synthetic_recording(tmp_path / "rec.jsonl", count=600)
    src = open_again(path)
    wait_for_index(src)
    src.stop()

    src = open_again(path)
    assert src.index is not None and src.index_note.startswith("index from the cache")
    src.stop()

    # Appended to (a recording still being written): built again, with the new record.
    with open(path, "ab") as f:
        f.write(protocol.encode(next(synthetic.samples(PID, 3, T0 + 1000, 1))))
    src = open_again(path)
    assert src.index is None and "changed" in src.index_note
    wait_for_index(src)
    assert src.length == 602
    src.stop()

    # Rewritten in place, same size, its time stamp put back: the last MiB's hash says so.
    data = bytearray(path.read_bytes())
    st = path.stat()
    at = data.rindex(b'"seq":')
    data[at + 6:at + 7] = b"7" if data[at + 6:at + 7] != b"7" else b"8"
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    src = open_again(path)
    assert src.index is None and "changed" in src.index_note
    wait_for_index(src)
    src.stop()


def test_a_recording_rewritten_in_the_middle_is_indexed_again(tmp_path, cache):
    """Same size, same inode, its time stamp put back, its first and last MiB
    untouched: only the middle changed, and the kept index is not used."""
    path = synthetic_recording(tmp_path / "rec.jsonl", count=1000)
    size = path.stat().st_size
    assert size > 4 * replay_cache.ENDS_BYTES  # the middle is outside the hashed ends
    src = open_again(path)
    wait_for_index(src)
    src.stop()

    # Lines from 40% to 60% of the file move up by one line; a record of the
    # same length takes its place at the end, so every offset in between moves.
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    starts = np.cumsum([0] + [len(x) for x in lines])
    i, j = int(np.searchsorted(starts, 0.4 * size)), int(np.searchsorted(starts, 0.6 * size))
    filler = {"type": "sample", "t": json.loads(lines[j - 1])["t"] + 0.01, "seq": -1, "pad": ""}
    filler["pad"] = "x" * (len(lines[i]) - len(protocol.encode(filler)))
    middle = b"".join(lines[i + 1:j]) + protocol.encode(filler)
    assert len(middle) == len(b"".join(lines[i:j]))
    st = path.stat()
    with open(path, "r+b") as f:  # in place: the same inode
        f.seek(int(starts[i]))
        f.write(middle)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == size and path.stat().st_ino == st.st_ino and path.stat().st_mtime_ns == st.st_mtime_ns

    src = open_again(path)
    try:
        # The stale index is not used. (Whether the new one is in yet is a
        # race with the indexer: the note is set before it starts.)
        assert "changed since it was indexed" in src.index_note, src.index_note
        wait_for_index(src)
        now = path.read_bytes()
        assert all(now[int(o) - 1:int(o)] == b"\n" for o in src.index.offsets[1:])  # every record starts a line
        # Seeking lands on the records the file holds now.
        for share in (0.45, 0.5, 0.55):
            at = now.index(b"\n", int(share * size)) + 1
            want = json.loads(now[at:now.index(b"\n", at)])
            src.seek(want["t"])
            assert src.model.processes[PID].latest.seq == want["seq"], share
    finally:
        src.stop()


def indexed(tmp_path, cache) -> tuple[Path, Path]:
    """A recording and its index, built and kept in the cache: (recording, index file)."""
    path = synthetic_recording(tmp_path / "rec.jsonl", count=600)
    src = open_again(path)
    wait_for_index(src)
    src.stop()
    return path, cache / replay_cache.index_name(str(path))


def test_a_damaged_index_is_built_again(tmp_path, cache):
    path, kept = indexed(tmp_path, cache)
    data = bytearray(kept.read_bytes())
    data[len(data) // 2] ^= 0xFF
    kept.write_bytes(bytes(data))
    src = open_again(path)
    assert src.index is None and "damaged" in src.index_note
    wait_for_index(src)
    src.stop()
    kept.write_bytes(kept.read_bytes()[:1000])  # cut short
    src = open_again(path)
    assert src.index is None and "damaged" in src.index_note
    src.stop()


def test_an_index_with_the_old_sha256_trailer_is_built_again_as_another_versions(tmp_path, cache):
    import hashlib

    path, kept = indexed(tmp_path, cache)
    body = kept.read_bytes()[:-20]  # without today's CRC-32 trailer
    kept.write_bytes(body + b"JAXTOPSHA256" + hashlib.sha256(body).hexdigest().encode())
    src = open_again(path)
    try:
        assert src.index is None and "another version" in src.index_note
    finally:
        src.stop()


class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


MARKER = "/tmp/jaxtop-test-replay-index-pwned"


def test_a_hostile_checkpoint_runs_nothing_and_the_seek_still_lands(tmp_path, cache, dense_checkpoints):
    if os.path.exists(MARKER):
        os.remove(MARKER)
    path = synthetic_recording(tmp_path / "rec.jsonl", count=600)
    index = replay_index.build(str(path))
    evil = zlib.compress(pickle.dumps(Payload()))
    index.blob = evil * len(index.checkpoint_at)
    index.checkpoint_ends = np.cumsum([len(evil)] * len(index.checkpoint_at)).astype(np.int64)
    cache.mkdir(parents=True, mode=0o700)
    replay_cache.save(index, str(cache / replay_cache.index_name(str(path))), replay_cache.fingerprint(str(path)))
    src = open_again(path)
    try:
        assert src.index is not None  # its checksum matches: a checksum says nothing of who wrote it
        src.seek(float(src.index.times[-1]))
        src.seek(float(src.index.times[len(src.index.times) // 2]))
        assert not os.path.exists(MARKER)
        assert any("may not build posix.system" in n for n in src.model.notices), src.model.notices
        assert shown(src.model, src.pid) == shown(played_from_the_start(src, src.position), src.pid)
    finally:
        src.stop()


def test_a_cache_directory_others_can_write_is_not_used(tmp_path, cache):
    cache.mkdir(parents=True)
    os.chmod(cache, 0o777)
    path = synthetic_recording(tmp_path / "rec.jsonl", count=300)
    src = open_again(path)
    try:
        assert "can be written by others" in src.index_note
        assert any("can be written by others" in n for n in src.model.notices)  # said on screen
        wait_for_index(src)
        assert list(cache.iterdir()) == []  # built in a private temporary directory instead
        src.seek(src.current_t() + 10)
        assert src.position > 1
    finally:
        src.stop()


def test_a_big_compressed_recording_is_indexed_into_a_copy_that_goes_at_stop(tmp_path, cache):
    plain = synthetic_recording(tmp_path / "rec.jsonl", count=600)
    path = tmp_path / "rec.jsonl.gz"
    path.write_bytes(gzip.compress(plain.read_bytes()))
    src = open_again(path)
    wait_for_index(src)
    copy = Path(src.index.data_path)
    assert copy.read_bytes() == plain.read_bytes().replace(b"{not a record\n", b"")
    assert not cache.exists() or list(cache.iterdir()) == []  # not kept: it would be many times the file
    src.stop()
    assert not copy.parent.exists()


def test_stopping_while_indexing_stops_the_indexer_and_leaves_nothing(tmp_path, cache):
    path = synthetic_recording(tmp_path / "rec.jsonl", count=6000)
    os.chmod(cache.parent.parent, 0o700) if cache.parent.parent.exists() else None
    src = ReplaySource(str(path), start_playing=False, background_min_bytes=0)
    builder = src._builder
    src.stop()
    assert builder.poll() is not None
    assert not cache.exists() or [p.name for p in cache.iterdir() if not p.name.startswith(".building-")] == []


def test_save_before_the_index_is_in_writes_the_records_played(tmp_path, cache):
    path = synthetic_recording(tmp_path / "rec.jsonl", count=300)
    src = ReplaySource(str(path), start_playing=False, background_min_bytes=0)
    src.start(Model(clock=clock), lambda: None)
    try:
        with src._lock:  # played from the file, whether or not the index came meanwhile
            src.step(5)
            out = tmp_path / "saved.jsonl"
            src.save(str(out))
        assert out.read_bytes() == b"".join(path.read_bytes().splitlines(keepends=True)[:6])
    finally:
        src.stop()


def test_an_indexer_that_fails_leaves_playback_and_says_why(tmp_path, cache):
    path = synthetic_recording(tmp_path / "rec.jsonl", count=300)
    src = ReplaySource(str(path), start_playing=False, background_min_bytes=0)
    os.remove(path)  # the indexer opens it by name; this source has it open already
    src.start(Model(clock=clock), lambda: None)
    try:
        wait_for_index_error(src)
        assert "No such file" in src.index_error
        assert any("seeking is not available" in n for n in src.model.notices)
        assert src.step(3) == 4  # playing goes on from the open file: the hello and 3 samples
    finally:
        src.stop()


def test_the_header_says_how_far_indexing_is_and_where_a_kept_seek_goes(tmp_path):
    src = ReplaySource(str(synthetic_recording(tmp_path / "rec.jsonl", count=50)), start_playing=False)
    model = Model(clock=clock)
    src.start(model, lambda: None)
    try:
        replay = dict(src.replay_state(), t_end=None, length=None, indexing=(420, 1000), pending_seek="0:02:30")
        snap = model.snapshot(replay=replay, now=T0)
        from rich.console import Console

        console = Console(width=160, record=True)
        console.print(HeaderBar().draw(snap, 160, 2))
        text = console.export_text()
        assert "/?" in text and "indexing 42%, then seek to 0:02:30" in text, text
    finally:
        src.stop()


def test_indexing_in_the_background_reports_its_progress(tmp_path, cache):
    path = synthetic_recording(tmp_path / "rec.jsonl", count=2600, devices=8)  # about 30 MB: progress every 8 MB
    size = path.stat().st_size
    src = ReplaySource(str(path), start_playing=False, background_min_bytes=0)
    seen = []
    src.start(Model(clock=clock), lambda: seen.append(src.indexing))
    try:
        wait_for_index(src)
        reports = [s for s in seen if s is not None]
        done = [d for d, _ in reports]
        assert len(set(done)) >= 3 and done == sorted(done) and all(total == size for _, total in reports)
        assert done[-1] == size and src.indexing is None
    finally:
        src.stop()


def test_an_index_too_big_to_write_leaves_playback_and_says_why(tmp_path, cache):
    """A file size limit: the indexer is killed by SIGXFSZ, as the kernel does by default."""
    import resource
    import signal

    path = synthetic_recording(tmp_path / "rec.jsonl", count=600)
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.getsignal(signal.SIGXFSZ)
    resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, old_limit[1]))  # inherited by the indexer it starts
    try:
        src = ReplaySource(str(path), start_playing=False, background_min_bytes=0)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    src.start(Model(clock=clock), lambda: None)
    try:
        wait_for_index_error(src)
        assert "SIGXFSZ" in src.index_error or "File too large" in src.index_error, src.index_error
        assert src.replay_state()["index_error"] == src.index_error
        assert any("seeking is not available" in n for n in src.model.notices)
        assert src.step(2) == 3  # playing goes on from the file
        assert [p.name for p in cache.iterdir() if not p.name.startswith(".building-")] == []
    finally:
        src.stop()


def test_a_cache_path_that_is_a_symbolic_link_is_not_followed(tmp_path, cache):
    path = synthetic_recording(tmp_path / "rec.jsonl", count=300)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    cache.parent.mkdir(parents=True)
    os.symlink(elsewhere, cache)  # planted where the cache goes
    src = open_again(path)
    try:
        assert "not a real directory" in src.index_note, src.index_note
        wait_for_index(src)
        assert list(elsewhere.iterdir()) == []
    finally:
        src.stop()


def test_no_process_for_the_indexer_leaves_playback_and_says_why(tmp_path, cache, monkeypatch):
    import errno
    import subprocess as subprocess_module

    from jaxtop.dashboard.sources import replay as replay_module

    def refused(*args, **kwargs):
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(replay_module.subprocess, "Popen", refused)
    path = synthetic_recording(tmp_path / "rec.jsonl", count=300)
    src = ReplaySource(str(path), start_playing=False, background_min_bytes=0)
    monkeypatch.setattr(replay_module.subprocess, "Popen", subprocess_module.Popen)
    src.start(Model(clock=clock), lambda: None)
    try:
        assert "could not be started" in src.index_error and src.replay_state()["indexing"] is None
        assert any("seeking is not available" in n for n in src.model.notices)
        assert src.step(2) == 3
        src.seek(src.current_t() + 5)  # no index is coming: not kept, nothing breaks
        src.seek_fraction(0.5)
        assert src.replay_state()["pending_seek"] is None and src.position == 3
    finally:
        src.stop()


def test_an_indexer_that_writes_much_to_stderr_still_finishes(tmp_path, cache, monkeypatch):
    # python -v writes 100 KB to stderr before the indexer reads a line: more
    # than a pipe holds, so a pipe read only at the end would stop it.
    monkeypatch.setenv("PYTHONVERBOSE", "1")
    path = synthetic_recording(tmp_path / "rec.jsonl", count=300)
    src = ReplaySource(str(path), start_playing=False, background_min_bytes=0)
    src.start(Model(clock=clock), lambda: None)
    try:
        wait_for_index(src, timeout=60)
        assert src.length == 301
    finally:
        src.stop()
