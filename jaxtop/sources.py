"""Where records come from: live agents or a recording. One code path feeds
the model either way; each source runs its own thread and never touches the UI.
"""

from __future__ import annotations

import abc
import gzip
import os
import shutil
import socket
import tempfile
import threading
import time
from typing import IO, Any, Callable, Iterable

from jaxtop import client, protocol
from jaxtop.model import DISCONNECTED, EXITED, REPLAY, Model

OnUpdate = Callable[[], None]


class Source(abc.ABC):
    """Base: a set of processes whose records go into a model."""

    kind = "base"

    def __init__(self) -> None:
        self.model: Model | None = None
        self.on_update: OnUpdate = lambda: None

    @property
    @abc.abstractmethod
    def pids(self) -> list[int]:
        """The processes this source follows, in display order."""

    def start(self, model: Model, on_update: OnUpdate) -> None:
        self.model, self.on_update = model, on_update

    def stop(self) -> None:
        pass

    def send_command(self, pid: int, name: str, args: dict[str, Any] | None = None) -> str | None:
        """Send a command to the agent; None when sent, else why not."""
        return "commands need a live agent"

    @abc.abstractmethod
    def save(self, path: str) -> list[str]:
        """Write the session as JSON lines; returns the files written."""

    def replay_state(self) -> dict[str, Any] | None:
        return None


def _spool_cap() -> int:
    text = os.environ.get("JAXTOP_SPOOL_MAX_BYTES", "")
    return int(text) if text.isdigit() and int(text) > 0 else 256 << 20


