"""`jaxtop replay` of a compressed recording writes an uncompressed copy to
seek in (gzip cannot seek). A small file that expands without end (valid
lines repeated: gzip takes them down ~1000x) filled TMPDIR: 2.5 GB after
90 s, 8 GiB in all. The reading now stops once 64 MiB came out at over 100x
the compressed bytes they came from (the copy also stops at 100x the
compressed size, or where it would leave under 1 GiB free), and what came
before plays, with the reason."""

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
    # The reading itself stops within the first 64 MiB that expand past 100x
    # (no recording of jaxtop's does), before the copy's own bound.
    assert (32 << 20) <= copied <= (65 << 20) < max(64 << 20, 100 * compressed), copied
    assert index.stats.stopped and "decompression bomb" in index.stats.stopped
    assert len(index.offsets) > 100_000  # what came before plays
