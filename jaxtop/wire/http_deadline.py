"""One HTTP request under one deadline and a cap on the answer's size.

``urllib``'s timeout bounds each socket operation, not the request: a
server that sends a byte every few seconds keeps a request going forever,
and ``read()`` takes whatever size the server sends. The Pushgateway push at
the program's exit and ``jaxtop attach --prometheus`` must end on time and
in bounded memory whatever the server does, so every step here (name
lookup, connect, TLS handshake, each send and each read) gets only the time
left until one deadline, and the answer is read to a cap.

A URL may carry ``user:password@``: it is sent as HTTP basic
authentication, and never printed (:func:`redact`).

Standard library only: the agent imports it inside the user's job.
"""

from __future__ import annotations

import base64
import http.client
import io
import socket
import ssl
import threading
import time
import urllib.parse
from typing import Any

__all__ = ["AnswerTooLarge", "Answer", "redact", "request"]


class AnswerTooLarge(OSError):
    """The answer's body is over the cap: read no further."""


class Answer:
    """A server's answer: its status, reason and body (at most the cap)."""

    def __init__(self, status: int, reason: str, body: bytes) -> None:
        self.status = status
        self.reason = reason
        self.body = body


def redact(url: str) -> str:
    """``url`` fit to print: a password in it replaced by ``***``
    (``http://user:***@host/``)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "(a URL that cannot be read)"
    if "@" not in parts.netloc:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    netloc = f"{user}:***@{hostport}" if ":" in userinfo else f"{user}@{hostport}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def request(method: str, url: str, deadline_s: float, body: bytes | None = None,
            headers: dict[str, str] | None = None, max_bytes: int = 1 << 16, truncate: bool = False) -> Answer:
    """Send one request and read its answer, all within ``deadline_s``.

    Args:
        method: ``GET``, ``PUT``, ...
        url: ``http://`` or ``https://`` (a URL without a scheme is taken as http).
        deadline_s: seconds the whole request may take, from now.
        body: the request body, if any.
        headers: more request headers.
        max_bytes: the most bytes of the answer's body read.
        truncate: past ``max_bytes``, keep what was read (the body is only
            for a message) instead of raising :class:`AnswerTooLarge`.

    Returns:
        The answer, whatever its status.

    Raises:
        TimeoutError: the deadline passed (the message says after how long).
        AnswerTooLarge: the body is over ``max_bytes``.
        OSError: anything else: a bad URL, a name that does not resolve, a
            refused connection, an answer that is not HTTP. Messages never
            hold the URL's password.
    """
    deadline = time.monotonic() + deadline_s
    target = url if "://" in url else f"http://{url}"
    try:
        parts = urllib.parse.urlsplit(target)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise OSError(f"not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OSError(f"not an http(s) URL: {redact(url)}")
    host = parts.hostname
    try:
        sock = _connect(host, port, deadline, deadline_s)
        try:
            if parts.scheme == "https":
                sock.settimeout(_left(deadline, deadline_s))
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
            lines = [f"{method} {urllib.parse.urlunsplit(('', '', parts.path or '/', parts.query, ''))} HTTP/1.1",
                     f"Host: {parts.netloc.rpartition('@')[2]}", "Connection: close", "User-Agent: jaxtop"]
            if parts.username is not None:
                user = urllib.parse.unquote(parts.username)
                password = urllib.parse.unquote(parts.password or "")
                token = base64.b64encode(f"{user}:{password}".encode()).decode()
                lines.append(f"Authorization: Basic {token}")
            for name, value in (headers or {}).items():
                lines.append(f"{name}: {value}")
            if body is not None:
                lines.append(f"Content-Length: {len(body)}")
            try:
                head = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
            except UnicodeError:
                raise OSError(f"not a URL HTTP can send: {redact(url)}") from None
            sock.settimeout(_left(deadline, deadline_s))
            sock.sendall(head + (body or b""))  # sendall: its timeout is for the whole send
            response = http.client.HTTPResponse(_DeadlineSocket(sock, deadline, deadline_s), method=method)
            response.begin()
            data = response.read(max_bytes + 1)
            if len(data) > max_bytes:
                if not truncate:
                    raise AnswerTooLarge(f"the answer is over {_size(max_bytes)}")
                data = data[:max_bytes]
            # The reason is the server's text: printable characters only.
            reason = "".join(c if c.isprintable() else "?" for c in str(response.reason)[:200])
            return Answer(response.status, reason, data)
        finally:
            sock.close()
    except (socket.timeout, TimeoutError):
        raise TimeoutError(f"no complete answer within {deadline_s:g} s") from None
    except http.client.HTTPException as exc:
        raise OSError(f"not an HTTP answer ({type(exc).__name__})") from None
    except (ssl.SSLError, ssl.CertificateError) as exc:
        raise OSError(f"TLS: {exc}") from None


def _left(deadline: float, deadline_s: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"no complete answer within {deadline_s:g} s")
    return left


def _connect(host: str, port: int, deadline: float, deadline_s: float) -> socket.socket:
    """A connected socket; the name lookup too is bounded by the deadline (on
    a thread of its own, which the resolver's own timeouts end)."""
    try:  # an address needs no lookup, nor a thread
        return _first_connected(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST),
                                host, deadline, deadline_s)
    except socket.gaierror:
        pass
    found: list[Any] = []

    def lookup() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            found.append(exc)

    resolver = threading.Thread(target=lookup, name="jaxtop-resolve", daemon=True)
    resolver.start()
    resolver.join(_left(deadline, deadline_s))
    if not found:
        raise TimeoutError(f"no complete answer within {deadline_s:g} s")
    if isinstance(found[0], OSError):
        raise found[0]
    return _first_connected(found[0], host, deadline, deadline_s)


def _first_connected(addresses: list[Any], host: str, deadline: float, deadline_s: float) -> socket.socket:
    error: OSError | None = None
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(_left(deadline, deadline_s))
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            if isinstance(exc, (socket.timeout, TimeoutError)):
                raise
            error = exc
    raise error or OSError(f"{host} has no address")


class _DeadlineSocket:
    """What ``http.client.HTTPResponse`` reads from: each read gets only the
    time left, so the whole answer is bounded, however it trickles in."""

    def __init__(self, sock: socket.socket, deadline: float, deadline_s: float) -> None:
        self._raw = _DeadlineReader(sock, deadline, deadline_s)

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(self._raw)


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock: socket.socket, deadline: float, deadline_s: float) -> None:
        self._sock = sock
        self._deadline = deadline
        self._deadline_s = deadline_s

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._sock.settimeout(_left(self._deadline, self._deadline_s))
        return self._sock.recv_into(buffer)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"
