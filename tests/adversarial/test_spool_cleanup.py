"""Adversarial: the dashboard's spool directory must not outlive it.

A real ``jaxtop attach`` in a pseudo-terminal, on an agent in a plain Python
child (no JAX: it starts in a fraction of a second), with a private TMPDIR.
Its terminal closing (SIGHUP) or a plain ``kill`` (SIGTERM) must remove the
spool; after ``kill -9`` the next dashboard removes it, and leaves alone the
spools of dashboards still running, of other users, and any it cannot tell
the owner of.
"""

from __future__ import annotations

import os
import pty
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import PY, wait_for

AGENT = (
    "import sys, time\nimport jaxtop\n"
    "h = jaxtop.instrument(capture_stderr=False, nvml=False)\n"
    "print('socket', h.socket_path, flush=True)\ntime.sleep(120)\n"
)


def spools(tmpdir: Path) -> list[Path]:
    return sorted(tmpdir.glob("jaxtop-session-*"))


@pytest.fixture
def tmpdir_env(tmp_path, child_env):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    return tmpdir, dict(child_env, TMPDIR=str(tmpdir), TERM="xterm-256color")


@pytest.fixture
def agent(child_env):
    proc = subprocess.Popen([PY, "-c", AGENT], env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline().decode()
    assert first.startswith("socket "), (first, proc.stderr.read())
    yield proc
    proc.kill()
    proc.wait(timeout=10)


class Dashboard:
    """``jaxtop attach PID`` on a pseudo-terminal whose output is drained."""

    def __init__(self, pid: int, env: dict) -> None:
        self.master, slave = pty.openpty()
        # SIGHUP as a terminal's program has it: a test run under nohup
        # passes SIG_IGN down, which the dashboard rightly leaves alone.
        self.proc = subprocess.Popen([PY, "-m", "jaxtop", "attach", str(pid)], env=env, stdin=slave, stdout=slave,
                                     stderr=slave, start_new_session=True,
                                     preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
        os.close(slave)
        self.out = bytearray()
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while True:
            try:
                if select.select([self.master], [], [], 0.2)[0]:
                    chunk = os.read(self.master, 65536)
                    if not chunk:
                        return
                    self.out += chunk
                elif self.proc.poll() is not None:
                    return
            except OSError:
                return

    def wait_running(self, tmpdir: Path) -> Path:
        """Until the dashboard has drawn its screen; returns its spool directory."""
        wait_for(lambda: len(self.out) > 2000 or self.proc.poll() is not None, timeout=30, what="the dashboard")
        assert self.proc.poll() is None, bytes(self.out[-500:])
        time.sleep(0.5)  # past on_mount: the source has started
        mine = [p for p in spools(tmpdir) if p.name.startswith(f"jaxtop-session-{self.proc.pid}-")]
        assert len(mine) == 1, (spools(tmpdir), self.proc.pid)
        return mine[0]

    def kill(self, sig: int) -> int:
        os.kill(self.proc.pid, sig)
        try:
            return self.proc.wait(timeout=15)
        finally:
            self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.thread.join(5)
        try:
            os.close(self.master)
        except OSError:
            pass


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_hangup_or_terminate_removes_the_spool(sig, agent, tmpdir_env):
    tmpdir, env = tmpdir_env
    dash = Dashboard(agent.pid, env)
    try:
        spool = dash.wait_running(tmpdir)
        assert (spool / f"{agent.pid}.jsonl.gz").exists()
        code = dash.kill(sig)
    finally:
        dash.close()
    assert spools(tmpdir) == []
    assert code == -sig  # it still dies of that signal, as a shell expects
    assert agent.poll() is None


def test_after_kill_9_the_next_dashboard_removes_the_orphan_and_nothing_else(agent, tmpdir_env, monkeypatch):
    tmpdir, env = tmpdir_env
    first = Dashboard(agent.pid, env)
    try:
        orphan = first.wait_running(tmpdir)
        assert first.kill(signal.SIGKILL) == -signal.SIGKILL
    finally:
        first.close()
    assert orphan.exists()  # nothing can run at a SIGKILL

    # Spools that must survive every sweep: one whose owner cannot be told
    # (an older jaxtop's), and, as root, another user's orphan.
    legacy = tmpdir / "jaxtop-session-k3x9q_2a"
    legacy.mkdir(mode=0o700)
    keep = [legacy]
    if os.geteuid() == 0:
        theirs = tmpdir / (orphan.name + "x")
        shutil.copytree(orphan, theirs)
        for path in [theirs, *theirs.iterdir()]:
            os.lchown(path, 65534, 65534)
        keep.append(theirs)

    second = Dashboard(agent.pid, env)
    try:
        live = second.wait_running(tmpdir)
        assert not orphan.exists()
        # A dashboard that runs (this test's process) keeps its spool when
        # another one starts, and it starts none of its own threads here.
        monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
        from jaxtop.dashboard.sources import LiveSource

        ours = LiveSource([agent.pid])
        try:
            assert live.exists()
            third = Dashboard(agent.pid, env)
            try:
                third.wait_running(tmpdir)
                assert Path(ours._spool_dir).exists() and live.exists()
                assert third.kill(signal.SIGTERM) == -signal.SIGTERM
            finally:
                third.close()
        finally:
            ours.stop()
        assert second.kill(signal.SIGHUP) == -signal.SIGHUP
    finally:
        second.close()
    assert spools(tmpdir) == sorted(keep)


def test_a_dashboard_that_exits_without_stopping_its_source_leaves_no_spool(tmpdir_env):
    # atexit: an exception or sys.exit() on the way out, no on_unmount.
    tmpdir, env = tmpdir_env
    code = ("import os\nfrom jaxtop.dashboard.sources import LiveSource\n"
            "src = LiveSource([os.getpid()])\nprint(src._spool_dir, flush=True)\nraise SystemExit(3)\n")
    res = subprocess.run([PY, "-c", code], env=env, capture_output=True, timeout=60)
    assert res.returncode == 3, res.stderr
    assert Path(res.stdout.decode().strip()).parent == tmpdir
    assert spools(tmpdir) == []
