"""Finding and connecting to agents; the recorder behind ``jaxtop log``.

No Textual, no jax: usable from scripts and the headless logging mode.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import IO, Any, Callable, Iterator

from jaxtop.wire import paths, protocol


class AgentNotFound(RuntimeError):
    """No agent listens for that process; the message says how to fix it."""


class ForeignAgent(paths.SocketDirError):
    """The process serving an agent's socket runs as another uid: refused
    before a command is sent or a record believed."""


@dataclass
class AgentInfo:
    """One instrumented process found in the socket directory."""

    pid: int
    socket_path: Path
    argv: list[str]
    started_t: float | None

    @property
    def command(self) -> str:
        return " ".join(self.argv) if self.argv else "?"


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, exited but not yet reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc: kill() said it exists


def no_agent_message(pid: int) -> str:
    if not pid_alive(pid):
        return f"no process with pid {pid}"
    return (
        f"no jaxtop agent in pid {pid} (no socket at {paths.socket_path(pid)}); "
        "start the program with `jaxtop run SCRIPT` or call jaxtop.instrument() in it"
    )


def peer_credentials(sock: socket.socket) -> tuple[int, int, int] | None:
    """``(pid, uid, gid)`` of the process at the other end of a Unix socket
    (Linux ``SO_PEERCRED``); None where the platform cannot tell."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i"))
    except OSError:
        return None
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def _check_peer(sock: socket.socket, path: Path) -> None:
    """Refuse a socket served by another uid. The directory check already
    keeps others from planting sockets; this also catches one linked or
    bound there by root, and does not depend on the directory's history."""
    creds = peer_credentials(sock)
    if creds is None:
        return  # no SO_PEERCRED here: the directory check is all there is
    peer_pid, uid, _gid = creds
    me = os.getuid()
    if uid != me:
        raise ForeignAgent(
            f"refusing {path}: the process serving it (pid {peer_pid}) runs as {paths.describe_uid(uid)}, "
            f"not as you, {paths.describe_uid(me)}; remove that socket if you did not expect it"
        )


def connect(pid: int, timeout_s: float = 2.0) -> socket.socket:
    """Connect to the agent of ``pid``.

    The socket directory is checked first (:func:`paths.check_socket_dir`)
    and the peer's uid after connecting: nothing is sent to, or read from, a
    socket that another user could have provided.

    Raises:
        AgentNotFound: no live agent socket for that pid (stale ones are removed).
        paths.SocketDirError: the socket directory is not safe to use, or
            (:class:`ForeignAgent`) the socket is served by another uid.
    """
    paths.check_socket_dir()
    path = paths.socket_path(pid)
    if not path.exists():
        raise AgentNotFound(no_agent_message(pid))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(str(path))
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT) and not pid_alive(pid):
            _remove_stale(path)
            raise AgentNotFound(f"pid {pid} has exited (removed its stale socket {path})") from None
        if exc.errno == errno.ECONNREFUSED:
            _remove_stale(path)
            raise AgentNotFound(f"stale socket {path}: nothing listens there (removed); {no_agent_message(pid)}") from None
        raise AgentNotFound(f"cannot connect to {path}: {exc.strerror}") from None
    try:
        _check_peer(sock, path)
    except ForeignAgent:
        sock.close()
        raise
    return sock