class _Connection:
    """One agent: reader thread, spool file of every raw line, command writer.

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
        self.sock: socket.socket | None = None
        self.send_lock = threading.Lock()
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
        self.next_id = 1

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
            if conn.sock is not None:
                try:
                    conn.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
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
                sock = client.connect(conn.pid)
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
            conn.sock = sock
            sock.settimeout(0.5)
            self._read(conn, sock)
            conn.sock = None
            try:
                sock.close()
            except OSError:
                pass
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

    def _read(self, conn: _Connection, sock: socket.socket) -> None:
        model = self.model
        assert model is not None
        pending = b""
        while not self._stop.is_set():
            try:
                chunk = sock.recv(1 << 16)
            except socket.timeout:
                continue
            except OSError:
                return
            if not chunk:
                return
            pending += chunk
            if len(pending) > protocol.MAX_RECORD_LINE_BYTES and b"\n" not in pending:
                model.add_event(conn.pid, "error", "agent sent an oversized line; skipped")
                pending = b""
                continue
            *lines, pending = pending.split(b"\n")
            with conn.spool_lock:
                for line in lines:
                    conn.spool_line(line + b"\n")
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
        if conn is None or conn.sock is None:
            return f"pid {pid} is not connected"
        with conn.send_lock:
            request = {"type": "command", "t": time.time(), "name": name, "args": args or {}, "id": conn.next_id}
            conn.next_id += 1
            try:
                conn.sock.sendall(protocol.encode(request))
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



class ReplaySource(Source):
    """Plays a recording: play/pause, step, seek, speed.

    The file is indexed once (line offsets); records are decoded as they are
    played, so big recordings open fast and cost little memory.
    """

    kind = "replay"

    def __init__(self, path: str, speed: float = 1.0, start_playing: bool = True) -> None:
        super().__init__()
        self.path = path
        self.speed = speed
        self.playing = start_playing
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self.stats = protocol.ReadStats()
        self._offsets: list[int] = []
        self._times: list[float] = []
        self._is_sample: list[bool] = []
        self.position = 0  # index of the next record to play
        self.pid = 0
        self._index()
        self._thread: threading.Thread | None = None

    def _index(self) -> None:
        """Find every valid record's offset and time (skips what is broken)."""
        with open(self.path, "rb") as f:
            offset = 0
            lineno = 0
            for line in f:
                lineno += 1
                start, offset = offset, offset + len(line)
                if not line.endswith(b"\n"):
                    self.stats.truncated = True
                    break
                if not line.strip():
                    continue
                try:
                    rec = protocol.decode(line)
                    t = float(rec.get("t"))
                except (protocol.ProtocolError, TypeError, ValueError) as exc:
                    self.stats.note(lineno, str(exc) if isinstance(exc, protocol.ProtocolError) else "no numeric 't'")
                    continue
                if rec.get("type") == "hello" and not self._offsets:
                    self.pid = int(rec.get("pid") or 0)
                self.stats.records += 1
                self._offsets.append(start)
                self._times.append(t)
                self._is_sample.append(rec.get("type") == "sample")
        if not self._offsets:
            raise ValueError(f"{self.path}: no jaxtop records found" + (f" ({self.stats.first_error})" if self.stats.first_error else ""))

    @property
    def pids(self) -> list[int]:
        return [self.pid]

    @property
    def length(self) -> int:
        return len(self._offsets)

    def notices(self) -> list[str]:
        out = []
        if self.stats.truncated:
            out.append("recording ends with a truncated line (writer was killed); it was skipped")
        if self.stats.malformed:
            out.append(f"{self.stats.malformed} malformed line(s) skipped; first: {self.stats.first_error}")
        return out

    def start(self, model: Model, on_update: OnUpdate) -> None:
        super().start(model, on_update)
        for note in self.notices():
            model.add_notice(note)
        model.process(self.pid)
        self._thread = threading.Thread(target=self._run, name="jaxtop-replay", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _read_at(self, index: int) -> dict[str, Any]:
        with open(self.path, "rb") as f:
            f.seek(self._offsets[index])
            return protocol.decode(f.readline())

    def _feed_range(self, start: int, stop: int, model: Model | None = None) -> None:
        model = model or self.model
        assert model is not None
        with open(self.path, "rb") as f:
            f.seek(self._offsets[start]) if start < len(self._offsets) else None
            for i in range(start, stop):
                f.seek(self._offsets[i])
                model.feed(self.pid, protocol.decode(f.readline()))
        model.set_state(self.pid, REPLAY)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                playing = self.playing and self.position < self.length
                if playing:
                    i = self.position
                    self._feed_range(i, i + 1)
                    self.position = i + 1
                    gap = (self._times[i + 1] - self._times[i]) / self.speed if i + 1 < self.length else None
            if playing:
                self.on_update()
                if gap is not None:
                    self._wake.wait(min(max(gap, 0.0), 1.0))
                    self._wake.clear()
            else:
                self._wake.wait(0.2)
                self._wake.clear()

    # -- controls (UI thread) ----------------------------------------------------
    def toggle(self) -> bool:
        with self._lock:
            self.playing = not self.playing
        self._wake.set()
        return self.playing

    def set_speed(self, speed: float) -> None:
        self.speed = max(0.1, min(speed, 1000.0))
        self._wake.set()

    def step(self, samples: int = 1) -> None:
        """Advance by whole samples (and the records between them), paused."""
        with self._lock:
            self.playing = False
            seen = 0
            start = self.position
            while self.position < self.length and seen < samples:
                if self._is_sample[self.position]:
                    seen += 1
                self.position += 1
            self._feed_range(start, self.position)
        self.on_update()

    def seek(self, t: float) -> None:
        """Jump to recording time ``t`` (rebuilds the model up to there)."""
        import bisect

        with self._lock:
            target = bisect.bisect_right(self._times, t)
            # Never seek to before the first sample: an empty screen says nothing.
            first_sample = next((i + 1 for i, is_sample in enumerate(self._is_sample) if is_sample), 1)
            target = max(first_sample, min(target, self.length))
            if target < self.position:
                assert self.model is not None
                rebuilt = Model(clock=self.model._clock)
                self._feed_range(0, target, rebuilt)
                self.model.adopt(self.pid, rebuilt)
            else:
                self._feed_range(self.position, target)
            self.position = target
        self._wake.set()
        self.on_update()

    def current_t(self) -> float:
        return self._times[max(0, self.position - 1)]

    def replay_state(self) -> dict[str, Any]:
        return {
            "playing": self.playing and self.position < self.length,
            "speed": self.speed,
            "position": self.position,
            "length": self.length,
            "t": self.current_t(),
            "t_start": self._times[0],
            "t_end": self._times[-1],
            "path": self.path,
        }

    def save(self, path: str) -> list[str]:
        with open(path, "wb") as out, open(self.path, "rb") as f:
            for i in range(self.position):
                f.seek(self._offsets[i])
                out.write(f.readline())
        return [path]


class PushSource(Source):
    """Records pushed in by code: embedding the dashboard, tests, benchmarks.

    ``push`` may be called from any thread; commands are recorded in
    ``commands`` (and answered by ``on_command`` if given).
    """

    kind = "live"

    def __init__(self, pids: list[int] | None = None, on_command: Callable[[int, str, dict], dict | None] | None = None) -> None:
        super().__init__()
        self._pids = list(pids or [])
        self.commands: list[tuple[int, str, dict[str, Any]]] = []
        self._on_command = on_command
        self._lines: list[bytes] = []

    @property
    def pids(self) -> list[int]:
        return list(self._pids)

    def push(self, pid: int, record: dict[str, Any], update: bool = True) -> None:
        assert self.model is not None, "start() the source first (mount the app)"
        if pid not in self._pids:
            self._pids.append(pid)
        self.model.feed(pid, record)
        if len(self._lines) < 100_000:
            self._lines.append(protocol.encode(record))
        if update:
            self.on_update()

    def send_command(self, pid: int, name: str, args: dict[str, Any] | None = None) -> str | None:
        self.commands.append((pid, name, dict(args or {})))
        if self._on_command is not None:
            reply = self._on_command(pid, name, dict(args or {}))
            if reply is not None and self.model is not None:
                self.push(pid, {"type": "reply", "t": time.time(), "ok": True, "result": reply})
        return None

    def save(self, path: str) -> list[str]:
        with open(path, "wb") as f:
            f.writelines(self._lines)
        return [path]
