"""Someone else's recording, census or program cannot drive the terminal.

A program's argv, the names of its jitted functions, the files that
allocated, its exception messages and the shapes it logs are chosen by
whoever wrote the program (or the recording, or the census file). Each test
here plants escape sequences in all of them and reads the raw bytes jaxtop
writes: every screen of the dashboard through a real pseudo-terminal, and
the text commands. No planted sequence may arrive as bytes a terminal
obeys; each must arrive shown (``\\x1b``, ``\\x9b``).
"""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from conftest import PY

FIXTURES = Path(__file__).parents[1] / "fixtures"

#: Sequences a terminal obeys: window title (OSC 0), clipboard write (OSC 52),
#: a cursor-position report typed back (CSI 6n), clear screen, and the C1
#: forms of CSI and OSC (no ESC at all), a bidi override.
PAYLOAD = "\x1b]0;PWNED-TITLE\x07\x1b]52;c;UFdORUQ=\x07\x1b[6n\x1b[2J\x9b6n\x9d0;PWNED-C1\x9c\u202e"
#: What must never reach the terminal as bytes.
OBEYED = (b"\x1b]0;PWNED", b"\x1b]52;c;UFdORUQ", b"\x1b[6n", b"\xc2\x9b", b"\xc2\x9d", "\u202e".encode())
#: What each payload shows as instead (a part of it, escaped).
SHOWN = b"\\x1b]0;PWNED-TITLE"

#: Keys whose string values are the program's (or a recording writer's) own.
PROGRAM_TEXT = {"name", "call_site", "site", "file", "function", "message", "text", "shape", "fingerprint",
                "defined_at", "label", "exception", "via", "call_fn", "host", "job"}


def _plant(value, key=None):
    if isinstance(value, str):
        return (value[:2] + PAYLOAD + value[2:]) if key in PROGRAM_TEXT or key == "argv" else value
    if isinstance(value, list):
        return [_plant(v, key if key in ("argv", "stack") else None) for v in value]
    if isinstance(value, dict):
        return {k: _plant(v, k) for k, v in value.items()}
    return value


def hostile_recording(path: Path) -> Path:
    """The chip's training-loop recording and OOM census, with the payload
    in every string the program chose."""
    with gzip.open(FIXTURES / "tpu" / "training-loop.jsonl.gz", "rt") as f:
        records = [json.loads(line) for line in f]
    census = json.loads((FIXTURES / "tpu" / "oom-census.json").read_text())
    census["t"] = records[-2]["t"]
    census["pid"] = records[0]["pid"]
    records.insert(len(records) - 1, census)
    with open(path, "w") as out:
        for rec in records:
            out.write(json.dumps(_plant(rec)) + "\n")
    return path


def _obeyed(raw: bytes) -> list[bytes]:
    return [seq for seq in OBEYED if seq in raw]


