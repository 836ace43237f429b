"""Adversarial: a forked child keeps the descriptors of the stderr capture.

``os.fork()`` copies every descriptor, close-on-exec or not, and a child
that does not exec keeps them for as long as it lives. The capture holds
four of its own besides fd 2: a spare read end of the fd-2 pipe (so that the
program's writes wait in the pipe, not fail, while the parent starts a new
relay), the relay's report pipe, the kick pipe that wakes the relay, and a
copy of the original stderr. A child's copies are the parent's: the child
restarts no relay and reads no report. Kept, they turned a gone reader into
a child that waits forever on a full pipe, kept the relay (and through it
the original stderr) alive after its last writer left, and hid a relay's
death from the parent.

Each program runs without jax (the windows are jaxtop's, not JAX's) and
ends its children itself.
"""

from __future__ import annotations

import subprocess
import sys

PY = sys.executable

#: The relay is killed after the parent gave fd 2 back: the child is then
#: the pipe's last writer, and nobody reads it any more.
CHILD_WRITES_AFTER_THE_RELAY_IS_GONE = r"""
import os, signal, sys
import jaxtop

h = jaxtop.instrument(interval_s=0.05)
capture = h.agent.capture
assert capture is not None and capture.active, "stderr is not captured"
go_r, go_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(go_w)
    os.read(go_r, 1)
    signal.alarm(5)  # a write that waits for a reader that never comes: SIGALRM ends the child
    try:
        for _ in range(64):
            os.write(2, b"x" * 65536)  # 4 MiB: more than the pipe holds
    except OSError:  # EPIPE (or EIO from a pseudo-terminal): nobody reads, as without jaxtop
        os._exit(0)
    os._exit(3)  # every byte taken: something still reads the pipe
os.close(go_r)
relay = capture._relay
h.stop()  # fd 2 back; the relay goes on draining for the child
relay.kill()
relay.wait()
os.write(go_w, b"g")
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), flush=True)
"""


def test_a_child_whose_relay_is_gone_sees_epipe_rather_than_waiting_forever(child_env, tmp_path):
    script = tmp_path / "child_writes.py"
    script.write_text(CHILD_WRITES_AFTER_THE_RELAY_IS_GONE)
    with open(tmp_path / "stderr", "wb") as err:
        run = subprocess.run([PY, str(script)], env=child_env, stdout=subprocess.PIPE, stderr=err, timeout=60)
    assert run.returncode == 0, (tmp_path / "stderr").read_bytes()[-2000:]
    # -14 (SIGALRM): the child's copy of the capture's spare read end kept
    # the pipe open, so its writes waited for a relay that was gone.
    assert run.stdout.split() == [b"child", b"0"], run.stdout


#: A child daemonises the usual way (fds 0-2 to /dev/null, the others left
#: open) after writing transfer-guard lines the parent no longer reads the
#: reports of. The parent then exits; the child lives on.
DAEMON_CHILD = r"""
import os, sys, time
import jaxtop

h = jaxtop.instrument(interval_s=0.05)
go_r, go_w = os.pipe()
done_r, done_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(go_w)
    os.close(done_r)
    os.read(go_r, 1)
    os.close(go_r)
    # As jax writes them, one distinct message each: the relay reports every
    # one on its report pipe (far more than the pipe's 64 KiB).
    for i in range(4000):
        os.write(2, b"W0101 00:00:00.000000    1 guard_lib.cc:125] host-to-device transfer: "
                    b"aval=f32[%d], sharding=SingleDeviceSharding\n" % i)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    os.write(done_w, b"d")
    os.close(done_w)
    time.sleep(30)
    os._exit(0)
os.close(go_r)
os.close(done_w)
h.stop()  # the agent stops reading the relay's reports
os.write(go_w, b"g")
os.read(done_r, 1)
print("daemon", pid, flush=True)
"""


