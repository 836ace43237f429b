"""The agent's clients: one connection's bounded queues (:class:`Client`)
and the set of connections with their commands (:class:`Clients`). What a
client is sent when it connects, the shared history, is
:mod:`jaxtop.agent.history`.

Everything here runs on the agent thread and never blocks: sockets are
non-blocking, and whatever a peer does costs the program bounded memory,
file descriptors and CPU:

* at most :data:`MAX_CLIENTS` connections, and none while the process is
  within :data:`FD_RESERVE` descriptors of its ``RLIMIT_NOFILE``; extra
  connections get an ``error`` line and are closed at once; accepting (and
  refusing) is rate limited, so connecting and leaving in a loop costs little;
* output is a queue of references to the agent's encoded lines, shared by
  every client, and the history sent on connecting is a range of indices
  into one shared history and references to its coarse records: a client
  never holds a copy of either (a coarse record is decompressed when it is
  its turn to be sent, one at a time). Live samples beyond
  :data:`MAX_CLIENT_BUFFER_BYTES` queued are dropped and counted;
* requests are read at most :data:`REQUESTS_PER_S` a second per client (and
  :data:`TOTAL_REQUESTS_PER_S` for all), and not at all while a client has
  :data:`MAX_CLIENT_REPLY_BYTES` of replies it has not read: the rest waits
  in the kernel and the sender blocks;
* bad input, or any failure while serving one client, closes that client
  only.
"""

from __future__ import annotations

import collections
import os
import selectors
import socket
import struct
import time
import zlib
from typing import Any, Callable

from jaxtop import protocol
from jaxtop.agent.history import (
    _SAMPLE_PREFIX,
    _BACKFILL_PREFIX,
    Greeting,
    Backfill,
    _Range,
    _Chunks,
    _LAZY,
)

try:
    import resource
except ImportError:  # not POSIX: no limit to read, and no Unix socket either
    resource = None  # type: ignore[assignment]


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


#: Connections served at once. A dashboard, a recorder and a few ``jaxtop
#: ls`` need a handful; past this, connections are refused with an error.
MAX_CLIENTS = _env_int("JAXTOP_MAX_CLIENTS", 64)
#: File descriptors always left to the program: no client is accepted while
#: the process has more than ``RLIMIT_NOFILE - FD_RESERVE`` open (the reserve
#: is at most a quarter of a small limit).
FD_RESERVE = _env_int("JAXTOP_FD_RESERVE", 128)
#: Queued bytes per client before live samples are dropped for it.
MAX_CLIENT_BUFFER_BYTES = _env_int("JAXTOP_CLIENT_BUFFER_BYTES", 16 * 1024 * 1024)
#: A client's own unread replies (and notices) after which its requests are
#: no longer read, until it reads: replies are the one output that is not
#: shared, so this bounds what a client that never reads can cost.
MAX_CLIENT_REPLY_BYTES = 256 * 1024
#: Requests read per second from one client (a bucket of REQUEST_BURST).
REQUESTS_PER_S = 10.0
REQUEST_BURST = 20
#: Requests read per second from all clients together.
TOTAL_REQUESTS_PER_S = 100.0
TOTAL_REQUEST_BURST = 100
#: A client that ran out of budget is read again once it has this many
#: requests' worth: one wake-up per batch, not one per request.
REQUEST_BATCH = 10
#: Connections accepted or refused per second (a bucket of ACCEPT_BURST).
ACCEPTS_PER_S = 50.0
ACCEPT_BURST = 64
#: Connections' worth of budget the listener waits for once it ran out.
ACCEPT_BATCH = 10
#: How long the listener rests after accept() failed for want of resources.
ACCEPT_PAUSE_S = 1.0
#: Bytes read from a client at a time.
RECV_BYTES = 65536
#: Bytes handed to one sendmsg(), in at most _MAX_IOV pieces.
SEND_CHUNK_BYTES = 256 * 1024
_MAX_IOV = 512
_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)  # EPIPE, never SIGPIPE


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process on the other end (Linux ``SO_PEERCRED``)."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    try:
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i")))
    except OSError:
        return None
    return uid


