"""Live agents over their sockets, and processes watched from outside
(psutil + NVML) when they have no agent."""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
import threading
import time
from typing import IO, Any, Iterable

from jaxtop import client, protocol
from jaxtop.dashboard.model import DISCONNECTED, EXITED, Model
from jaxtop.dashboard.sources.base import OnUpdate, Source


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
        self.spool: IO[bytes] = gzip.open(self.spool_path, "wb", compresslevel=1)
        self.spool_lock = threading.Lock()
        self.spool_cap = _spool_cap()
        self.header: list[bytes] = []
        self.header_lines_in_segment = 0  # repeated header lines at the top of the current segment
        self.rotations = 0
        self._lines_since_check = 0
        self.saw_exit = False
        self.thread: threading.Thread | None = None

    def spool_line(self, line: bytes) -> None:
        """Append one line (ending in a newline) to the spool."""
        if line.startswith(self.HEADER_TYPES):
            if line.startswith(b'{"type":"hello"'):
                self.header = []
            self.header.append(line)
        try:
            self.spool.write(line)
        except (OSError, ValueError):
            return
        self._lines_since_check += 1
        if self._lines_since_check >= 256:
            self._lines_since_check = 0
            try:
                size = self.spool.fileobj.tell()  # type: ignore[attr-defined]
            except (AttributeError, OSError, ValueError):
                return
            if size > self.spool_cap // 2:
                self._rotate()

    def _rotate(self) -> None:
        try:
            self.spool.close()
            os.replace(self.spool_path, self.prev_path)
            self.spool = gzip.open(self.spool_path, "wb", compresslevel=1)
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
        with open(target, "wb") as out:
            if self.rotations and os.path.exists(self.prev_path):
                _copy_gzip_lines(self.prev_path, out)
                _copy_gzip_lines(self.spool_path, out, skip=self.header_lines_in_segment)
            else:
                _copy_gzip_lines(self.spool_path, out)


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
        self._spool_dir = tempfile.mkdtemp(prefix="jaxtop-session-")
        self._conns = {pid: _Connection(pid, self._spool_dir) for pid in self._pids}

    @property
    def pids(self) -> list[int]:
        return list(self._pids)

    def start(self, model: Model, on_update: OnUpdate) -> None:
        super().start(model, on_update)
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

    def _run(self, conn: _Connection) -> None:
        model = self.model
        assert model is not None
        first = True
        while not self._stop.is_set():
            try:
                agent = client.AgentConnection.open(conn.pid)
            except client.AgentNotFound as exc:
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
            self._read(conn, agent)
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
                for line in lines:
                    conn.spool_line(line)
            for line in lines:
                if not line.strip():
                    continue
                try:
                    record = protocol.decode(line)
                except protocol.ProtocolError as exc:
                    model.add_event(conn.pid, "error", f"malformed line from agent skipped: {exc}")
                    continue
                if record.get("type") == "exit":
                    conn.saw_exit = True
                model.feed(conn.pid, record)
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


def _with_suffix(path: str, pid: int) -> str:
    root, ext = os.path.splitext(path)
    return f"{root}-{pid}{ext or '.jsonl'}"


def _copy_gzip_lines(src: str, out: IO[bytes], skip: int = 0) -> None:
    """Copy the complete lines of a (possibly still open) gzip spool, after
    the first ``skip`` ones."""
    try:
        with gzip.open(src, "rb") as f:
            while True:
                try:
                    line = f.readline()
                except (EOFError, OSError):
                    break  # the unfinished tail of a stream still being written
                if not line or not line.endswith(b"\n"):
                    break
                if skip:
                    skip -= 1
                    continue
                out.write(line)
    except OSError:
        pass