def test_a_daemonised_child_does_not_keep_the_original_stderr_open(child_env, tmp_path):
    """The parent's caller reads the parent's stderr to its end: it must end
    when the parent exits, not when a daemon child that left stderr does."""
    script = tmp_path / "daemon.py"
    script.write_text(DAEMON_CHILD)
    proc = subprocess.Popen([PY, str(script)], env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    daemon = None
    try:
        out = proc.stdout.readline()
        assert out.startswith(b"daemon "), (out, proc.stderr.read()[-2000:] if proc.poll() is not None else b"")
        daemon = int(out.split()[1])
        # The parent has exited or is about to. Before, stderr stayed open
        # until the daemon's exit: its copy of the original stderr, and the
        # relay waiting forever to hand its last reports to the report pipe
        # the daemon held open and never read.
        try:
            rest, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            raise AssertionError("the parent's stderr stayed open while its daemonised child lived") from None
        assert proc.returncode == 0, err[-2000:]
        assert b"transfer:" not in err  # the guard lines were jaxtop's to count, and were
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if daemon is not None:
            _kill_quietly(daemon)


#: The program forks while the capture starts its relay, between making the
#: relay's pipes and closing the relay's ends of them. Here the same thread
#: forks, at that very point, so that it happens every time.
FORK_WHILE_THE_RELAY_STARTS = r"""
import os, subprocess, sys, time

real_popen = subprocess.Popen
forked = []


def popen_after_a_fork(*args, **kwargs):
    pid = os.fork()
    if pid == 0:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the test reads stdout to its end
        time.sleep(30)  # lives on with whatever else it inherited
        os._exit(0)
    forked.append(pid)
    return real_popen(*args, **kwargs)


subprocess.Popen = popen_after_a_fork
import jaxtop

try:
    h = jaxtop.instrument(interval_s=0.05)
finally:
    subprocess.Popen = real_popen
assert len(forked) == 1, forked
capture = h.agent.capture
first = capture.relay_pid
capture._relay.kill()
deadline = time.monotonic() + 5
while capture.relay_pid == first and time.monotonic() < deadline:
    time.sleep(0.05)
print("relay", "restarted" if capture.relay_pid != first else "not-restarted", forked[0], flush=True)
h.stop()
"""


def test_a_relay_death_is_seen_although_a_child_forked_while_it_started(child_env, tmp_path):
    """The parent learns that its relay died from the end of the report pipe;
    a child holding the relay's end of it hid that, and the program's
    stderr would have filled the pipe with nobody to read it."""
    script = tmp_path / "fork_in_spawn.py"
    script.write_text(FORK_WHILE_THE_RELAY_STARTS)
    with open(tmp_path / "stderr", "wb") as err:
        run = subprocess.run([PY, str(script)], env=child_env, stdout=subprocess.PIPE, stderr=err, timeout=60)
    words = run.stdout.split()
    try:
        assert run.returncode == 0, (tmp_path / "stderr").read_bytes()[-2000:]
        assert words[:2] == [b"relay", b"restarted"], run.stdout
    finally:
        if len(words) == 3:
            _kill_quietly(int(words[2]))


def test_the_relay_ends_with_its_stream_though_its_reports_are_never_read(tmp_path):
    """The relay's last reports are handed over for a moment, not forever:
    a process may hold the report pipe without reading it (a stopped agent,
    a child's copy), and the relay holds the original stderr, whose reader
    waits for its end."""
    import os

    from jaxtop.probes import _relay

    report_r, report_w = os.pipe()
    out_fd = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        proc = subprocess.Popen(
            [PY, "-S", "-E", "-s", _relay.__file__, str(out_fd), str(report_w), "0123456789abcdef", "|", "pipe"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(out_fd, report_w), bufsize=0,
        )
    finally:
        os.close(out_fd)
        os.close(report_w)
    try:
        # Distinct guard lines: one report each, far more than the report
        # pipe holds; we keep its read end and never read it.
        proc.stdin.write(b"".join(b"W0101 00:00:00.000000    1 guard_lib.cc:125] host-to-device transfer: "
                                  b"aval=f32[%d], sharding=SingleDeviceSharding\n" % i for i in range(4000)))
        proc.stdin.write(b"the last line\n")
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            raise AssertionError("the relay waited forever to hand over reports nobody reads") from None
        assert proc.returncode == 0
        assert (tmp_path / "out").read_bytes() == b"the last line\n"  # forwarded, guard lines taken out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(report_r)


def _kill_quietly(pid: int) -> None:
    import os
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
