"""The in-process agent: probes -> samples -> Unix socket (and a log file).

One daemon thread runs a selector loop: it accepts clients and reads their
commands; every ``interval_s`` it takes the guard lines the stderr relay
reported, takes a sample and sends it to every client. Nothing here may
raise into the user's program or block its threads: every entry point that
runs on a user thread (``start``, the import hook, ``atexit``) is guarded, and
all socket I/O is non-blocking on the agent's own thread.

No peer can stop the agent or weigh on the program: what clients may cost is
bounded in :mod:`.clients`, a failure while serving one client closes that
client only, and ``memory_profile`` runs at most once per
:data:`PROFILE_MIN_INTERVAL_S`. ``start`` is all or nothing. In a child made
by ``os.fork()`` the inherited agent is inert: it never touches the parent's
socket, log or stderr relay, and never waits at exit.

No Textual here: the agent must run in a job that has only jax installed.
"""

from __future__ import annotations

import atexit
import errno
import os
import platform
import selectors
import socket
import stat
import sys
import threading
import time
import traceback
import weakref
from typing import Any, Callable

from jaxtop.agent import labels
from jaxtop.wire import paths, protocol
from jaxtop.agent import cadence
from jaxtop.agent.clients import Clients, CommandError, CommandHandler
from jaxtop.agent.history import Backfill
from jaxtop.agent.import_hook import when_imported
from jaxtop.probes.compile import CompileProbe
from jaxtop.probes.donation import DonationProbe
from jaxtop.probes.executables import JitLedgerProbe
from jaxtop.probes.holders import HoldersProbe
from jaxtop.probes.host_sync import HostSyncProbe
from jaxtop.probes.jax_memory import JaxMemoryProbe, backend_ready
from jaxtop.probes.nvml import NvmlProbe
from jaxtop.probes.oom import install as install_oom, uninstall as uninstall_oom
from jaxtop.probes.process import ProcessProbe
from jaxtop.probes.stderr_capture import CaptureError, StderrCapture
from jaxtop.probes.transfer_guard import CachedParser, GuardController, TransferCounter, untested_jax_reason
from jaxtop.wire.prometheus import DEFAULT_ADDR as DEFAULT_PROMETHEUS_ADDR

#: Least time between two memory profiles of this process, whoever asks:
#: taking one stalls the program for milliseconds and writes a file.
PROFILE_MIN_INTERVAL_S = 2.0

