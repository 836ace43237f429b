"""Real layer: `jaxtop attach PID` in a real terminal (tmux), read with capture-pane."""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid

import pytest

from conftest import PY, TARGETS, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")]

#: The h2d total: a row of the directions' table ("h2d 41/s 0 B 390 (196 KiB)") or,
#: on a narrow panel that lists the lines making transfers, "h2d 41/s ×390".
H2D_TOTAL = re.compile(r"h2d\s(?:\S+\s×(\d+)|.*?(\d+) \()")


def capture(session: str) -> str:
    res = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True)
    return res.stdout


def _total(match: re.Match) -> int:
    return int(match.group(1) or match.group(2))


def test_attach_in_tmux_shows_device_growing_transfers_and_exit(targets, child_env):
    target = targets.run(TARGETS / "loop.py", "--seconds", "12", "--sleep", "0.01", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    session = f"jaxtop-test-{uuid.uuid4().hex[:8]}"
    env_args = [f"{k}={v}" for k, v in child_env.items() if k in ("JAXTOP_SOCKET_DIR", "PATH", "HOME")]
    cmd = ["env", *env_args, "TERM=xterm-256color", PY, "-m", "jaxtop", "attach", str(target.pid)]
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24", *cmd], check=True)
    try:
        try:
            screen = wait_for(lambda: (lambda s: s if "cpu:0" in s and H2D_TOTAL.search(s) else None)(capture(session)),
                              timeout=40, what="device line and transfer row on screen")
        except AssertionError:
            print(capture(session))  # shown by pytest on failure
            raise
        first = _total(H2D_TOTAL.search(screen))
        assert "live" in screen
        later = wait_for(lambda: (lambda m: _total(m) if m and _total(m) > first else None)(H2D_TOTAL.search(capture(session))),
                         timeout=20, what="growing h2d count")
        assert later > first
        target.wait(timeout=30)
        final = wait_for(lambda: (lambda s: s if "exited" in s else None)(capture(session)), timeout=20, what="exited state")
        assert "cpu:0" in final  # history stays on screen after the target ended
        subprocess.run(["tmux", "send-keys", "-t", session, "q"])
        wait_for(lambda: subprocess.run(["tmux", "has-session", "-t", session], capture_output=True).returncode != 0,
                 timeout=10, what="dashboard to quit on q")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
