"""Starting the agent in a running process: check it, write the bootstrap,
queue the line that runs it, wait for the bootstrap's report."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jaxtop.wire import client, paths
from jaxtop.inject.bootstrap import BOOTSTRAP, one_line, package_locations
from jaxtop.inject.gdb import run_gdb
from jaxtop.inject.remote import remote_exec
from jaxtop.inject.target import InjectError, check_target, check_visible

#: How long to wait, by default, for the target to run the injected agent.
DEFAULT_TIMEOUT_S = 15.0


def inject(pid: int, timeout_s: float = DEFAULT_TIMEOUT_S, interval_s: float = 0.1,
           method: str | None = None) -> dict[str, Any]:
    """Start the agent in ``pid``; returns the bootstrap's report.

    Raises:
        InjectError: with what happened and what to do. On failure the target
            is left as it was: a bootstrap that has not run yet finds its file
            gone and does nothing.
        paths.SocketDirError: this user's socket directory is not safe to use.
    """
    target = check_target(pid)
    paths.check_socket_dir()
    if paths.socket_path(pid).exists():
        return {"ok": True, "socket": str(paths.socket_path(pid)), "already": True}
    workdir = tempfile.mkdtemp(prefix="jaxtop-inject-")
    boot = os.path.join(workdir, "bootstrap.py")
    result = os.path.join(workdir, "result.json")
    packages, fallbacks = package_locations()
    params = {
        "result": result,
        "python": list(target.python),
        "packages": packages,
        "fallbacks": fallbacks,
        "instrument": {"interval_s": interval_s},
    }
    Path(boot).write_text(BOOTSTRAP.replace("__PARAMS__", repr(params)))
    if method is None:
        method = "remote_exec" if target.python >= (3, 14) and hasattr(sys, "remote_exec") else "gdb"
    try:
        check_visible(pid, [boot, packages["jaxtop"]])
        if method == "remote_exec":
            # The same guarded one-liner as with gdb: nothing lands in the
            # namespace it runs in, and no exception escapes.
            line_file = os.path.join(workdir, "run_bootstrap.py")
            Path(line_file).write_text(one_line(boot) + "\n")
            remote_exec(target, line_file)
        else:
            run_gdb(target, one_line(boot).encode(), timeout_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if os.path.exists(result):
                report = json.loads(Path(result).read_text())
                if not report.get("ok"):
                    raise InjectError(f"the agent did not start in process {pid}: {report.get('error')}\n{report.get('traceback', '')}".rstrip())
                return report
            if not client.pid_alive(pid):
                raise InjectError(f"process {pid} exited during injection")
            time.sleep(0.05)
        raise InjectError(
            f"process {pid} did not run the injected code within {timeout_s:g} s: its main thread is "
            "probably inside a long C call (a blocking read, a long XLA computation, time.sleep). "
            "The pending injection was withdrawn; try again when it is back in Python code, or raise --inject-timeout"
        )
    finally:
        # On failure this withdraws the injection: a pending line that runs
        # later finds no bootstrap and does nothing.
        shutil.rmtree(workdir, ignore_errors=True)
