"""``jaxtop demo``: the workload child plus the dashboard with a Strategies panel."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding

from jaxtop import paths
from jaxtop.dashboard.app import JaxtopApp
from jaxtop.dashboard.sources import LiveSource
from jaxtop.demo.panel import StrategiesPanel, demo_state

# `python -m jaxtop.demo.worker` would put the current directory first on
# sys.path: run from a jaxtop checkout, its source `jaxtop/` (which has no
# `demo` subpackage: that lives in the top-level `demo/`) would shadow the
# installed package. Drop that entry before importing anything of ours.
WORKER_MAIN = "import runpy, sys; del sys.path[0]; runpy.run_module('jaxtop.demo.worker', run_name='__main__', alter_sys=True)"

FRACTIONS = ("0.75", "0.5", "0.25")
ALLOCATORS = ("default", "platform", "cuda_async")


class Worker:
    """The demo workload child process (``python -m jaxtop.demo.worker``)."""

    def __init__(self, small: bool = False, env: dict[str, str] | None = None) -> None:
        self.small = small
        self.env_overrides: dict[str, str] = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self.log_path: str | None = None

    def start(self, timeout_s: float = 120.0) -> int:
        env = dict(os.environ)
        env.update(self.env_overrides)
        fd, self.log_path = tempfile.mkstemp(prefix="jaxtop-demo-", suffix=".log")
        cmd = [sys.executable, "-c", WORKER_MAIN] + (["--small"] if self.small else [])
        with os.fdopen(fd, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        sock = paths.socket_path(self.proc.pid)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"demo workload exited with code {self.proc.returncode}; see {self.log_path}")
            if sock.exists():
                return self.proc.pid
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"demo workload did not start within {timeout_s:.0f} s; see {self.log_path}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class DemoApp(JaxtopApp):
    """The dashboard plus the Strategies panel; toggles go to the workload."""

    CSS = JaxtopApp.CSS + """
    #strategies { height: 11; }
    #memory { height: 6; }
    """
    # Added to the dashboard's action table: footer, help and palette list them.
    BINDINGS = [
        Binding("up,k", "cursor(-1)", "↑", show=False, tooltip="Strategies: cursor up"),
        Binding("down,j", "cursor(1)", "↓", show=False, tooltip="Strategies: cursor down"),
        Binding("enter,t", "toggle", "toggle strategy", tooltip="Strategies: turn the strategy under the cursor on or off"),
        Binding("P", "restart('prealloc')", "preallocate", show=False,
                tooltip="Restart the workload with XLA_PYTHON_CLIENT_PREALLOCATE switched"),
        Binding("F", "restart('fraction')", "mem fraction", show=False,
                tooltip="Restart the workload with the next XLA_PYTHON_CLIENT_MEM_FRACTION (0.75, 0.5, 0.25)"),
        Binding("A", "restart('allocator')", "allocator", show=False,
                tooltip="Restart the workload with the next XLA_PYTHON_CLIENT_ALLOCATOR (default, platform, cuda_async)"),
    ]

    def __init__(self, worker: Worker, pid: int) -> None:
        # One device and effects to watch as they happen: redraw every second.
        super().__init__(LiveSource([pid]), refresh_s=1.0)
        self.worker = worker

    def compose_extra(self) -> ComposeResult:
        yield StrategiesPanel(id="strategies")

    # Textual calls the on_mount/on_unmount of every class in the MRO: the
    # dashboard's own (start and stop the source) run without being called
    # here. Calling them again started a second reader: every sample twice.
    def on_mount(self) -> None:
        if self.worker.log_path:
            self.model.add_event(self.source.pids[0], "info", f"demo workload output: {self.worker.log_path}")

    def on_unmount(self) -> None:
        self.worker.stop()

    def _strategies(self) -> list[dict[str, Any]]:
        demo = demo_state(self.snapshot) if self.snapshot else None
        return (demo or {}).get("strategies") or []

    def action_cursor(self, delta: int) -> None:
        panel = self.query_one(StrategiesPanel)
        n = len(self._strategies()) or 9
        panel.cursor = (panel.cursor + delta) % n
        panel.refresh()

    def action_toggle(self) -> None:
        strategies = self._strategies()
        panel = self.query_one(StrategiesPanel)
        if not strategies:
            self.notify("the workload is still compiling", timeout=2)
            return
        s = strategies[panel.cursor]
        pid = self.source.pids[0]
        error = self.source.send_command(pid, "demo_set", {"strategy": s["name"]})
        if error:
            self.notify(error, severity="warning")

    def action_restart(self, which: str) -> None:
        env = self.worker.env_overrides
        if which == "prealloc":
            env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false" if env.get("XLA_PYTHON_CLIENT_PREALLOCATE") != "false" else "true"
        elif which == "fraction":
            cur = env.get("XLA_PYTHON_CLIENT_MEM_FRACTION", FRACTIONS[0])
            env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = FRACTIONS[(FRACTIONS.index(cur) + 1) % len(FRACTIONS)] if cur in FRACTIONS else FRACTIONS[0]
        elif which == "allocator":
            cur = env.get("XLA_PYTHON_CLIENT_ALLOCATOR", ALLOCATORS[0])
            env["XLA_PYTHON_CLIENT_ALLOCATOR"] = ALLOCATORS[(ALLOCATORS.index(cur) + 1) % len(ALLOCATORS)] if cur in ALLOCATORS else ALLOCATORS[0]
        settings = " ".join(f"{k}={v}" for k, v in sorted(env.items()))
        self.notify(f"restarting the workload with {settings}", timeout=4)
        self.run_worker(self._restart, thread=True, exclusive=True)

    def _restart(self) -> None:
        old = self.source
        old_pid = old.pids[0]
        old.stop()
        self.worker.stop()
        try:
            pid = self.worker.start()
        except RuntimeError as exc:
            self.model.add_event(old_pid, "error", str(exc))
            return
        self.model.reset(old_pid)
        settings = " ".join(f"{k}={v}" for k, v in sorted(self.worker.env_overrides.items()))
        self.model.add_event(pid, "info", f"workload restarted (pid {pid}) with {settings}; these settings act on GPU allocators only")
        self.source = LiveSource([pid])
        self.source.start(self.model, self._poke)
        self.selected = 0


def run_demo(small: bool = False) -> int:
    print("jaxtop demo: starting the workload (compiling every strategy's variants)…", flush=True)
    worker = Worker(small=small)
    try:
        pid = worker.start()
    except RuntimeError as exc:
        print(f"jaxtop demo: {exc}", file=sys.stderr)
        return 1
    try:
        DemoApp(worker, pid).run()
    finally:
        worker.stop()
    return 0