def _count_open_fds() -> int | None:
    """Open file descriptors of this process, or None when it cannot tell."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder)) - 1  # listdir's own descriptor
        except FileNotFoundError:
            continue
        except OSError:
            return 1 << 30  # EMFILE, most likely: as good as full
    return None


def fd_shortage(newest_fd: int) -> str | None:
    """Why one more client would eat into the program's descriptors, or None.

    Args:
        newest_fd: the descriptor just accepted. The kernel hands out the
            lowest free number, so every lower one is open: a cheap lower
            bound on the count.
    """
    if resource is None:
        return None
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return None
    reserve = max(1, min(FD_RESERVE, soft // 4))
    ceiling = soft - reserve
    open_fds = newest_fd + 1
    if open_fds <= ceiling:
        counted = _count_open_fds()
        if counted is not None:
            open_fds = max(open_fds, counted)
    if open_fds <= ceiling:
        return None
    return (f"refused: the process has {open_fds} of its {soft} file descriptors open; "
            f"the agent leaves the last {reserve} to the program")


class TokenBucket:
    """``rate`` events a second on average, ``burst`` at once."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self._t = now

    def _refill(self, now: float) -> None:
        if now > self._t:
            self.tokens = min(self.burst, self.tokens + (now - self._t) * self.rate)
        self._t = now

    def ready(self, now: float) -> bool:
        self._refill(now)
        return self.tokens >= 1.0

    def take(self, now: float) -> None:
        self._refill(now)
        self.tokens -= 1.0

    def wait_s(self, now: float, n: float = 1.0) -> float:
        """Seconds until ``n`` tokens (at most the burst) are there."""
        self._refill(now)
        n = min(float(n), self.burst)
        return 0.0 if self.tokens >= n else (n - self.tokens) / self.rate


