"""`jaxtop run SCRIPT` must behave like `python SCRIPT`.

Paths (``__file__``, ``sys.argv[0]``, ``sys.path[0]``), warnings and
tracebacks (no jaxtop or runpy frames, KeyboardInterrupt included), exit
codes, and a stderr that is a pipe nobody reads.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from conftest import PY, TARGETS

SCRIPT = "like_python.py"
# jaxtop's own code, by path: the checkout itself may be named "jaxtop"
# (git's default clone directory), so the word alone proves nothing.
JAXTOP_DIRS = tuple(os.path.dirname(os.path.abspath(m.__file__)).encode()
                    for m in (__import__("jaxtop"), __import__("jaxtop.probes", fromlist=["x"])))


def _no_jaxtop_frames(stderr: bytes) -> bool:
    return not any(d in stderr for d in JAXTOP_DIRS) and b"runpy" not in stderr


def run_both(*args, cwd=TARGETS, env=None, **kw):
    """(plain, under jaxtop): `python ARGS` and `python -m jaxtop run ARGS`."""
    env = env or dict(os.environ)
    plain = subprocess.run([PY, *args], cwd=cwd, env=env, capture_output=True, timeout=60, **kw)
    ours = subprocess.run([PY, "-m", "jaxtop", "run", *args], cwd=cwd, env=env, capture_output=True, timeout=60, **kw)
    return plain, ours


@pytest.mark.parametrize("path", [SCRIPT, "./" + SCRIPT, "../targets/" + SCRIPT])
def test_paths_and_warning_lines_match_python(path, sockdir):
    plain, ours = run_both(path, "info")
    assert plain.returncode == ours.returncode == 0, ours.stderr
    assert ours.stdout == plain.stdout
    assert ours.stderr == plain.stderr  # the warning names the absolute path
    file, argv0 = plain.stdout.decode().split()[:2]
    assert os.path.isabs(file) and argv0 == path


def test_symlinked_script_gets_the_real_directory_on_sys_path(tmp_path, sockdir):
    link = tmp_path / "link.py"
    link.symlink_to(TARGETS / SCRIPT)
    plain, ours = run_both("link.py", "info", cwd=tmp_path)
    assert ours.stdout == plain.stdout
    assert str(TARGETS) in plain.stdout.decode()  # sys.path[0]: the real directory


def test_file_still_works_after_chdir(sockdir):
    plain, ours = run_both(SCRIPT, "chdir")
    assert plain.returncode == 0, plain.stderr
    assert (ours.returncode, ours.stdout, ours.stderr) == (plain.returncode, plain.stdout, plain.stderr)


def test_uncaught_exception_traceback_matches_python(sockdir):
    plain, ours = run_both(SCRIPT, "raise")
    assert plain.returncode == ours.returncode == 1
    assert ours.stderr == plain.stderr
    assert _no_jaxtop_frames(ours.stderr), ours.stderr


def _interrupted(cmd, env) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(cmd, cwd=TARGETS, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"waiting\n", proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _check_interrupt(mode, env):
    plain = _interrupted([PY, SCRIPT, mode], env)
    ours = _interrupted([PY, "-m", "jaxtop", "run", SCRIPT, mode], env)
    assert plain.returncode == -signal.SIGINT  # Python ends itself with SIGINT
    assert ours.stderr == plain.stderr
    assert _no_jaxtop_frames(ours.stderr), ours.stderr
    assert ours.returncode == plain.returncode


@pytest.mark.slow
def test_keyboard_interrupt_traceback_and_exit_match_python(child_env):
    _check_interrupt("sigint-jax", child_env)


def test_keyboard_interrupt_without_jax_exits_like_python(child_env):
    _check_interrupt("sigint", child_env)


@pytest.mark.parametrize("mode", ["stderr", "partial"])
def test_stderr_a_pipe_nobody_reads(mode, sockdir):
    # As in `python prog.py 2>&1 | true`: the reader of stderr is gone, so
    # the program's first write to stderr fails and it exits 1, having
    # printed nothing after that. jaxtop's relay must not hide that.
    results = []
    for cmd in ([PY, SCRIPT, mode], [PY, "-m", "jaxtop", "run", SCRIPT, mode]):
        r, w = os.pipe()
        os.close(r)
        try:
            res = subprocess.run(cmd, cwd=TARGETS, stdout=subprocess.PIPE, stderr=w, timeout=60)
        finally:
            os.close(w)
        results.append((res.returncode, res.stdout))
    plain, ours = results
    assert plain[0] == 1
    assert ours == plain


LOSES_ITS_READER = """
import os, sys, time
from jaxtop.probes.stderr_capture import StderrCapture
notices = []
cap = StderrCapture(lambda m, n: None, on_notice=notices.append)
cap.start()
os.write(2, b"one\\n")
assert cap.sync(5)
print("close it", flush=True)
sys.stdin.readline()  # the test closed stderr's read end
os.write(2, b"two\\n")  # still into jaxtop's pipe; the relay finds nobody reads
deadline = time.monotonic() + 10
while cap.active and time.monotonic() < deadline:
    cap.read_reports()
    time.sleep(0.02)
try:
    os.write(2, b"three\\n")
    print("write ok")
except BrokenPipeError:
    print("EPIPE", bool(notices))
cap.stop()
"""


def test_stderr_reader_going_away_later_is_passed_on_to_the_program():
    # Mid-run, jaxtop cannot fail the write that found the reader gone (it
    # went into jaxtop's pipe), but the program's next writes fail as they
    # would have without jaxtop.
    r, w = os.pipe()
    proc = subprocess.Popen([PY, "-c", LOSES_ITS_READER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=w)
    os.close(w)
    try:
        assert proc.stdout.readline() == b"close it\n"
        assert os.read(r, 100) == b"one\n"
        os.close(r)
        out, _ = proc.communicate(b"\n", timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out == b"EPIPE True\n"