# Agents started in this process, for the fork handler below.
_agents: "weakref.WeakSet[Agent]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """``os.fork()`` copied every agent of the parent, but not its thread."""
    for agent in list(_agents):
        try:
            agent._after_fork_in_child()
        except Exception:
            pass  # never disturb the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _versions() -> dict[str, Any]:
    out: dict[str, Any] = {"jaxtop": protocol.JAXTOP_VERSION, "python": platform.python_version()}
    for name in ("jax", "jaxlib"):
        module = sys.modules.get(name)
        out[name] = getattr(module, "__version__", None) if module else None
    return out


def _jax_version() -> str | None:
    module = sys.modules.get("jax")
    return getattr(module, "__version__", None) if module else None


class Agent:
    """Streams samples of this process over ``PID.sock``.

    Args:
        interval_s: sample period for memory, transfers and host stats.
        slow_interval_s: least time between two live-array scans, buffer maps
            and other slow work (costly scans come less often: jaxtop.agent.cadence).
        backfill_s: how much history a newly connected client receives.
        log_path: also write the stream to this JSON-lines file (gzip when
            it ends in ``.gz``; samples are written once a second).
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
        self._prom_state: Any = None  # jaxtop.wire.prometheus.StreamState when serving
        self._prom_server: Any = None
        self.started_t = time.time()
        self.events: list[dict[str, Any]] = []  # notices for the next sample

        self._capture_wanted = capture_stderr
        self._backfill = Backfill()  # one history, shared by every client
        self._commands: dict[str, CommandHandler] = {
            "ping": lambda args: {"pong": True},
            "memory_profile": self._cmd_memory_profile,
            "detach": self._cmd_detach,
        }
        self._clients = Clients(self._greeting, self._commands, self._backfill, on_error=self._on_client_error)
        self._selector: selectors.BaseSelector | None = None
        self._next_profile_t = 0.0  # monotonic
        self._inert = False  # a fork child's copy: does nothing
        self._stderr_fd: int | None = None  # the original stderr, kept before the capture takes fd 2
        self._log_bytes = 0  # bytes of whole lines in the log so far
        self._last_loop_error: str | None = None
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
        self._log_gz: protocol.GzipLines | None = None  # a log named *.gz
        self._log_pending: list[bytes] = []  # samples not written yet (at most LOG_FLUSH_S of them)
        self._deferred: list[dict[str, Any]] = []  # samples not encoded yet (no client; see _flush_deferred)
        self._deferred_t = time.monotonic()
        self._log_flush_t = time.monotonic()
        self._log_lines_bytes = 0  # bytes of lines logged (before compression)

        self.transfers = TransferCounter()
        self._parse_guard_line = CachedParser()
        self.capture: StderrCapture | None = None
        self.guard: GuardController | None = None
        self.compile = CompileProbe()
        self.donation = DonationProbe()
        # The jit ledger: every compiled function's memory, compiles and
        # recompile reasons (sample field `jit`, command `jit_ledger`).
        self.jit = JitLedgerProbe(interval_s=self.slow_interval_s)
        self._commands["jit_ledger"] = self.jit.command
        self.process = ProcessProbe()
        self.nvml = NvmlProbe() if nvml else None
        self.memory: JaxMemoryProbe | None = None
        self._jax_hooked = False
        self._capture_reason: str | None = None
        self._agent_cpu_s = 0.0
        self._capture_cache: dict[str, Any] | None = None
        self._encoder = protocol.StreamEncoder()  # samples: unchanged fields keep their encoding
        # What the costly details may spend (see jaxtop.agent.cadence).
        self._scan_allowance = cadence.Allowance(cadence.SCAN_SHARE, start=cadence.START_CPU_S)
        self._detail_allowance = cadence.Allowance(cadence.DETAIL_SHARE, start=cadence.START_CPU_S)
        self._map_bytes = cadence.Allowance(cadence.MAP_BYTES_PER_S, start=cadence.MAP_BYTES_PER_S * 10)
        self._read_credit = cadence.READ_CREDIT_S
        self._meter = cadence.SelfMeter()
        # (monotonic, process CPU) at the last slow tick: tells a stopped
        # process from a busy one when a tick comes late (see _resumed_after).
        self._cpu_mark: tuple[float, float] | None = None
        self.suspended_s = 0.0  # wall time the process spent stopped, as far as the agent could tell
        self._scan_next = 0.0  # monotonic: the slow interval at most this often
        self._scan_requested = False
        self._scan_t: float | None = None
        self._scan_interval_s: float | None = None  # between the last two scans
        self._scan_cpu_s: float | None = None
        self._detail_next = 0.0
        self._detail_t: float | None = None
        self._detail_interval_s: float | None = None
        self._detail_cpu_s: float | None = None
        self.oom: Any = None  # jaxtop.probes.oom.OomMonitor, from start() on
        # Who holds memory (sample field `holders`, commands holders_mark and
        # holders_profile), which lines read arrays on the host (`host_syncs`)
        # and named pytrees (`labels`): each waits for `import jax` to finish.
        self.holders = HoldersProbe().install(self)
        self.host_sync = HostSyncProbe().install(self)
        labels.install(self)

    # -- lifecycle (called on a user thread: must not raise) -----------------
    def start(self) -> None:
        """Bind the socket, start stderr capture and the agent thread.

        All or nothing: if any step fails, every earlier one is undone (the
        socket closed and removed, the Prometheus server stopped, the log
        closed, fd 2 given back) before the error is raised, so that
        ``instrument()`` can be called again in the same process.

        Raises:
            OSError, paths.SocketDirError: the socket, the Prometheus port or
            the log file cannot be opened. This is the one failure reported to
            the caller of ``instrument()``; nothing in the process was changed.
        """
        undo: list[Callable[[], None]] = []
        try:
            self._start(undo)
        except BaseException:
            for step in reversed(undo):
                try:
                    step()
                except Exception:
                    pass
            self._stopped.set()  # the import hook, if armed, finds it stopped
            self._close_wake_pipe()
            try:
                self.process.close()  # it keeps /proc files open from __init__ on
            except Exception:
                pass
            raise

    def _start(self, undo: list[Callable[[], None]]) -> None:
        """The steps of :meth:`start`, each pushing its own undoing to ``undo``."""
        if self.prometheus_port is not None:  # first: fail before changing anything
            from jaxtop.wire.prometheus import StreamState, serve

            state = StreamState()
            self._prom_server = serve(state, self.prometheus_port, self.prometheus_addr)
            self._prom_state = state
            undo.append(self._stop_prometheus)
        directory = paths.ensure_socket_dir()
        path = str(directory / f"{self.pid}.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        undo.append(listener.close)
        if os.path.exists(path):
            os.unlink(path)  # a previous process with our pid left it
        listener.bind(path)
        undo.append(lambda: _unlink_quietly(path))
        os.chmod(path, 0o600)
        listener.listen(16)
        listener.setblocking(False)
        self._listener, self.socket_path = listener, path
        undo.append(self._forget_socket)
        if self.log_path:
            # Unbuffered: each line goes to the file in whole writes of our
            # own, so a failed write leaves no buffer behind for a later
            # flush (or the garbage collector) to fail on again.
            self._log_file = open(self.log_path, "wb", buffering=0)
            if self.log_path.endswith(".gz"):
                # Compressed as written (about 20 times smaller), readable up
                # to the last second if the program is killed.
                self._log_gz = protocol.GzipLines()
            undo.append(self._close_log)
        if self._capture_wanted:
            try:
                self._stderr_fd = os.dup(2)  # where our own notices go
            except OSError:
                self._stderr_fd = None
            undo.append(self._close_stderr_fd)
            self.capture = StderrCapture(self._on_guard_lines, on_notice=self._on_capture_notice, on_oom_line=self._on_oom_line)
            try:
                self.capture.start()
            except CaptureError as exc:
                self._capture_reason = str(exc)
                self.capture = None
            else:
                undo.append(self._stop_capture)
        else:
            self._capture_reason = "stderr capture disabled"
        if self.nvml is not None:
            self.nvml.start()
            undo.append(self.nvml.stop)
        atexit.register(self._atexit)
        undo.append(lambda: atexit.unregister(self._atexit))
        _agents.add(self)
        undo.append(lambda: _agents.discard(self))
        when_imported("jax", self._on_jax_imported)  # a no-op once stopped
        self.oom = install_oom(self)
        undo.append(self._uninstall_oom)
        self._thread = threading.Thread(target=self._run, name="jaxtop-agent", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling, close clients, give fd 2 and the guard back."""
        if self._thread is None or self._stopped.is_set() or self._inert:
            return
        self._stop_requested = True
        self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        self._teardown()

    @property
    def running(self) -> bool:
        """False once :meth:`stop` (or the process's exit) has torn it down,
        and in a child made by ``os.fork()``."""
        return not self._stopped.is_set() and not self._inert

    def transfer_totals(self, sync_timeout_s: float = 0.0) -> dict[str, int]:
        """Implicit transfers counted so far, per direction.

        Args:
            sync_timeout_s: first wait up to this long until every guard line
                the program has written so far is counted (the relay reads
                stderr in its own process; a loaded machine holds it back).
        """
        if sync_timeout_s > 0 and self.capture is not None and not self._inert:
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

    def request_scan(self) -> None:
        """Make the next tick scan the live arrays whatever the cadence says
        (a budget window that ends wants totals read after its end)."""
        self._scan_requested = True

    def transfer_detail(self, sync_timeout_s: float = 0.0) -> dict[str, Any]:
        """Implicit transfers so far, per direction and per shape (resets nothing).

        Args:
            sync_timeout_s: as for :meth:`transfer_totals`.

        Returns:
            ``{"synced": bool, "h2d": {"count", "bytes_known",
            "count_bytes_unknown"}, "d2h": ..., "d2d": ..., "shapes": [...]}``,
            most frequent shape first; ``synced`` is False when the relay did
            not acknowledge in time (counts may be short).
        """
        synced = True
        if sync_timeout_s > 0 and self.capture is not None and not self._inert:
            synced = self.capture.sync(timeout_s=sync_timeout_s)
        return {"synced": synced, **self.transfers.detail()}

    def compile_count(self) -> int:
        """Backend compiles seen so far (``jax.monitoring`` events)."""
        return self.compile.total()

    def register_command(self, name: str, handler: CommandHandler) -> None:
        """Serve ``{"type": "command", "name": name, "args": {...}}`` requests.

        The handler runs on the agent thread and must return quickly; its
        return value is sent back as ``result``. To refuse a request, raise
        :class:`~jaxtop.agent.clients.CommandError`: the reply is ``ok: false``
        with its message. Each client's requests are rate limited (see
        :mod:`jaxtop.agent.clients`); a handler that does expensive work
        should limit itself further, as ``memory_profile`` does.
        """
        self._commands[name] = handler

    def _cmd_memory_profile(self, args: dict[str, Any]) -> dict[str, Any]:
        """Take a device memory profile and save it (command ``memory_profile``).

        Args:
            args: the command's arguments. ``directory`` (optional) is where
                the profile file goes: a string naming an existing directory
                by its absolute path. Anything else is refused: a non-string,
                a relative path (it would land in the program's working
                directory), a path that does not exist or is not a directory.
                The directory is never created. Without it: the directory in
                ``$JAXTOP_PROFILE_DIR`` (which must exist too), else the
                program's working directory.

        Returns:
            ``take_profile``'s result (``path``, ``total_bytes``,
            ``seconds``, ``top_sites``, ...) or ``{"error": ...}``. jaxtop
            keeps the newest ``MAX_PROFILE_FILES`` (20) files of its own
            naming in that directory and deletes older ones of that naming;
            it deletes nothing else.

        Raises:
            CommandError: a bad ``directory``; or a profile was taken less
                than :data:`PROFILE_MIN_INTERVAL_S` ago, by any client: the
                reply says "rate limited ... retry in X s" and carries
                ``retry_after_s``. A flood of requests costs the program one
                profile per interval, not one per request.
        """
        directory = _profile_directory(args.get("directory"))
        if self.memory is None:
            return {"error": "the program has not started a JAX backend yet"}
        now = time.monotonic()
        if now < self._next_profile_t:
            wait = self._next_profile_t - now
            raise CommandError(
                f"rate limited: at most one memory profile every {PROFILE_MIN_INTERVAL_S:g} s; retry in {wait:.1f} s",
                retry_after_s=max(0.001, round(wait, 3)),
            )
        self._next_profile_t = now + PROFILE_MIN_INTERVAL_S
        from jaxtop.probes.memory_profile import take_profile

        return take_profile(directory)

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
        if self._inert:
            return  # a fork child: the lock may have been held by a thread that is gone
        with self._lock:
            if len(self.events) < 1000:
                self.events.append({"kind": kind, "t": time.time(), **fields})

    # -- hooks on user threads -------------------------------------------------
    def _on_jax_imported(self, _module: Any) -> None:
        """Runs right after ``import jax`` finishes, on the importing thread."""
        if self._jax_hooked or self._stopped.is_set() or self._inert:
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
        for probe in (self.compile, self.donation, self.jit, self.host_sync):
            try:
                probe.start()
            except Exception as exc:
                probe.reason = f"could not start: {type(exc).__name__}: {exc}"
        self._capture_cache = None
        if self.oom is not None:
            self.oom.on_jax_imported()
        # jax registered its own atexit clean-up (which tears the backends
        # down) during import; registering again now runs ours before it.
        atexit.register(self._atexit)

    def _atexit(self) -> None:
        """Final sample (true totals) at interpreter exit, then shut down."""
        if self._thread is None or self._final_requested or self._stopped.is_set() or self._inert:
            return
        self._final_requested = True
        self._wake()
        self._final_done.wait(timeout=3.0)
        self.stop()

    def _on_capture_notice(self, text: str) -> None:
        """The capture lost its relay (killed, or the terminal went away):
        say so on the stream. Once it has given up for good, the guard goes
        back to the user's setting, so the lines only jaxtop caused stop."""
        self._capture_cache = None
        self.post_event("error", source="stderr_capture", text=text)
        if self.capture is not None and not self.capture.active and self.guard is not None:
            self.guard.restore()

    def _on_oom_line(self, text: str) -> None:
        """An allocator's out-of-memory line passed on by the relay (GPU):
        the census is taken even when the program catches the error."""
        if self.oom is not None:
            self.oom.on_allocator_line(text)

    def _uninstall_oom(self) -> None:
        self.oom = None
        uninstall_oom()

    def recent_lines(self, n: int) -> list[bytes]:
        """The last ``n`` kept records as sent, oldest first (the OOM census
        shows the climb before the failure)."""
        deferred = list(self._deferred)  # taken by the agent thread meanwhile: a copy, encoded apart
        end = self._backfill.end
        kept = self._backfill.lines(end - max(0, n - len(deferred)), end) if n > len(deferred) else []
        return kept + [protocol.encode(r) for r in deferred[max(0, len(deferred) - n):]]

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
        self._selector = sel
        self._clients.selector = sel
        next_tick = time.monotonic()
        next_slow = next_tick
        try:
            self._clients.listen(self._listener)
            sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
            # The relay's reports are read once per tick, not selected on: waking
            # per guard line cost ~80 us of GIL-holding CPU per implicit transfer.
            self._emit(self._hello(), keep=False)
            while not self._stop_requested:
                wake = self._clients.service(time.monotonic())
                deadline = next_tick if wake is None else min(next_tick, wake)
                for key, mask in sel.select(max(0.0, deadline - time.monotonic())):
                    try:
                        self._on_event(key, mask)
                    except Exception as exc:  # one event, never the loop
                        self._loop_error("serving a connection", exc)
                if self._final_requested and not self._final_done.is_set():
                    self._final_sample()
                    break
                now = time.monotonic()
                if now >= next_tick:
                    if now - next_tick >= cadence.SUSPEND_MIN_S:
                        gap = self._resumed_after(now, now - next_tick)
                        next_slow += gap
                    slow = now >= next_slow
                    if slow:
                        next_slow = now + self.slow_interval_s
                        self._cpu_mark = (now, time.process_time())
                    try:
                        self._tick(slow=slow)
                    except Exception as exc:  # a probe failed: the next tick may do better
                        self._loop_error("sampling", exc)
                    next_tick += self.interval_s
                    if next_tick < now:  # fell behind (suspended): don't burst
                        next_tick = now + self.interval_s
        except Exception:
            # Only the selector itself gets here. The agent dies quietly
            # rather than disturb the program; the reason goes to clients
            # still connected.
            self._clients.broadcast(protocol.encode({
                "type": protocol.ERROR, "t": time.time(), "message": "agent stopped: " + traceback.format_exc(limit=5),
            }))
        finally:
            self._final_done.set()
            self._clients.flush_all(deadline=time.monotonic() + 1.0)

    def _on_event(self, key: selectors.SelectorKey, mask: int) -> None:
        kind, client = key.data
        if kind == "accept":
            self._clients.accept()
        elif kind == "wake":
            try:
                os.read(self._wake_r, 4096)
            except OSError:
                pass
        elif kind == "client":
            self._clients.on_event(client, mask)

    def _on_client_error(self, message: str) -> None:
        self.post_event("error", text=message)

    def _loop_error(self, doing: str, exc: BaseException) -> None:
        """Record an unforeseen failure as an event, once per distinct message
        in a row (a probe that fails every tick says so once)."""
        message = f"agent: error while {doing}: {type(exc).__name__}: {exc}"
        if message != self._last_loop_error:
            self._last_loop_error = message
            self.post_event("error", text=message)

    def _emit(self, record: dict[str, Any], keep: bool = True) -> None:
        sample = record["type"] == protocol.SAMPLE
        if sample and keep and not self._clients and not record.get("final"):
            # Nobody watches live: the sample is encoded and kept with the
            # others of its second, when the log takes them (see _flush_deferred).
            if self._prom_state is not None:
                self._prom_state.update(record)
            self._deferred.append(record)
            if time.monotonic() - self._deferred_t >= LOG_FLUSH_S:
                self._flush_deferred()
            return
        self._flush_deferred()  # in order, before anything else
        line = self._encoder.encode(record) if sample else protocol.encode(record)
        if self._prom_state is not None:
            self._prom_state.update(record)
        if keep:
            now = record["t"]
            self._backfill.add(record, line)  # the fine and coarse levels, the present
            self._backfill.trim(now - self.backfill_s)
        elif record.get("type") == protocol.HELLO:
            self._backfill.note_hello(record)
        self._clients.broadcast(line)
        self._write_log(line, urgent=record["type"] != protocol.SAMPLE or bool(record.get("final")))

    def _flush_deferred(self) -> None:
        """Encode the samples taken while no client was connected, keep them
        in the history and hand them to the log, in order.

        Beside a busy program each tick finds the agent's code and data
        evicted from the CPU's caches; encoding and keeping ten samples
        together once a second costs a fraction of doing it on each tick
        (the log writes them once a second anyway). A client that connects
        gets them in its greeting (flushed first), and from then on each
        sample is sent as it is taken."""
        self._deferred_t = time.monotonic()
        deferred = self._deferred
        if not deferred:
            return
        self._deferred = []
        encode, add, pending = self._encoder.encode, self._backfill.add, self._log_pending
        for record in deferred:
            line = encode(record)
            add(record, line)
            if self._log_file is not None:
                pending.append(line)
        self._backfill.trim(deferred[-1]["t"] - self.backfill_s)
        self._write_log(b"")

    def _write_log(self, line: bytes, urgent: bool = False, final: bool = False) -> None:
        """Log one line. Samples are written together once a second (a write
        is a system call that lets the GIL go, and takes it back from the
        user's thread); any other record (an OOM census, the exit) goes out
        at once, with the samples before it."""
        if self._log_file is None:
            return
        if line:
            self._log_pending.append(line)
        mono = time.monotonic()
        if urgent or final or mono - self._log_flush_t >= LOG_FLUSH_S:
            self._log_flush_t = mono
            data = b"".join(self._log_pending)
            self._log_pending.clear()
            self._write_log_data(data, final)

    def _write_log_data(self, data: bytes, final: bool) -> None:
        log = self._log_file
        lines = data
        if self._log_gz is not None:
            data = self._log_gz.compress(data) + (self._log_gz.finish() if final else self._log_gz.sync())
            if final:
                self._log_gz = None
        written = 0
        try:
            view = memoryview(data)
            while view:
                n = log.write(view)
                if not n:
                    raise OSError(errno.EIO, "the log file took no bytes")
                view = view[n:]
                written += n
        except (OSError, ValueError) as exc:
            if self._log_gz is None:  # keep the whole lines of a batch cut short
                self._log_bytes += data.rfind(b"\n", 0, written) + 1
            self._log_failed(exc)
        else:
            self._log_bytes += len(data)
            self._log_lines_bytes += len(lines)

    def _log_failed(self, exc: BaseException) -> None:
        """Stop recording after a failed write; say so once, never raise."""
        log, self._log_file = self._log_file, None
        try:
            # A write cut short left part of a line: cut the file back to
            # the last whole one, so that what was recorded reads cleanly.
            if stat.S_ISREG(os.fstat(log.fileno()).st_mode):
                os.ftruncate(log.fileno(), self._log_bytes)
        except (OSError, ValueError):
            pass
        try:
            log.close()
        except (OSError, ValueError):
            pass
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        message = (f"jaxtop: cannot write the log {self.log_path}: {reason}; "
                   f"recording stopped after {self._log_bytes} bytes (the program and the live stream go on)")
        self._notice(message)
        self.post_event("error", text=message)

    def _notice(self, message: str) -> None:
        """One line on the terminal's stderr: the one saved before the capture
        took fd 2 (fd 2 itself without a capture). Never raises."""
        fd = self._stderr_fd if self._stderr_fd is not None else 2
        try:
            os.write(fd, (message + "\n").encode("utf-8", "replace"))
        except OSError:
            pass

    # -- samples ---------------------------------------------------------------
    def _greeting(self) -> tuple[Any, ...]:
        """What a new client receives first (a :class:`jaxtop.agent.history.Greeting`):
        hello, the present (the newest
        sample with the last map and sparse fields), the coarse history, then
        the fine one from ``backfill_s`` ago (ranges of the shared history,
        not copies), then ``history_end`` (docs/protocol.md, "History")."""
        self._flush_deferred()
        hello = self._hello()
        hello["history"] = self._backfill.describe(self.backfill_s)
        self._backfill.note_hello(hello)
        return self._backfill.greeting(protocol.encode(hello), time.time() - self.backfill_s)

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

    def _capture_status_cached(self, fresh: bool) -> dict[str, Any]:
        """:meth:`_capture_status`, worked out again once a second (or when
        the capture or the guard changed): ticks in between reuse it."""
        if fresh or self._capture_cache is None:
            self._capture_cache = self._capture_status()
        return self._capture_cache

    def _capture_status(self) -> dict[str, Any]:
        if self.capture is None:
            return {"available": False, "reason": self._capture_reason or "not started"}
        if self.guard is None:
            return {"available": True, "guard": None, "note": "waiting for jax to be imported"}
        if self.capture.unrecognised is not None:
            return {"available": False, "reason": "guard lines arrive in a form jaxtop does not recognise "
                    f"(jax {_jax_version()}): {self.capture.unrecognised[:160]}"}
        untested = untested_jax_reason(_jax_version())
        if untested and not any(self.transfers.totals().values()):
            # Until one guard line is recognised, 0 could mean "none" or
            # "not understood": say which we cannot tell.
            return {"available": False, "reason": untested + "; no transfer-guard line recognised yet"}
        if self.guard.reason:
            # The guard's lines never reach stderr (the user's log threshold
            # silences warnings, and this jaxlib cannot lower it): 0 would
            # be a guess.
            return {"available": False, "reason": self.guard.reason}
        return {"available": True, "guard": self.guard.user_levels()}

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
        if self.oom is not None:
            for census in self.oom.take_records():
                self._emit(census)
        if slow and self.guard is not None:
            try:
                self.guard.refresh()
            except Exception:
                pass
        if self.memory is not None:
            self._details(now, final)
        self._seq += 1
        record: dict[str, Any] = {
            "type": protocol.SAMPLE,
            "t": now,
            "seq": self._seq,
            "devices": self.memory.sample(include_map=True) if self.memory else [],
            "transfers": self.transfers.take(),
            "transfer_capture": self._capture_status_cached(slow or final),
            "process": self.process.sample(slow=slow or final),
            "compile": self.compile.sample(),
            "donation": self.donation.sample(),
        }
        if self.nvml is not None and self.nvml.available:
            record["nvml"] = self.nvml.sample()
        jit = self.jit.sample(force=final, full=final)
        if jit is not None:
            record["jit"] = jit
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
        if slow or final or self._seq == 1:
            # Once a second: its totals are cumulative, so nothing is lost,
            # and each tick spared is work not done in the user's process.
            record["agent"] = self._agent_record(thread_cpu)
        self._emit(record)

    def _resumed_after(self, now: float, late: float) -> float:
        """A tick ``late`` seconds late: was the process stopped (SIGSTOP,
        Ctrl-Z, a debugger, a checkpoint) rather than busy? Then nothing in
        it changed meanwhile, and every costly detail's next run moves on by
        the stop, as if those seconds had not passed: what the agent shows is
        still the present, and a process thawed for a moment does not pay
        for every pass that fell due while it was frozen. A process whose
        threads kept running (the agent starved of the GIL) is not moved.

        Returns:
            The seconds the deadlines moved (0 when the process was busy).
        """
        mark = self._cpu_mark
        if mark is None:
            return 0.0
        elapsed = now - mark[0]
        try:
            used = time.process_time() - mark[1]
        except OSError:
            return 0.0
        if elapsed <= 0 or used > cadence.SUSPEND_CPU_SHARE * elapsed:
            return 0.0
        gap = late
        self.suspended_s += gap
        self._scan_next += gap
        self._detail_next += gap
        for allowance in (self._scan_allowance, self._detail_allowance, self._map_bytes):
            allowance.shift(gap)
        self._meter.shift(gap)
        for probe in (self.jit, self.holders):
            try:
                probe.shift_deadlines(gap)
            except Exception:
                pass
        self._cpu_mark = (mark[0] + gap, mark[1])
        return gap

    def _details(self, now: float, final: bool) -> None:
        """The live-array scan and the detail derived from it, each when its
        allowance has paid for the last one (both at once for the final
        sample); never more often than ``slow_interval_s``."""
        memory = self.memory
        mono = time.monotonic()
        if final or self._scan_requested or (mono >= self._scan_next and self._scan_allowance.ready(mono)):
            self._scan_requested = False
            started = time.thread_time()
            memory.scan_live_arrays(now, detail=False)
            cost = self._scan_cpu_s = time.thread_time() - started
            covered = min(memory.arrays.read_cpu_s, self._read_credit)  # see jaxtop.agent.cadence
            self._read_credit -= covered
            self._scan_allowance.spend(cost - covered, mono)
            if self._scan_t is not None:
                self._scan_interval_s = mono - self._scan_t
            self._scan_t, self._scan_next = mono, mono + self.slow_interval_s
        if final or (mono >= self._detail_next and memory.detail_stale()
                     and self._detail_allowance.ready(mono) and self._map_bytes.ready(mono)):
            started = time.thread_time()
            entries = memory.refresh_detail(now)
            cost = self._detail_cpu_s = time.thread_time() - started
            self._detail_allowance.spend(cost, mono)
            self._map_bytes.spend(entries * MAP_ENTRY_BYTES, mono)
            if self._detail_t is not None:
                self._detail_interval_s = mono - self._detail_t
            self._detail_t, self._detail_next = mono, mono + self.slow_interval_s

    def _agent_record(self, thread_cpu: float) -> dict[str, Any]:
        """The sample's ``agent`` field: what the thread spent, its budget,
        and how often the costly details ran."""
        self._meter.update(time.monotonic(), thread_cpu,
                           (self._scan_allowance, self._detail_allowance, self._map_bytes))
        return {
            "cpu_s_total": round(self._agent_cpu_s, 6),
            # Everything the thread did so far: ticks, encoding and writing
            # samples, clients. A tick runs on the agent thread only.
            "thread_cpu_s_total": round(thread_cpu, 6),
            "budget_share": cadence.CPU_BUDGET,
            "cpu_share": _rounded(self._meter.share),
            "scan_interval_s": _rounded(self._scan_interval_s, 3),
            "scan_cpu_s": _rounded(self._scan_cpu_s),
            "detail_interval_s": _rounded(self._detail_interval_s, 3),
            "detail_cpu_s": _rounded(self._detail_cpu_s),
            "suspended_s": _rounded(self.suspended_s, 3),
        }

    def _final_sample(self) -> None:
        if self.capture is not None:
            self.capture.sync(timeout_s=1.0)
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

    def _forget_socket(self) -> None:
        self._listener = None
        self.socket_path = None

    def _close_log(self) -> None:
        try:
            self._flush_deferred()
        except Exception:
            self._deferred = []
        if self._log_file is not None:
            self._write_log(b"", final=True)  # samples still held, and a gzip trailer
        log, self._log_file = self._log_file, None
        self._log_gz = None
        if log is not None:
            try:
                log.close()
            except (OSError, ValueError):
                pass

    def _close_stderr_fd(self) -> None:
        fd, self._stderr_fd = self._stderr_fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def _stop_capture(self) -> None:
        capture, self.capture = self.capture, None
        if capture is not None:
            capture.stop()

    def _close_wake_pipe(self) -> None:
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1

    def _after_fork_in_child(self) -> None:
        """In a child made by ``os.fork()``: make this copy of the agent inert.

        The agent thread did not survive the fork, so nothing may wait for it
        (the exit handler would wait seconds for a final sample), and the
        socket path, the log file and the stderr relay are the parent's: the
        child must never unlink, write or signal them. It only closes its own
        copies of the descriptors, which leaves the parent's open, so that
        the parent's clients still see the end of the stream when the parent
        ends, and the port and the socket are not held by the child.
        """
        if self._inert or self._thread is None or self._stopped.is_set():
            return
        self._inert = True
        self._clients.close_in_child()
        if self._listener is not None:
            try:
                self._listener.close()
            except OSError:
                pass
        if self._selector is not None:
            try:
                self._selector.close()  # this copy of the epoll fd, not the parent's registrations
            except Exception:
                pass
        server, self._prom_server = self._prom_server, None
        if server is not None:
            try:
                server.server_close()  # closes the listening socket; shutdown() would wait for a thread that is gone
            except Exception:
                pass
        log, self._log_file = self._log_file, None
        if log is not None:
            try:
                log.close()  # unbuffered: nothing is flushed, the fd is closed
            except (OSError, ValueError):
                pass
        self._deferred = []
        self._close_stderr_fd()
        self._close_wake_pipe()
        try:
            self.process.close()
        except Exception:
            pass

    def _teardown(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        _agents.discard(self)
        self._stop_prometheus()
        self._clients.close_all()
        if self._listener is not None:
            self._listener.close()
        if self.socket_path:
            _unlink_quietly(self.socket_path)
        if self._selector is not None:
            try:
                self._selector.close()
            except Exception:
                pass
        if self.guard is not None:
            self.guard.restore()
        if self.capture is not None:
            self.capture.stop()
        self._uninstall_oom()
        self.compile.stop()
        self.donation.stop()
        self.jit.stop()
        self.host_sync.stop()  # jax.Array and numpy exactly as they were
        if self.memory is not None:
            self.memory.close()  # jax.Array.delete as it was
        self.process.close()
        if self.nvml is not None:
            self.nvml.stop()
        self._close_log()
        self._close_stderr_fd()
        self._backfill.clear()
        self._close_wake_pipe()
        try:
            atexit.unregister(self._atexit)
        except Exception:
            pass


#: Seconds of samples the log holds before writing them (other records go at once).
LOG_FLUSH_S = 1.0

#: Bytes a buffer of a map (or a top buffer) weighs in a sample, about:
#: ``[140225514849600,16384],`` (the wire's map allowance counts these).
MAP_ENTRY_BYTES = 24


def _rounded(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _profile_directory(requested: Any) -> str:
    """Where ``memory_profile`` saves, checked (see ``Agent._cmd_memory_profile``).

    Raises:
        CommandError: the directory is not acceptable.
    """
    if requested is None:
        env = os.environ.get("JAXTOP_PROFILE_DIR")
        directory = os.path.abspath(env) if env else os.getcwd()
    elif not isinstance(requested, str):
        raise CommandError(f"directory must be a string (an absolute path), not {type(requested).__name__}")
    elif not os.path.isabs(requested):
        raise CommandError(f"directory must be an absolute path, not {requested!r}")
    else:
        directory = requested
    if not os.path.exists(directory):
        raise CommandError(f"directory {directory!r} does not exist (the command never creates one)")
    if not os.path.isdir(directory):
        raise CommandError(f"{directory!r} is not a directory")
    return directory
