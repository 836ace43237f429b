"""Who ``jaxtop serve`` answers: the token, the origin and the host.

Loopback is open to every local user, and a browser carries whatever it
holds for 127.0.0.1 to every port of it: a cookie set by one port is sent
to any other port's server, and ``SameSite`` treats another port of the same
host as the same site. So nothing here is ambient. The token travels in the
path of every URL the dashboard's page uses (``/TOKEN/``, its static files
and its websocket ``/TOKEN/ws``), never in a cookie; a page on another
origin cannot read the dashboard's page to learn it. On top of that every
request must name the served host in ``Host`` (a DNS-rebinding page names
its own), any ``Origin`` must be exactly the origin the server printed, and
the websocket upgrade must carry one. Downloads (``/download/KEY``, the one
path textual-serve's page builds without the prefix) are one-time keys sent
only down the websocket; a browser must fetch them from the dashboard's own
page (``Sec-Fetch-Site: same-origin``).

The checks run in an aiohttp middleware on the application that holds
textual-serve's own (mounted under the token), so textual-serve's handlers
are used as they are. docs/security.md says why each check is there.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import secrets
import stat
from typing import Any, Awaitable, Callable

__all__ = ["Guard", "TokenError", "new_token", "read_token_file", "RedactingFormatter"]

#: What a token may be: it is a path segment of the URL, so URL-safe
#: characters only, and long enough not to be guessed.
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,128}")

#: Headers on every response. The page holds the token (in its URLs): not
#: framed by another page (clickjacking, a second session), not cached, and
#: its URL never sent as a Referer (not even to the web font it loads).
SECURITY_HEADERS = {
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}


class TokenError(ValueError):
    """A token file that cannot be used; the message is one line."""


def new_token() -> str:
    """A random token (192 bits)."""
    return secrets.token_urlsafe(24)


def read_token_file(path: str) -> str:
    """The token kept in ``path``: its first line.

    The file must be a regular file of yours that group and others cannot
    read: the token in it is the whole key to the dashboard.

    Raises:
        TokenError: the file cannot be read, is readable by others, or its
            first line is not 16 to 128 URL-safe characters.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO would block
    except OSError as exc:
        raise TokenError(f"cannot read the token file {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TokenError(f"the token file {path} is not a regular file")
        if st.st_uid != os.getuid():
            raise TokenError(f"the token file {path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()})")
        if st.st_mode & 0o077:
            raise TokenError(f"the token file {path} can be read by others (mode {stat.S_IMODE(st.st_mode):04o}): "
                             f"chmod 600 it")
        first = os.read(fd, 4096).split(b"\n", 1)[0].strip()
    finally:
        os.close(fd)
    token = first.decode("ascii", "replace")
    if not TOKEN_PATTERN.fullmatch(token):
        raise TokenError(f"the first line of {path} is not a token: 16 to 128 of A-Z a-z 0-9 _ -")
    return token


def _lower(value: str | None) -> str | None:
    return value.lower() if value is not None else None


class Guard:
    """Admits a request only from the dashboard's own page, or the user's
    navigation to the printed URL.

    Args:
        token: the URL's token (the first path segment of every page URL).
        netloc: the served ``host:port`` as printed (the port left out for
            80, as browsers send it); ``Host`` must be exactly this.
    """

    def __init__(self, token: str, netloc: str) -> None:
        self.token = token
        #: Called with the transport of each request let through (the
        #: server's connection bound keeps those open).
        self.on_trusted: Callable[[Any], None] | None = None
        self.netloc = netloc.lower()
        self.origin = f"http://{self.netloc}"
        self._token_bytes = token.encode()

    def refusal(self, request: Any, websocket: bool) -> tuple[int, str] | None:
        """Why ``request`` is refused (HTTP status and a line), or None.

        Args:
            request: the aiohttp request.
            websocket: whether it asks for the dashboard's websocket.
        """
        headers = request.headers
        if _lower(headers.get("Host")) != self.netloc:
            # DNS rebinding: a page of evil.example resolved to 127.0.0.1
            # sends Host: evil.example:PORT.
            return 421, f"jaxtop serve: this server answers {self.netloc} only"
        origin = headers.get("Origin")
        if origin is not None and _lower(origin) != self.origin:
            return 403, "jaxtop serve: requests from another origin are refused"
        if websocket and origin is None:
            # Browsers always send Origin on a websocket; its absence means a
            # client that could be anyone's.
            return 403, "jaxtop serve: a websocket without Origin is refused"
        segments = request.path.split("/")
        first = segments[1] if len(segments) > 1 else ""
        if first == "download" and len(segments) == 3:
            site = headers.get("Sec-Fetch-Site")
            if site is not None and site != "same-origin":
                return 403, "jaxtop serve: a download is fetched by the dashboard's own page only"
            return None  # the key is random, single-use and sent down the websocket only
        if not hmac.compare_digest(first.encode(), self._token_bytes):
            return 403, "jaxtop serve: open the URL with its token (printed when the server started)"
        return None

    def middleware(self) -> Callable[..., Awaitable[Any]]:
        """The aiohttp middleware that applies :meth:`refusal` to every request."""
        from aiohttp import web

        @web.middleware
        async def guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                        ) -> web.StreamResponse:
            route = getattr(request.match_info, "route", None)
            websocket = (request.headers.get("Upgrade", "").lower() == "websocket"
                         or getattr(route, "name", None) == "websocket")
            refused = self.refusal(request, websocket)
            if refused is not None:
                return web.Response(status=refused[0], text=refused[1])
            if self.on_trusted is not None:
                self.on_trusted(request.transport)  # the connection showed the token
            return await handler(request)

        return guard

    def install(self, app: Any) -> None:
        """Guard ``app`` (an aiohttp application) and every application mounted in it."""
        app.middlewares.append(self.middleware())

        async def add_headers(request: Any, response: Any) -> None:
            for name, value in SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)

        app.on_response_prepare.append(add_headers)


class RedactingFormatter(logging.Formatter):
    """A formatter that writes ``<token>`` wherever the token would appear.

    The token is in every request path: an error logged about a request
    (aiohttp's "Error handling request", textual-serve's websocket errors,
    a traceback) would otherwise print it.
    """

    def __init__(self, token: str, fmt: str = "%(levelname)s %(name)s: %(message)s") -> None:
        super().__init__(fmt)
        self._token = token

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace(self._token, "<token>")
