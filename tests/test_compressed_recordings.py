"""Real: recordings compressed as they are written (``*.gz``), by the agent
(``jaxtop run --log``) and by the recorder (``jaxtop log -o``), read back by
gzip itself and by jaxtop's own readers, whole or cut short by a kill."""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import time
import zlib
from pathlib import Path

from conftest import PY, jaxtop_cmd

TARGETS = Path(__file__).parent / "targets"


def _records(path: Path) -> list[dict]:
    """Every whole line gzip can give back (a stream cut short ends early)."""
    out, data = [], b""
    z = zlib.decompressobj(16 + zlib.MAX_WBITS)
    data = z.decompress(path.read_bytes())
    for line in data.split(b"\n")[:-1]:
        out.append(json.loads(line))
    return out


def test_agent_and_recorder_write_gzip_that_every_reader_opens(targets, child_env, tmp_path):
    run_log = tmp_path / "run.jsonl.gz"
    proc = targets.run("--log", run_log, TARGETS / "loop.py", "--seconds", "6")
    targets.wait_ready(proc)
    rec = subprocess.run([PY, "-m", "jaxtop", "log", str(proc.pid), "-o", str(tmp_path / "rec.jsonl.gz"),
                          "--duration", "3"], env=child_env, capture_output=True, timeout=60)
    assert rec.returncode == 0, rec.stderr.decode()
    assert proc.wait(timeout=60) == 0
    for path in (run_log, tmp_path / "rec.jsonl.gz"):
        with gzip.open(path) as f:  # a complete gzip file: trailer and all
            records = [json.loads(line) for line in f]
        samples = [r for r in records if r["type"] == "sample"]
        assert records[0]["type"] == "hello" and len(samples) > 15
        seqs = [r["seq"] for r in samples]
        assert seqs == sorted(seqs)
        out = jaxtop_cmd("export", path, "--format", "csv", "-o", tmp_path / (path.name + ".csv"), env=child_env)
        assert out.returncode == 0, out.stderr.decode()
        assert len((tmp_path / (path.name + ".csv")).read_text().splitlines()) > 15
    assert any(r["type"] == "exit" for r in _records(run_log))


def test_a_killed_program_leaves_a_compressed_log_that_reads_to_its_last_second(targets, child_env, tmp_path):
    log = tmp_path / "killed.jsonl.gz"
    proc = targets.run("--log", log, TARGETS / "loop.py", "--seconds", "60")
    targets.wait_ready(proc)
    time.sleep(4)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    records = _records(log)  # no gzip trailer: the stream is cut, but flushed each second
    samples = [r for r in records if r["type"] == "sample"]
    assert len(samples) >= 20
    out = jaxtop_cmd("export", log, "--format", "csv", "-o", tmp_path / "killed.csv", env=child_env)
    assert out.returncode == 0, out.stderr.decode()
    rows = (tmp_path / "killed.csv").read_text().splitlines()
    assert len(rows) - 1 >= len(samples)  # a row per sample and device, each sample kept