class CommandError(Exception):
    """A command refused its request: the reply is ``ok: false`` with this
    message as ``error`` (verbatim) and ``fields`` added to the reply."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.fields = fields


class Client:
    """Output queue, input buffer and request budget of one connection.

    The output queue holds references: stream lines shared with every client
    (``(line, False)``), this client's own lines such as replies (``(line,
    True)``), at most one backfill range and one list of coarse records
    (expanded into lines a send's worth, or a record, at a time).
    :attr:`queued` counts the bytes of the lines, :attr:`own` those of its
    own lines.
    """

    def __init__(self, sock: socket.socket, ident: int, now: float) -> None:
        self.sock = sock
        self.ident = ident
        self._out: collections.deque[Any] = collections.deque()
        self._offset = 0  # bytes of the first queued line already sent
        self.queued = 0
        self.own = 0
        self.inbuf = bytearray()
        self.budget = TokenBucket(REQUESTS_PER_S, REQUEST_BURST, now)
        self.dropped = 0  # samples dropped since the last notice
        self.dropped_total = 0
        self.closed = False
        self.close_after_flush = False
        self.throttled = False  # out of request budget: input not read for now
        self.events = 0  # selector interest currently registered

    # -- output -------------------------------------------------------------
    @property
    def has_output(self) -> bool:
        return bool(self._out)

    def queue(self, line: bytes, droppable: bool = True) -> None:
        """Queue one encoded line.

        Args:
            line: the encoded line; it is referenced, never copied.
            droppable: a stream line shared with other clients, dropped and
                counted when the queue is over :data:`MAX_CLIENT_BUFFER_BYTES`.
                Otherwise the line is this client's own (hello, a reply) and
                always queued; the caller bounds those (see :meth:`wants_input`).
        """
        if self.closed or self.close_after_flush:
            return
        if droppable:
            if self.queued >= MAX_CLIENT_BUFFER_BYTES:
                self.dropped += 1
                self.dropped_total += 1
                return
            if self.dropped and self.queued < MAX_CLIENT_BUFFER_BYTES // 2:
                # Tell the client, in order, what it missed before the next line.
                self._push(self._dropped_notice(self.dropped, "client too slow: its queue was full"), True)
                self.dropped = 0
        self._push(line, not droppable)

    def queue_backfill(self, first: int, last: int, retype: bool = False) -> None:
        """Queue the shared backfill entries ``[first, last)`` (``retype``:
        its samples are sent as ``backfill`` records)."""
        if first < last and not self.closed:
            self._out.append(_Range(first, last, retype))

    def queue_coarse(self, entries: list[tuple[bool, bytes]]) -> None:
        """Queue coarse ``history`` records (shared; a compressed one is
        expanded only when it is its turn to be sent)."""
        if entries and not self.closed:
            self._out.append(_Chunks(entries))

    def _push(self, line: bytes, own: bool) -> None:
        self._out.append((line, own))
        self.queued += len(line)
        if own:
            self.own += len(line)

    def _dropped_notice(self, count: int, reason: str) -> bytes:
        return protocol.encode({
            "type": protocol.DROPPED, "t": time.time(), "count": count,
            "count_total": self.dropped_total, "reason": reason,
        })

    def _expand(self, backfill: Backfill) -> None:
        """Turn the backfill range (or coarse records) at the head of the
        queue into lines, about a send's worth (or one record) at a time."""
        while self._out and isinstance(self._out[0], _LAZY):
            rng = self._out.popleft()
            if isinstance(rng, _Chunks):
                compressed, data = rng.entries[rng.next]
                rng.next += 1
                if rng.next < len(rng.entries):
                    self._out.appendleft(rng)
                line = zlib.decompress(data) if compressed else data
                self._out.appendleft((line, False))
                self.queued += len(line)
                continue
            first = max(rng.first, backfill.start)
            missed = min(first, rng.last) - rng.first
            lines: list[bytes] = []
            size = 0
            for line in backfill.lines(first, min(rng.last, first + _MAX_IOV)):
                if rng.retype and line.startswith(_SAMPLE_PREFIX):
                    line = _BACKFILL_PREFIX + line[len(_SAMPLE_PREFIX):]
                lines.append(line)
                size += len(line)
                if size >= SEND_CHUNK_BYTES or len(lines) >= _MAX_IOV:
                    break
            rest = first + len(lines)
            if rest < rng.last and lines:
                rng.first = rest
                self._out.appendleft(rng)
            for line in reversed(lines):
                self._out.appendleft((line, False))
            self.queued += size
            if missed > 0:
                # Entries aged out of the history before this client read them.
                self.dropped_total += missed
                notice = self._dropped_notice(missed, "client too slow: backfill aged out before it was read")
                self._out.appendleft((notice, True))
                self.queued += len(notice)
                self.own += len(notice)

    def flush(self, backfill: Backfill) -> bool:
        """Send what the socket takes now. Returns False if the peer is gone."""
        while self._out:
            self._expand(backfill)
            buffers: list[Any] = []
            size = 0
            for item in self._out:
                if isinstance(item, _LAZY):
                    break
                data = item[0]
                if not buffers and self._offset:
                    data = memoryview(data)[self._offset:]
                buffers.append(data)
                size += len(data)
                if size >= SEND_CHUNK_BYTES or len(buffers) >= _MAX_IOV:
                    break
            if not buffers:
                continue  # an emptied range was dropped; look again
            try:
                n = self.sock.sendmsg(buffers, [], _SEND_FLAGS)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False
            if n <= 0:
                return False
            self._consume(n)
            if n < size:
                return True  # the socket is full for now
        return True

    def _consume(self, n: int) -> None:
        while n > 0:
            data, own = self._out[0]
            left = len(data) - self._offset
            if n < left:
                self._offset += n
                return
            n -= left
            self._out.popleft()
            self._offset = 0
            self.queued -= len(data)
            if own:
                self.own -= len(data)

    # -- input ----------------------------------------------------------------
    def has_line(self) -> bool:
        return self.inbuf.find(b"\n") >= 0

    def wants_input(self) -> bool:
        """Whether to read from the socket now: not while lines already read
        wait for budget, nor while the client has not read its replies."""
        return not (self.closed or self.close_after_flush or self.throttled
                    or self.own >= MAX_CLIENT_REPLY_BYTES or self.has_line())

    def receive(self) -> bool:
        """Read what arrived into the input buffer.

        Returns:
            False when the peer closed (or the socket failed).

        Raises:
            protocol.ProtocolError: a line longer than the command limit.
        """
        try:
            data = self.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        if not data:
            return False
        self.inbuf += data
        if len(self.inbuf) > protocol.MAX_COMMAND_LINE_BYTES and not self.has_line():
            raise protocol.ProtocolError(f"line longer than {protocol.MAX_COMMAND_LINE_BYTES} bytes")
        return True

    def next_line(self) -> bytes | None:
        """The next complete line read (without its newline), or None.

        Raises:
            protocol.ProtocolError: a line longer than the command limit.
        """
        nl = self.inbuf.find(b"\n")
        if nl < 0:
            return None
        if nl > protocol.MAX_COMMAND_LINE_BYTES:
            raise protocol.ProtocolError(f"line longer than {protocol.MAX_COMMAND_LINE_BYTES} bytes")
        line = bytes(self.inbuf[:nl])
        if nl + 1 == len(self.inbuf):
            self.inbuf = bytearray()  # give the memory back, not just the length
        else:
            del self.inbuf[:nl + 1]
        return line

    # -- end --------------------------------------------------------------------
    def fail(self, message: str) -> None:
        """Replace what is queued by a fatal error record; the caller sends it
        if the socket takes it now, then closes."""
        if self.closed:
            return
        self._out.clear()
        self._offset = self.queued = self.own = 0
        self._push(protocol.encode({"type": protocol.ERROR, "t": time.time(), "message": message, "fatal": True}), True)
        self.close_after_flush = True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass
            self._out.clear()
            self.inbuf = bytearray()


def command_reply(request: dict[str, Any], ok: bool, **fields: Any) -> bytes:
    """The reply to a command, echoing its ``id`` so a client can match it."""
    reply = {"type": protocol.REPLY, "t": time.time(), "id": request.get("id"), "ok": ok}
    reply.update(fields)
    return protocol.encode(reply)


CommandHandler = Callable[[dict[str, Any]], Any]


class Clients:
    """The agent's connections: accept, answer commands, send, drop.

    Runs on the agent thread. ``selector`` is the agent's; it is set when the
    agent thread starts, before :meth:`listen`.

    Args:
        greeting: what a new client is sent first: a :class:`Greeting`, or
            the hello line and the backfill index it starts at (the backfill
            then goes as samples).
        commands: handlers by command name; the agent may add to it later.
        backfill: the shared history the backfill ranges point into.
        on_error: told (one line of text) when serving a client failed in a
            way the agent did not foresee; that client is closed.
    """

    def __init__(
        self,
        greeting: Callable[[], Greeting | tuple[bytes, int]],
        commands: dict[str, CommandHandler],
        backfill: Backfill,
        on_error: Callable[[str], None] = lambda message: None,
    ) -> None:
        self.selector: selectors.BaseSelector | None = None
        self._greeting = greeting
        self._commands = commands
        self.backfill = backfill
        self._on_error = on_error
        self._clients: dict[int, Client] = {}
        self._throttled: dict[int, Client] = {}
        self._next_ident = 1
        now = time.monotonic()
        self._accepts = TokenBucket(ACCEPTS_PER_S, ACCEPT_BURST, now)
        self._requests = TokenBucket(TOTAL_REQUESTS_PER_S, TOTAL_REQUEST_BURST, now)
        self._listener: socket.socket | None = None
        self._listener_resume: float | None = None  # monotonic time; None while selected

    def __len__(self) -> int:
        return len(self._clients)

    # -- connections ------------------------------------------------------------
    def listen(self, listener: socket.socket) -> None:
        """Select ``listener`` for new connections (events ``("accept", None)``)."""
        self._listener = listener
        self.selector.register(listener, selectors.EVENT_READ, ("accept", None))

    def _pause_listener(self, until: float) -> None:
        if self._listener_resume is None:
            try:
                self.selector.unregister(self._listener)
            except (KeyError, ValueError, OSError):
                pass
        self._listener_resume = until

    def accept(self) -> None:
        """Accept (or refuse) what is pending, within the accept budget."""
        while True:
            now = time.monotonic()
            if not self._accepts.ready(now):
                # Leave the rest in the backlog (connecting peers wait) and
                # stop selecting the listener until a batch's worth of budget
                # is back: one wake-up per batch, not one per connection.
                self._pause_listener(now + self._accepts.wait_s(now, ACCEPT_BATCH))
                return
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                # Out of descriptors or memory: the connection stays queued
                # and the listener readable; rest rather than spin on it.
                self._pause_listener(now + ACCEPT_PAUSE_S)
                return
            self._accepts.take(now)
            self._admit(sock, now)

    def _admit(self, sock: socket.socket, now: float) -> None:
        try:
            sock.setblocking(False)
            uid = peer_uid(sock)
            if uid is not None and uid != os.getuid():
                _refuse(sock, f"refused: uid {uid} is not the owner (uid {os.getuid()}) of this process")
                return
            if len(self._clients) >= MAX_CLIENTS:
                _refuse(sock, f"refused: {MAX_CLIENTS} clients are connected already (the agent's limit); "
                              "try again later")
                return
            shortage = fd_shortage(sock.fileno())
            if shortage:
                _refuse(sock, shortage)
                return
        except Exception:
            sock.close()
            raise
        client = Client(sock, self._next_ident, now)
        self._next_ident += 1
        self._clients[client.ident] = client
        try:
            greeting = self._greeting()
            if isinstance(greeting, Greeting):
                for line in greeting.head:
                    client.queue(line, droppable=False)
                client.queue_coarse(greeting.coarse)
                client.queue_backfill(greeting.first, greeting.last, retype=True)
                for line in greeting.tail:
                    client.queue(line, droppable=False)
            else:  # (hello, first index): the backfill as samples, oldest first
                hello, first = greeting
                client.queue(hello, droppable=False)
                client.queue_backfill(first, self.backfill.end)
            self._flush(client)
        except Exception as exc:
            self._crashed(client, exc)

    # -- events -----------------------------------------------------------------
    def on_event(self, client: Client, mask: int) -> None:
        """Serve one selector event of ``client``; any failure closes it only."""
        try:
            if mask & selectors.EVENT_READ:
                self._on_readable(client)
            if not client.closed and mask & selectors.EVENT_WRITE:
                self._flush(client)
                if not client.closed and client.has_line() and not client.throttled:
                    self._serve(client, time.monotonic())
                    self._flush(client)
        except Exception as exc:
            self._crashed(client, exc)

    def broadcast(self, line: bytes) -> None:
        """Queue a stream line for every client."""
        for client in list(self._clients.values()):
            try:
                idle = not client.has_output
                client.queue(line)
                # A client with output pending is selected for writing and
                # gets it when its socket has room: no send attempt per line.
                if idle and client.has_output:
                    self._flush(client)
            except Exception as exc:
                self._crashed(client, exc)

    def service(self, now: float) -> float | None:
        """Resume what waited for a budget. Call it on every loop turn.

        Returns:
            The monotonic time by which it wants to be called again, or None.
        """
        wake: float | None = None
        if self._listener_resume is not None:
            if now >= self._listener_resume:
                self._listener_resume = None
                try:
                    self.selector.register(self._listener, selectors.EVENT_READ, ("accept", None))
                except (KeyError, ValueError, OSError):
                    pass
            else:
                wake = self._listener_resume
        for client in list(self._throttled.values()):
            if client.closed:
                self._throttled.pop(client.ident, None)
                continue
            wait = max(client.budget.wait_s(now, REQUEST_BATCH), self._requests.wait_s(now, REQUEST_BATCH))
            if wait > 0:
                due = now + max(wait, 0.01)
                wake = due if wake is None else min(wake, due)
                continue
            self._throttled.pop(client.ident, None)
            client.throttled = False
            try:
                self._serve(client, now)
                self._flush(client)
            except Exception as exc:
                self._crashed(client, exc)
        return wake

    def flush_all(self, deadline: float) -> None:
        """Best effort to send what is queued (used at exit)."""
        while time.monotonic() < deadline:
            pending = [c for c in self._clients.values() if c.has_output and not c.closed]
            if not pending:
                return
            for c in pending:
                if not c.flush(self.backfill):
                    c.close()
            time.sleep(0.005)

    def close_all(self) -> None:
        for client in list(self._clients.values()):
            client.close()
        self._clients.clear()
        self._throttled.clear()

    # -- requests -----------------------------------------------------------------
    def _on_readable(self, client: Client) -> None:
        if not client.wants_input():
            return  # a stale event: interest is being changed
        try:
            alive = client.receive()
        except protocol.ProtocolError as exc:
            self._fail(client, str(exc))
            return
        if not alive:
            self._drop(client)
            return
        self._serve(client, time.monotonic())
        self._flush(client)

    def _serve(self, client: Client, now: float) -> None:
        """Answer the complete lines read so far, within the budgets."""
        while not client.closed and not client.close_after_flush and client.own < MAX_CLIENT_REPLY_BYTES:
            if not (client.budget.ready(now) and self._requests.ready(now)):
                if client.has_line():
                    client.throttled = True
                    self._throttled[client.ident] = client
                return
            try:
                raw = client.next_line()
            except protocol.ProtocolError as exc:
                self._fail(client, str(exc))
                return
            if raw is None:
                return
            client.budget.take(now)
            self._requests.take(now)
            if not raw.strip():
                continue
            try:
                request = protocol.decode(raw)
            except protocol.ProtocolError as exc:
                self._fail(client, f"bad input: {exc}")
                return
            client.queue(self._answer(request), droppable=False)

    def _answer(self, request: dict[str, Any]) -> bytes:
        kind = request.get("type")
        if kind == protocol.PING:
            return protocol.encode({"type": protocol.PONG, "t": time.time(), "id": request.get("id")})
        if kind != protocol.COMMAND:
            return command_reply(request, False, error=f"unknown request type {kind!r}")
        name = request.get("name")
        handler = self._commands.get(name) if isinstance(name, str) else None
        if handler is None:
            return command_reply(request, False, error=f"unknown command {name!r}; known: {sorted(self._commands)}")
        args = request.get("args") if isinstance(request.get("args"), dict) else {}
        try:
            result = handler(args)
        except CommandError as exc:
            return command_reply(request, False, error=str(exc), **exc.fields)
        except Exception as exc:
            return command_reply(request, False, error=f"{type(exc).__name__}: {exc}")
        try:
            return command_reply(request, True, result=result)
        except Exception as exc:  # a handler returned something JSON cannot carry
            return command_reply(request, False, error=f"unencodable result: {type(exc).__name__}: {exc}")

    # -- bookkeeping ----------------------------------------------------------------
    def _flush(self, client: Client) -> None:
        if client.closed:
            return
        if not client.flush(self.backfill) or (client.close_after_flush and not client.has_output):
            self._drop(client)
            return
        self._set_interest(client)

    def _set_interest(self, client: Client) -> None:
        events = (selectors.EVENT_READ if client.wants_input() else 0) | (
            selectors.EVENT_WRITE if client.has_output else 0)
        if events == client.events or client.closed:
            return
        # A client that waits for nothing (out of budget, nothing to send)
        # is not selected at all; service() takes it up again.
        if client.events == 0:
            self.selector.register(client.sock, events, ("client", client))
        elif events == 0:
            self.selector.unregister(client.sock)
        else:
            self.selector.modify(client.sock, events, ("client", client))
        client.events = events

    def _fail(self, client: Client, message: str) -> None:
        """Send a fatal error if the socket takes it now, then close."""
        client.fail(message)
        client.flush(self.backfill)
        self._drop(client)

    def _crashed(self, client: Client, exc: BaseException) -> None:
        message = f"internal error while serving this client: {type(exc).__name__}: {exc}"
        try:
            self._fail(client, message)
        except Exception:
            self._drop(client)
        try:
            self._on_error(f"client {client.ident} closed after an {message}")
        except Exception:
            pass

    def _drop(self, client: Client) -> None:
        if client.events:
            try:
                self.selector.unregister(client.sock)
            except (KeyError, ValueError, OSError):
                pass
            client.events = 0
        client.close()
        self._clients.pop(client.ident, None)
        self._throttled.pop(client.ident, None)

    def close_in_child(self) -> None:
        """After fork, in the child: close this process's copies of the client
        sockets. Closing a copy never shuts the connection down for the
        parent, and the selector (shared with the parent) is not touched."""
        for client in list(self._clients.values()):
            client.close()
        self._clients.clear()
        self._throttled.clear()


def _refuse(sock: socket.socket, message: str) -> None:
    """Tell a connection why it is refused (if its buffer takes it), close it."""
    try:
        sock.send(protocol.encode({"type": protocol.ERROR, "t": time.time(), "message": message, "fatal": True}),
                  _SEND_FLAGS)
    except OSError:
        pass
    sock.close()
