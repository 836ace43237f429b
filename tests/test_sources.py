"""Sources without the app: a recording plain or gzip-compressed, and the
replay controls every source has."""

from __future__ import annotations

import gzip
import os
import tempfile

import pytest

from jaxtop.wire import protocol
from jaxtop.testing import synthetic
from jaxtop.dashboard.model import Model
from jaxtop.dashboard.sources import LiveSource, PushSource, ReplaySource

T0 = 1_000_000.0
PID = 3


def recording_bytes(count: int = 100) -> bytes:
    """A recording with what real ones hold: blank and malformed lines."""
    lines = [protocol.encode(synthetic.hello(PID, 1, T0)), b"\n"]
    for i, rec in enumerate(synthetic.samples(PID, 1, T0, count)):
        lines.append(protocol.encode(rec))
        if i == count // 2:
            lines.append(b"{garbage line\n")
    return b"".join(lines)


@pytest.fixture
def recordings(tmp_path):
    """The same recording twice: plain, and gzip-compressed."""
    data = recording_bytes()
    plain = tmp_path / "rec.jsonl"
    plain.write_bytes(data)
    packed = tmp_path / "rec.jsonl.gz"
    with gzip.open(packed, "wb") as f:
        f.write(data)
    return str(plain), str(packed)


def started(path: str) -> ReplaySource:
    src = ReplaySource(path, start_playing=False)
    src.start(Model(), lambda: None)
    return src


def view(src: ReplaySource) -> tuple:
    """What a replay shows at its position: the records played and the model's state."""
    proc = src.model.snapshot().processes[0]
    return src.position, src.current_t(), proc.seq, proc.process, proc.state


def played(src: ReplaySource, tmp_path, name: str) -> bytes:
    """The records played so far, as ``save`` writes them."""
    out = tmp_path / name
    src.save(str(out))
    return out.read_bytes()


def test_a_gzip_recording_replays_and_seeks_like_its_plain_copy(recordings, tmp_path):
    plain, packed = (started(path) for path in recordings)
    try:
        assert (packed.length, packed.pid) == (plain.length, plain.pid) == (101, PID)
        assert packed.stats == plain.stats and packed.stats.malformed == 1
        # Forwards, backwards (a rebuild from the start), a step, the end.
        for move in (lambda s: s.seek(T0 + 3.0), lambda s: s.seek(T0 + 7.5), lambda s: s.seek(T0 + 1.0),
                     lambda s: s.step(3), lambda s: s.seek(T0 + 100.0)):
            assert move(packed) == move(plain)
            assert view(packed) == view(plain)
            assert played(packed, tmp_path, "packed.jsonl") == played(plain, tmp_path, "plain.jsonl")
        assert view(plain)[2] == 100  # the last sample's seq: the end was reached
    finally:
        plain.stop()
        packed.stop()


def test_the_uncompressed_copy_goes_on_stop(recordings, tmp_path, monkeypatch):
    os.mkdir(tmp_path / "tmp")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    src = started(recordings[1])
    assert len(os.listdir(tmp_path / "tmp")) == 1
    src.stop()
    assert os.listdir(tmp_path / "tmp") == []
    # A plain recording is read in place: no copy.
    src = started(recordings[0])
    assert os.listdir(tmp_path / "tmp") == []
    src.stop()


