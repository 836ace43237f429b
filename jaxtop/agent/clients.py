"""The agent's set of connections (:class:`Clients`): accepting and refusing
them, greeting each with the shared history (:mod:`jaxtop.agent.history`),
answering their commands, sending and dropping.

Everything here runs on the agent thread and never blocks; whatever a peer
does costs the program bounded memory, file descriptors and CPU (the bounds
are :mod:`jaxtop.agent.limits`; one connection's queues are
:class:`~jaxtop.agent.connection.Client`). Commands are answered within a
budget of the agent thread's CPU, per client and for all, whatever they
are: a command registered by a probe or by the program is held to it as
much as the agent's own. Bad input, or any failure while serving one client,
closes that client only.
"""

from __future__ import annotations

import json
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
    CACHED_COMMANDS,
    CLIENT_COMMAND_CPU_BURST_S,
    CLIENT_COMMAND_CPU_SHARE,
    COMMAND_CPU_BURST_S,
    COMMAND_CPU_SHARE,
    FD_RESERVE,
    MAX_CLIENT_BUFFER_BYTES,
    MAX_CLIENT_REPLY_BYTES,
    MAX_CLIENTS,
    MAX_REPLY_BYTES,
    RECV_BYTES,
    REQUEST_BATCH,
    REQUEST_BURST,
    REQUESTS_PER_S,
    SEND_CHUNK_BYTES,
    TOTAL_REQUEST_BURST,
    TOTAL_REQUESTS_PER_S,
    CpuBudget,
    TokenBucket,
    fd_shortage,
)

