"""Adversarial: a program run with ``jaxtop run --budget`` forks a worker
that ends normally (``sys.exit``, or the end of the script).

The child unwinds through ``jaxtop run`` as the parent would, and runs the
parent's budget check: a second report on stderr, for a window that is the
parent's, read through a meter whose reader thread the child does not have
(``the jaxtop agent stopped during the window``), and the child closes the
meter's connection to the agent with ``shutdown()``, which ends it for the
parent too (the socket is one, shared by both processes).

The run's budget now belongs to the process that started it: a forked
worker's exit checks nothing and leaves the parent's connection alone.
"""

from __future__ import annotations

import subprocess
import sys

PY = sys.executable

WORKER = r"""
import os, sys

pid = os.fork()
if pid == 0:
    sys.exit(0)  # a worker that ends normally
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), flush=True)
"""


def test_a_forked_worker_does_not_report_the_parents_budget(child_env, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    run = subprocess.run([PY, "-m", "jaxtop", "run", "--budget", "host_syncs=1", str(script)], env=child_env,
                         capture_output=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == [b"child", b"0"], run.stdout
    # One report: the parent's, for the run.
    assert run.stderr.count(b"jaxtop run: budget") == 1, run.stderr.decode(errors="replace")
