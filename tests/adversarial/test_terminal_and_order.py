"""Under `jaxtop run` the program's terminal and output order stay its own.

With stderr captured, a program must still see a terminal where it had one
(``isatty``, the terminal size, a resize) and its writes to stdout and stderr
must come out in the order it made them when both go to one place
(``2>&1``, a terminal). Each case runs the same program plainly and under
jaxtop and compares the bytes.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import shutil
import struct
import subprocess
import termios
import time
import uuid

import pytest

from conftest import PY

# A tight loop writing both streams, flushing each write, and raw writes
# that bypass Python's buffers (a C library logging to fd 2 does that).
INTERLEAVE = """
import os, sys
for i in range(300):
    sys.stdout.write(f"out {i}\\n"); sys.stdout.flush()
    sys.stderr.write(f"err {i}\\n"); sys.stderr.flush()
    if i % 25 == 0:
        os.write(1, b"raw-out "); os.write(2, b"raw-err\\n")
print("last line, left in stdout's buffer until exit")
"""

# The same, with JAX logging transfer-guard lines that jaxtop asked for and
# hides: they are taken out of the stream without moving anything else.
INTERLEAVE_JAX = """
import sys
import jax, jax.numpy as jnp
x = jnp.ones(4)
for i in range(40):
    print(f"out {i}", flush=True)
    x = x + i          # a Python scalar: an implicit host-to-device transfer
    sys.stderr.write(f"err {i}\\n"); sys.stderr.flush()
print(float(x.sum()))
"""

TERMINAL = """
import os, shutil, sys
print("isatty", [os.isatty(fd) for fd in (0, 1, 2)], sys.stdout.isatty(), sys.stderr.isatty())
for fd in (1, 2):
    try:
        print("size", fd, tuple(os.get_terminal_size(fd)))
    except OSError as exc:
        print("size", fd, "error", exc.errno)
