"""One connected client of the agent: bounded output, line-limited input.

Everything here runs on the agent thread and never blocks: sockets are
non-blocking, output beyond the bound is dropped and counted, and bad input
closes only this client.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import Any

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
                "type": "dropped",
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
        self.out += protocol.encode({"type": "error", "t": time.time(), "message": message, "fatal": True})
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
    reply = {"type": "reply", "t": time.time(), "id": request.get("id"), "ok": ok}
    reply.update(fields)
    return protocol.encode(reply)
