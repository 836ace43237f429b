"""Adversarial: recordings that cannot be written, outputs that are not
plain files, and recordings that are broken.

- ``jaxtop log`` into a full device, a file that hits a size limit or a full
  disk mid-recording, a pipe whose reader left (``| head -1``): one clear
  line, a non-zero exit (141, quietly, for the pipe), whole lines kept;
- ``jaxtop export -o`` into a symlink, a device, a FIFO, ``/dev/stdout``:
  written through, never replaced; no temporary file left, even on SIGTERM;
- export and replay of a gzip cut short or corrupt, random bytes, NaN times,
  values of the wrong JSON type, a 200 MB line, a big file to index;
  values of any size, type or shape, field by field, are in
  ``test_recordings_values.py``.

No JAX here: the agent is a Unix socket served by the test at its own pid's
path, which is all ``jaxtop log`` looks for.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import random
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jaxtop import cli
from jaxtop.wire import protocol
from jaxtop.dashboard.model import Model
from jaxtop.dashboard.sources import ReplaySource

PY = sys.executable
T0 = 1_000_000.0
PID = 7
MB = 1 << 20


def hello(t: float = T0, **extra) -> bytes:
    return protocol.encode({"type": "hello", "t": t, "pid": PID, "interval_s": 0.1, **extra})


def sample(seq: int, **extra) -> bytes:
    """A small sample; ``pad`` varies its length, so size limits fall mid-line."""
    rec = {"type": "sample", "t": T0 + seq * 0.01, "seq": seq,
           "devices": [{"id": 0, "platform": "cpu", "bytes_in_use": 1000 + seq}],
           "pad": "x" * (50 + seq * 37 % 300)}
    rec.update(extra)
    return protocol.encode(rec)


def recording(count: int) -> list[bytes]:
    return [hello()] + [sample(i) for i in range(1, count + 1)]


def stderr_lines(err: bytes) -> list[str]:
    return [line for line in err.decode(errors="replace").splitlines() if line.strip()]


def assert_no_traceback(err: bytes) -> None:
    text = err.decode(errors="replace")
    assert "Traceback" not in text and "Exception ignored" not in text, text


# --------------------------------------------------------------- jaxtop log

class FakeAgent:
    """A Unix socket at our own pid's path, as an agent's: sends ``lines``,
    then, with ``forever``, more samples until the reader is gone (30 s at
    most), then closes."""

    def __init__(self, sockdir: Path, lines: list[bytes], forever: bool = False) -> None:
        self.lines, self.forever = lines, forever
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(str(sockdir / f"{os.getpid()}.sock"))
        self.server.listen(1)
        self.sent: list[bytes] = []
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        self.server.settimeout(30)
        try:
            conn, _ = self.server.accept()
        except OSError:
            return
        with conn:
            try:
                for line in self.lines:
                    conn.sendall(line)
                    self.sent.append(line)
                seq = len(self.lines)
                deadline = time.monotonic() + 30
                while self.forever and time.monotonic() < deadline:
                    line = sample(seq)
                    conn.sendall(line)
                    self.sent.append(line)
                    seq += 1
                    time.sleep(0.002)
            except OSError:
                pass  # the reader left
        self.server.close()


def log_command(*args: str) -> list[str]:
    return [PY, "-m", "jaxtop", "log", str(os.getpid()), *args]


def assert_whole_lines_of(path: Path, sent: list[bytes]) -> bytes:
    """The file holds the first lines sent, each whole, and at least one."""
    data = path.read_bytes()
    assert data and data.endswith(b"\n"), data[-200:]
    kept = data.splitlines(keepends=True)
    assert kept == sent[: len(kept)]
    for line in kept:
        protocol.decode(line)
    return data


def test_log_into_a_full_device_is_reported_once_and_fails(sockdir):
    FakeAgent(sockdir, recording(50))
    res = subprocess.run(log_command("-o", "/dev/full"), capture_output=True, timeout=60)
    assert res.returncode == 1, res.stderr
    assert_no_traceback(res.stderr)
    [line] = stderr_lines(res.stderr)
    assert line.startswith("jaxtop log:") and "/dev/full" in line and "No space left on device" in line


def test_log_with_stdout_on_a_full_device_is_reported_once_and_fails(sockdir):
    FakeAgent(sockdir, recording(50))
    with open("/dev/full", "wb") as full:
        res = subprocess.run(log_command(), stdout=full, stderr=subprocess.PIPE, timeout=60)
    assert res.returncode == 1, res.stderr
    assert_no_traceback(res.stderr)
    [line] = stderr_lines(res.stderr)
    assert "stdout" in line and "No space left on device" in line


def test_log_to_dash_writes_stdout_not_a_file_named_dash(sockdir, tmp_path):
    lines = recording(5)
    FakeAgent(sockdir, lines)
    res = subprocess.run(log_command("-o", "-"), capture_output=True, timeout=60, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout == b"".join(lines)
    assert os.listdir(tmp_path) == []


LIMIT = 20_000


def limit_file_size() -> None:
    """In the child: writes past LIMIT bytes fail with EFBIG instead of a signal."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def test_log_past_a_file_size_limit_keeps_whole_lines_and_fails(sockdir, tmp_path):
    agent = FakeAgent(sockdir, recording(300))  # about 70 KB
    out = tmp_path / "rec.jsonl"
    res = subprocess.run(log_command("-o", str(out)), capture_output=True, timeout=60, preexec_fn=limit_file_size)
    assert res.returncode == 1, res.stderr
    assert_no_traceback(res.stderr)
    [line] = stderr_lines(res.stderr)
    assert str(out) in line and "File too large" in line
    agent.thread.join(10)
    data = assert_whole_lines_of(out, agent.sent)
    assert LIMIT - 1000 < len(data) <= LIMIT  # all that fitted, less the line cut in two


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_log_onto_a_disk_that_fills_up_keeps_whole_lines_and_fails(sockdir, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        agent = FakeAgent(sockdir, recording(600))  # about 140 KB
        out = mnt / "rec.jsonl"
        res = subprocess.run(log_command("-o", str(out)), capture_output=True, timeout=60)
        assert res.returncode == 1, res.stderr
        assert_no_traceback(res.stderr)
        [line] = stderr_lines(res.stderr)
        assert str(out) in line and "No space left on device" in line
        agent.thread.join(10)
        assert_whole_lines_of(out, agent.sent)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_log_piped_into_head_exits_quietly_with_141(sockdir):
    FakeAgent(sockdir, recording(5), forever=True)
    # As a shell runs `jaxtop log PID | head -1`; PIPESTATUS gives jaxtop's own status.
    script = '"$@" | head -1; exit ${PIPESTATUS[0]}'
    res = subprocess.run(["bash", "-c", script, "sh", *log_command()], capture_output=True, timeout=60)
    assert res.stdout == hello()
    assert res.stderr == b"", res.stderr.decode()
    assert res.returncode == 141


# ------------------------------------------------------------ jaxtop export -o

@pytest.fixture
def small_recording(tmp_path) -> Path:
    path = tmp_path / "rec.jsonl"
    path.write_bytes(b"".join(recording(20)))
    return path


def export(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "jaxtop", "export", *map(str, args)], capture_output=True, timeout=120, **kw)


def csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_export_through_a_symlink_replaces_its_target_and_keeps_the_link(small_recording, tmp_path):
    data, links = tmp_path / "data", tmp_path / "links"
    data.mkdir()
    links.mkdir()
    (data / "real.csv").write_text("old\n")
    os.chmod(data / "real.csv", 0o640)
    (links / "out.csv").symlink_to("../data/real.csv")
    res = export(small_recording, "--format", "csv", "-o", links / "out.csv")
    assert res.returncode == 0, res.stderr
    assert os.readlink(links / "out.csv") == "../data/real.csv"
    assert stat.S_ISREG((data / "real.csv").lstat().st_mode)
    assert stat.S_IMODE((data / "real.csv").stat().st_mode) == 0o640  # the file's mode is kept
    assert len(csv_rows((data / "real.csv").read_text())) == 20
    assert sorted(os.listdir(data)) == ["real.csv"] and sorted(os.listdir(links)) == ["out.csv"]


def test_export_through_a_dangling_symlink_creates_its_target(small_recording, tmp_path):
    (tmp_path / "link.csv").symlink_to("made.csv")
    res = export(small_recording, "--format", "csv", "-o", tmp_path / "link.csv")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "link.csv").is_symlink() and len(csv_rows((tmp_path / "made.csv").read_text())) == 20


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_export_into_a_device_writes_through_it(small_recording, tmp_path):
    # A private /dev/null (same major and minor): replacing it harms nothing.
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    link = tmp_path / "link"
    link.symlink_to(null)
    for target in (null, link):
        res = export(small_recording, "--format", "perfetto", "-o", target)
        assert res.returncode == 0, res.stderr
        assert stat.S_ISCHR(null.lstat().st_mode) and link.is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["link", "null", "rec.jsonl"]


