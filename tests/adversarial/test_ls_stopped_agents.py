"""`jaxtop ls` with agents that do not answer: a process stopped by SIGSTOP
or a debugger still accepts connections (the kernel's backlog) but never
says hello. Each costs the hello's timeout; asked one after another, 40 such
agents held `ls` for 40 s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from conftest import PY, jaxtop_cmd

N = 6


def test_ls_waits_once_for_all_silent_agents(tmp_path, child_env):
    script = tmp_path / "idle.py"
    script.write_text("import time, jaxtop\njaxtop.instrument()\nprint('up', flush=True)\ntime.sleep(120)\n")
    children = [subprocess.Popen([PY, str(script)], env=child_env, stdout=subprocess.PIPE) for _ in range(N)]
    try:
        for c in children:
            assert c.stdout.readline().strip() == b"up"
        for c in children:
            os.kill(c.pid, signal.SIGSTOP)
        started = time.monotonic()
        ls = jaxtop_cmd("ls", "--json", env=child_env, timeout=120)
        took = time.monotonic() - started
        assert ls.returncode == 0, ls.stderr
        listed = {json.loads(line)["pid"] for line in ls.stdout.decode().splitlines()}
        assert {c.pid for c in children} <= listed
        assert took < N * 0.6, took  # one timeout (1 s) for all, not N of them
    finally:
        for c in children:
            os.kill(c.pid, signal.SIGCONT)
            c.kill()
            c.wait()
