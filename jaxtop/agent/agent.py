"""The in-process agent: probes -> samples -> Unix socket (and a log file).

One daemon thread runs a selector loop (:mod:`.loop`): it accepts clients
and reads their commands; every ``interval_s`` it ticks the probe list
(:mod:`.probe_list`: the stderr relay's guard lines first, then memory,
transfers, host, compiles...) and sends the sample to every client, the
history and the recording (:mod:`.stream`). This module starts and stops
it, on the user's threads. Nothing here may
raise into the user's program or block its threads: every entry point that
runs on a user thread (``start``, the import hook, ``atexit``) is guarded, and
all socket I/O is non-blocking on the agent's own thread.

No peer can stop the agent or weigh on the program: what clients may cost is
bounded in :mod:`.clients`, a failure while serving one client closes that
client only, and ``memory_profile`` runs at most once per
:data:`jaxtop.agent.commands.PROFILE_MIN_INTERVAL_S`. ``start`` is all or
nothing. In a child made by ``os.fork()`` the inherited agent is inert: it
never touches the parent's socket, log or stderr relay, and never waits at
exit.

No Textual here: the agent must run in a job that has only jax installed.
"""

from __future__ import annotations

import atexit
import os
import selectors
import socket
import threading
import time
import weakref
from typing import Any, Callable

from jaxtop.agent import cadence, labels
from jaxtop.agent.capture import CaptureProbe
from jaxtop.agent.clients import Clients, CommandHandler
from jaxtop.agent.commands import MemoryProfileCommand, detach_command
from jaxtop.agent.devices import DevicesProbe
from jaxtop.agent.import_hook import when_imported
from jaxtop.agent.log import RecordLog
from jaxtop.agent.loop import AgentLoop, versions
from jaxtop.agent.probe_list import FieldProbe, ProbeList
from jaxtop.agent.stream import Stream
from jaxtop.probes.base import Probe
from jaxtop.probes.compile import CompileProbe
from jaxtop.probes.donation import DonationProbe
from jaxtop.probes.executables import JitLedgerProbe
from jaxtop.probes.holders import HoldersProbe, NotNow
from jaxtop.probes.host_sync import HostSyncProbe
from jaxtop.probes.jax_memory import JaxMemoryProbe
from jaxtop.probes.nvml import NvmlProbe
from jaxtop.probes.oom import OomProbe
from jaxtop.probes.process import ProcessProbe
from jaxtop.probes.tpu_monitoring import TpuMonitoringProbe
from jaxtop.probes.transfer_guard import TransferCounter
from jaxtop.probes.transfer_sites import TransferSitesProbe
from jaxtop.wire import paths
from jaxtop.wire.prometheus import DEFAULT_ADDR as DEFAULT_PROMETHEUS_ADDR, job_name

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


