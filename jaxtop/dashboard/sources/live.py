"""Live agents over their sockets, and processes watched from outside
(psutil + NVML) when they have no agent."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import stat
import tempfile
import threading
import time
from typing import Any, Iterable

from jaxtop.wire import client, paths, protocol
from jaxtop.dashboard.model import DISCONNECTED, EXITED, Model
from jaxtop.dashboard.sources.base import OnUpdate, Source
from jaxtop.dashboard.sources.spool import Spool, copy_gzip_lines
from jaxtop.wire.records import Exit, Record, Unknown, decode


#: Name of a dashboard's spool directory in the temporary directory: this
#: prefix, the owning process's pid, a dash, then mkdtemp's random part.
SPOOL_PREFIX = "jaxtop-session-"
#: Inside the spool directory: who owns it (pid, start time, pid namespace),
#: so that a later dashboard can tell that its owner is gone.
OWNER_FILE = "owner.json"

# The spool directories of this process's sources that have not been
# stopped, each with its source: removed at exit and on SIGHUP/SIGTERM when
# the dashboard did not get to stop them itself.
_open_spools: dict[str, LiveSource] = {}
_atexit_registered = False
# Signals for which our handler is installed (only ever over SIG_DFL).
_handled_signals: set[int] = set()
_FATAL_SIGNALS = (signal.SIGHUP, signal.SIGTERM)


def _process_start(pid: int) -> str | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/PID/stat``
    field 22): with the pid it tells a process from a later one that got
    the same pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _owner_is_gone(owner: Any) -> bool:
    """True only when the process that wrote ``owner`` surely is gone."""
    if not isinstance(owner, dict):
        return False
    pid = owner.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    # A dashboard in another pid namespace (a container sharing /tmp) has
    # pids that mean nothing here: leave its spool alone.
    namespace = _pid_namespace()
    if namespace is None or owner.get("pid_ns") != namespace:
        return False
    if not client.pid_alive(pid):
        return True
    start = owner.get("start")
    now = _process_start(pid)
    return start is not None and now is not None and now != start  # the pid was reused


def remove_orphaned_spools(tmpdir: str | None = None) -> list[str]:
    """Remove the spool directories of dashboards of this user that are gone.

    A dashboard killed with SIGKILL cannot remove its spool; the next one
    does, here. Only directories named ``jaxtop-session-*`` in ``tmpdir``
    (default: the temporary directory), owned by this uid, whose owner file
    names a process of this pid namespace that no longer runs, are
    removed: never another user's, never one whose owner is unknown (an
    older jaxtop's, or one being created right now).

    Returns:
        The directories removed.
    """
    tmpdir = tmpdir or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = os.listdir(tmpdir)
    except OSError:
        return removed
    me = os.getuid()
    for name in names:
        if not name.startswith(SPOOL_PREFIX):
            continue
        path = os.path.join(tmpdir, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != me:
                continue
            with open(os.path.join(path, OWNER_FILE)) as f:
                owner = json.load(f)
        except (OSError, ValueError):
            continue
        if _owner_is_gone(owner):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _remove_open_spools() -> None:
    """At exit: the spools of sources nobody stopped (an exception, sys.exit)."""
    for source in list(_open_spools.values()):
        source._discard_spool()


def _on_fatal_signal(signum: int, frame: Any) -> None:
    """SIGHUP (the terminal closed) or SIGTERM: remove every spool, then die
    of the same signal, as without this handler."""
    _remove_open_spools()
    for sig in _handled_signals:
        signal.signal(sig, signal.SIG_DFL)
    _handled_signals.clear()
    os.kill(os.getpid(), signum)


def _install_signal_handlers() -> None:
    # Only from the main thread (Python's rule), and only where nothing else
    # handles the signal: a program's own handler, or SIG_IGN under nohup, stays.
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _FATAL_SIGNALS:
        if sig in _handled_signals:
            continue
        try:
            if signal.getsignal(sig) is signal.SIG_DFL:
                signal.signal(sig, _on_fatal_signal)
                _handled_signals.add(sig)
        except (ValueError, OSError):
            pass


def _restore_signal_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # left installed: with no spool open, it only dies of the signal
    for sig in list(_handled_signals):
        try:
            if signal.getsignal(sig) is _on_fatal_signal:
                signal.signal(sig, signal.SIG_DFL)
        except (ValueError, OSError):
            pass
        _handled_signals.discard(sig)


def _make_spool_dir() -> str:
    """A new spool directory for this process, with its owner file."""
    global _atexit_registered
    remove_orphaned_spools()
    path = tempfile.mkdtemp(prefix=f"{SPOOL_PREFIX}{os.getpid()}-")
    owner = {"pid": os.getpid(), "start": _process_start(os.getpid()), "pid_ns": _pid_namespace()}
    try:
        paths.write_atomic(os.path.join(path, OWNER_FILE), json.dumps(owner).encode())
    except OSError:
        pass  # then no later dashboard removes it if we are killed: no worse than that
    if not _atexit_registered:
        atexit.register(_remove_open_spools)
        _atexit_registered = True
    return path


def _spool_cap() -> int:
    text = os.environ.get("JAXTOP_SPOOL_MAX_BYTES", "")
    return int(text) if text.isdigit() and int(text) > 0 else 256 << 20


class _Connection:
    """One agent: reader thread, spool file of every raw line, its connection.

    Every raw line goes to a compressed spool on disk, so `w` can save the
    session while the dashboard's memory stays flat. The spool is capped:
    past ``JAXTOP_SPOOL_MAX_BYTES`` (compressed, default 256 MiB) the current
    segment becomes the previous one (the one before is dropped) and a new
    segment starts with the stream's header lines (hello, backend), so a
    saved session always opens with them. All spool methods run under
    ``spool_lock``.
    """

    HEADER_TYPES = (b'{"type":"hello"', b'{"type":"backend"')

    def __init__(self, pid: int, spool_dir: str) -> None:
        self.pid = pid
        self.agent: client.AgentConnection | None = None  # while connected
        self.spool_path = os.path.join(spool_dir, f"{pid}.jsonl.gz")
        self.prev_path = os.path.join(spool_dir, f"{pid}.prev.jsonl.gz")
        self.spool = Spool(self.spool_path)
        self.spool_lock = threading.Lock()
        self.spool_cap = _spool_cap()
        self.header: list[bytes] = []
        self.header_lines_in_segment = 0  # repeated header lines at the top of the current segment
        self.rotations = 0
        self._lines_since_check = 0
        self.saw_exit = False
        self.thread: threading.Thread | None = None
        # The spool is a recording: the history an agent sends after its
        # present goes in before it, in time order.
        self.order = client.RecordingOrder()

    def spool_line(self, line: bytes) -> None:
        """Append one line (ending in a newline) to the spool."""
        self.spool_lines([line])

    def spool_lines(self, lines: list[bytes]) -> None:
        """Append lines (each ending in a newline) to the spool, in one
        write: a backlog comes a read of hundreds of lines at a time, and a
        gzip write a line cost a fifth of a backlog's reading."""
        if not lines:
            return
        for line in lines:
            if line.startswith(self.HEADER_TYPES):
                if line.startswith(b'{"type":"hello"'):
                    self.header = []
                self.header.append(line)
        try:
            self.spool.write(b"".join(lines) if len(lines) > 1 else lines[0])
        except (OSError, ValueError):
            return
        self._lines_since_check += len(lines)
        if self._lines_since_check >= 256:
            self._lines_since_check = 0
            try:
                full = self.spool.size_over(self.spool_cap // 2)
            except (OSError, ValueError):
                return
            if full:
                self._rotate()

    def _rotate(self) -> None:
        try:
            self.spool.close()
            os.replace(self.spool_path, self.prev_path)
            self.spool = Spool(self.spool_path)
            for line in self.header:
                self.spool.write(line)
        except OSError:
            return
        self.header_lines_in_segment = len(self.header)
        self.rotations += 1

    def save(self, target: str) -> None:
        try:
            self.spool.flush()
        except (OSError, ValueError):
            pass
        with paths.replacing(target) as out:
            if self.rotations and os.path.exists(self.prev_path):
                copy_gzip_lines(self.prev_path, out)
                copy_gzip_lines(self.spool_path, out, skip=self.header_lines_in_segment)
            else:
                copy_gzip_lines(self.spool_path, out)


class LiveSource(Source):
    """Reads one or more running agents over their sockets.

    Reconnects while the target lives (an agent that was stopped and started
    again); marks a process exited when its stream ends for good.
    """

    kind = "live"

    def __init__(self, pids: list[int], retry_s: float = 1.0, external: Iterable[int] = ()) -> None:
        super().__init__()
        self._pids = list(dict.fromkeys(pids))
        # Processes without an agent, watched from outside (psutil + NVML).
        self._external = set(external)
        self._retry_s = retry_s
        self._stop = threading.Event()
        # Removed by stop(); if the dashboard never gets there, at exit or
        # on SIGHUP/SIGTERM; after a SIGKILL, by the next dashboard.
        self._spool_dir = _make_spool_dir()
        _open_spools[self._spool_dir] = self
        self._conns = {pid: _Connection(pid, self._spool_dir) for pid in self._pids}

    @property
    def pids(self) -> list[int]:
        return list(self._pids)

    def start(self, model: Model, on_update: OnUpdate) -> None:
        super().start(model, on_update)
        _install_signal_handlers()
        for conn in self._conns.values():
            model.process(conn.pid)
            run = self._run_external if conn.pid in self._external else self._run
            conn.thread = threading.Thread(target=run, args=(conn,), name=f"jaxtop-read-{conn.pid}", daemon=True)
            conn.thread.start()

    def stop(self) -> None:
        self._stop.set()
        for conn in self._conns.values():
            agent = conn.agent
            if agent is not None:
                agent.shutdown()
        for conn in self._conns.values():
            if conn.thread is not None:
                conn.thread.join(timeout=2)
            with conn.spool_lock:
                try:
                    conn.spool.close()
                except OSError:
                    pass
        # The spool only serves `w` while the dashboard runs: remove it.
        shutil.rmtree(self._spool_dir, ignore_errors=True)
        _open_spools.pop(self._spool_dir, None)
        if not _open_spools:
            _restore_signal_handlers()

    def _discard_spool(self, lock_timeout_s: float = 0.5) -> None:
        """Close and remove the spool now, without waiting for the readers
        (at exit, or in a signal handler that may have interrupted a holder
        of a spool lock on this very thread)."""
        self._stop.set()
        for conn in self._conns.values():
            locked = conn.spool_lock.acquire(timeout=lock_timeout_s)
            try:
                conn.spool.close(wait=False)
            except (OSError, ValueError):
                pass
            finally:
                if locked:
                    conn.spool_lock.release()
        shutil.rmtree(self._spool_dir, ignore_errors=True)
        _open_spools.pop(self._spool_dir, None)

    def _run(self, conn: _Connection) -> None:
        model = self.model
        assert model is not None
        first = True
        while not self._stop.is_set():
            try:
                agent = client.AgentConnection.open(conn.pid)
            except (client.AgentNotFound, paths.SocketDirError) as exc:
                # SocketDirError: the directory, or the socket's owner, is not
                # to be trusted; shown like a missing agent, never read.
                if first:
                    model.add_event(conn.pid, "error", str(exc))
                if not client.pid_alive(conn.pid):
                    model.set_state(conn.pid, EXITED, "process exited" + ("" if conn.saw_exit else " (no final sample)"))
                    self.on_update()
                    return
                model.set_state(conn.pid, DISCONNECTED, str(exc))
                self.on_update()
                first = False
                self._stop.wait(self._retry_s)
                continue
            first = False
            conn.agent = agent
            # Bigger reads while a backfill pours in: fewer, larger batches for
            # Model.feed_many; a live 10 Hz stream is never near this size.
            agent.RECV_BYTES = 1 << 20
            self._read(conn, agent)
            with conn.spool_lock:
                conn.spool_lines(conn.order.flush())
            conn.agent = None
            agent.close()
            if self._stop.is_set():
                return
            if conn.saw_exit or not client.pid_alive(conn.pid):
                model.set_state(conn.pid, EXITED, "process exited" + ("" if conn.saw_exit else " (no final sample)"))
                self.on_update()
                return
            model.set_state(conn.pid, DISCONNECTED, "connection lost; retrying")
            self.on_update()
            self._stop.wait(self._retry_s)

    def _feed_spooled(self, conn: _Connection, record: dict[str, Any]) -> None:
        assert self.model is not None
        with conn.spool_lock:
            conn.spool_line(protocol.encode(record))
        self.model.feed(conn.pid, record)
        self.on_update()

    def _run_external(self, conn: _Connection) -> None:
        """No agent: what needs no cooperation, once a second (psutil, NVML)."""
        import psutil

        from jaxtop.probes.nvml import NvmlProbe
        from jaxtop.probes.process import ProcessProbe

        pid = conn.pid
        try:
            ps = psutil.Process(pid)
            argv, started = ps.cmdline(), ps.create_time()
            probe = ProcessProbe(pid)
        except (psutil.Error, OSError) as exc:
            assert self.model is not None
            self.model.add_event(pid, "error", f"cannot watch pid {pid}: {exc}")
            self.model.set_state(pid, EXITED, str(exc))
            self.on_update()
            return
        nvml = NvmlProbe(pid=pid)
        nvml.start(thread=True)
        note = "psutil + NVML only, no agent in the process (jaxtop attach --inject for device memory and transfers)"
        self._feed_spooled(conn, {
            "type": "hello", "t": time.time(), "protocol": protocol.PROTOCOL_VERSION, "pid": pid, "argv": argv,
            "started_t": started, "interval_s": 1.0, "devices": [], "backend": None,
            "external": {"note": note, "probes": ["psutil", "nvml"]},
            "transfer_capture": {"available": False, "reason": "external view: no agent in the process"},
            "nvml": nvml.describe(),
        })
        self.model.add_event(pid, "info", f"external view of pid {pid}: {note}")
        seq = 0
        try:
            while not self._stop.wait(1.0):
                if not client.pid_alive(pid):
                    self.model.set_state(pid, EXITED, "process exited")
                    self.on_update()
                    return
                seq += 1
                record: dict[str, Any] = {"type": "sample", "t": time.time(), "seq": seq, "devices": [],
                                          "process": probe.sample()}
                if nvml.available:
                    record["nvml"] = nvml.sample()
                self._feed_spooled(conn, record)
        finally:
            nvml.stop()

    def _read(self, conn: _Connection, agent: client.AgentConnection) -> None:
        model = self.model
        assert model is not None

        def oversized() -> None:
            model.add_event(conn.pid, "error", "agent sent an oversized line; skipped")

        for lines in agent.batches(should_stop=self._stop.is_set, poll_s=0.5, on_oversized=oversized):
            with conn.spool_lock:
                conn.spool_lines(conn.order.feed_many(lines))
            if ingest(model, conn.pid, lines):
                conn.saw_exit = True
            self.on_update()

    def send_command(self, pid: int, name: str, args: dict[str, Any] | None = None) -> str | None:
        conn = self._conns.get(pid)
        agent = conn.agent if conn is not None else None  # read once: the reader may drop it meanwhile
        if agent is None:
            return f"pid {pid} is not connected"
        try:
            agent.send_command(name, args)
        except OSError as exc:
            return f"send failed: {exc}"
        return None

    def save(self, path: str) -> list[str]:
        written = []
        for pid, conn in self._conns.items():
            target = path if len(self._conns) == 1 else _with_suffix(path, pid)
            with conn.spool_lock:
                conn.save(target)
            if conn.rotations:
                assert self.model is not None
                self.model.add_event(pid, "info", f"saved the newest part of the session: the spool keeps "
                                     f"{conn.spool_cap >> 20} MiB compressed (JAXTOP_SPOOL_MAX_BYTES)")
            written.append(target)
        return written


#: Lines decoded between two chances for the UI to go first (Model.step_aside):
#: about 2 ms of decoding for an 8-device sample on a 2-core VM.
STEP_ASIDE_LINES = 16


def ingest(model: Model, pid: int, lines: list[bytes]) -> bool:
    """Decode one read of an agent's lines and feed them to ``model``.

    One model update per read: an agent's backfill arrives in a few big
    reads, and the model ingests a batch far faster than the same records
    one by one. Every few lines the reader steps aside while the UI answers
    a key (:meth:`Model.step_aside`): decoding holds the GIL as much as
    feeding does. A line that is not a record is skipped with an error event
    placed after the records before it.

    Returns:
        Whether the read held the agent's ``exit`` record.
    """
    records: list[Record | Unknown] = []
    saw_exit = False
    for n, line in enumerate(lines, 1):
        if n % STEP_ASIDE_LINES == 0:
            model.step_aside()
        if not line or line.isspace():  # (strip() would copy every line)
            continue
        try:
            record = decode(line)
        except protocol.ProtocolError as exc:
            model.feed_many(pid, records)
            records = []
            model.add_event(pid, "error", f"malformed line from agent skipped: {exc}")
            continue
        if record.__class__ is Exit:
            saw_exit = True
        records.append(record)
    if records:
        model.feed_many(pid, records)
    return saw_exit


def _with_suffix(path: str, pid: int) -> str:
    root, ext = os.path.splitext(path)
    return f"{root}-{pid}{ext or '.jsonl'}"
