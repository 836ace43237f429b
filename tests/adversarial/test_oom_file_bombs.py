"""`jaxtop oom` on files that would take the machine's memory: a census
file (one JSON document) far larger than any census, compressed to almost
nothing, and a recording with one enormous line. Both are refused or
skipped in bounded memory, with one line saying why."""

from __future__ import annotations

import gzip
import resource
import subprocess
import sys
import time

from conftest import PY

GiB = 1 << 30


def _peak_rss_after(argv: list[str]) -> tuple[subprocess.CompletedProcess, int]:
    """Run ``argv`` in a child of its own; its peak RSS in bytes."""
    probe = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True); "
             "sys.stdout.buffer.write(p.stdout); sys.stderr.buffer.write(p.stderr); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(p.returncode)")
    proc = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, timeout=300)
    *rest, peak = proc.stderr.decode().strip().splitlines()
    proc.stderr = "\n".join(rest).encode()
    return proc, int(peak) * 1024


def _bomb(path, head: bytes, nbytes: int, tail: bytes = b"") -> None:
    chunk = b"x" * (1 << 20)
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(head)
        for _ in range(nbytes // len(chunk)):
            f.write(chunk)
        f.write(tail)


def test_a_compressed_json_document_of_a_gibibyte_is_refused_in_bounded_memory(tmp_path):
    path = tmp_path / "census.json.gz"
    _bomb(path, b'{\n "type": "oom_census",\n "pad": "', 1 * GiB, b'"\n}\n')
    proc, peak = _peak_rss_after([PY, "-m", "jaxtop", "oom", str(path)])
    assert proc.returncode == 2, proc.stderr[-500:]
    assert b"no OOM census" in proc.stderr and b"Traceback" not in proc.stderr
    assert peak < 400 << 20, peak  # was the whole document, twice (4.25 GB for a 2 GiB line)


def test_a_recording_with_a_line_of_a_gibibyte_keeps_what_came_before_and_says_why_no_more(tmp_path):
    """A gibibyte of one repeated byte expands 1000x: no recording of
    jaxtop's does (13 to 30x). Reading stops within its first 64 MiB, the
    census before it is shown, one line says why the rest is not read (it
    used to read the whole gibibyte: a 54 MB bomb held it for minutes)."""
    path = tmp_path / "rec.jsonl.gz"
    census = (b'{"type":"oom_census","t":1.0,"id":"1-1","pid":1,"verdict":"the pool is full",'
              b'"request":{"bytes":1024},"devices":[]}\n')
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(b'{"type":"hello","t":0.5,"pid":1,"argv":["x.py"]}\n')
        f.write(census)
        f.write(b'{"type":"sample","t":0.6,"pad":"')
        chunk = b"x" * (1 << 20)
        for _ in range(1024):
            f.write(chunk)
        f.write(b'"}\n')
        f.write(census.replace(b"the pool is full", b"after the bomb"))
    t0 = time.monotonic()
    proc, peak = _peak_rss_after([PY, "-m", "jaxtop", "oom", str(path)])
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-500:]
    assert b"the pool is full" in proc.stdout and b"after the bomb" not in proc.stdout
    assert b"decompression bomb" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert peak < 400 << 20, peak
    assert took < 30, took