class Agent(AgentLoop):
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
        prometheus_port, prometheus_addr: serve Prometheus metrics there.
        job: the run this process belongs to, the ``job`` label of its
            metrics (default ``$JAXTOP_JOB``, else the jax.distributed
            coordinator's address, else the program's name).
        prometheus_push: a Pushgateway URL the last metrics are pushed to at
            exit (default ``$JAXTOP_PROMETHEUS_PUSH``).
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
        job: str | None = None,
        prometheus_push: str | None = None,
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
        # The run this process belongs to (the `job` label of its metrics);
        # None: named from the jax.distributed coordinator or the program.
        self.job = job_name(job if job is not None else os.environ.get("JAXTOP_JOB"))
        # A Pushgateway to push the last metrics to at exit (a process that
        # lives shorter than a scrape interval is seen all the same).
        self.prometheus_push = prometheus_push or os.environ.get("JAXTOP_PROMETHEUS_PUSH") or None
        self._prom_server: Any = None
        self.started_t = time.time()
        self.events: list[dict[str, Any]] = []  # notices for the next sample

        self.stream = Stream(self.backfill_s)  # clients, history, recording, Prometheus
        self._commands: dict[str, CommandHandler] = {
            "ping": lambda args: {"pong": True},
            "memory_profile": MemoryProfileCommand(lambda: self.memory is not None),
            "detach": detach_command(self),
        }
        self._clients = Clients(lambda: self.stream.greeting(self._hello()), self._commands, self.stream.backfill,
                                on_error=self._on_client_error)
        self.stream.clients = self._clients
        self._selector: selectors.BaseSelector | None = None
        self._inert = False  # a fork child's copy: does nothing
        self._stderr_fd: int | None = None  # the original stderr, kept before the capture takes fd 2
        self._last_loop_error: str | None = None
        self._seq = 0
        self._lock = threading.Lock()
        self._tick_requested = False  # request_tick(): the loop ticks at its next wake
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._stop_requested = False
        self._final_requested = False
        self._final_done = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None
        self._jax_hooked = False
        self._agent_cpu_s = 0.0
        self._meter = cadence.SelfMeter()  # the agent thread's own CPU share (see jaxtop.agent.cadence)
        self._stops = cadence.StopDetector()  # a late tick: was the process stopped, or busy?

        # The probes, in the order of their fields in a sample. Each is
        # started, ticked and stopped through one interface
        # (jaxtop.probes.base.Probe): the agent itself reads nothing.
        self.probes = ProbeList()
        self.transfers = TransferCounter()
        # First: each tick takes the guard lines the stderr relay reported
        # before the transfer counts are read.
        self.capture_probe = CaptureProbe(self.transfers, enabled=capture_stderr,
                                          on_notice=self._on_capture_notice, on_oom_line=self._on_oom_line)
        self.oom_probe = OomProbe(self)  # censuses go out as records of their own, before the sample
        self.devices = DevicesProbe(self.slow_interval_s, versions)
        self.process = ProcessProbe()
        self.compile = CompileProbe()
        self.donation = DonationProbe()
        self.nvml = NvmlProbe() if nvml else None
        # The TPU runtime's own readings (duty cycle, HBM, HLO queue), on a
        # TPU backend only: sample field `accelerator`, sent when it changes.
        self.accelerator = TpuMonitoringProbe(pause_limit_s=self.devices.pause.limit_s)
        # The jit ledger: every compiled function's memory, compiles and
        # recompile reasons (sample field `jit`, command `jit_ledger`).
        self.jit = JitLedgerProbe(interval_s=self.slow_interval_s)
        for probe in (self.capture_probe, self.oom_probe, self.devices, self.transfers, self.process,
                      self.compile, self.donation, self.nvml, self.accelerator, self.jit):
            if probe is not None:
                self.add_probe(probe)
        # Who holds memory (`holders`, commands holders_mark and
        # holders_profile), which lines read arrays on the host
        # (`host_syncs`), named pytrees (`labels`).
        self._holders_scan = -1  # the live-array scan a holders profile last read, while scans are held
        self.holders = HoldersProbe(arrays=self._holders_arrays).install(self)
        self.host_sync = HostSyncProbe().install(self)
        # Which line made each implicit transfer (`transfer_sites`): the
        # guard lines' stamps from the capture, matched with the calls and
        # host reads the program's threads note.
        self.transfer_sites = TransferSitesProbe(enabled=capture_stderr)
        self.capture_probe.on_stamps = self.transfer_sites.take_stamps
        self.transfer_sites.wait_report = self.capture_probe.wait_report
        self.host_sync.on_read = self.transfer_sites.on_read
        self.add_probe(self.transfer_sites)
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
            self.probes.stop()  # the process probe keeps /proc files open from __init__ on
            raise

    def _start(self, undo: list[Callable[[], None]]) -> None:
        """The steps of :meth:`start`, each pushing its own undoing to ``undo``."""
        if self.prometheus_port is not None:  # first: fail before changing anything
            from jaxtop.wire.prometheus import StreamState, serve

            state = StreamState()
            self._prom_server = serve(state, self.prometheus_port, self.prometheus_addr)
            self.stream.prometheus = state
            undo.append(self._stop_prometheus)
        if self.prometheus_push and self.stream.prometheus is None:
            try:
                import prometheus_client  # noqa: F401  (fail now, not at exit)
            except ImportError:
                from jaxtop.wire.prometheus import INSTALL_HINT

                raise ImportError(INSTALL_HINT) from None
            from jaxtop.wire.prometheus import StreamState

            self.stream.prometheus = StreamState()
            undo.append(lambda: setattr(self.stream, "prometheus", None))
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
            self.stream.log = RecordLog(self.log_path, self._log_failed)
            undo.append(self._close_log)
        if self.capture_probe.enabled:
            try:
                self._stderr_fd = os.dup(2)  # where our own notices go, once the capture has fd 2
            except OSError:
                self._stderr_fd = None
            undo.append(self._close_stderr_fd)
        self.probes.start_early()  # the stderr relay, the OOM hooks, NVML...
        undo.append(self.probes.stop)
        atexit.register(self._atexit)
        undo.append(lambda: atexit.unregister(self._atexit))
        _agents.add(self)
        undo.append(lambda: _agents.discard(self))
        if self.devices.max_pause_error:
            self._notice(f"jaxtop: {self.devices.max_pause_error}")
        when_imported("jax", self._on_jax_imported)  # a no-op once stopped
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
        if sync_timeout_s > 0 and not self._inert:
            self.capture_probe.sync(timeout_s=sync_timeout_s)
        return self.transfers.totals()

    @property
    def memory(self) -> JaxMemoryProbe | None:
        """The devices' memory probe, once the program has a JAX backend."""
        return self.devices.memory

    def _holders_arrays(self) -> tuple[Any, dict[int, str]] | None:
        """The memory probe's live arrays and the devices' profile labels
        (``platform:id``, as jaxlib's profile names them), for a holders
        profile read from the arrays; None before a backend."""
        memory = self.devices.memory
        if memory is None:
            return None
        if self.devices.scan_held:
            # The arrays are the last scan's (jaxlib's own profile would hold
            # the interpreter longer still: 35 ms at 50,000 arrays): one
            # profile reads them, the next waits for a scan (a growing
            # program's come once a minute: jaxtop.agent.scan_pause).
            if memory.scans == self._holders_scan:
                raise NotNow(f"no profile until the next live-array scan ({self.devices.scan_held})")
            self._holders_scan = memory.scans
        return memory.arrays, memory.device_labels()

    @property
    def capture(self) -> Any:
        """The stderr relay (``jaxtop.probes.stderr_capture.StderrCapture``), or None."""
        return self.capture_probe.capture

    @property
    def guard(self) -> Any:
        """The transfer guard's controller (``jaxtop.probes.transfer_guard.GuardController``),
        once jax is imported, or None."""
        return self.capture_probe.guard

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
        self.devices.request_scan()

    def request_tick(self) -> None:
        """Take a sample now rather than at the next interval (a budget
        window's edge waits for one: half an interval per edge on average,
        most of what pytest's plugin cost a small test). In-process callers
        only: no client command reaches it."""
        self.transfer_sites.tie_soon()  # and the lines it batches tied in it
        self._tick_requested = True
        self._wake()

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
        if sync_timeout_s > 0 and not self._inert:
            synced = self.capture_probe.sync(timeout_s=sync_timeout_s)
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

    def register_sample_field(self, name: str, fn: Callable[[], Any]) -> None:
        """Add ``record[name] = fn()`` to each sample when fn returns non-None
        (in place of the probe filling ``name``, if any).

        Runs on the agent thread: fn must be quick and thread-safe.
        """
        self.add_probe(FieldProbe(name, fn))

    def add_probe(self, probe: Probe) -> None:
        """List ``probe`` (``jaxtop.probes.base.Probe``) among the agent's:
        its field in every sample, its commands on the socket. One listed
        under the same name is stopped and replaced. Started at once if the
        agent runs (and, for a probe that needs jax, jax is imported)."""
        for name, handler in (getattr(probe, "commands", None) or {}).items():
            self._commands[name] = handler
        self.probes.add(probe)

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
        # Each probe that waits for jax starts now (one that cannot records
        # why; its samples then carry {"available": false, "reason": ...}).
        self.probes.jax_imported()
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
        """The capture lost its relay (killed, or the terminal went away): say so on the stream."""
        self.post_event("error", source="stderr_capture", text=text)

    def _on_oom_line(self, text: str) -> None:
        """An allocator's out-of-memory line passed on by the relay (GPU):
        the census is taken even when the program catches the error."""
        self.oom_probe.on_allocator_line(text)

    def recent_lines(self, n: int) -> list[bytes]:
        """The last ``n`` kept records as sent, oldest first (the OOM census
        shows the climb before the failure)."""
        return self.stream.recent_lines(n)

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

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
        self.stream.close_log()

    def _close_stderr_fd(self) -> None:
        fd, self._stderr_fd = self._stderr_fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

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
        if self.stream.log is not None:
            self.stream.log.close_in_child()
        self.stream.forget()
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
        # Every probe, the last listed first: jax.Array, numpy, jax's error
        # classes, the exception hooks, the guard and fd 2 exactly as they were.
        self.probes.stop()
        self._close_log()
        self._close_stderr_fd()
        self.stream.forget()
        self._close_wake_pipe()
        try:
            atexit.unregister(self._atexit)
        except Exception:
            pass


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
