"""The agent's clients: bounded output and line-limited input per connection
(:class:`Client`), and the set of connections with their commands
(:class:`Clients`).

Everything here runs on the agent thread and never blocks: sockets are
non-blocking, output beyond the bound is dropped and counted, and bad input
closes only this client.
"""

from __future__ import annotations

import os
import selectors
import socket
import struct
import time
from typing import Any, Callable, Iterable

from jaxtop import protocol

#: Queued output per client before live samples are dropped for it.
MAX_CLIENT_BUFFER_BYTES = int(os.environ.get("JAXTOP_CLIENT_BUFFER_BYTES", 16 * 1024 * 1024))


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


class Client:
    """Output queue and input parser for one connection."""

    def __init__(self, sock: socket.socket, ident: int) -> None:
        self.sock = sock
        self.ident = ident
        self.out = bytearray()
        self.inbuf = bytearray()
        self.dropped = 0  # samples dropped since the last notice
        self.dropped_total = 0
        self.closed = False
        self.close_after_flush = False

    def queue(self, line: bytes, droppable: bool = True) -> None:
        """Queue one encoded line, or count it as dropped when over the bound."""
        if self.closed or self.close_after_flush:
            return
        if droppable and len(self.out) >= MAX_CLIENT_BUFFER_BYTES:
            self.dropped += 1
            self.dropped_total += 1
            return
        if self.dropped and len(self.out) < MAX_CLIENT_BUFFER_BYTES // 2:
            # Tell the client, in order, what it missed before the next line.
            self.out += protocol.encode({
                "type": protocol.DROPPED,
                "t": time.time(),
                "count": self.dropped,
                "count_total": self.dropped_total,
                "reason": "client too slow: its queue was full",
            })
            self.dropped = 0
        self.out += line

    def flush(self) -> bool:
        """Send what the socket takes now. Returns False if the peer is gone."""
        while self.out:
            try:
                n = self.sock.send(self.out)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False
            if n == 0:
                return False
            del self.out[:n]
        return True

    def read_lines(self) -> list[bytes] | None:
        """Read what arrived; complete lines, or None when the peer closed.

        Raises:
            protocol.ProtocolError: a line longer than the command limit.
        """
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError:
            return None
        if not data:
            return None
        self.inbuf += data
        lines = []
        while True:
            nl = self.inbuf.find(b"\n")
            if nl < 0:
                break
            if nl > protocol.MAX_COMMAND_LINE_BYTES:
                raise protocol.ProtocolError(f"line longer than {protocol.MAX_COMMAND_LINE_BYTES} bytes")
            lines.append(bytes(self.inbuf[:nl]))
            del self.inbuf[: nl + 1]
        if len(self.inbuf) > protocol.MAX_COMMAND_LINE_BYTES:
            raise protocol.ProtocolError(f"line longer than {protocol.MAX_COMMAND_LINE_BYTES} bytes")
        return lines

    def fail(self, message: str) -> None:
        """Queue an error record and close once it is sent (or cannot be)."""
        self.out += protocol.encode({"type": protocol.ERROR, "t": time.time(), "message": message, "fatal": True})
        self.close_after_flush = True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass


def command_reply(request: dict[str, Any], ok: bool, **fields: Any) -> bytes:
    """The reply to a command, echoing its ``id`` so a client can match it."""
    reply = {"type": protocol.REPLY, "t": time.time(), "id": request.get("id"), "ok": ok}
    reply.update(fields)
    return protocol.encode(reply)


CommandHandler = Callable[[dict[str, Any]], Any]


class Clients:
    """The agent's connections: accept, answer commands, send, drop.

    Runs on the agent thread. ``selector`` is the agent's; it is set when the
    agent thread starts, before any client can connect.

    Args:
        greeting: the lines a new client receives first (hello, backfill).
        commands: handlers by command name; the agent may add to it later.
    """

    def __init__(self, greeting: Callable[[], Iterable[bytes]], commands: dict[str, CommandHandler]) -> None:
        self.selector: selectors.BaseSelector | None = None
        self._greeting = greeting
        self._commands = commands
        self._clients: dict[int, Client] = {}
        self._next_ident = 1

    def accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:  # BlockingIOError, InterruptedError or worse: later
                return
            sock.setblocking(False)
            client = Client(sock, self._next_ident)
            self._next_ident += 1
            uid = peer_uid(sock)
            if uid is not None and uid != os.getuid():
                client.fail(f"refused: uid {uid} is not the owner (uid {os.getuid()}) of this process")
                client.flush()
                client.close()
                continue
            for line in self._greeting():
                client.queue(line, droppable=False)
            self._clients[client.ident] = client
            self.selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, ("client", client))

    def on_event(self, client: Client, mask: int) -> None:
        if mask & selectors.EVENT_READ:
            self._read(client)
        if not client.closed and mask & selectors.EVENT_WRITE:
            self._flush(client)

    def broadcast(self, line: bytes) -> None:
        for client in list(self._clients.values()):
            client.queue(line)
            self._flush(client)

    def flush_all(self, deadline: float) -> None:
        """Best effort to send what is queued (used at exit)."""
        while time.monotonic() < deadline:
            pending = [c for c in self._clients.values() if c.out and not c.closed]
            if not pending:
                return
            for c in pending:
                if not c.flush():
                    c.close()
            time.sleep(0.005)

    def close_all(self) -> None:
        for client in list(self._clients.values()):
            client.close()
        self._clients.clear()

    def _read(self, client: Client) -> None:
        try:
            lines = client.read_lines()
        except protocol.ProtocolError as exc:
            self._fail(client, str(exc))
            return
        if lines is None:
            self._drop(client)
            return
        for raw in lines:
            if not raw.strip():
                continue
            try:
                request = protocol.decode(raw)
            except protocol.ProtocolError as exc:
                self._fail(client, f"bad input: {exc}")
                return
            client.queue(self._answer(request), droppable=False)
        self._flush(client)

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
            return command_reply(request, True, result=handler(args))
        except Exception as exc:
            return command_reply(request, False, error=f"{type(exc).__name__}: {exc}")

    def _fail(self, client: Client, message: str) -> None:
        client.fail(message)
        self._flush(client)

    def _flush(self, client: Client) -> None:
        if client.closed:
            return
        alive = client.flush()
        if not alive or (client.close_after_flush and not client.out):
            self._drop(client)
            return
        if client.close_after_flush:
            # An error is pending for a peer that does not read: the
            # selector says when it can take it; never wait here.
            events = selectors.EVENT_WRITE
        else:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if client.out else 0)
        try:
            self.selector.modify(client.sock, events, ("client", client))
        except (KeyError, ValueError, OSError):
            pass

    def _drop(self, client: Client) -> None:
        try:
            self.selector.unregister(client.sock)
        except (KeyError, ValueError, OSError):
            pass
        client.close()
        self._clients.pop(client.ident, None)