def _remove_stale(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


class AgentConnection:
    """One connection to an agent: commands out, raw lines in.

    The one place that reads an agent's stream. Lines come back whole and byte
    for byte; a line over :data:`protocol.MAX_RECORD_LINE_BYTES` is skipped
    without ever being held in full, and reported through ``on_oversized``.
    One thread may read while others send commands.

    Args:
        sock: A connected stream socket; the connection owns it from here.
    """

    #: Bytes asked of the socket per read.
    RECV_BYTES = 1 << 16
    #: The most a batch gathers while more is waiting (see :meth:`batches`).
    GATHER_BYTES = 4 << 20

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.oversized_lines = 0  # skipped for being over the limit, all reads together
        self._send_lock = threading.Lock()
        self._next_id = 1

    @classmethod
    def open(cls, pid: int, timeout_s: float = 2.0) -> AgentConnection:
        """Connect to the agent of ``pid`` (see :func:`connect`).

        Raises:
            AgentNotFound: no live agent socket for that pid.
            paths.SocketDirError: the directory or the socket's owner is not
                to be trusted (see :func:`connect`).
        """
        return cls(connect(pid, timeout_s))

    def send_command(self, name: str, args: dict[str, Any] | None = None) -> int:
        """Send one command; the agent's ``reply`` will carry the returned id.

        Returns:
            The command's ``id``, increasing per connection from 1.

        Raises:
            OSError: the send failed (the agent is gone, or it stopped reading).
        """
        # The lock keeps ids in order and requests whole when several threads send.
        with self._send_lock:
            command_id = self._next_id
            self._next_id += 1
            request = {"type": "command", "t": time.time(), "name": name, "args": args or {}, "id": command_id}
            self.sock.sendall(protocol.encode(request))
        return command_id

    def batches(
        self,
        should_stop: Callable[[], bool] = lambda: False,
        poll_s: float = 0.2,
        on_oversized: Callable[[], None] | None = None,
    ) -> Iterator[list[bytes]]:
        """Yield the complete lines of each read, each ending in ``b"\\n"``;
        while more is already waiting, of several reads (up to
        :attr:`GATHER_BYTES`).

        Ends when the peer closes, the socket fails or is shut down, or
        ``should_stop()`` is true; that is asked before every read and at
        least every ``poll_s`` while no data comes. Blank lines are yielded
        too (a recorder copies them); a batch is never empty.

        Args:
            should_stop: Polled between reads.
            poll_s: Longest a read blocks before ``should_stop`` is asked again.
            on_oversized: Called once per line skipped for being longer than
                :data:`protocol.MAX_RECORD_LINE_BYTES` (newline excluded),
                before the lines that follow it are yielded.
        """
        self.sock.settimeout(poll_s)
        ready: list[bytes] = []  # complete lines not yielded yet
        gathered = 0  # their bytes
        pending = bytearray()  # the start of an unfinished line, never over the limit
        skipping = False  # inside an oversized line: drop bytes up to its newline

        def oversized() -> None:
            self.oversized_lines += 1
            if on_oversized is not None:
                on_oversized()

        while not should_stop():
            try:
                chunk = self.sock.recv(self.RECV_BYTES)
            except TimeoutError:  # socket.timeout: nothing within poll_s
                if ready:  # the rest of a line that did not come: what is whole goes now
                    yield ready
                    ready, gathered = [], 0
                continue
            except OSError:
                break
            if not chunk:
                break
            limit = protocol.MAX_RECORD_LINE_BYTES
            if skipping:
                newline = chunk.find(b"\n")
                if newline < 0:
                    continue
                chunk, skipping = chunk[newline + 1:], False
            cut = chunk.rfind(b"\n") + 1
            if not cut:
                pending += chunk
                if len(pending) > limit:
                    # Drop what we hold rather than grow without bound.
                    oversized()
                    pending.clear()
                    skipping = True
                continue
            # bytearray += is amortised, so a long line costs no quadratic copying.
            pending += chunk[:cut]
            lines = []
            for line in bytes(pending).split(b"\n")[:-1]:
                if len(line) > limit:
                    oversized()
                else:
                    lines.append(line + b"\n")
            pending = bytearray(chunk[cut:])
            ready += lines
            # While more is already waiting (a backlog pours in), gather it
            # into one batch of up to GATHER_BYTES: a batch has a fixed cost
            # downstream (a model update, a spool write). A live stream's
            # line a tick is yielded at once.
            gathered += cut
            # A full read is a backlog pouring in: the next part is a moment
            # away (its writer blocked on this reader), so a batch waits that
            # moment for it rather than going at a fraction of its size.
            if ready and (gathered >= self.GATHER_BYTES
                          or not _readable(self.sock, BACKLOG_WAIT_S if len(chunk) == self.RECV_BYTES else 0.0)):
                yield ready
                ready, gathered = [], 0
        if ready:  # what the last reads brought before the end
            yield ready

    def lines(
        self,
        should_stop: Callable[[], bool] = lambda: False,
        poll_s: float = 0.2,
        on_oversized: Callable[[], None] | None = None,
    ) -> Iterator[bytes]:
        """Yield complete lines one at a time; arguments as :meth:`batches`."""
        for batch in self.batches(should_stop, poll_s, on_oversized):
            yield from batch

    def shutdown(self) -> None:
        """End a read blocked in another thread now (it sees end of stream)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> AgentConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def list_agents(timeout_s: float = 1.0, on_refused: Callable[[str], None] | None = None) -> list[AgentInfo]:
    """Instrumented processes of this user; stale sockets are removed quietly.

    Args:
        timeout_s: Longest wait for each agent's hello.
        on_refused: Called with a one-line message for each socket left out
            because another uid serves it (:class:`ForeignAgent`).

    Raises:
        paths.SocketDirError: the socket directory is not safe to use; no
            socket in it was connected to.
    """
    directory = paths.check_socket_dir()
    try:
        entries = sorted(directory.glob("*.sock"))
    except OSError:
        return []
    # Each agent is asked at once, not one after another: a silent or
    # stopped agent (SIGSTOP, a debugger) costs its timeout once for the
    # whole list, not once per agent (40 stopped agents took 40 s).
    candidates = []
    for path in entries:
        try:
            candidates.append((int(path.stem), path))
        except ValueError:
            continue
    if not candidates:
        return []
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(LIST_WORKERS, len(candidates)), thread_name_prefix="jaxtop-ls") as pool:
        answers = list(pool.map(lambda c: _ask_hello(c[0], c[1], timeout_s), candidates))
    found: list[AgentInfo] = []
    for answer in answers:
        if isinstance(answer, AgentInfo):
            found.append(answer)
        elif isinstance(answer, str) and on_refused is not None:
            on_refused(answer)
    return found


#: How long a batch waits for the next part of a backlog after a full read
#: (:meth:`AgentConnection.batches`): a backlog's writer is blocked on this
#: reader, so it comes at once; a batch of a read is ~9 samples of 8
#: devices, and a model's batch costs per batch as much as per sample.
BACKLOG_WAIT_S = 0.002

#: Agents asked for their hello at once by :func:`list_agents`.
LIST_WORKERS = 32


def _ask_hello(pid: int, path: Path, timeout_s: float) -> AgentInfo | str | None:
    """One socket of the directory: its agent's hello, the message why it is
    left out (another uid serves it), or None (stale, gone)."""
    if not pid_alive(pid):
        _remove_stale(path)
        return None
    try:
        agent = AgentConnection.open(pid, timeout_s)
    except AgentNotFound:
        return None
    except ForeignAgent as exc:
        return str(exc)
    hello: dict = {}
    deadline = time.monotonic() + timeout_s
    with agent:
        # The stream opens with hello; a first record of another type
        # means an agent without one, so stop there as well.
        for line in agent.lines(should_stop=lambda end=deadline: time.monotonic() >= end):
            if not line.strip():
                continue
            try:
                first = protocol.decode(line)
            except protocol.ProtocolError:
                continue
            if first.get("type") == "hello":
                hello = first
            break
    return AgentInfo(pid, path, list(hello.get("argv") or []), hello.get("started_t"))


class RecordingOrder:
    """An agent's stream in the order a recording keeps: time order.

    An agent whose ``hello`` says ``history.present_first`` sends, on
    connecting, the present (the newest sample, ``present: true``) before
    its history: coarse ``history`` records, then the kept samples as
    ``backfill`` records, oldest first, then ``history_end``. A recording
    must replay and export in time order, so :meth:`feed` turns that into
    what an agent's stream used to be: the ``backfill`` records become
    ``sample`` records again, the present takes the place of its own copy
    at the end of them (it is that sample, with the last buffer map and
    sparse fields filled in), the coarse records and ``history_end`` are
    left out (a recording holds samples; the coarse level summarises
    samples it does not have). Anything else passes unchanged, as does a
    stream without that hello. Lines are compared by their first bytes,
    as the agent writes them; only the hello and the present are decoded.
    """

    _SAMPLE = b'{"type":"sample",'
    _BACKFILL = b'{"type":"backfill",'
    _HISTORY = (b'{"type":"history",', b'{"type":"history_end",')

    def __init__(self) -> None:
        self._in_history = False
        self._present: bytes | None = None
        self._present_seq: Any = None

    def feed_many(self, lines: list[bytes]) -> list[bytes]:
        """:meth:`feed` of each line in turn, as one list: outside a history,
        a read without a ``hello`` passes as it is (a backlog's reads, a
        live stream's), without a step a line."""
        if not self._in_history and not any(map(bytes.startswith, lines, repeat(b'{"type":"hello"'))):
            return lines
        return [out for line in lines for out in self.feed(line)]

    def feed(self, line: bytes) -> list[bytes]:
        """The lines to write for one line received (each ending in a newline)."""
        if line.startswith(b'{"type":"hello"'):
            out = self.flush()
            try:
                hello = protocol.decode(line)
            except protocol.ProtocolError:
                hello = {}
            history = hello.get("history")
            self._in_history = isinstance(history, dict) and bool(history.get("present_first"))
            return out + [line]
        if not self._in_history:
            return [line]
        if line.startswith(self._BACKFILL):
            if self._present is not None and self._seq(line) == self._present_seq:
                present, self._present = self._present, None
                return [present]
            return [self._SAMPLE + line[len(self._BACKFILL):]]
        if line.startswith(self._HISTORY):
            if line.startswith(self._HISTORY[1]):
                self._in_history = False
                return self.flush()
            return []
        if line.startswith(self._SAMPLE):
            if self._present is None and self._present_seq is None:
                try:
                    record = protocol.decode(line)
                except protocol.ProtocolError:
                    record = {}
                if record.get("present") is True:
                    self._present, self._present_seq = line, record.get("seq", object())
                    return []
            # A live sample within the history: the history is over.
            self._in_history = False
            return self.flush() + [line]
        return [line]

    @staticmethod
    def _seq(line: bytes) -> Any:
        """The ``seq`` of a sample line as the agent writes it (``"seq"``
        third, after ``type`` and ``t``); None when it is not there."""
        at = line.find(b',"seq":', 0, 200)
        if at < 0:
            return None
        end = at + 7
        stop = end
        while stop < len(line) and line[stop:stop + 1].isdigit():
            stop += 1
        return int(line[end:stop]) if stop > end else None

    def flush(self) -> list[bytes]:
        """What is held back: the present, when its copy never came."""
        present, self._present = self._present, None
        return [present] if present is not None else []


def record(
    pid: int,
    out: IO[bytes],
    duration_s: float | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> int:
    """Copy an agent's stream to ``out`` until it ends, time runs out, or
    ``should_stop()``, in time order (:class:`RecordingOrder`: the history
    an agent sends after its present goes before it, as samples; its coarse
    level is left out). Only whole lines are written, byte for byte; a line
    over :data:`protocol.MAX_RECORD_LINE_BYTES` is left out, as every reader
    would skip it. ``on_record`` also gets each decoded record (undecodable
    lines are still copied, and skipped for it).

    ``out`` may be unbuffered (``open(path, "wb", buffering=0)``), so that a
    failed write is seen at once: a short write is continued. When a write
    fails part-way through a line (a full disk, a file size limit), the part
    of that line that reached a regular file is cut off again, where the
    file ends with it, so the file holds whole lines only; then the error
    is raised.

    Returns:
        Number of lines written.

    Raises:
        AgentNotFound: no agent for ``pid``.
        OSError: writing to ``out`` failed (BrokenPipeError: its reader left).
    """
    import select
    import stat

    deadline = time.monotonic() + duration_s if duration_s is not None else None

    def done() -> bool:
        return should_stop() or (deadline is not None and time.monotonic() >= deadline)

    def write_all(data: bytes) -> None:
        view = memoryview(data)
        written = 0
        try:
            while written < len(view):
                n = out.write(view[written:])
                if n is None:  # a non-blocking descriptor that is full: wait for room
                    select.select([], [out], [], 1.0)
                    continue
                written += n
            out.flush()
        except OSError:
            # Keep the batch's lines that made it whole; cut the one in two.
            partial = written - (data.rfind(b"\n", 0, written) + 1)
            if partial:
                cut_back(partial)
            raise

    def cut_back(partial: int) -> None:
        """Remove the last ``partial`` bytes written from the end of a regular file."""
        try:
            fd = out.fileno()
            end = os.lseek(fd, 0, os.SEEK_CUR)
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode) and info.st_size == end >= partial:
                os.ftruncate(fd, end - partial)
                os.lseek(fd, end - partial, os.SEEK_SET)
        except (OSError, ValueError, AttributeError):
            pass  # not a file we can cut: readers skip a truncated last line anyway

    lines = 0
    order = RecordingOrder()

    def write(batch: list[bytes]) -> None:
        nonlocal lines
        if not batch:
            return
        write_all(b"".join(batch))
        lines += len(batch)
        if on_record is not None:
            for line in batch:
                try:
                    on_record(protocol.decode(line))
                except protocol.ProtocolError:
                    pass

    with AgentConnection.open(pid) as agent:
        for batch in agent.batches(should_stop=done):
            write([out for line in batch for out in order.feed(line)])
        write(order.flush())
    return lines


def _readable(sock: socket.socket, wait_s: float = 0.0) -> bool:
    """Whether ``sock`` has data waiting now, or within ``wait_s`` (or is
    closed: a read returns at once)."""
    try:
        return bool(select.select([sock], [], [], wait_s)[0])
    except (OSError, ValueError):  # closed meanwhile, or a descriptor select cannot take
        return False
