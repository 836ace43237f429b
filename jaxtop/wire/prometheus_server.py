"""The HTTP server behind ``--prometheus PORT``: one thread, and a bound on
everything a peer can make it do.

It runs inside the user's program, on loopback by default, where every local
user can connect. Every moment its thread holds the GIL is a moment the
program's own Python threads wait, so the request path is built to hold it
rarely and briefly, whatever the peers send:

* **One thread, no thread per connection.** Non-blocking sockets and one
  ``poll()`` per pass; a connection costs a file descriptor and a few
  hundred bytes, never a thread (thread start-up and ``http.server``'s
  header parsing in Python were most of what a flood cost before).
* **Paced passes.** At most one pass every :data:`PASS_S`, each accepting
  at most :data:`ACCEPTS_PER_PASS` connections. A flood's surplus waits in
  the kernel's listen queue, which costs this process nothing, and once that
  queue is full the kernel turns connections away: the cheapest rejection
  there is. The thread's share of the GIL is bounded by the pace, not by
  the peers' rate.
* **A scrape needs no slot.** A connection whose request is already there
  when it is accepted (a scraper sends it with the connection) is answered
  at once, so peers that hold connections open never keep a scrape out.
* **A cap on connections waiting for their request** (:data:`MAX_CONNECTIONS`).
  A new one that must wait closes the oldest still waiting: dripping
  connections are churned out rather than holding the server.
* **One deadline per connection, for the whole exchange**
  (:data:`SOCKET_TIMEOUT_S` from accept), not per read: a peer dripping a
  byte a second cannot stretch it.
* **Bounded requests.** A request head (request line and headers) past
  :data:`MAX_HEAD_BYTES`, or a request line past :data:`MAX_LINE_BYTES`, is
  answered 431 / 414 without reading further; bodies are never read; any
  method but GET and HEAD is answered 405.
* **The exposition rendered at most once per** :data:`RENDER_INTERVAL_S`, and
  only when the state changed since: every answer in between is the same
  cached bytes (a render holds the GIL for a fraction of a millisecond per
  device; a flood must not multiply it).

So the server holds at most ``MAX_CONNECTIONS + 2`` descriptors (the
listener, the waiting connections, one being accepted) and one thread, and
a pass does a bounded amount of work.
"""

from __future__ import annotations

import gzip
import select
import socket
import threading
import time
from typing import Any, Callable

#: Connections waiting for their request (or for their answer to drain) at once.
MAX_CONNECTIONS = 8
#: Seconds a connection may take from accept to its last byte out: the
#: whole exchange, not one read.
SOCKET_TIMEOUT_S = 5.0
#: Seconds between two passes at the least: the thread wakes at most
#: 1 / PASS_S times a second, whatever its peers do.
PASS_S = 0.02
#: Connections accepted per pass (so at most ACCEPTS_PER_PASS / PASS_S a second).
ACCEPTS_PER_PASS = 4
#: Connections the kernel queues for us while we pace (more are refused by it).
BACKLOG = 128
#: The most bytes of a request head read: request line and headers.
MAX_HEAD_BYTES = 8192
#: The most bytes of a request line.
MAX_LINE_BYTES = 2048
#: Seconds an exposition is served from the cache before it may be rendered again.
RENDER_INTERVAL_S = 1.0
#: Seconds the thread waits in ``poll()`` with nothing to do (shutdown wakes it sooner).
IDLE_POLL_S = 1.0

#: The text format every Prometheus server reads (prometheus-client's generate_latest).
CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"

_ERRORS = {
    400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed", 414: b"URI Too Long",
    431: b"Request Header Fields Too Large", 500: b"Internal Server Error",
}


class _Conn:
    """One accepted connection: what it sent so far, what is left to send."""

    __slots__ = ("sock", "fd", "buf", "out", "deadline")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.buf = b""
        self.out: memoryview | None = None  # set once answered
        self.deadline = deadline


class _Exposition:
    """One render: its time, the state it was rendered from, and the whole
    answers (status line, headers, body) made from it, plain and gzipped."""

    __slots__ = ("t", "key", "plain", "head_only", "gzipped", "body")

    def __init__(self, t: float, key: tuple, body: bytes, status: int) -> None:
        self.t = t
        self.key = key
        self.body = body
        self.plain, self.head_only = _answer(status, body)
        self.gzipped: bytes | None = None

    def answer(self, gzipped: bool, head: bool) -> bytes:
        if head:
            return self.head_only
        if not gzipped:
            return self.plain
        if self.gzipped is None:  # once per render, for the first scraper that asks
            self.gzipped = _answer(200, gzip.compress(self.body, 6, mtime=0), b"Content-Encoding: gzip\r\n")[0]
        return self.gzipped