def test_export_into_a_fifo_writes_through_it(small_recording, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    os.link(fifo, tmp_path / "spare")  # the same FIFO: unblocks the reader if the export never opens it
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    res = export(small_recording, "--format", "csv", "-o", fifo)
    reader.join(10)
    if reader.is_alive():
        os.close(os.open(tmp_path / "spare", os.O_WRONLY))
    assert res.returncode == 0, res.stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert got and len(csv_rows(got[0].decode())) == 20
    assert sorted(os.listdir(tmp_path)) == ["fifo", "rec.jsonl", "spare"]


@pytest.mark.parametrize("name", ["-", "/dev/stdout"])
def test_export_to_stdout_by_name(small_recording, capfd, monkeypatch, name):
    # In-process, with /dev guarded: as root the old code replaced /dev/stdout.
    real_replace = os.replace

    def guarded(src, dst, *args, **kw):
        if str(dst).startswith("/dev/"):
            raise AssertionError(f"export tried to replace {dst}")
        return real_replace(src, dst, *args, **kw)

    monkeypatch.setattr(os, "replace", guarded)
    assert cli.main(["export", str(small_recording), "--format", "csv", "-o", name]) == 0
    out, err = capfd.readouterr()
    assert len(csv_rows(out)) == 20 and "20 records" not in out
    assert "21 records" in err
    assert not os.path.lexists("/dev/stdout.tmp") and os.path.islink("/dev/stdout")


@pytest.mark.parametrize("when", ["created", "written"])
def test_export_killed_by_sigterm_leaves_no_temporary_file(tmp_path, when):
    # Lines with 19-digit numbers take the slow path: the export runs ~1 s.
    # SIGTERM comes as soon as the temporary file appears, or once it holds
    # 100 KB.
    src = tmp_path / "in" / "slow.jsonl"
    src.parent.mkdir()
    lines = [hello()] + [b'{"type":"sample","t":%d.5,"seq":%d,"x":1234567890123456789}\n' % (i, i)
                         for i in range(300_000)]
    src.write_bytes(b"".join(lines))
    outdir = tmp_path / "out"
    outdir.mkdir()
    (outdir / "slow.csv").write_text("old\n")
    proc = subprocess.Popen([PY, "-m", "jaxtop", "export", src, "--format", "csv", "-j", "1",
                             "-o", outdir / "slow.csv"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    def temporary_size() -> int:
        others = [name for name in os.listdir(outdir) if name != "slow.csv"]
        try:
            return os.path.getsize(outdir / others[0]) if others else -1
        except OSError:
            return -1

    threshold = 0 if when == "created" else 100_000
    deadline = time.monotonic() + 60
    while temporary_size() < threshold and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert proc.poll() is None, "the export ended before it could be killed"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert_no_traceback(err)
    assert os.listdir(outdir) == ["slow.csv"] and (outdir / "slow.csv").read_text() == "old\n"
    assert os.listdir(src.parent) == ["slow.jsonl"]


# ------------------------------------------------------ broken recordings: export

def gz_of(lines: list[bytes]) -> bytes:
    # mtime 0: the same bytes every run.
    return gzip.compress(b"".join(lines), mtime=0)


@pytest.fixture
def bulky() -> list[bytes]:
    """About 5 MB of records: several compressed blocks, so a cut loses little."""
    rng = random.Random(1)
    return [hello()] + [sample(i, noise=rng.randbytes(600).hex()) for i in range(1, 4001)]


@pytest.mark.parametrize("fmt", ["csv", "perfetto"])
def test_export_of_a_gzip_cut_in_the_middle_writes_what_was_read(tmp_path, bulky, fmt):
    packed = gz_of(bulky)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(packed[: len(packed) // 2])
    out = tmp_path / "out"
    res = export(path, "--format", fmt, "-o", out)
    assert res.returncode == 0, res.stderr
    assert_no_traceback(res.stderr)
    err = res.stderr.decode()
    assert "stopped" in err and "cut short" in err, err
    if fmt == "csv":
        rows = csv_rows(out.read_text())
        assert 1000 < len(rows) < 4000
        assert [int(r["seq"]) for r in rows] == list(range(1, len(rows) + 1))
    else:
        doc = json.loads(out.read_text())
        assert len(doc["traceEvents"]) > 1000


def test_export_of_a_corrupt_gzip_writes_what_was_read(tmp_path, bulky):
    packed = bytearray(gz_of(bulky))
    middle = len(packed) // 2
    packed[middle:middle + 64] = bytes(64)  # a run of zeros inside the deflate stream
    path = tmp_path / "bad.jsonl.gz"
    path.write_bytes(bytes(packed))
    res = export(path, "--format", "csv", "-o", tmp_path / "out.csv")
    assert res.returncode == 0, res.stderr
    assert_no_traceback(res.stderr)
    err = res.stderr.decode()
    assert "stopped" in err and "corrupt" in err, err
    rows = csv_rows((tmp_path / "out.csv").read_text())
    assert len(rows) > 1000 and [int(r["seq"]) for r in rows] == list(range(1, len(rows) + 1))


@pytest.mark.parametrize("head", [b"", b"\x1f\x8b"], ids=["plain", "gzip-magic"])
def test_export_of_random_bytes_exports_nothing_and_says_why(tmp_path, head):
    path = tmp_path / "noise.jsonl"
    path.write_bytes(head + random.Random(2).randbytes(200_000))
    res = export(path, "--format", "csv", "-o", tmp_path / "out.csv")
    assert res.returncode == 0, res.stderr
    assert_no_traceback(res.stderr)
    [line] = stderr_lines(res.stderr)
    assert "0 records" in line and ("malformed" in line or "stopped" in line), line
    assert (tmp_path / "out.csv").read_text().startswith("t,seq,pid,")


def test_export_of_deep_json_skips_it_and_goes_on(tmp_path):
    path = tmp_path / "deep.jsonl"
    deep = b'{"type":"sample","t":1,"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    path.write_bytes(b"".join([hello(), sample(1), deep, b"[" * 5000 + b"\n", sample(2)]))
    for fmt in ("csv", "perfetto"):
        res = export(path, "--format", fmt, "-o", tmp_path / f"out.{fmt}")
        assert res.returncode == 0, res.stderr
        assert_no_traceback(res.stderr)
        assert "2 malformed line(s) skipped" in res.stderr.decode()
    assert [r["seq"] for r in csv_rows((tmp_path / "out.csv").read_text())] == ["1", "2"]


# ------------------------------------------------------ broken recordings: replay

def play_to_end(path: Path, model: Model | None = None) -> tuple[ReplaySource, Model]:
    """Replay at full speed with a real model until every record was played."""
    model = model or Model()
    src = ReplaySource(str(path), speed=1000.0)
    src.start(model, lambda: None)
    deadline = time.monotonic() + 20
    while src.position < src.length and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # the last record's notices
    return src, model


def seqs_fed(model: Model) -> int | None:
    seq = model.processes[PID].latest.seq
    return int(seq) if seq is not None else None


WRONG_TYPES = [
    {"devices": [1, 2]}, {"transfers": []}, {"transfers": [1]}, {"process": "x"}, {"compile": "x"},
    {"donation": [1]}, {"devices": [{"id": [1]}]}, {"devices": [{"id": 0, "live_arrays": [1]}]},
]


def raises_in_a_model(extra: dict) -> bool:
    try:
        Model().feed(PID, protocol.decode(sample(99, **extra)))
    except Exception:  # noqa: BLE001 - any failure is what is asked about
        return True
    return False


def test_replay_survives_nan_times_and_values_of_the_wrong_type(tmp_path):
    lines = recording(5)
    lines.append(b'{"type":"sample","t":NaN,"seq":90}\n')
    lines.append(b'{"type":"sample","t":1e999,"seq":91}\n')
    lines.append(b'{"type":"sample","t":"1000000.1","seq":92}\n')
    for i, extra in enumerate(WRONG_TYPES):
        lines.append(sample(6 + i, **extra))
    tail = 6 + len(WRONG_TYPES)
    lines += [sample(i) for i in range(tail, tail + 5)]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"".join(lines))
    src, model = play_to_end(path)
    try:
        assert src.position == src.length == len(lines) - 3
        assert src._thread is not None and src._thread.is_alive()
        assert seqs_fed(model) == tail + 4  # the records after the bad ones were fed
        notices = "\n".join(model.notices)
        assert "3 malformed line(s) skipped" in notices and "line 7: no finite 't'" in notices, notices
        failing = [i for i, extra in enumerate(WRONG_TYPES) if raises_in_a_model(extra)]
        if failing:  # whatever the model still refuses is said, with its line
            assert f"line {10 + failing[0]}: the record could not be shown" in notices, notices
        if len(failing) > 1:  # and counted
            assert f"{len(failing)} record(s) could not be shown and were skipped (first on line {10 + failing[0]})" \
                in notices, notices
    finally:
        src.stop()


class FragileModel(Model):
    """A real model that fails on one record, as a model bug would."""

    def feed(self, pid, record):
        if getattr(record, "seq", None) == 3:
            raise KeyError("boom")
        super().feed(pid, record)


def test_replay_survives_a_model_that_raises_and_says_so(tmp_path):
    path = tmp_path / "rec.jsonl"
    path.write_bytes(b"".join(recording(10)))
    src, model = play_to_end(path, FragileModel())
    try:
        assert src._thread.is_alive() and seqs_fed(model) == 10
        [note] = [n for n in model.notices if "could not be shown" in n]
        assert "line 4" in note and "KeyError" in note and "boom" in note
        # Seeking back feeds it again: still one failing record, one notice.
        src.seek(T0)
        src.seek(T0 + 1)
        assert [n for n in model.notices if "could not be shown" in n] == [note]
    finally:
        src.stop()


def test_replay_of_a_corrupt_gzip_plays_what_was_read_and_says_where_it_stopped(tmp_path, bulky):
    packed = bytearray(gz_of(bulky))
    middle = len(packed) // 2
    packed[middle:middle + 64] = bytes(64)
    path = tmp_path / "bad.jsonl.gz"
    path.write_bytes(bytes(packed))
    src = ReplaySource(str(path), start_playing=False)
    try:
        assert 1000 < src.length < 4001
        assert any("stopped" in n and "corrupt" in n for n in src.notices()), src.notices()
    finally:
        src.stop()


@pytest.mark.parametrize("head", [b"", b"\x1f\x8b"], ids=["plain", "gzip-magic"])
def test_replay_of_random_bytes_is_refused_in_one_line(tmp_path, head):
    path = tmp_path / "noise.jsonl"
    path.write_bytes(head + random.Random(3).randbytes(100_000))
    res = subprocess.run([PY, "-m", "jaxtop", "replay", str(path)], capture_output=True, stdin=subprocess.DEVNULL,
                         timeout=60)
    assert res.returncode == 2
    assert_no_traceback(res.stderr)
    [line] = stderr_lines(res.stderr)
    assert "no jaxtop records" in line


# --------------------------------------------- a 200 MB line: memory stays flat

# Runs the code in a grandchild and reports its peak RSS. A process's peak
# RSS counts the memory of the process it was forked from (the kernel keeps
# the high-water mark across exec), so the code runs under a small Python
# started for the purpose, never straight under this test, which may hold
# hundreds of MB.
_MEASURE = """
import json, resource, subprocess, sys
rc = subprocess.call([sys.executable, "-c", sys.argv[1]])
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
with open(sys.argv[2], "w") as f:
    json.dump({"rc": rc, "peak_kb": peak}, f)
"""


def child_peak_rss_mb(code: str, tmp_path: Path) -> tuple[float, int, bytes, bytes]:
    """Run ``code`` in a fresh Python; its peak RSS (MB), status, stdout, stderr."""
    report = tmp_path / "rss.json"
    res = subprocess.run([PY, "-c", _MEASURE, code, str(report)], capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr
    measured = json.loads(report.read_text())
    return measured["peak_kb"] / 1024, measured["rc"], res.stdout, res.stderr


@pytest.fixture(scope="module")
def giant_line(tmp_path_factory) -> tuple[Path, Path]:
    """A recording with one 200 MB line between good records, plain and gzip."""
    base = tmp_path_factory.mktemp("giant")
    plain = base / "giant.jsonl"
    with open(plain, "wb") as f:
        f.write(hello() + sample(1))
        f.write(b'{"type":"sample","t":1000000.015,"seq":99,"pad":"')
        chunk = b"x" * (8 * MB)
        f.writelines(chunk for _ in range(25))
        f.write(b'"}\n' + sample(2))
    packed = base / "giant.jsonl.gz"
    with open(plain, "rb") as src, gzip.open(packed, "wb", compresslevel=1) as dst:
        shutil.copyfileobj(src, dst, 8 * MB)
    return plain, packed


@pytest.mark.parametrize("kind", ["plain", "gzip"])
def test_a_200mb_line_is_skipped_by_replay_in_bounded_memory(giant_line, kind, tmp_path):
    path = giant_line[0] if kind == "plain" else giant_line[1]
    # Indexed in this process (a big recording is indexed by a separate
    # process, running this same code), so that its memory is measured.
    code = ("from jaxtop.dashboard.sources import ReplaySource\n"
            f"s = ReplaySource({str(path)!r}, start_playing=False, background_min_bytes=1 << 40)\n"
            "print(s.length, s.stats.malformed, s.stats.errors[0]); s.stop()")
    rss, rc, out, err = child_peak_rss_mb(code, tmp_path)
    assert rc == 0, err
    assert out.decode().split(maxsplit=2) == ["3", "1", "line 3: line too long\n"]
    assert rss < 200, rss


@pytest.mark.parametrize("kind", ["plain", "gzip"])
def test_a_200mb_line_is_skipped_by_export_in_bounded_memory(giant_line, kind, tmp_path):
    path = giant_line[0] if kind == "plain" else giant_line[1]
    out = tmp_path / "out.csv"
    code = f"import sys; from jaxtop import cli; sys.exit(cli.main(['export', {str(path)!r}, '--format', 'csv', '-o', {str(out)!r}]))"
    rss, rc, _, err = child_peak_rss_mb(code, tmp_path)
    assert rc == 0, err
    assert "1 malformed line(s) skipped (first: line 3: line too long)" in err.decode()
    assert [r["seq"] for r in csv_rows(out.read_text())] == ["1", "2"]
    assert rss < 200, rss


def test_a_200mb_line_is_left_out_by_log_in_bounded_memory(sockdir, tmp_path):
    giant = b'{"type":"sample","t":1000000.015,"seq":99,"pad":"' + b"x" * (200 * MB) + b'"}\n'
    agent = FakeAgent(sockdir, [hello(), sample(1), giant, sample(2)])
    del giant
    out = tmp_path / "rec.jsonl"
    code = (f"import sys; from jaxtop import cli; sys.exit(cli.main(['log', '{os.getpid()}', '-o', {str(out)!r}]))")
    rss, rc, _, err = child_peak_rss_mb(code, tmp_path)
    agent.thread.join(10)
    assert rc == 0, err
    assert out.read_bytes() == hello() + sample(1) + sample(2)
    assert rss < 200, rss
