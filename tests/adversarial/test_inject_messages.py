"""Adversarial: injection failures must name their real cause.

Each cause is produced for real where this machine can: a non-dumpable
process of the same uid (root without CAP_SYS_PTRACE, through setpriv), a
process of another uid (as root), one already traced, one whose /tmp is
not ours, PID 1, a process that is not Python. None of them may be reported
as "another user" or as a "long C call" unless that is what it is, and a
process that cannot be injected at all is said so before any prompt.
"""

from __future__ import annotations

import os
import pty
import select
import shutil
import subprocess
import sys
import time

import pytest

from conftest import PY
from jaxtop import inject

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc and ptrace: Linux")

SYSTEM_PY = "/usr/bin/python3"
NOBODY = 65534
# Busy in Python code (so a queued injection would run) and says when it started.
LOOP = "import time\nprint('up', flush=True)\nwhile True:\n    sum(range(1000))\n    time.sleep(0.01)\n"
NON_DUMPABLE = ("import ctypes, time\nctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0\n"
                "print('up', flush=True)\nwhile True:\n    time.sleep(0.01)\n")


def jaxtop(*args, env, prefix=(), timeout=60):
    """``jaxtop ARGS`` with a terminal for stdout (the dashboard refuses to
    start, and to inject, without one) and stderr captured."""
    import pty

    screen, terminal = pty.openpty()
    try:
        res = subprocess.run([*prefix, PY, "-m", "jaxtop", *map(str, args)], env=env, stdout=terminal,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=timeout)
    finally:
        os.close(terminal)
        os.close(screen)
    res.stdout = b""
    return res


def start(argv, **kw) -> subprocess.Popen:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/", **kw)
    assert proc.stdout.readline() == b"up\n", proc.stderr.read()
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def test_pid_1_is_refused_as_init_not_as_another_user(child_env):
    with pytest.raises(inject.InjectError) as info:
        inject.check_target(1)
    message = str(info.value)
    assert "PID 1" in message and "another user" not in message, message
    res = jaxtop("attach", 1, env=child_env)
    err = res.stderr.decode()
    assert res.returncode == 1, err
    assert "PID 1" in err and "another user" not in err and len(err.strip().splitlines()) == 1, err


def _drop_ptrace_capability() -> list[str]:
    """A prefix that runs a command as this uid but without CAP_SYS_PTRACE
    (root has it; anyone else lacks it already)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to drop CAP_SYS_PTRACE as root")
    return ["setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace"]


def test_non_dumpable_process_of_the_same_uid_is_not_called_another_users(child_env):
    prefix = _drop_ptrace_capability()
    target = start([PY, "-c", NON_DUMPABLE], env=child_env)
    try:
        res = jaxtop("attach", "--inject", target.pid, env=child_env, prefix=prefix)
        err = res.stderr.decode()
        assert res.returncode == 1, err
        assert "another user" not in err, err
        assert "not attachable" in err and "non-dumpable" in err and "CAP_SYS_PTRACE" in err, err
        assert target.poll() is None
    finally:
        stop(target)


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(SYSTEM_PY), reason="needs root and a system python3")
def test_process_of_another_user_is_refused_before_anything_is_queued(child_env):
    # Root may ptrace it, but the target could not read root's private
    # bootstrap, and its agent would serve only its own uid: say so at once,
    # rather than wait and blame a "long C call".
    target = start([SYSTEM_PY, "-c", LOOP], user=NOBODY, group=NOBODY, extra_groups=[])
    try:
        t0 = time.monotonic()
        res = jaxtop("attach", "--inject", "--inject-timeout", "3", target.pid, env=child_env)
        err = res.stderr.decode()
        assert res.returncode == 1, err
        assert "another user" in err and "uid 65534" in err, err
        assert "long C call" not in err and "injecting" not in err, err
        assert time.monotonic() - t0 < 3, "it waited for an injection that could never run"
        assert target.poll() is None
    finally:
        stop(target)


def _private_tmp_prefix() -> list[str]:
    """A prefix that runs a command with a /tmp of its own (a systemd
    service with PrivateTmp=, a container), or skips."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a private /tmp")
    if os.path.abspath(PY).startswith("/tmp/") or os.path.realpath(PY).startswith("/tmp/"):
        # The target's own interpreter would vanish under its private /tmp.
        pytest.skip(f"the interpreter {PY} lives under /tmp, which a private /tmp hides")
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs none /tmp"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a private /tmp here: {probe.stderr.decode().strip()}")
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount -t tmpfs none /tmp && exec "$@"', "-"]


def test_process_with_a_private_tmp_is_told_apart_from_a_long_c_call(child_env):
    prefix = _private_tmp_prefix()
    target = start([*prefix, PY, "-c", LOOP], env=child_env)
    try:
        res = jaxtop("attach", "--inject", "--inject-timeout", "3", target.pid, env=child_env)
        err = res.stderr.decode()
        assert res.returncode == 1, err
        assert "long C call" not in err and "another user" not in err, err
        assert "cannot see" in err and "mount namespace" in err, err
        assert target.poll() is None
    finally:
        stop(target)


SEIZE = r"""
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
if libc.ptrace(ctypes.c_long(0x4206), ctypes.c_long(int(sys.argv[1])), None, None) != 0:  # PTRACE_SEIZE
    print("seize failed", ctypes.get_errno(), flush=True)
    sys.exit(1)
print("up", flush=True)
time.sleep(60)
"""


def test_process_already_traced_names_its_tracer(child_env):
    target = start([PY, "-c", LOOP], env=child_env)
    tracer = None
    try:
        tracer = start([PY, "-c", SEIZE, str(target.pid)])
        res = jaxtop("attach", "--inject", "--inject-timeout", "3", target.pid, env=child_env)
        err = res.stderr.decode()
        assert res.returncode == 1, err
        assert f"already traced by pid {tracer.pid}" in err, err
        assert "ptrace_scope" not in err, err
    finally:
        if tracer is not None:
            stop(tracer)
        stop(target)


def test_not_a_python_process_is_said_before_any_prompt(child_env):
    sleeper = subprocess.Popen(["sleep", "60"])
    master, slave = pty.openpty()
    try:
        dash = subprocess.Popen([PY, "-m", "jaxtop", "attach", str(sleeper.pid)], env=dict(child_env, TERM="xterm"),
                                stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
        os.close(slave)
        out = b""
        deadline = time.monotonic() + 20
        while dash.poll() is None and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    out += os.read(master, 65536)
                except OSError:
                    break
        while select.select([master], [], [], 0.2)[0]:  # what it wrote just before exiting
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        try:
            dash.wait(timeout=max(0.5, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            dash.kill()
            dash.wait()
            pytest.fail(f"jaxtop attach waited at a prompt for a process that cannot be injected: {out[-400:]!r}")
        text = out.decode(errors="replace")
        assert dash.returncode == 1, text
        assert "not a Python process" in text and "Inject the agent now" not in text, text
        assert sleeper.poll() is None
    finally:
        os.close(master)
        sleeper.kill()
        sleeper.wait()