print("shutil", tuple(shutil.get_terminal_size()))
sys.stderr.write("to stderr\\n")
print("end")
"""


def _run_to_file(tmp_path, code, jaxtop: bool, env) -> bytes:
    script = tmp_path / "prog.py"
    script.write_text(code)
    out = tmp_path / f"out-{uuid.uuid4().hex}"
    cmd = [PY, "-m", "jaxtop", "run", str(script)] if jaxtop else [PY, str(script)]
    with open(out, "wb") as f:  # `> out 2>&1`: one open file for both
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=120, cwd=tmp_path)
    data = out.read_bytes()
    assert proc.returncode == 0, data[-2000:]
    return data


def test_stdout_and_stderr_keep_their_order_under_2_to_1_fifty_times(tmp_path, child_env):
    plain = _run_to_file(tmp_path, INTERLEAVE, False, child_env)
    assert plain.count(b"\n") > 600
    differing = [i for i in range(50) if _run_to_file(tmp_path, INTERLEAVE, True, child_env) != plain]
    assert differing == [], f"{len(differing)} of 50 runs changed the bytes"


def test_order_kept_while_jax_logs_hidden_guard_lines(tmp_path, child_env):
    plain = _run_to_file(tmp_path, INTERLEAVE_JAX, False, child_env)
    assert b"transfer:" not in plain
    for _ in range(3):
        assert _run_to_file(tmp_path, INTERLEAVE_JAX, True, child_env) == plain


def test_separate_files_are_left_separate(tmp_path, child_env):
    # `>out 2>err`: fd 1 is not the capture's business; it stays the file.
    script = tmp_path / "prog.py"
    script.write_text("import os, stat, sys\nprint(stat.S_ISREG(os.fstat(1).st_mode))\n"
                      "sys.stderr.write('e\\n')\n")
    with open(tmp_path / "o", "wb") as o, open(tmp_path / "e", "wb") as e:
        subprocess.run([PY, "-m", "jaxtop", "run", str(script)], stdout=o, stderr=e, env=child_env,
                       timeout=60, check=True)
    assert (tmp_path / "o").read_bytes() == b"True\n"
    assert (tmp_path / "e").read_bytes() == b"e\n"


def test_same_stream_is_one_open_file_not_one_path(tmp_path):
    from jaxtop.probes.stderr_pipe import same_stream as _same_stream

    path = tmp_path / "f"
    a = os.open(path, os.O_WRONLY | os.O_CREAT)
    b = os.open(path, os.O_WRONLY)  # `>f 2>f`: two offsets, not one stream
    c = os.dup(a)
    r, w = os.pipe()
    other = os.open(tmp_path / "g", os.O_WRONLY | os.O_CREAT)
    try:
        os.write(a, b"xx")
        assert not _same_stream(a, b)
        assert _same_stream(a, c)
        assert _same_stream(w, os.dup(w))
        assert not _same_stream(a, other)
        assert not _same_stream(a, 12345)  # not open
    finally:
        for fd in (a, b, c, r, w, other):
            os.close(fd)


# -- a real terminal: a pseudo-terminal we own, as a terminal emulator does ------------


class Terminal:
    """A child on a terminal of ``cols`` x ``rows`` it controls, as in a shell."""

    def __init__(self, argv, env, cols=111, rows=37, cwd=None):
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

        # A session leader (setsid) takes the terminal as its controlling
        # one, then becomes the program: a small exec, not a preexec_fn (no
        # Python code between fork and exec in this multithreaded process).
        take_terminal = ("import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
                         "os.execv(sys.argv[1], sys.argv[1:])")
        self.proc = subprocess.Popen([PY, "-c", take_terminal, *argv], stdin=slave, stdout=slave, stderr=slave,
                                     env=env, cwd=cwd, start_new_session=True)
        os.close(slave)
        self.out = b""

    def read_until(self, token: bytes, timeout=60.0) -> bytes:
        deadline = time.monotonic() + timeout
        hung_up = 0
        while token not in self.out and time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError as exc:
                    if exc.errno != errno.EIO:
                        raise
                    # EIO: every writer closed the terminal. Linux hands the
                    # last bytes written before that to the reader from a
                    # work queue, and may say EIO first: ask again a little
                    # while before taking it for the end (a plain `python`
                    # lost its last "\r\n" here under load otherwise).
                    hung_up += 1
                    if hung_up >= 10 and token == EOF:
                        break  # to EOF: what came is all
                    time.sleep(0.05)  # waiting for a token: until it comes or the timeout
                    continue
                if not chunk:
                    break
                hung_up = 0
                self.out += chunk
        return self.out

    def resize(self, cols, rows):
        # The kernel sends SIGWINCH to the terminal's foreground process group.
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def type(self, text: bytes):
        os.write(self.master, text)

    def close(self):
        try:
            self.proc.wait(timeout=60)
        finally:
            os.close(self.master)


#: read_until's token for "until every writer closed the terminal".
EOF = b"\x00never"


def _on_terminal(tmp_path, code, jaxtop, env, until=b"end\r\n"):
    script = tmp_path / "prog.py"
    script.write_text(code)
    cmd = [PY, "-m", "jaxtop", "run", str(script)] if jaxtop else [PY, str(script)]
    term = Terminal(cmd, env)
    try:
        out = term.read_until(until)
        term.read_until(EOF)  # and on to EOF: every byte
    finally:
        term.close()
    assert term.proc.returncode == 0, out
    return out


def test_a_terminal_stays_a_terminal_with_its_size(tmp_path, child_env):
    plain = _on_terminal(tmp_path, TERMINAL, False, child_env)
    assert b"isatty [True, True, True] True True" in plain and b"(111, 37)" in plain
    assert _on_terminal(tmp_path, TERMINAL, True, child_env) == plain


def test_order_on_a_terminal(tmp_path, child_env):
    plain = _on_terminal(tmp_path, INTERLEAVE, False, child_env, until=b"until exit\r\n")
    for _ in range(5):
        assert _on_terminal(tmp_path, INTERLEAVE, True, child_env, until=b"until exit\r\n") == plain


RESIZE = """
import os, signal, sys
seen = []
signal.signal(signal.SIGWINCH, lambda *_: seen.append(1))
print("before", tuple(os.get_terminal_size(2)), flush=True)
sys.stdin.readline()
print("after", tuple(os.get_terminal_size(2)), tuple(os.get_terminal_size(1)), "winch", bool(seen), flush=True)
"""


@pytest.mark.parametrize("jaxtop", [False, True], ids=["python", "jaxtop-run"])
def test_a_resize_reaches_the_program(tmp_path, child_env, jaxtop):
    script = tmp_path / "prog.py"
    script.write_text(RESIZE)
    cmd = [PY, "-m", "jaxtop", "run", str(script)] if jaxtop else [PY, str(script)]
    term = Terminal(cmd, child_env, cols=80, rows=24)
    try:
        assert b"before (80, 24)" in term.read_until(b"before (")
        term.resize(132, 43)
        time.sleep(0.3)  # the relay's copy of SIGWINCH, as a person types after resizing
        term.type(b"\n")
        # The line may arrive in pieces: wait for all of it (a wrong one is
        # whole by the time this gives up).
        out = term.read_until(b"winch True", timeout=15.0)
        assert b"after (132, 43) (132, 43) winch True" in out, out
    finally:
        term.close()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_in_tmux_the_program_prints_the_same(tmp_path, child_env):
    script = tmp_path / "prog.py"
    script.write_text(TERMINAL)
    session = f"jt-{uuid.uuid4().hex[:8]}"
    env = dict(child_env)
    env.pop("TMUX", None)
    outs = []
    try:
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "97", "-y", "31"], env=env, check=True)
        for i, cmd in enumerate([f"{PY} {script}", f"{PY} -m jaxtop run {script}"]):
            log = tmp_path / f"pane{i}"
            subprocess.run(["tmux", "send-keys", "-t", session, f"clear; {cmd}; echo DONE{i} > {log}", "Enter"],
                           env=env, check=True)
            deadline = time.monotonic() + 60
            while not log.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], env=env, check=True,
                                    capture_output=True).stdout.decode()
            outs.append(screen[screen.index("isatty"):screen.index("end") + 3])
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], env=env)
    assert "isatty [True, True, True] True True" in outs[0] and "(97, 31)" in outs[0]
    assert outs[1] == outs[0]
