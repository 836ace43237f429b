"""The live session's spool: lines compressed on a writer thread, in order,
bounded in memory, and never a reason for the session to stop."""

from __future__ import annotations

import gzip
import io
import threading
import time

import pytest

from jaxtop.dashboard.sources import spool as spool_mod
from jaxtop.dashboard.sources.spool import Spool, copy_gzip_lines


def _lines(n: int, width: int = 200) -> list[bytes]:
    return [b'{"type":"sample","seq":%d,"pad":"%s"}\n' % (i, b"x" * (i % width)) for i in range(n)]


def test_a_flush_sees_every_line_written_before_it_in_order(tmp_path):
    path = str(tmp_path / "s.jsonl.gz")
    s = Spool(path)
    lines = _lines(5000)
    for i in range(0, len(lines), 37):
        s.write(b"".join(lines[i:i + 37]))
    s.flush()
    out = io.BytesIO()
    copy_gzip_lines(path, out)  # the spool is still open, as when `w` saves a running session
    assert out.getvalue() == b"".join(lines)
    s.close()
    with gzip.open(path, "rb") as f:
        assert f.read() == b"".join(lines)


def test_the_queue_is_bounded_a_writer_waits_for_the_compressor(tmp_path, monkeypatch):
    monkeypatch.setattr(spool_mod, "MAX_PENDING_BYTES", 1000)
    s = Spool(str(tmp_path / "s.gz"))
    gate = threading.Event()
    slow = s._compress

    def held(data: bytes) -> None:
        gate.wait(5)
        slow(data)

    monkeypatch.setattr(s, "_compress", held)
    s.write(b"a" * 2000 + b"\n")  # over the bound, queued: the next write must wait
    second = threading.Thread(target=s.write, args=(b"b\n",))
    second.start()
    time.sleep(0.2)
    assert second.is_alive()  # held back while 2,000 bytes wait
    gate.set()
    second.join(5)
    assert not second.is_alive()
    s.close()
    with gzip.open(str(tmp_path / "s.gz"), "rb") as f:
        assert f.read() == b"a" * 2000 + b"\nb\n"


def test_a_full_disk_ends_the_spool_quietly(tmp_path, monkeypatch):
    monkeypatch.setattr(spool_mod.paths, "create_output", lambda path: open("/dev/full", "wb"))  # fails at its first flush
    s = Spool(str(tmp_path / "s.gz"))
    for line in _lines(2000):
        s.write(line * 20)  # incompressible enough to reach the file
    s.flush()
    assert isinstance(s.failed, OSError)
    s.write(b"more\n")  # after the failure: no error, nothing queued
    assert s._pending == 0
    s.close()


def test_a_close_that_must_not_wait_drops_what_is_queued(tmp_path, monkeypatch):
    s = Spool(str(tmp_path / "s.gz"))
    gate = threading.Event()
    slow = s._compress
    monkeypatch.setattr(s, "_compress", lambda data: (gate.wait(5), slow(data)))
    s.write(b"queued\n")
    began = time.monotonic()
    s.close(wait=False)  # a signal handler's close: the compressor is stuck
    assert time.monotonic() - began < 1.0
    gate.set()
    with pytest.raises(ValueError):
        s.write(b"late\n")
