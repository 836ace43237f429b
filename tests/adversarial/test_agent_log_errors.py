"""Adversarial: the ``--log`` file cannot be written.

``/dev/full`` opens fine and fails every write with ENOSPC, like a disk that
fills up mid-recording. The program must not notice; the user is told once,
on the terminal's stderr and on the stream; sampling goes on.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import time

import pytest

PY = sys.executable

SCRIPT = r"""
import sys, time
print("start", flush=True)
sys.stdin.readline()  # the test watches the stream meanwhile
time.sleep(0.3)
print("user's own stderr line", file=sys.stderr, flush=True)
print("end", flush=True)
"""


def test_log_to_a_full_device_is_reported_once_and_changes_nothing(child_env, sockdir, tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(SCRIPT)
    plain = subprocess.run([PY, str(script)], env=child_env, input=b"\n", capture_output=True, timeout=60)

    proc = subprocess.Popen([PY, "-m", "jaxtop", "run", "--interval", "0.05", "--log", "/dev/full", str(script)],
                            env=child_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"start\n"
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(10)
        s.connect(str(sockdir / f"{proc.pid}.sock"))
        stream = s.makefile("rb")
        samples = []
        deadline = time.monotonic() + 20
        while len(samples) < 20 and time.monotonic() < deadline:
            rec = json.loads(stream.readline())
            if rec["type"] == "sample":
                samples.append(rec)
        s.close()
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # Sampling went on after the failure (it happens on the first record).
    seqs = [r["seq"] for r in samples]
    assert len(seqs) == 20 and seqs == list(range(seqs[0], seqs[0] + 20))
    # The stream says so, once, to whoever watches (the backfill keeps it).
    errors = [e for r in samples for e in r.get("events", []) if e.get("kind") == "error"]
    assert len(errors) == 1 and "/dev/full" in errors[0]["text"], errors
    # The program's own output and exit code are as without jaxtop; stderr
    # gains exactly one clear line, and no traceback.
    assert proc.returncode == plain.returncode == 0
    assert b"start\n" + out == plain.stdout
    notices = [line for line in err.decode().splitlines() if "/dev/full" in line]
    assert len(notices) == 1 and notices[0].startswith("jaxtop:"), err.decode()
    assert "No space left on device" in notices[0]
    assert "Traceback" not in err.decode() and "Exception ignored" not in err.decode(), err.decode()
    assert err.decode().replace(notices[0] + "\n", "") == plain.stderr.decode()


class FillingFile:
    """A log file on a disk that fills up after ``room`` bytes: the write
    that reaches the limit is cut short, every later one fails (ENOSPC)."""

    def __init__(self, path, room: int) -> None:
        self.raw = open(path, "wb", buffering=0)
        self.room = room

    def write(self, data) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = min(len(data), self.room)
        self.raw.write(bytes(data[:n]))
        self.room -= n
        return n

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        self.raw.close()


@pytest.mark.parametrize("flush_s", [0.0, 3600.0])
def test_disk_full_mid_recording_keeps_whole_lines_and_says_so_once(tmp_path, monkeypatch, flush_s):
    """Each line written as it comes, or samples held and written together
    (the agent writes its log once a second): whole lines either way."""
    from jaxtop.wire import protocol
    from jaxtop.agent import Agent
    from jaxtop.agent import log as log_module
    from jaxtop.agent.log import RecordLog

    monkeypatch.setattr(log_module, "LOG_FLUSH_S", flush_s)

    agent = Agent(capture_stderr=False, nvml=False, log_path=str(tmp_path / "run.jsonl"))
    notice_r, notice_w = os.pipe()
    try:
        log = agent.stream.log = RecordLog(str(tmp_path / "run.jsonl"), agent._log_failed)
        log.file.close()
        log.file = FillingFile(tmp_path / "run.jsonl", room=1000)
        agent._stderr_fd = notice_w  # where the notice goes: the terminal's stderr
        for seq in range(1, 40):
            agent._emit({"type": "sample", "t": time.time(), "seq": seq, "pad": "x" * 90})
        agent._close_log()  # what a stop does: the samples held are written
        raw = (tmp_path / "run.jsonl").read_bytes()
        # What was written reads cleanly: whole lines only, none cut short.
        assert raw and raw.endswith(b"\n") and len(raw) <= 1000
        stats = protocol.ReadStats()
        with open(tmp_path / "run.jsonl", "rb") as f:
            seqs = [r["seq"] for r in protocol.iter_records(f, stats)]
        assert seqs == list(range(1, len(seqs) + 1)) and not stats.truncated and not stats.malformed
        os.close(notice_w)
        notice_w = -1
        with os.fdopen(notice_r, "rb") as f:
            notice_r = -1
            notices = f.read().decode().splitlines()
        assert len(notices) == 1 and notices[0].startswith("jaxtop: cannot write the log"), notices
        assert "No space left on device" in notices[0]
        events = [e for e in agent.events if e["kind"] == "error"]
        assert len(events) == 1 and "No space left on device" in events[0]["text"]
    finally:
        for fd in (notice_r, notice_w, agent._wake_r, agent._wake_w):
            if fd >= 0:
                os.close(fd)
        agent.process.close()
