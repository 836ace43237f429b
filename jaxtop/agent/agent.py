"""The in-process agent: probes -> samples -> Unix socket (and a log file).

One daemon thread runs a selector loop: it accepts clients and reads their
commands; every ``interval_s`` it takes the guard lines the stderr relay
reported, takes a sample and sends it to every client. Nothing here may
raise into the user's program or block its threads: every entry point that
runs on a user thread (``start``, the import hook, ``atexit``) is guarded, and
all socket I/O is non-blocking on the agent's own thread.

No Textual here: the agent must run in a job that has only jax installed.
"""

from __future__ import annotations

import atexit
import collections
import os
import platform
import selectors
import socket
import sys
import threading
import time
import traceback
from typing import Any, Callable, Iterable

from jaxtop import paths, protocol
from jaxtop.agent.clients import Clients, CommandHandler
from jaxtop.agent.import_hook import when_imported
from jaxtop.probes.compile import CompileProbe
from jaxtop.probes.donation import DonationProbe
from jaxtop.probes.jax_memory import JaxMemoryProbe, backend_ready
from jaxtop.probes.nvml import NvmlProbe
from jaxtop.probes.process import ProcessProbe
from jaxtop.probes.stderr_capture import CaptureError, StderrCapture
from jaxtop.probes.transfer_guard import CachedParser, GuardController, TransferCounter
from jaxtop.prometheus import DEFAULT_ADDR as DEFAULT_PROMETHEUS_ADDR


def _versions() -> dict[str, Any]:
    out: dict[str, Any] = {"jaxtop": protocol.JAXTOP_VERSION, "python": platform.python_version()}
    for name in ("jax", "jaxlib"):
        module = sys.modules.get(name)
        out[name] = getattr(module, "__version__", None) if module else None
    return out


