"""How many connections ``jaxtop serve`` holds open, and which it lets go.

Loopback is open to every local user. Anyone can open connections to the
server and leave them idle without ever naming the token: each holds a
descriptor, and at the process's limit (1,024 by default) the server can
no longer accept the owner's own page, while asyncio prints a traceback for
every refused accept. So connections are counted as they are accepted:

- at most :data:`MAX_OPEN` at once (or a quarter of the descriptor limit,
  whichever is less), so descriptors stay for the dashboard's own pipes and
  files;
- at the bound, the oldest connection that has not shown the token and has
  been open :data:`GRACE_S` or more is closed to make room (the owner's
  browser sends its request at once, with the token; an idle stranger's
  never does), and only when there is none is the new one refused;
- one line on stderr says so, once per burst, instead of a traceback per
  connection.

The listening socket is wrapped (:meth:`Doors.listener`), so nothing of
aiohttp or textual-serve changes: asyncio calls its ``accept``.
"""

from __future__ import annotations

import resource
import socket
import sys
import time
from typing import Any, Callable

__all__ = ["Doors", "GRACE_S", "MAX_OPEN"]

#: Connections held open at once, at most.
MAX_OPEN = 256
#: Seconds a connection without the token may stay before it can be closed
#: to make room.
GRACE_S = 2.0
#: Seconds of no refusal after which the next one is said again.
QUIET_S = 60.0


class _Listening(socket.socket):
    """The server's listening socket, admitting each connection it accepts
    through ``doors``."""

    doors: "Doors"

    def accept(self) -> tuple[socket.socket, Any]:
        conn, addr = super().accept()
        self.doors.admit(conn)  # raises ConnectionAbortedError for one refused (asyncio skips it)
        return conn, addr


class Doors:
    """The connections open, when each came, and which showed the token.

    Args:
        limit: connections held open at once; None: :data:`MAX_OPEN`, or a
            quarter of the soft descriptor limit if that is less.
        say: where the one line goes (stderr by default).
        clock: monotonic seconds (tests give their own).
    """

    def __init__(self, limit: int | None = None, say: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if limit is None:
            try:
                soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            except (OSError, ValueError):
                soft = 1024
            limit = MAX_OPEN if soft == resource.RLIM_INFINITY else max(8, min(MAX_OPEN, soft // 4))
        self.limit = limit
        self._say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self._clock = clock
        # fd -> [socket, opened at, showed the token]; oldest first.
        self._open: dict[int, list[Any]] = {}
        self.refused = 0
        self.closed = 0
        self._said_at: float | None = None

    def listener(self, sock: socket.socket) -> socket.socket:
        """``sock`` (bound and listening) as a socket whose accepts go through here."""
        wrapped = _Listening(sock.family, sock.type, sock.proto, fileno=sock.detach())
        wrapped.doors = self
        return wrapped

    def open_count(self) -> int:
        self._prune()
        return len(self._open)

    def admit(self, conn: socket.socket) -> None:
        """Take ``conn`` in, making room if needed; close it and raise
        ConnectionAbortedError where there is none."""
        self._prune()
        now = self._clock()
        if len(self._open) >= self.limit and not self._make_room(now):
            self.refused += 1
            conn.close()
            self._tell(now)
            raise ConnectionAbortedError("jaxtop serve: too many connections open")
        self._open[conn.fileno()] = [conn, now, False]

    def trust(self, transport: Any) -> None:
        """The connection under ``transport`` showed the token: it is never
        closed to make room."""
        sock = transport.get_extra_info("socket") if transport is not None else None
        try:
            fd = sock.fileno() if sock is not None else -1
        except (OSError, ValueError):
            return
        entry = self._open.get(fd)
        if entry is not None:
            entry[2] = True

    def _prune(self) -> None:
        gone = [fd for fd, (conn, _, _) in self._open.items() if conn.fileno() != fd]
        for fd in gone:
            del self._open[fd]

    def _make_room(self, now: float) -> bool:
        """Close the oldest connection without the token past its grace; False where none is."""
        for fd, (conn, opened, trusted) in self._open.items():
            if not trusted and now - opened >= GRACE_S:
                try:
                    conn.shutdown(socket.SHUT_RDWR)  # its transport sees the end and closes it
                except OSError:
                    pass
                del self._open[fd]
                self.closed += 1
                self._tell(now)
                return True
        return False

    def _tell(self, now: float) -> None:
        if self._said_at is not None and now - self._said_at < QUIET_S:
            return
        self._said_at = now
        self._say(f"jaxtop serve: {self.limit} connections open at once, most without the token (another local "
                  f"user?): the oldest idle ones are closed and new ones refused while it lasts (said once a minute)")
