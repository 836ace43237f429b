"""``jaxtop demo``: the workload child plus the dashboard with a Strategies panel."""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.events import Resize
from textual.screen import Screen

from jaxtop.wire import paths
from jaxtop.dashboard.app import JaxtopApp
from jaxtop.dashboard.model import Snapshot
from jaxtop.dashboard.sources import LiveSource, Source
from jaxtop.demo.panel import StrategiesPanel, demo_state


FRACTIONS = ("0.75", "0.5", "0.25")
ALLOCATORS = ("default", "platform", "cuda_async")

#: Rows from which the Strategies panel and the memory panels fit together;
#: below, ``v`` switches between them.
BOTH_FIT_ROWS = 40
#: Signals that end the demo as its own quit key does.
EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


#: The advisor's evidence window in the demo (seconds).
DEMO_ADVICE_WINDOW_S = 12.0


class Worker:
    """The demo workload child process (``python -m jaxtop.demo.worker``).

    Its output goes to a temporary log file, which :meth:`close` removes.
    """

    def __init__(self, small: bool = False, env: dict[str, str] | None = None) -> None:
        self.small = small
        self.env_overrides: dict[str, str] = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self.log_path: str | None = None

    def start(self, timeout_s: float = 120.0) -> int:
        """Start the workload; returns its pid once its agent listens.

        Raises:
            RuntimeError: it exited or did not start in time; the message
                ends with the last lines of its output.
        """
        self._remove_log()  # a restart: the previous run's log has served
        env = dict(os.environ)
        env.update(self.env_overrides)
        fd, self.log_path = tempfile.mkstemp(prefix="jaxtop-demo-", suffix=".log")
        # Not `python -m`, which puts the working directory first on sys.path:
        # run from a jaxtop checkout, its source `jaxtop/` (which has no `demo`
        # subpackage: that lives in the top-level `demo/`) would shadow the
        # installed package; run from a shared directory, someone else's
        # `numpy.py` would run as the user.
        cmd = paths.python_command("jaxtop.demo.worker", *(["--small"] if self.small else []), own_env=True)
        with os.fdopen(fd, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        sock = paths.socket_path(self.proc.pid)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"demo workload exited with code {self.proc.returncode}{self._tail_text()}")
            if sock.exists():
                return self.proc.pid
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"demo workload did not start within {timeout_s:.0f} s{self._tail_text()}")

    def stop(self) -> None:
        """End the workload (SIGTERM, then SIGKILL after 10 s); keeps its log."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def close(self) -> None:
        """Stop the workload and remove its log. Safe to call more than once."""
        self.stop()
        self._remove_log()

    def crashed(self) -> bool:
        """True when the workload ended by itself with an error."""
        code = self.proc.poll() if self.proc is not None else None
        return code not in (None, 0, -signal.SIGTERM, -signal.SIGKILL)

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the workload's output ("" if none)."""
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(deque(f, maxlen=lines)).rstrip()
        except OSError:
            return ""

    def _tail_text(self) -> str:
        # The log goes when the demo ends: what it says must be in the message.
        tail = self.log_tail()
        return f"; its last output:\n{tail}" if tail else " (no output)"

    def _remove_log(self) -> None:
        if self.log_path:
            try:
                os.unlink(self.log_path)
            except OSError:
                pass
            self.log_path = None


