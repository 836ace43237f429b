"""The agent's set of connections (:class:`Clients`): accepting and refusing
them, greeting each with the shared history (:mod:`jaxtop.agent.history`),
answering their commands, sending and dropping.

Everything here runs on the agent thread and never blocks; whatever a peer
does costs the program bounded memory, file descriptors and CPU (the bounds
are :mod:`jaxtop.agent.limits`; one connection's queues are
:class:`~jaxtop.agent.connection.Client`). Bad input, or any failure while
serving one client, closes that client only.
"""

from __future__ import annotations

import os
import selectors
import socket
import time
from typing import Any, Callable

from jaxtop.wire import protocol
from jaxtop.agent.connection import Client, peer_uid, refuse
from jaxtop.agent.history import Backfill, Greeting
from jaxtop.agent.limits import (
    ACCEPT_BATCH,
    ACCEPT_BURST,
    ACCEPT_PAUSE_S,
    ACCEPTS_PER_S,
    FD_RESERVE,
    MAX_CLIENT_BUFFER_BYTES,
    MAX_CLIENT_REPLY_BYTES,
    MAX_CLIENTS,
    RECV_BYTES,
    REQUEST_BATCH,
    REQUEST_BURST,
    REQUESTS_PER_S,
    SEND_CHUNK_BYTES,
    TOTAL_REQUEST_BURST,
    TOTAL_REQUESTS_PER_S,
    TokenBucket,
    fd_shortage,
)

# Besides this module's own names, the limits and the connection class,
# which other modules import from here.
__all__ = [
    "ACCEPT_BATCH", "ACCEPT_BURST", "ACCEPT_PAUSE_S", "ACCEPTS_PER_S", "FD_RESERVE", "MAX_CLIENT_BUFFER_BYTES",
    "MAX_CLIENT_REPLY_BYTES", "MAX_CLIENTS", "RECV_BYTES", "REQUEST_BATCH", "REQUEST_BURST", "REQUESTS_PER_S",
    "SEND_CHUNK_BYTES", "TOTAL_REQUEST_BURST", "TOTAL_REQUESTS_PER_S", "Backfill", "Client", "Clients",
    "CommandError", "CommandHandler", "Greeting", "TokenBucket", "command_reply", "fd_shortage", "peer_uid",
]


class CommandError(Exception):
    """A command refused its request: the reply is ``ok: false`` with this
    message as ``error`` (verbatim) and ``fields`` added to the reply."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.fields = fields


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
                refuse(sock, f"refused: uid {uid} is not the owner (uid {os.getuid()}) of this process")
                return
            if len(self._clients) >= MAX_CLIENTS:
                refuse(sock, f"refused: {MAX_CLIENTS} clients are connected already (the agent's limit); "
                              "try again later")
                return
            shortage = fd_shortage(sock.fileno())
            if shortage:
                refuse(sock, shortage)
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