# Besides this module's own names, the limits and the connection class,
# which other modules import from here.
__all__ = [
    "ACCEPT_BATCH", "ACCEPT_BURST", "ACCEPT_PAUSE_S", "ACCEPTS_PER_S", "CACHED_COMMANDS", "CLIENT_COMMAND_CPU_BURST_S",
    "CLIENT_COMMAND_CPU_SHARE", "COMMAND_CPU_BURST_S", "COMMAND_CPU_SHARE", "FD_RESERVE", "MAX_CLIENT_BUFFER_BYTES",
    "MAX_CLIENT_REPLY_BYTES", "MAX_CLIENTS", "MAX_REPLY_BYTES", "RECV_BYTES", "REQUEST_BATCH", "REQUEST_BURST",
    "REQUESTS_PER_S", "SEND_CHUNK_BYTES", "TOTAL_REQUEST_BURST", "TOTAL_REQUESTS_PER_S", "Backfill", "Client",
    "Clients", "CommandError", "CommandHandler", "CpuBudget", "Greeting", "TokenBucket", "command_reply",
    "fd_shortage", "peer_uid",
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


# A result is encoded on its own (as protocol.encode would), so that its size
# is known before a reply is built and a cached one is never encoded again.
_RESULT_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _spliced_reply(request: dict[str, Any], result: bytes, **fields: Any) -> bytes:
    """``command_reply(request, True, result=..., **fields)`` around an encoded result."""
    head = command_reply(request, True, **fields)  # b'{...}\n'
    return b"".join((head[:-2], b',"result":', result, b"}\n"))


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
        self._command_cpu = CpuBudget(COMMAND_CPU_SHARE, COMMAND_CPU_BURST_S, now)
        self._client_cpu: dict[int, CpuBudget] = {}  # client ident -> its commands' budget
        # command name -> (monotonic time, arguments as JSON, encoded result):
        # the last reply of each command in CACHED_COMMANDS.
        self._cached: dict[str, tuple[float, str, bytes]] = {}
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
        for name, (t, _args, _result) in list(self._cached.items()):
            if now - t >= CACHED_COMMANDS.get(name, 0.0):
                del self._cached[name]  # a stale reply is not held until the next request
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
        self._client_cpu.clear()
        self._cached.clear()

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
            client.queue(self._answer(client, request, now), droppable=False)

    def _answer(self, client: Client, request: dict[str, Any], now: float) -> bytes:
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
        own = self._client_cpu.get(client.ident)
        if own is None:
            own = self._client_cpu[client.ident] = CpuBudget(CLIENT_COMMAND_CPU_SHARE, CLIENT_COMMAND_CPU_BURST_S, now)
        refusal = self._over_budget(request, own, now)
        if refusal is not None:
            return refusal
        started = time.thread_time()
        try:
            return self._run(request, name, handler, args, now)
        finally:
            spent = time.thread_time() - started
            own.charge(now, spent)
            self._command_cpu.charge(now, spent)

    def _over_budget(self, request: dict[str, Any], own: CpuBudget, now: float) -> bytes | None:
        """The ``rate limited`` reply when this client's commands, or all
        clients', have used their share of the agent's CPU; else None.

        A client with half its own burst or more left has asked little
        lately: it may draw on the shared budget's reserve, so that others'
        floods do not lock it out."""
        quiet = own.level(now) >= 0.5 * own.burst_s
        if not own.allows(now):
            wait, whose = own.retry_s(now), f"this connection's share, {CLIENT_COMMAND_CPU_SHARE:.1%}"
        elif not self._command_cpu.allows(now, reserve=quiet):
            wait = self._command_cpu.retry_s(now, reserve=quiet)
            whose = f"the share of all connections, {COMMAND_CPU_SHARE:.1%}"
        else:
            return None
        return command_reply(
            request, False,
            error=f"rate limited: commands have used {whose} of a core of the agent's CPU; retry in {wait:.1f} s",
            retry_after_s=max(0.001, round(wait, 3)),
        )

    def _run(self, request: dict[str, Any], name: str, handler: CommandHandler, args: dict[str, Any],
             now: float) -> bytes:
        """Run the handler (or take its cached reply) and build the reply."""
        ttl = CACHED_COMMANDS.get(name)
        key = None
        if ttl is not None:
            try:
                key = json.dumps(args, sort_keys=True, separators=(",", ":"))
            except (TypeError, ValueError):
                key = None
            kept = self._cached.get(name)
            if kept is not None and now - kept[0] >= ttl:
                del self._cached[name]  # stale: its bytes are not held any longer
                kept = None
            if kept is not None and kept[1] == key:
                return _spliced_reply(request, kept[2], cached_age_s=round(now - kept[0], 3))
        try:
            result = handler(args)
        except CommandError as exc:
            return command_reply(request, False, error=str(exc), **exc.fields)
        except Exception as exc:
            return command_reply(request, False, error=f"{type(exc).__name__}: {exc}")
        try:
            encoded = _RESULT_ENCODER.encode(result).encode()
        except ValueError:  # NaN or infinity somewhere: protocol.encode writes them as null
            try:
                reply = command_reply(request, True, result=result)
            except Exception as exc:
                return command_reply(request, False, error=f"unencodable result: {type(exc).__name__}: {exc}")
            return reply if len(reply) <= MAX_REPLY_BYTES else _too_large(request, len(reply))
        except Exception as exc:  # a handler returned something JSON cannot carry
            return command_reply(request, False, error=f"unencodable result: {type(exc).__name__}: {exc}")
        if len(encoded) > MAX_REPLY_BYTES:
            return _too_large(request, len(encoded))
        if key is not None:
            self._cached[name] = (now, key, encoded)
        return _spliced_reply(request, encoded)

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
        self._client_cpu.pop(client.ident, None)

    def close_in_child(self) -> None:
        """After fork, in the child: close this process's copies of the client
        sockets. Closing a copy never shuts the connection down for the
        parent, and the selector (shared with the parent) is not touched."""
        for client in list(self._clients.values()):
            client.close()
        self._clients.clear()
        self._throttled.clear()
        self._client_cpu.clear()
        self._cached.clear()


def _too_large(request: dict[str, Any], size: int) -> bytes:
    """The error that takes the place of a reply over :data:`MAX_REPLY_BYTES`."""
    return command_reply(request, False, reply_bytes=size,
                         error=f"reply too large: {size} bytes, over the agent's limit of {MAX_REPLY_BYTES} bytes")