class DemoApp(JaxtopApp):
    """The dashboard plus the Strategies panel; switches go to the workload.

    Args:
        worker: the workload child (restarted by the P, F and A keys).
        pid: its process id.
        source: where records come from; default, the agent of ``pid``
            (tests push records instead).
    """

    CSS = JaxtopApp.CSS + """
    #strategies { height: 17; }
    Screen.-strategies-page #strategies { height: 1fr; }
    Screen.-strategies-page #events { height: 4; }
    Screen.-memory-page #strategies { display: none; }
    """
    # Added to the dashboard's action table: footer, help and palette list them.
    BINDINGS = [
        Binding("up,k", "cursor(-1)", "↑", show=False, tooltip="Strategies: select the strategy above"),
        Binding("down,j", "cursor(1)", "↓", show=False, tooltip="Strategies: select the strategy below"),
        Binding("enter,t", "toggle", "run",
                tooltip="Strategies: run the selected one and measure it; again: switch it to its next variant (off → on) and measure that"),
        Binding("v", "view", "view", show=False,
                tooltip=f"Show the Strategies panel or the memory panels (both from {BOTH_FIT_ROWS} rows up)"),
        Binding("P", "restart('prealloc')", "preallocate", show=False,
                tooltip="Restart the workload with XLA_PYTHON_CLIENT_PREALLOCATE switched"),
        Binding("F", "restart('fraction')", "mem fraction", show=False,
                tooltip="Restart the workload with the next XLA_PYTHON_CLIENT_MEM_FRACTION (0.75, 0.5, 0.25)"),
        Binding("L", "restart('allocator')", "allocator", show=False,
                tooltip="Restart the workload with the next XLA_PYTHON_CLIENT_ALLOCATOR (default, platform, cuda_async)"),
    ]

    def __init__(self, worker: Worker, pid: int, source: Source | None = None) -> None:
        # One device and effects to watch as they happen: redraw every second.
        super().__init__(source or LiveSource([pid]), refresh_s=1.0)
        # A variant's advice leaves within a third of this after the switch
        # to the next (the evidence must stop rising in the window's last
        # slices): a few seconds, not the 20 s of the default minute.
        self.model.advice_window_s = DEMO_ADVICE_WINDOW_S
        self.worker = worker
        self.page = "strategies"  # what a terminal too short for both shows
        self.loop: asyncio.AbstractEventLoop | None = None
        self.main_screen: Screen | None = None

    def compose_extra(self) -> ComposeResult:
        yield StrategiesPanel(id="strategies")

    # Textual calls the on_mount/on_unmount of every class in the MRO: the
    # dashboard's own (start and stop the source) run without being called
    # here. Calling them again started a second reader: every sample twice.
    def on_mount(self) -> None:
        self.loop = asyncio.get_running_loop()
        # The page classes go on the dashboard's own screen: help and the
        # profile open over it as screens of their own.
        self.main_screen = self.screen
        self._layout(self.size.height)
        if self.worker.log_path:
            self.model.add_event(self.source.pids[0], "info",
                                 f"demo workload output: {self.worker.log_path} (removed when the demo ends)")

    def on_unmount(self) -> None:
        self.worker.stop()

    def on_resize(self, event: Resize) -> None:
        if self.main_screen is not None:
            self._layout(event.size.height)

    # -- layout: both views, or one page at a time ---------------------------------
    def _layout(self, rows: int) -> None:
        both = rows >= BOTH_FIT_ROWS
        self.main_screen.set_class(not both and self.page == "strategies", "-strategies-page")
        self.main_screen.set_class(self.page == "memory", "-memory-page")
        self.query_one(StrategiesPanel).paged = not both
        if self.snapshot is not None:
            self.show(self.snapshot)

    def show(self, snap: Snapshot) -> None:
        super().show(snap)
        if self.main_screen is not None and self.main_screen.has_class("-strategies-page"):
            # The dashboard shows its main area on each snapshot; the
            # Strategies page has no room for it.
            self.query_one("#main").display = False
            self.query_one("#overview").display = False

    def action_view(self) -> None:
        self.page = "memory" if self.page == "strategies" else "strategies"
        self._layout(self.size.height)

    # -- strategies ----------------------------------------------------------------
    def _strategies(self) -> list[dict[str, Any]]:
        demo = demo_state(self.snapshot) if self.snapshot else None
        return (demo or {}).get("strategies") or []

    def action_cursor(self, delta: int) -> None:
        panel = self.query_one(StrategiesPanel)
        n = len(self._strategies()) or 1  # none shown yet: nothing to move to
        panel.cursor = (panel.cursor + delta) % n
        panel.refresh()

    def action_toggle(self) -> None:
        strategies = self._strategies()
        panel = self.query_one(StrategiesPanel)
        if not strategies:
            self.notify("the workload is still compiling", timeout=2)
            return
        if self.page == "memory":
            # A switch is read in the Strategies panel: bring it back.
            self.action_view()
        s = strategies[panel.cursor]
        pid = self.source.pids[0]
        error = self.source.send_command(pid, "demo_set", {"strategy": s["name"]})
        if error:
            self.notify(error, severity="warning")

    # -- restart-time settings -----------------------------------------------------
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
            self.model.add_event(old_pid, "error", str(exc).splitlines()[0])
            return
        self.model.reset(old_pid)
        settings = " ".join(f"{k}={v}" for k, v in sorted(self.worker.env_overrides.items()))
        self.model.add_event(pid, "info", f"workload restarted (pid {pid}) with {settings}; these settings act on GPU allocators only")
        self.source = LiveSource([pid])
        self.source.start(self.model, self._poke)
        self.selected = 0

    # -- ending on a signal ----------------------------------------------------------
    def exit_on_signal(self, signum: int) -> None:
        """End the app from a signal handler, as the quit key would.

        The handler interrupts the event loop's own thread between two
        bytecodes: it only hands the exit to the loop, which then restores
        the terminal and returns from ``run()``.
        """
        if self.loop is None or self.loop.is_closed():
            raise SystemExit(128 + signum)
        self.loop.call_soon_threadsafe(lambda: self.exit(return_code=128 + signum))


def run_demo(small: bool = False) -> int:
    """Start the workload, run the dashboard on it, and clean up on any exit.

    The workload is stopped and its log removed however the demo ends: quit,
    an exception, SIGTERM or SIGHUP (the terminal closed).

    Returns:
        The exit status: 0, 1 when the workload did not start, 128 + the
        signal's number after SIGTERM or SIGHUP.
    """
    worker = Worker(small=small)
    # A backstop for exits that skip the finally below (an exception while
    # it runs, the interpreter ending from another thread).
    atexit.register(worker.close)
    app: DemoApp | None = None
    signals: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        signals.append(signum)
        if app is not None and app.is_running and len(signals) == 1:
            app.exit_on_signal(signum)
        else:
            # Before or after the app, or a second signal while it ends
            # (its terminal may be gone): leave through the finally.
            raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in EXIT_SIGNALS}
    try:
        print("jaxtop demo: starting the workload (compiling every strategy's variants)…", flush=True)
        try:
            pid = worker.start()
        except RuntimeError as exc:
            print(f"jaxtop demo: {exc}", file=sys.stderr)
            return 1
        app = DemoApp(worker, pid)
        app.run_as_main()
        if worker.crashed():
            print(f"jaxtop demo: the workload exited with code {worker.proc.returncode}{worker._tail_text()}",
                  file=sys.stderr)
        if signals:
            return 128 + signals[0]
        return app.return_code or 0
    finally:
        worker.close()
        atexit.unregister(worker.close)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
