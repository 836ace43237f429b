"""The stderr relay is killed while the program runs.

The relay is a separate process; it can die (the OOM killer, a `kill -9`
aimed at the wrong pid). The program must not notice: its writes to stderr
keep succeeding, nothing it writes is lost, transfers are still counted, and
the recording says what happened.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import PY, TARGETS, wait_for
from jaxtop.wire import protocol

psutil = pytest.importorskip("psutil")


def _relay_of(pid: int) -> "psutil.Process":
    def find():
        for child in psutil.Process(pid).children():
            try:
                if any(part.endswith("_relay.py") for part in child.cmdline()):
                    return child
            except psutil.Error:
                continue
        return None

    return wait_for(find, timeout=20, what="the relay process")


def _dead(relay: psutil.Process) -> bool:
    """Gone or a zombie. The process can be reaped between the two reads, so
    a vanished one is dead too."""
    try:
        return not relay.is_running() or relay.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _run(cmd, env, kill: bool):
    proc = subprocess.Popen(cmd, cwd=TARGETS, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n", proc.stderr.read()[-2000:]
        if kill:
            relay = _relay_of(proc.pid)
            relay.kill()
            # Not our child: it stays a zombie until the program reaps it.
            wait_for(lambda: _dead(relay), timeout=10, what="the relay's death")
        out, err = proc.communicate(b"go\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, b"ready\n" + out, err


def _killed_run(child_env, tmp_path):
    """The target under `jaxtop run --log`, its relay killed mid-run: (exit
    code, stdout, stderr, samples of the recording)."""
    log = tmp_path / "run.jsonl"
    code, out, err = _run([PY, "-m", "jaxtop", "run", "--log", str(log), "relay_killed.py"], child_env, kill=True)
    assert code == 0, err[-3000:]
    with open(log, "rb") as f:
        samples = [r for r in protocol.iter_records(f) if r["type"] == "sample"]
    assert samples[-1].get("final") is True
    return code, out, err, samples


@pytest.mark.slow
def test_program_outlives_its_relay(child_env, tmp_path):
    code, out, err, samples = _killed_run(child_env, tmp_path)
    plain = _run([PY, "relay_killed.py"], child_env, kill=False)
    assert (code, out, err) == plain  # every byte, in order, nothing raised
    # Counting went on with a new relay: every transfer is in the total.
    assert samples[-1]["transfers"]["h2d"]["count_total"] == int(out.split()[-1])


@pytest.mark.slow
def test_relay_death_is_on_the_stream(child_env, tmp_path):
    # An event the dashboard shows: the agent passes the capture's notices on
    # (StderrCapture's on_notice) with post_event.
    *_, samples = _killed_run(child_env, tmp_path)
    events = [e for s in samples for e in s.get("events") or []]
    assert any("relay" in (e.get("text") or "") and "restarted" in e["text"] for e in events), events


H2D = b"W1203 19:57:01.063419   17029 guard_lib.cc:125] host-to-device transfer: \n"
D2H = b"W1203 19:57:01.063420   17029 guard_lib.cc:125] device-to-host transfer: \n"
CAPTURE = f"H2D, D2H = {H2D!r}, {D2H!r}\n" + """
import os, sys, time
from jaxtop.probes.stderr_capture import StderrCapture
notices = []
cap = StderrCapture(lambda m, n: None, on_notice=notices.append)
cap.start()
cap.set_visibility({"h2d"}, "")  # the user's own guard logs h2d: those lines are theirs
os.write(2, b"one\\n")
assert cap.sync(5)
pid = cap.relay_pid
os.kill(pid, 9)
while open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
    time.sleep(0.01)  # dead (a zombie until the capture reaps it)
os.write(2, b"two\\n")  # before the capture noticed: into the pipe, not EPIPE
deadline = time.monotonic() + 10
while not notices and time.monotonic() < deadline:
    cap.read_reports()
    time.sleep(0.05)
os.write(2, b"three\\n")
os.write(2, H2D)  # the new relay knows what the user sees
os.write(2, D2H)
assert cap.sync(5)
cap.stop()
print(notices)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_capture_restarts_a_killed_relay_and_says_so():
    res = subprocess.run([PY, "-c", CAPTURE], capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stderr == b"one\ntwo\nthree\n" + H2D
    assert b"relay" in res.stdout and b"restarted" in res.stdout