class Agent:
    """Streams samples of this process over ``PID.sock``.

    Args:
        interval_s: sample period for memory, transfers and host stats.
        slow_interval_s: period of the heavier probes (live-array scan).
        backfill_s: how much history a newly connected client receives.
        log_path: also write the stream to this JSON-lines file.
        capture_stderr: count transfer-guard lines from fd 2 (via the relay).
        nvml: enable the NVML probe.
    """

    def __init__(
        self,
        interval_s: float = 0.1,
        slow_interval_s: float = 1.0,
        backfill_s: float = 600.0,
        log_path: str | None = None,
        capture_stderr: bool = True,
        nvml: bool = True,
        prometheus_port: int | None = None,
        prometheus_addr: str | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ValueError("interval_s must be positive")
        self.interval_s = float(interval_s)
        self.slow_interval_s = max(float(slow_interval_s), self.interval_s)
        self.backfill_s = float(backfill_s)
        self.log_path = log_path
        self.pid = os.getpid()
        self.socket_path: str | None = None
        self.prometheus_port = prometheus_port
        self.prometheus_addr = prometheus_addr or DEFAULT_PROMETHEUS_ADDR
        self._prom_state: Any = None  # jaxtop.prometheus.StreamState when serving
        self._prom_server: Any = None
        self.started_t = time.time()
        self.events: list[dict[str, Any]] = []  # notices for the next sample

        self._capture_wanted = capture_stderr
        self._ring: collections.deque[tuple[float, bytes]] = collections.deque()
        self._commands: dict[str, CommandHandler] = {
            "ping": lambda args: {"pong": True},
            "memory_profile": self._cmd_memory_profile,
            "detach": self._cmd_detach,
        }
        self._clients = Clients(self._greeting, self._commands)
        self._seq = 0
        self._fields: dict[str, Callable[[], Any]] = {}
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._stop_requested = False
        self._final_requested = False
        self._final_done = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None
        self._log_file: Any = None

        self.transfers = TransferCounter()
        self._parse_guard_line = CachedParser()
        self.capture: StderrCapture | None = None
        self.guard: GuardController | None = None
        self.compile = CompileProbe()
        self.donation = DonationProbe()
        self.process = ProcessProbe()
        self.nvml = NvmlProbe() if nvml else None
        self.memory: JaxMemoryProbe | None = None
        self._jax_hooked = False
        self._capture_reason: str | None = None
        self._agent_cpu_s = 0.0

    # -- lifecycle (called on a user thread: must not raise) -----------------
    def start(self) -> None:
        """Bind the socket, start stderr capture and the agent thread.

        Raises:
            OSError, paths.SocketDirError: the socket cannot be created. This
            is the one failure reported to the caller of ``instrument()``,
            before anything in the process was changed.
        """
        if self.prometheus_port is not None:  # first: fail before changing anything
            from jaxtop.prometheus import StreamState, serve

            state = StreamState()
            self._prom_server = serve(state, self.prometheus_port, self.prometheus_addr)
            self._prom_state = state
        try:
            directory = paths.ensure_socket_dir()
        except Exception:
            self._stop_prometheus()
            raise
        path = str(directory / f"{self.pid}.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if os.path.exists(path):
                os.unlink(path)  # a previous process with our pid left it
            listener.bind(path)
            os.chmod(path, 0o600)
            listener.listen(16)
            listener.setblocking(False)
        except OSError:
            listener.close()
            self._stop_prometheus()
            raise
        self._listener, self.socket_path = listener, path
        if self.log_path:
            self._log_file = open(self.log_path, "wb")
        if self._capture_wanted:
            self.capture = StderrCapture(self._on_guard_lines)
            try:
                self.capture.start()
            except CaptureError as exc:
                self._capture_reason = str(exc)
                self.capture = None
        else:
            self._capture_reason = "stderr capture disabled"
        if self.nvml is not None:
            self.nvml.start()
        atexit.register(self._atexit)
        when_imported("jax", self._on_jax_imported)
        self._thread = threading.Thread(target=self._run, name="jaxtop-agent", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling, close clients, give fd 2 and the guard back."""
        if self._thread is None or self._stopped.is_set():
            return
        self._stop_requested = True
        self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        self._teardown()

    @property
    def running(self) -> bool:
        """False once :meth:`stop` (or the process's exit) has torn it down."""
        return not self._stopped.is_set()

    def transfer_totals(self, sync_timeout_s: float = 0.0) -> dict[str, int]:
        """Implicit transfers counted so far, per direction.

        Args:
            sync_timeout_s: first wait up to this long until every guard line
                the program has written so far is counted (the relay reads
                stderr in its own process; a loaded machine holds it back).
        """
        if sync_timeout_s > 0 and self.capture is not None:
            self.capture.sync(timeout_s=sync_timeout_s)
        return self.transfers.totals()

    @property
    def thread_ident(self) -> int | None:
        """``threading.get_ident()`` of the agent thread (None before start):
        benchmarks read its CPU clock to measure the agent's own cost."""
        return self._thread.ident if self._thread is not None else None

    @property
    def tick_cpu_s(self) -> float:
        """CPU seconds spent in sampling ticks so far (``agent.cpu_s_total``)."""
        return self._agent_cpu_s

    def compile_count(self) -> int:
        """Backend compiles seen so far (``jax.monitoring`` events)."""
        return self.compile.total()

    def register_command(self, name: str, handler: CommandHandler) -> None:
        """Serve ``{"type": "command", "name": name, "args": {...}}`` requests.

        The handler runs on the agent thread and must return quickly; its
        return value is sent back as ``result``.
        """
        self._commands[name] = handler

    def _cmd_memory_profile(self, args: dict[str, Any]) -> dict[str, Any]:
        """Take a device memory profile; saved next to the program (or in
        ``args["directory"]`` / ``$JAXTOP_PROFILE_DIR``)."""
        if self.memory is None:
            return {"error": "the program has not started a JAX backend yet"}
        from jaxtop.probes.memory_profile import take_profile

        directory = args.get("directory") or os.environ.get("JAXTOP_PROFILE_DIR") or os.getcwd()
        return take_profile(str(directory))

    def _cmd_detach(self, args: dict[str, Any]) -> dict[str, Any]:
        """Stop this agent (``jaxtop detach PID``), on a thread of its own so
        that the agent thread flushes this reply on its way out."""
        def stop() -> None:
            from jaxtop.agent.handle import current

            handle = current()
            if handle is not None and handle.agent is self:
                handle.stop()
            else:
                self.stop()

        threading.Thread(target=stop, name="jaxtop-detach", daemon=True).start()
        return {"detaching": True, "pid": self.pid}

    def register_sample_field(self, name: str, fn: Callable[[], Any]) -> None:
        """Add ``record[name] = fn()`` to each sample when fn returns non-None.

        Runs on the agent thread: fn must be quick and thread-safe.
        """
        self._fields[name] = fn

    def post_event(self, kind: str, **fields: Any) -> None:
        """Attach an event (e.g. a caught error) to the next sample."""
        with self._lock:
            if len(self.events) < 1000:
                self.events.append({"kind": kind, "t": time.time(), **fields})

    # -- hooks on user threads -------------------------------------------------
    def _on_jax_imported(self, _module: Any) -> None:
        """Runs right after ``import jax`` finishes, on the importing thread."""
        if self._jax_hooked or self._stopped.is_set():
            return
        self._jax_hooked = True
        try:
            if self.capture is not None:
                self.guard = GuardController(self.capture.set_visibility)
                self.guard.start()
        except Exception as exc:
            self._capture_reason = f"transfer guard could not be set: {exc}"
        # Each probe records why it could not start; the samples then carry
        # {"available": false, "reason": ...} for it instead of zeros.
        for probe in (self.compile, self.donation):
            try:
                probe.start()
            except Exception as exc:
                probe.reason = f"could not start: {type(exc).__name__}: {exc}"
        # jax registered its own atexit clean-up (which tears the backends
        # down) during import; registering again now runs ours before it.
        atexit.register(self._atexit)

    def _atexit(self) -> None:
        """Final sample (true totals) at interpreter exit, then shut down."""
        if self._thread is None or self._final_requested or self._stopped.is_set():
            return
        self._final_requested = True
        self._wake()
        self._final_done.wait(timeout=3.0)
        self.stop()

    def _on_guard_lines(self, message: str, n: int) -> None:
        parsed = self._parse_guard_line(message)
        if parsed is not None:
            self.transfers.add(parsed, n)

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    # -- the agent thread --------------------------------------------------------
    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        self._clients.selector = sel
        sel.register(self._listener, selectors.EVENT_READ, ("accept", None))
        sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        # The relay's reports are read once per tick, not selected on: waking
        # per guard line cost ~80 us of GIL-holding CPU per implicit transfer.
        self._emit(self._hello(), keep=False)
        next_tick = time.monotonic()
        next_slow = next_tick
        try:
            while not self._stop_requested:
                timeout = max(0.0, next_tick - time.monotonic())
                for key, mask in sel.select(timeout):
                    self._on_event(key, mask)
                if self._final_requested and not self._final_done.is_set():
                    self._final_sample()
                    break
                now = time.monotonic()
                if now >= next_tick:
                    slow = now >= next_slow
                    if slow:
                        next_slow = now + self.slow_interval_s
                    self._tick(slow=slow)
                    next_tick += self.interval_s
                    if next_tick < now:  # fell behind (suspended): don't burst
                        next_tick = now + self.interval_s
        except Exception:
            # The agent dies quietly rather than disturb the program; the
            # reason goes to clients still connected.
            self._clients.broadcast(protocol.encode({
                "type": protocol.ERROR, "t": time.time(), "message": "agent stopped: " + traceback.format_exc(limit=5),
            }))
        finally:
            self._final_done.set()
            self._clients.flush_all(deadline=time.monotonic() + 1.0)

    def _on_event(self, key: selectors.SelectorKey, mask: int) -> None:
        kind, client = key.data
        if kind == "accept":
            self._clients.accept(self._listener)
        elif kind == "wake":
            try:
                os.read(self._wake_r, 4096)
            except OSError:
                pass
        elif kind == "client":
            self._clients.on_event(client, mask)

    def _emit(self, record: dict[str, Any], keep: bool = True) -> None:
        line = protocol.encode(record)
        if self._prom_state is not None:
            self._prom_state.update(record)
        if keep:
            now = record["t"]
            self._ring.append((now, line))
            horizon = now - self.backfill_s
            while self._ring and self._ring[0][0] < horizon:
                self._ring.popleft()
        self._clients.broadcast(line)
        if self._log_file is not None:
            try:
                self._log_file.write(line)
                self._log_file.flush()
            except (OSError, ValueError):
                self._log_file = None

    # -- samples ---------------------------------------------------------------
    def _greeting(self) -> Iterable[bytes]:
        """What a new client receives first: hello, then the backfill."""
        yield protocol.encode(self._hello())
        horizon = time.time() - self.backfill_s
        for t, line in self._ring:
            if t >= horizon:
                yield line

    def _hello(self) -> dict[str, Any]:
        argv = list(sys.argv) if getattr(sys, "argv", None) else []
        return {
            "type": protocol.HELLO,
            "t": time.time(),
            "protocol": protocol.PROTOCOL_VERSION,
            "pid": self.pid,
            "argv": argv,
            "started_t": self.started_t,
            "versions": _versions(),
            "backend": self.memory.backend if self.memory else None,
            "devices": self.memory.describe() if self.memory else [],
            "interval_s": self.interval_s,
            "slow_interval_s": self.slow_interval_s,
            "backfill_s": self.backfill_s,
            "transfer_capture": self._capture_status(),
            "nvml": self.nvml.describe() if self.nvml else {"available": False, "reason": "disabled"},
            "prometheus": ({"addr": self.prometheus_addr, "port": self.prometheus_port}
                           if self._prom_server is not None else None),
            "host": platform.node(),
        }

    def _capture_status(self) -> dict[str, Any]:
        if self.capture is None:
            return {"available": False, "reason": self._capture_reason or "not started"}
        if self.guard is None:
            return {"available": True, "guard": None, "note": "waiting for jax to be imported"}
        status: dict[str, Any] = {"available": True, "guard": self.guard.user_levels()}
        if self.guard.reason:
            status["note"] = self.guard.reason
        return status

    def _ensure_memory_probe(self) -> None:
        if self.memory is not None or not self._jax_hooked:
            return
        if not backend_ready():
            return
        self.memory = JaxMemoryProbe()
        self._emit({
            "type": protocol.BACKEND,
            "t": time.time(),
            "backend": self.memory.backend,
            "devices": self.memory.describe(),
            "versions": _versions(),
        }, keep=False)

    def _tick(self, slow: bool, final: bool = False) -> None:
        started_cpu = time.thread_time()
        now = time.time()
        if self.capture is not None:
            self.capture.read_reports()
        self._ensure_memory_probe()
        if slow:
            if self.guard is not None:
                try:
                    self.guard.refresh()
                except Exception:
                    pass
            if self.memory is not None:
                self.memory.scan_live_arrays(now)
        self._seq += 1
        record: dict[str, Any] = {
            "type": protocol.SAMPLE,
            "t": now,
            "seq": self._seq,
            "devices": self.memory.sample(include_map=slow or final) if self.memory else [],
            "transfers": self.transfers.take(),
            "process": self.process.sample(slow=slow or final),
            "compile": self.compile.sample(),
            "donation": self.donation.sample(),
        }
        if self.nvml is not None and self.nvml.available:
            record["nvml"] = self.nvml.sample()
        for name, fn in list(self._fields.items()):
            try:
                value = fn()
            except Exception as exc:
                value = {"error": f"{type(exc).__name__}: {exc}"}
            if value is not None:
                record[name] = value
        with self._lock:
            if self.events:
                record["events"], self.events = self.events, []
        if final:
            record["final"] = True
        thread_cpu = time.thread_time()
        self._agent_cpu_s += thread_cpu - started_cpu
        record["agent"] = {
            "cpu_s_total": round(self._agent_cpu_s, 6),
            # Everything the thread did so far: ticks, encoding and writing
            # samples, clients. A tick runs on the agent thread only.
            "thread_cpu_s_total": round(thread_cpu, 6),
        }
        self._emit(record)

    def _final_sample(self) -> None:
        if self.capture is not None:
            self.capture.sync(timeout_s=1.0)
        if self.memory is not None:
            self.memory.scan_live_arrays(time.time())
        self._tick(slow=False, final=True)
        self._emit({"type": protocol.EXIT, "t": time.time(), "pid": self.pid}, keep=False)
        self._final_done.set()

    def _stop_prometheus(self) -> None:
        server, self._prom_server = self._prom_server, None
        if server is not None:
            try:
                server.shutdown()
                server.server_close()
            except Exception:
                pass

    def _teardown(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._stop_prometheus()
        self._clients.close_all()
        if self._listener is not None:
            self._listener.close()
        if self.socket_path:
            try:
                os.unlink(self.socket_path)
            except OSError:
                pass
        if self.guard is not None:
            self.guard.restore()
        if self.capture is not None:
            self.capture.stop()
        self.compile.stop()
        self.donation.stop()
        self.process.close()
        if self.nvml is not None:
            self.nvml.stop()
        if self._log_file is not None:
            try:
                self._log_file.close()
            except OSError:
                pass
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            atexit.unregister(self._atexit)
        except Exception:
            pass