def _pty_run(argv: list[str], keys: list[bytes], env: dict[str, str], cols: int = 120, rows: int = 40,
             settle_s: float = 1.5) -> bytes:
    """Run ``argv`` on a pseudo-terminal, type ``keys`` one by one with a
    pause after each, and return every byte it wrote."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command on the terminal
        try:
            os.execvpe(argv[0], argv, env)
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    out = bytearray()

    def drain(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], 0.05)
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    return
                if not chunk:
                    return
                out.extend(chunk)

    try:
        drain(6.0)
        for key in keys:
            os.write(fd, key)
            drain(settle_s)
        os.write(fd, b"q")
        drain(2.0)
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        os.close(fd)
    return bytes(out)


@pytest.fixture
def env(sockdir):
    out = dict(os.environ, TERM="xterm-256color", COLUMNS="120", LINES="40", JAX_PLATFORMS="cpu")
    out.pop("PYTEST_CURRENT_TEST", None)
    return out


def test_every_screen_of_a_hostile_recording_shows_the_escapes_and_obeys_none(tmp_path, env):
    recording = hostile_recording(tmp_path / f"rec{PAYLOAD[:4]}.jsonl")
    jaxtop = [PY, "-m", "jaxtop"]
    # Seek into the run, then every screen: jit ledger, holders, OOM, help,
    # the last profile, the overview, and back.
    keys = [b" ", b"]", b"]", b"]", b"]", b"J", b"\x1b", b"H", b"\x1b", b"O", b"\x1b", b"?", b"\x1b", b"p", b"\x1b",
            b"o", b"o", b"\x1b[F"]
    raw = _pty_run([*jaxtop, "replay", str(recording)], keys, env)
    assert len(raw) > 10_000, raw[-2000:]  # the dashboard drew
    assert not _obeyed(raw), _obeyed(raw)
    assert SHOWN in raw.replace(b"\x1b[", b"")  # shown, not dropped (the cells may be styled apart)


def test_text_commands_show_the_escapes_and_obey_none(tmp_path, env):
    recording = hostile_recording(tmp_path / "rec.jsonl")
    census = tmp_path / "census.json"
    census.write_text(json.dumps(_plant(json.loads((FIXTURES / "tpu" / "oom-census.json").read_text())), indent=1))
    jaxtop = [PY, "-m", "jaxtop"]
    outputs = {
        "oom census": subprocess.run([*jaxtop, "oom", str(census)], capture_output=True, env=env, timeout=60),
        "oom recording": subprocess.run([*jaxtop, "oom", str(recording)], capture_output=True, env=env, timeout=60),
    }
    for name, proc in outputs.items():
        assert proc.returncode == 0, (name, proc.stderr[-2000:])
        raw = proc.stdout + proc.stderr
        assert not _obeyed(raw), (name, _obeyed(raw))
        assert b"\\x1b]0;PWNED-TITLE" in raw, name
    # export to a terminal: the program's strings shown; into a pipe: as recorded.
    for fmt in ("csv", "holders-csv", "labels-csv", "host-syncs-csv", "perfetto"):
        raw = _pty_run([*jaxtop, "export", str(recording), "--format", fmt, "-o", "-"], [], env, settle_s=0.1)
        assert not _obeyed(raw), (fmt, _obeyed(raw))
    piped = subprocess.run([*jaxtop, "export", str(recording), "--format", "csv", "-o", "-"], capture_output=True,
                           env=env, timeout=60)
    assert piped.returncode == 0


def test_snapshot_text_of_a_hostile_stream_obeys_none():
    """`jaxtop snapshot` prints the model's views: fed the hostile records."""
    from jaxtop.dashboard.snapshot_text import snapshot_text as _text
    from jaxtop.dashboard.model import Model

    model = Model(clock=lambda: 0.0)
    with gzip.open(FIXTURES / "tpu" / "training-loop.jsonl.gz", "rt") as f:
        for line in f:
            model.feed(1, _plant(json.loads(line)))
    text = _text(model.snapshot(now=0.0)).encode()
    assert not _obeyed(text), _obeyed(text)
    assert b"\\x1b]0;PWNED-TITLE" in text


def test_ls_shows_a_program_s_hostile_argv(tmp_path, env, sockdir):
    """A running program named with escapes: `jaxtop ls` lists it shown."""
    script = tmp_path / "p.py"
    script.write_text("import sys, time, jaxtop\njaxtop.instrument()\nprint('up', flush=True)\ntime.sleep(30)\n")
    child = subprocess.Popen([PY, str(script), PAYLOAD], env=env, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"up"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            ls = subprocess.run([PY, "-m", "jaxtop", "ls"], capture_output=True, env=env, timeout=60)
            if str(child.pid).encode() in ls.stdout:
                break
            time.sleep(0.2)
        assert str(child.pid).encode() in ls.stdout, ls.stdout
        assert not _obeyed(ls.stdout + ls.stderr), _obeyed(ls.stdout)
        assert b"\\x1b]0;PWNED-TITLE" in ls.stdout
    finally:
        child.kill()
        child.wait()
