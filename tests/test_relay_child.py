"""The stderr relay as a real child process of the program."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading

import pytest

from jaxtop.probes import _relay
from relay_rig import G, GUARD_CACHED, GUARD_D2D, GUARD_H2D, GUARD_OLD, GUARD_TSL, GUARD_TSL_TID, OTHER_ERROR, OTHER_WARNING, RELAY_PATH, TOKEN, marker


# -- the real child process ---------------------------------------------------------------


def test_relay_process_is_byte_exact_on_a_megabyte_of_random_bytes(tmp_path):
    rng = random.Random(1234)
    guards = [GUARD_H2D, GUARD_CACHED, GUARD_D2D, GUARD_OLD, GUARD_TSL, GUARD_TSL_TID]
    stream = bytearray()
    expected = bytearray()
    n_guard = n_sync = 0
    while len(expected) < 1_000_000:
        piece = rng.randbytes(rng.randint(1, 20000))
        if rng.random() < 0.2:
            piece += marker("sync", str(n_sync + 1))  # anywhere, even mid-line
            n_sync += 1
        piece += b"\n"
        stream += piece
        expected += piece
        for _ in range(rng.randint(0, 3)):
            stream += rng.choice(guards)
            n_guard += 1
    # Strip our markers from the expectation (they are not user bytes).
    for k in range(1, n_sync + 1):
        expected = expected.replace(marker("sync", str(k)), b"", 1)
    expected += b"unterminated tail \xff"
    stream += b"unterminated tail \xff"
    assert n_guard > 50 and n_sync > 10

    out_path, rep_path = tmp_path / "out", tmp_path / "rep"
    out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT, 0o600)
    rep_fd = os.open(rep_path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-S", "-E", str(RELAY_PATH), str(out_fd), str(rep_fd), TOKEN.decode(), ""],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=(out_fd, rep_fd),
            bufsize=0,
        )
    finally:
        os.close(out_fd)
        os.close(rep_fd)
    err = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()))
    reader.start()
    pos = 0
    view = memoryview(bytes(stream))
    while pos < len(view):  # irregular writes: chunk edges fall anywhere
        size = rng.randint(1, 70000)
        proc.stdin.write(view[pos : pos + size])
        pos += size
    proc.stdin.close()
    assert proc.wait(timeout=20) == 0
    reader.join(timeout=5)
    assert err == [b""]

    got = out_path.read_bytes()
    assert len(got) == len(expected)
    assert got == bytes(expected)
    reports = rep_path.read_bytes().split(b"\n")
    assert reports[-1] == b""
    g_lines = [x.split(b" ", 2) for x in reports if x.startswith(b"G ")]
    s_lines = [x for x in reports if x.startswith(b"S ")]
    assert sum(int(n) for _, n, _ in g_lines) == n_guard
    assert {m + b"\n" for _, _, m in g_lines} == {G(line)[4:] for line in guards}
    assert s_lines == [b"S %d" % k for k in range(1, n_sync + 1)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pipe sizes are a Linux feature")
def test_relay_batches_longer_only_when_the_pipe_holds_a_mebibyte():
    import fcntl

    from jaxtop.probes.stderr_pipe import PIPE_BYTES, grow_pipe as _grow_pipe

    r, w = os.pipe()
    try:
        assert _relay.batch_seconds(r) == _relay.BATCH_S  # the default 64 KiB
        _grow_pipe(w)
        assert fcntl.fcntl(r, fcntl.F_GETPIPE_SZ) >= PIPE_BYTES
        assert _relay.batch_seconds(r) == _relay.BATCH_BIG_PIPE_S
        assert _relay.batch_seconds(12345) == _relay.BATCH_S  # not a pipe: the safe wait
    finally:
        os.close(r)
        os.close(w)


def test_relay_process_takes_what_the_user_sees_from_its_arguments(tmp_path):
    # A relay started later (after one died) must judge the first bytes it
    # reads as the last one did: the visibility comes on its command line.
    out_path = tmp_path / "out"
    out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT, 0o600)
    info = b"I1202 18:34:31.000003    2146 service.cc:1] XLA service initialized\n"
    try:
        proc = subprocess.run(
            [sys.executable, "-S", "-E", str(RELAY_PATH), str(out_fd), "-1", TOKEN.decode(), "h2d|IW"],
            input=GUARD_H2D + GUARD_D2D + info + OTHER_WARNING + OTHER_ERROR + b"end\n",
            pass_fds=(out_fd,), capture_output=True, timeout=20,
        )
    finally:
        os.close(out_fd)
    assert proc.returncode == 0, proc.stderr
    assert out_path.read_bytes() == GUARD_H2D + OTHER_ERROR + b"end\n"
