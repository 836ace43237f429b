"""`jaxtop replay` of a compressed recording writes an uncompressed copy to
seek in (gzip cannot seek). A small file that expands without end (valid
lines repeated: gzip takes them down ~1000x) filled TMPDIR: 2.5 GB after
90 s, 8 GiB in all. The copy now stops at 100x the compressed size (64 MiB
at least) or where it would leave under 1 GiB free, and what came before
plays, with the reason."""

from __future__ import annotations

import gzip
import os

from jaxtop.dashboard.sources import replay_index

LINE = b'{"type":"sample","t":%d.5,"seq":%d,"devices":[],"pad":"' + b"x" * 60 + b'"}\n'


def test_the_copy_of_a_compressed_bomb_stops_at_its_bound(tmp_path):
    src = tmp_path / "bomb.jsonl.gz"
    with gzip.open(src, "wb", compresslevel=6) as f:
        f.write(b'{"type":"hello","t":1.0,"pid":7,"argv":["x.py"],"interval_s":0.1}\n')
        block = (LINE % (1000, 1)) * 10_000  # one sample, over and over: ~1000x smaller compressed
        for _ in range(300):  # ~300 MB uncompressed
            f.write(block)
    compressed = os.path.getsize(src)
    assert compressed < 2 << 20  # 300 MB in about 1 MB
    index = replay_index.build(str(src), str(tmp_path / "copy.jsonl"))
    copied = os.path.getsize(tmp_path / "copy.jsonl")
    assert (32 << 20) <= copied <= max(64 << 20, 100 * compressed) < (300 << 20), copied
    bound, why = replay_index.copy_room(str(tmp_path / "copy.jsonl"), compressed)
    assert copied <= bound
    assert index.stats.stopped and "uncompressed copy was stopped" in index.stats.stopped and why in index.stats.stopped
    assert len(index.offsets) > 100_000  # what came before plays


def test_a_bomb_that_the_copys_bound_would_let_through_stops_at_the_guard(tmp_path, monkeypatch):
    """A big bomb (54 MB of gzip, 8 GiB of lines) passes the copy's ratio
    bound (100x: 5.4 GB): the reading itself stops once it has expanded past
    100x for EXPANSION_RUN_BYTES in a row. Here the guard's sizes are made
    small, so that a small file shows it."""
    from jaxtop.export import convert

    monkeypatch.setattr(convert, "EXPANSION_MIN_BYTES", 4 << 20)
    monkeypatch.setattr(convert, "EXPANSION_RUN_BYTES", 32 << 20)
    monkeypatch.setattr(replay_index, "COPY_MAX_RATIO", 10_000)  # as if the file were big
    src = tmp_path / "bomb.jsonl.gz"
    with gzip.open(src, "wb", compresslevel=9) as f:
        f.write(b'{"type":"hello","t":1.0,"pid":7,"argv":["x.py"],"interval_s":0.1}\n')
        block = (LINE % (1000, 1)) * 10_000
        for _ in range(200):  # ~200 MB uncompressed
            f.write(block)
    index = replay_index.build(str(src), str(tmp_path / "copy.jsonl"))
    copied = os.path.getsize(tmp_path / "copy.jsonl")
    assert copied <= (32 + 8) << 20, copied
    assert index.stats.stopped and "decompression bomb" in index.stats.stopped
    assert len(index.offsets) > 100_000  # what came before plays