def test_a_gzip_recording_cut_short_keeps_its_whole_records(tmp_path):
    data = recording_bytes()
    packed = gzip.compress(data)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(packed[: len(packed) * 2 // 3])  # the writer was killed
    src = started(str(path))
    try:
        assert src.stats.truncated
        assert any("truncated" in note for note in src.notices())
        assert 1 < src.length < 101
        src.seek(T0 + 1000)
        assert view(src)[2] == src.length - 1  # the hello, then samples 1..n
    finally:
        src.stop()


def test_an_oversized_line_is_skipped_and_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(protocol, "MAX_RECORD_LINE_BYTES", 8192)
    data = recording_bytes(10)
    huge = b'{"type":"sample","t":1000000.05,"pad":"' + b"x" * 20_000 + b'"}\n'
    for name, write in (("big.jsonl", lambda p, d: p.write_bytes(d)),
                        ("big.jsonl.gz", lambda p, d: p.write_bytes(gzip.compress(d)))):
        path = tmp_path / name
        write(path, data + huge + protocol.encode({"type": "exit", "t": T0 + 2}))
        src = ReplaySource(str(path), start_playing=False)
        assert src.length == 12 and src.stats.malformed == 2  # the garbage line and the long one
        assert any("line too long" in e for e in src.stats.errors)
        src.stop()


def test_a_file_without_records_is_refused_and_leaves_no_copy(tmp_path, monkeypatch):
    os.mkdir(tmp_path / "tmp")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    path = tmp_path / "empty.jsonl.gz"
    path.write_bytes(gzip.compress(b"not a record\n"))
    with pytest.raises(ValueError, match="no jaxtop records"):
        ReplaySource(str(path))
    assert os.listdir(tmp_path / "tmp") == []


@pytest.mark.parametrize("make", [PushSource, lambda: LiveSource([os.getpid()])], ids=["push", "live"])
def test_replay_controls_are_no_ops_where_nothing_plays(make):
    # LiveSource defines none of them: what it inherits must do nothing.
    src = make()
    assert (src.replays, src.live) == (False, True)
    assert src.toggle() is None
    assert src.step(1) is None
    assert src.seek(T0) is None
    assert src.seek_by(10) is None
    assert src.current_t() is None
    assert src.scale_speed(2) is None
    assert src.replay_state() is None
    src.stop()


def test_replay_controls_answer_on_a_recording(recordings):
    src = started(recordings[0])
    try:
        assert (src.replays, src.live) == (True, False)
        assert src.toggle() is True and src.toggle() is False
        assert src.scale_speed(2) == 2.0 and src.scale_speed(0.25) == 0.5
        assert src.seek(T0 + 5.0) == src.current_t() <= T0 + 5.0
        assert src.seek_by(-2.0) == src.current_t() <= T0 + 3.0
        position = src.position
        assert src.step(1) > position
    finally:
        src.stop()


def test_empty_like_is_an_empty_model_on_the_same_clock():
    ticks = iter(range(100, 200))
    model = Model(clock=lambda: next(ticks))
    model.feed(PID, synthetic.hello(PID, 1, T0))
    twin = model.empty_like()
    assert twin.processes == {}
    twin.feed(PID, synthetic.hello(PID, 1, T0))
    assert twin.processes[PID].last_recv == 101  # the next tick of the shared clock


@pytest.mark.parametrize("indexed", [False, True])
def test_a_replay_opens_on_its_first_sample_not_on_the_programs_start_up(tmp_path, indexed):
    """The hello comes when the agent starts, the first sample when the
    program has a backend: often seconds later. A replay plays what comes
    before its first sample at once (a gap is waited for up to 1 s: the
    first sample must come well before that), and the gaps between samples
    as they were (the second is not shown within the test)."""
    import time

    hello = synthetic.hello(7, 1, 1000.0)
    samples = list(synthetic.samples(7, 1, 1030.0, 2, interval_s=30.0))
    path = tmp_path / "slow-start.jsonl"
    path.write_bytes(b"".join(protocol.encode(r) for r in [hello, *samples]))
    if indexed:  # the same once the index is in (a replay opened again)
        first = ReplaySource(str(path), start_playing=False)
        first.start(Model(), lambda: None)
        deadline = time.monotonic() + 20
        while first.index is None and time.monotonic() < deadline:
            time.sleep(0.02)
        first.stop()
    src = ReplaySource(str(path), start_playing=True)
    model = Model()
    src.start(model, lambda: None)
    try:
        deadline = time.monotonic() + 0.6
        while time.monotonic() < deadline and not (model.processes.get(src.pid) and model.processes[src.pid].samples):
            time.sleep(0.01)
        proc = model.processes.get(src.pid)
        assert proc is not None and proc.samples == 1, "the first sample waited for the hello's gap"
        assert proc.latest.seq == samples[0]["seq"]
    finally:
        src.stop()
