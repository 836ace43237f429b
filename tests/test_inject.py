"""Attaching to processes that were not started with jaxtop (gdb injection).

Real child processes and real gdb; each failure that this machine can
produce is produced for real.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import PY, TARGETS, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64", reason="gdb injection: Linux x86-64"),
]
needs_gdb = pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed")


def jaxtop(*args, env, timeout=120, capture_output=True, **kw):
    return subprocess.run([PY, "-m", "jaxtop", *map(str, args)], env=env, capture_output=capture_output,
                          timeout=timeout, **kw)


class Lines:
    """Reads a child's pipe on a thread, timestamping every line."""

    def __init__(self, stream):
        self.lines: list[tuple[float, bytes]] = []
        self.thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self.thread.start()

    def _pump(self, stream):
        for raw in iter(stream.readline, b""):
            self.lines.append((time.monotonic(), raw))

    def data(self) -> bytes:
        return b"".join(raw for _, raw in self.lines)


def start_plain(env, steps, sleep=0.01):
    proc = subprocess.Popen([PY, str(TARGETS / "plain_loop.py"), "--steps", str(steps), "--sleep", str(sleep)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    wait_for(lambda: len(out.lines) > 20 or proc.poll() is not None, what="the loop to start")
    return proc, out, err


def expected_output(steps):
    out = b"".join(f"step {i}\n".encode() for i in range(steps))
    err = b"".join(f"err {i}\n".encode() for i in range(0, steps, 10))
    return out, err


@needs_gdb
def test_inject_log_detach_leaves_the_loop_untouched(child_env, sockdir, tmp_path):
    steps = 700  # ~10 s at 10 ms a step
    proc, out, err = start_plain(child_env, steps)
    log = tmp_path / "injected.jsonl"
    res = jaxtop("log", proc.pid, "--inject", "-o", log, "--duration", "4", env=child_env)
    assert res.returncode == 0, res.stderr.decode()
    assert (sockdir / f"{proc.pid}.sock").exists()
    det = jaxtop("detach", proc.pid, env=child_env)
    assert det.returncode == 0, det.stderr.decode()
    assert not (sockdir / f"{proc.pid}.sock").exists()
    assert proc.wait(timeout=120) == 0
    out.thread.join(10)
    err.thread.join(10)

    records = [json.loads(line) for line in log.read_bytes().splitlines()]
    assert records[0]["type"] == "hello" and records[0]["pid"] == proc.pid
    samples = [r for r in records if r["type"] == "sample" and r["devices"]]
    assert len(samples) > 10
    assert samples[0]["devices"][0]["platform"] == "cpu"
    h2d = [s["transfers"]["h2d"]["count_total"] for s in samples]
    assert h2d[-1] > h2d[0]  # the loop's implicit copies are being counted

    # Byte-identical output, and the step counter never stalled for > 2 s.
    want_out, want_err = expected_output(steps)
    assert out.data() == want_out
    assert err.data() == want_err
    times = [t for t, _ in out.lines]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps) < 2.0, max(gaps)


@needs_gdb
def test_attach_and_detach_keep_the_order_of_one_stream(child_env, sockdir, tmp_path):
    # `2>&1` into one pipe: attaching mid-run sends fd 1 through the relay
    # with fd 2, and detaching gives both back; the merged stream is exactly
    # the program's, in its order, before, during and after.
    steps = 500
    proc = subprocess.Popen([PY, str(TARGETS / "plain_loop.py"), "--steps", str(steps), "--sleep", "0.01"],
                            env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    both = Lines(proc.stdout)
    wait_for(lambda: len(both.lines) > 20 or proc.poll() is not None, what="the loop to start")
    res = jaxtop("log", proc.pid, "--inject", "-o", tmp_path / "log.jsonl", "--duration", "2", env=child_env)
    assert res.returncode == 0, res.stderr.decode()
    det = jaxtop("detach", proc.pid, env=child_env)
    assert det.returncode == 0, det.stderr.decode()
    assert proc.wait(timeout=120) == 0
    both.thread.join(10)
    want = b"".join(f"step {i}\n".encode() + (f"err {i}\n".encode() if i % 10 == 0 else b"") for i in range(steps))
    assert both.data() == want


@needs_gdb
def test_second_attach_to_an_instrumented_process_just_connects(targets, sockdir, child_env):
    from jaxtop.inject import inject

    proc = targets.run(TARGETS / "loop.py", "--seconds", "30")
    report = inject(proc.pid)
    assert report["already"] is True and report["socket"].endswith(f"{proc.pid}.sock")
    res = jaxtop("log", proc.pid, "--inject", "--duration", "1", env=child_env)
    assert res.returncode == 0
    assert b'"type":"hello"' in res.stdout


def test_without_gdb_the_error_says_how_to_install_it(child_env, tmp_path):
    proc, out, err = start_plain(child_env, 3000)
    try:
        env = dict(child_env, PATH=str(tmp_path))  # an empty PATH: no gdb
        res = jaxtop("log", proc.pid, "--inject", env=env)
        assert res.returncode == 1
        assert b"gdb is not installed" in res.stderr and b"apt install gdb" in res.stderr
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_not_a_python_process_is_refused(child_env):
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        res = jaxtop("attach", sleeper.pid, "--inject", env=child_env)
        assert res.returncode == 1
        assert b"is not a Python process" in res.stderr
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_attach_without_agent_and_without_a_terminal_explains(child_env):
    import pty

    proc, out, err = start_plain(child_env, 3000)
    screen, terminal = pty.openpty()  # stdout a terminal, stdin not: no one to answer the prompt
    try:
        res = jaxtop("attach", proc.pid, env=child_env, stdin=subprocess.DEVNULL, stdout=terminal, stderr=subprocess.PIPE,
                     capture_output=False)
        assert res.returncode == 2
        assert b"--inject" in res.stderr and b"--no-inject" in res.stderr
        # Without a terminal at all: refused before anything, pointing to what works there.
        res = jaxtop("attach", proc.pid, "--inject", env=child_env)
        assert res.returncode == 2 and b"stdout is not a terminal" in res.stderr and b"jaxtop snapshot" in res.stderr
        assert not (Path(child_env["JAXTOP_SOCKET_DIR"]) / f"{proc.pid}.sock").exists()  # nothing injected
    finally:
        os.close(screen)
        os.close(terminal)
        proc.kill()
        proc.wait()


@needs_gdb
def test_main_thread_in_a_long_c_call_times_out_and_leaves_nothing(child_env, sockdir):
    code = "import sys, time; print('sleeping', flush=True); time.sleep(6); print('woke', flush=True); sys.stderr.write('done\\n')"
    proc = subprocess.Popen([PY, "-c", code], env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"sleeping\n"
    started = time.monotonic()
    res = jaxtop("log", proc.pid, "--inject", "--inject-timeout", "1.5", env=child_env)
    assert res.returncode == 1
    assert b"safe point" in res.stderr or b"long C call" in res.stderr, res.stderr
    assert time.monotonic() - started < 30
    out, errb = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert out == b"woke\n" and errb == b"done\n"  # sleep was not broken, nothing printed
    assert not (sockdir / f"{proc.pid}.sock").exists()


@needs_gdb
def test_target_exiting_during_injection_is_reported(child_env):
    code = "import time; time.sleep(30)"
    proc = subprocess.Popen([PY, "-c", code], env=child_env)
    time.sleep(0.5)
    killer = threading.Timer(1.5, proc.kill)
    killer.start()
    try:
        res = jaxtop("log", proc.pid, "--inject", "--inject-timeout", "20", env=child_env)
    finally:
        killer.cancel()
        proc.wait()
    assert res.returncode in (1, 2)
    assert b"exited" in res.stderr or b"no process" in res.stderr, res.stderr


def test_python_version_mismatch_is_a_clear_refusal(monkeypatch):
    from jaxtop import inject
    from jaxtop.inject import target

    # check_target looks the version up in its own module.
    monkeypatch.setattr(target, "_python_version_of", lambda pid: ("/usr/bin/python3.9", (3, 9)))
    with pytest.raises(inject.InjectError, match=r"runs Python 3\.9 but this jaxtop runs on"):
        inject.check_target(os.getpid())


def test_version_comes_from_libpython_or_the_executable():
    from jaxtop.inject import _version_from_maps

    maps = "7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libpython3.12.so.1.0\n"
    assert _version_from_maps(maps, "/usr/bin/myapp") == (3, 12)
    assert _version_from_maps("", "/root/.pyenv/versions/3.11.7/bin/python3.11") == (3, 11)
    assert _version_from_maps("7f00-7f01 r-xp 0 08:01 1 /usr/lib/libc.so.6\n", "/usr/bin/sleep") is None


def test_external_view_shows_host_stats_labelled(child_env):
    """--no-inject: psutil (and NVML where present) from outside, labelled."""
    import asyncio

    from jaxtop.dashboard.app import make_app
    from jaxtop.dashboard.sources import LiveSource

    proc, out, err = start_plain(child_env, 3000)
    try:
        async def run():
            app = make_app(LiveSource([proc.pid], external=[proc.pid]), refresh_s=0.2)
            async with app.run_test(size=(120, 40)) as pilot:
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    await pilot.pause(0.3)
                    snap = app.snapshot
                    if snap and snap.processes and snap.processes[0].process.rss_bytes:
                        break
                snap = app.snapshot
                view = snap.processes[0]
                assert view.external and "no agent" in view.external
                assert view.process.rss_bytes > 10 << 20
                assert "plain_loop.py" in " ".join(view.argv)
                from jaxtop.widgets.panels import HeaderBar

                header = app.query_one(HeaderBar).draw(snap, 120, 2)
                from rich.console import Console

                console = Console(width=120, record=True)
                console.print(header)
                screen = console.export_text()
                assert "EXTERNAL VIEW" in screen and "backend unknown (no agent)" in screen
                from jaxtop.widgets.panels import HostPanel

                host = Console(width=60, record=True)
                host.print(app.query_one(HostPanel).draw(snap, 60, 4))
                text = host.export_text()
                assert "RSS" in text and "compiles n/a" in text and "0.0s" not in text  # n/a, never a made-up 0

        asyncio.run(run())
    finally:
        proc.kill()
        proc.wait()
