"""One client connection of the agent (:class:`Client`): its bounded output
queue, its input buffer and request budget; and the refusal a connection
gets when it cannot be served.

Everything here runs on the agent thread and never blocks; what a client
may cost is set in :mod:`jaxtop.agent.limits`.
"""

from __future__ import annotations

import collections
import socket
import struct
import time
import zlib
from typing import Any

from jaxtop.wire import protocol
from jaxtop.agent.history import (
    _SAMPLE_PREFIX,
    _BACKFILL_PREFIX,
    Backfill,
    _Range,
    _Chunks,
    _LAZY,
)
from jaxtop.agent.limits import (
    MAX_CLIENT_BUFFER_BYTES,
    MAX_CLIENT_REPLY_BYTES,
    MAX_IOV,
    RECV_BYTES,
    REQUEST_BURST,
    REQUESTS_PER_S,
    SEND_CHUNK_BYTES,
    TokenBucket,
)

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
            for line in backfill.lines(first, min(rng.last, first + MAX_IOV)):
                if rng.retype and line.startswith(_SAMPLE_PREFIX):
                    line = _BACKFILL_PREFIX + line[len(_SAMPLE_PREFIX):]
                lines.append(line)
                size += len(line)
                if size >= SEND_CHUNK_BYTES or len(lines) >= MAX_IOV:
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
                if size >= SEND_CHUNK_BYTES or len(buffers) >= MAX_IOV:
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


def refuse(sock: socket.socket, message: str) -> None:
    """Tell a connection why it is refused (if its buffer takes it), close it."""
    try:
        sock.send(protocol.encode({"type": protocol.ERROR, "t": time.time(), "message": message, "fatal": True}),
                  _SEND_FLAGS)
    except OSError:
        pass
    sock.close()