def _answer(status: int, body: bytes, extra: bytes = b"", content_type: bytes = CONTENT_TYPE) -> tuple[bytes, bytes]:
    """(the whole answer, the answer to a HEAD) for ``status`` and ``body``."""
    reason = b"OK" if status == 200 else _ERRORS.get(status, b"Error")
    head = (b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%sConnection: close\r\n\r\n"
            % (status, reason, content_type, len(body), extra))
    return head + body, head


def _error(status: int, extra: bytes = b"") -> bytes:
    text = _ERRORS[status] + b"\n"
    return _answer(status, text, extra, b"text/plain; charset=utf-8")[0]


class MetricsServer:
    """Serves one exposition over HTTP from one thread (see the module's doc).

    Args:
        address: ``(host, port)`` to bind.
        family: the address family of ``host``.
        render: makes the exposition's body; called on the server's thread,
            at most once per :data:`RENDER_INTERVAL_S`.
        state_key: what the exposition is made from, compared by identity:
            a render is reused while every item is the same object.
        max_connections: see :data:`MAX_CONNECTIONS`.
        timeout_s: see :data:`SOCKET_TIMEOUT_S`.

    Raises:
        OSError: the address cannot be bound.
    """

    def __init__(self, address: tuple[str, int], family: int, render: Callable[[], bytes],
                 state_key: Callable[[], tuple] = tuple, max_connections: int = MAX_CONNECTIONS,
                 timeout_s: float = SOCKET_TIMEOUT_S) -> None:
        self._render = render
        self._state_key = state_key
        self.max_connections = max(1, int(max_connections))
        self.timeout_s = float(timeout_s)
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restarted program gets its port back
            listener.bind(address)
            listener.listen(BACKLOG)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self._listener_fd = listener.fileno()
        self.server_address = listener.getsockname()[:2]
        self._conns: dict[int, _Conn] = {}  # by fd, oldest first
        self._poll = select.poll()
        self._poll.register(self._listener_fd, select.POLLIN)
        self._cache: _Exposition | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        #: Counters for tests and benchmarks: connections accepted, answered,
        #: closed for time, closed to make room, renders.
        self.stats = {"accepted": 0, "answered": 0, "timed_out": 0, "evicted": 0, "renders": 0}

    # -- lifetime ----------------------------------------------------------------
    def start(self) -> None:
        """Serve on a daemon thread of its own."""
        self._thread = threading.Thread(target=self.serve_forever, name="jaxtop-prometheus", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stop serving and wait for the thread (from another thread)."""
        self._stopping.set()
        try:
            # Wakes the thread's poll() at once (POLLHUP on the listener).
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def server_close(self) -> None:
        """Close the listener and any connection left (after :meth:`shutdown`)."""
        self._listener.close()
        if self._thread is None or not self._thread.is_alive():
            self._close_all()

    def serve_forever(self) -> None:
        try:
            while not self._stopping.is_set():
                began = time.monotonic()
                events = self._poll.poll(self._poll_timeout_ms(began))
                now = time.monotonic()
                for fd, mask in events:
                    if self._stopping.is_set():
                        break
                    if fd == self._listener_fd:
                        self._accept(now)
                        continue
                    conn = self._conns.get(fd)
                    if conn is None:
                        continue
                    if mask & (select.POLLERR | select.POLLNVAL):
                        self._close(conn)
                    elif conn.out is not None:
                        self._write(conn)
                    else:
                        self._read(conn, now)
                self._expire(time.monotonic())
                rest = PASS_S - (time.monotonic() - began)
                if rest > 0 and not self._stopping.is_set():
                    time.sleep(rest)  # the pace: the GIL stays free meanwhile
        finally:
            self._close_all()

    def _poll_timeout_ms(self, now: float) -> int:
        if not self._conns:
            return int(IDLE_POLL_S * 1000)
        soonest = min(c.deadline for c in self._conns.values())
        return max(0, int((soonest - now) * 1000) + 1)

    # -- connections -------------------------------------------------------------
    def _accept(self, now: float) -> None:
        for _ in range(ACCEPTS_PER_PASS):
            try:
                sock, _ = self._listener.accept()
            except OSError:
                # Nothing queued (EAGAIN), or no descriptor to take it with
                # (EMFILE): it stays queued, and the pace keeps this from spinning.
                return
            self.stats["accepted"] += 1
            sock.setblocking(False)
            self._read(_Conn(sock, now + self.timeout_s), now)

    def _read(self, conn: _Conn, now: float) -> None:
        try:
            data = conn.sock.recv(MAX_HEAD_BYTES + 1 - len(conn.buf))
        except BlockingIOError:
            data = None  # accepted before its request came
        except OSError:
            self._close(conn)
            return
        if data == b"":  # the peer is gone
            self._close(conn)
            return
        if data:
            start = max(0, len(conn.buf) - 3)
            conn.buf += data
            end = _head_end(conn.buf, start)
            if end >= 0:
                self._respond(conn, self._reply(conn.buf[:end], now))
                return
            if len(conn.buf) > MAX_HEAD_BYTES:
                self._respond(conn, _error(431))
                return
            if b"\n" not in conn.buf and len(conn.buf) > MAX_LINE_BYTES:
                self._respond(conn, _error(414))
                return
        self._hold(conn, select.POLLIN)

    def _reply(self, head: bytes, now: float) -> bytes:
        """The answer to a complete request head."""
        line, _, headers = head.partition(b"\n")
        if len(line) > MAX_LINE_BYTES:
            return _error(414)
        parts = line.split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/") or not parts[1].startswith(b"/"):
            return _error(400)
        method = parts[0]
        if method not in (b"GET", b"HEAD"):
            return _error(405, b"Allow: GET, HEAD\r\n")
        if parts[1].startswith(b"/favicon.ico"):
            return _error(404)
        exposition = self._exposition(now)
        return exposition.answer(_accepts_gzip(headers), method == b"HEAD")

    def _exposition(self, now: float) -> _Exposition:
        cached = self._cache
        if cached is not None and now - cached.t < RENDER_INTERVAL_S:
            return cached
        key = self._state_key()
        if cached is not None and len(key) == len(cached.key) and all(a is b for a, b in zip(key, cached.key)):
            cached.t = now  # nothing new: the same bytes, checked again in an interval
            return cached
        self.stats["renders"] += 1
        try:
            body, status = self._render(), 200
        except Exception as exc:  # a bug must not take the endpoint down: a 500, cached like a render
            body, status = f"jaxtop: the metrics could not be rendered: {type(exc).__name__}\n".encode(), 500
        self._cache = _Exposition(now, key, body, status)
        return self._cache

    def _respond(self, conn: _Conn, answer: bytes) -> None:
        conn.out = memoryview(answer)
        conn.buf = b""
        self.stats["answered"] += 1
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        assert conn.out is not None
        try:
            sent = conn.sock.send(conn.out)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._close(conn)
            return
        conn.out = conn.out[sent:]
        if not conn.out:
            self._close(conn)
        else:
            self._hold(conn, select.POLLOUT)

    def _hold(self, conn: _Conn, events: int) -> None:
        """Keep ``conn`` for a later pass, making room if the table is full."""
        if conn.fd in self._conns:
            self._poll.modify(conn.fd, events)
            return
        if len(self._conns) >= self.max_connections:
            # The oldest still waiting for its request goes first: an answer
            # being sent is nearly done, a request still dripping is not.
            waiting = next((c for c in self._conns.values() if c.out is None), None)
            self._close(waiting or next(iter(self._conns.values())))
            self.stats["evicted"] += 1
        self._conns[conn.fd] = conn
        self._poll.register(conn.fd, events)

    def _expire(self, now: float) -> None:
        late = [c for c in self._conns.values() if now >= c.deadline]
        for conn in late:
            self.stats["timed_out"] += 1
            self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if self._conns.pop(conn.fd, None) is not None:
            try:
                self._poll.unregister(conn.fd)
            except (KeyError, ValueError):
                pass
        try:
            conn.sock.close()
        except OSError:
            pass

    def _close_all(self) -> None:
        for conn in list(self._conns.values()):
            self._close(conn)


def _head_end(buf: bytes, start: int) -> int:
    """Where the request head in ``buf`` ends (after its blank line), or -1.
    Bare LF line ends are taken too, as most servers do."""
    crlf = buf.find(b"\r\n\r\n", start)
    lf = buf.find(b"\n\n", start)
    ends = [i + n for i, n in ((crlf, 4), (lf, 2)) if i >= 0]
    return min(ends) if ends else -1


def _accepts_gzip(headers: bytes) -> bool:
    for line in headers.split(b"\n"):
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"accept-encoding":
            return b"gzip" in value.lower()
    return False


def bind_address(addr: str, port: int) -> tuple[int, Any]:
    """(address family, socket address) for binding ``addr``: an IPv6
    address needs AF_INET6."""
    family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    return family, sockaddr
