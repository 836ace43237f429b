"""``jaxtop serve``: the dashboard in a browser (textual-serve).

The server binds 127.0.0.1 unless told otherwise. Loopback is open to every
local user of the machine, and a browser hands whatever it keeps for
127.0.0.1 to any port of it, so the server keeps nothing in the browser:
the token is the first segment of the path of every URL the page uses
(``http://127.0.0.1:PORT/TOKEN/``), the websocket included, and every
request must also name the served host and, where it has an origin, the
served origin (:mod:`jaxtop.dashboard.web_guard`; docs/security.md). The
token is random unless ``--token-file`` names a file only you can read; it
is printed once, in the URL line, and never put in the process's arguments,
environment or logs. The port is bound before that line is printed: a busy
port is one line on stderr, and the token goes nowhere.

One dashboard process at a time: a second tab is refused (each tab would
otherwise start a process of its own, with its own connection to the
agent). ``w`` and ``s`` deliver their files to the browser as downloads
(``jaxtop.dashboard.web``).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import shlex
import signal
import socket
import sys
from typing import Any

from jaxtop.cli.exits import EXIT_USAGE
from jaxtop.wire import paths

__all__ = ["cmd_serve", "make_server", "listen", "netloc_of"]

INSTALL_HINT = "textual-serve is not installed: pip install 'jaxtop[serve]' (or textual-serve)"
#: Exit status when the address cannot be bound (EXIT_STATUS_HELP: the action failed).
EXIT_LISTEN = 1


def netloc_of(host: str, port: int) -> str:
    """``host:port`` as a browser writes it in ``Host`` and ``Origin``
    (IPv6 in brackets; no port for 80)."""
    shown = f"[{host}]" if ":" in host else host
    return shown if port == 80 else f"{shown}:{port}"


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``, bound now.

    Bound before the URL (and its token) is printed, so that a port taken
    by someone else fails here, and the victim's browser is never sent to a
    server that another user runs on it. No ``SO_REUSEPORT``: nobody can
    bind the port beside us.

    Raises:
        OSError: the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=128)


def make_server(command: str, host: str, port: int, token: str, title: str) -> Any:
    """A textual-serve server for ``command`` behind ``token`` that runs one
    dashboard at a time.

    textual-serve's application is mounted, unchanged, under ``/TOKEN`` in
    an application of ours that carries the guard; only ``/download/KEY``
    stays at the root, where textual-serve's page asks for downloads.

    Raises:
        ImportError: textual-serve is not installed.
    """
    from aiohttp import web
    from textual_serve.server import Server

    from jaxtop.dashboard.web_guard import Guard, RedactingFormatter

    netloc = netloc_of(host, port)
    guard = Guard(token, netloc)

    class JaxtopServer(Server):
        sessions = 0

        async def _make_app(self) -> web.Application:
            # textual-serve offers no hook for middleware: the application it
            # builds is mounted whole, its routes and handlers unchanged.
            dashboard = await super()._make_app()
            app = web.Application()
            guard.install(app)

            async def to_index(request: web.Request) -> web.StreamResponse:
                raise web.HTTPFound(f"/{token}/")  # the URL copied without its final slash

            app.router.add_get(f"/{token}", to_index)  # before the mount, which would answer it 404
            app.add_subapp(f"/{token}", dashboard)
            app.router.add_get("/download/{key}", self.handle_download)
            return app

        async def handle_websocket(self, request: web.Request) -> web.StreamResponse:
            if JaxtopServer.sessions:
                return web.Response(status=409, text="jaxtop serve: the dashboard is open in another tab (one at a "
                                                      "time); close it, or start another jaxtop serve")
            JaxtopServer.sessions += 1
            try:
                return await super().handle_websocket(request)
            finally:
                JaxtopServer.sessions -= 1

        async def on_startup(self, app: web.Application) -> None:
            """Nothing: textual-serve's banner shows the command it runs
            (escaped past reading) and its address without the token, which
            answers 403; the one line to open is printed before serving."""

        def initialize_logging(self) -> None:
            # textual-serve's own handler prints tracebacks with their local
            # variables (the request, its path: the token); aiohttp's errors
            # name the path too. Everything logged goes through a formatter
            # that blanks the token.
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(RedactingFormatter(token))
            logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)

        def serve_socket(self, sock: socket.socket) -> None:
            """Serve on ``sock`` (already bound) until SIGINT or SIGTERM.

            textual-serve's ``serve`` binds host and port itself, after we
            would have printed the token, and logs every request line (the
            token is in each path): this is it with a bound socket and
            without the access log.
            """
            self.initialize_logging()
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            if sys.platform != "win32":  # asyncio has no signal handlers there
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(sig, self.request_exit)
            web.run_app(self._make_app(), sock=sock, handle_signals=False, loop=loop,
                        print=lambda *args: None, access_log=None)

    return JaxtopServer(command, host=host, port=port, title=title, public_url=f"http://{netloc}")


def cmd_serve(args: argparse.Namespace) -> int:
    """``jaxtop serve replay FILE | attach PID...``; returns the exit status."""
    what = args.what
    if what == "replay" and len(args.targets) != 1:
        print("jaxtop serve replay: give one recording", file=sys.stderr)
        return EXIT_USAGE
    if what == "attach" and (not args.targets or not all(t.isdigit() for t in args.targets)):
        print("jaxtop serve attach: give one or more PIDs", file=sys.stderr)
        return EXIT_USAGE
    from jaxtop.dashboard.web_guard import TokenError, new_token, read_token_file

    try:
        token = read_token_file(args.token_file) if args.token_file else new_token()
    except TokenError as exc:
        print(f"jaxtop serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # Each browser's dashboard is a child run by a shell in this directory:
    # paths.python_command keeps it from importing what others put there.
    command = shlex.join(paths.python_command("jaxtop", what, *args.targets))
    title = f"jaxtop {what} {' '.join(args.targets)}"
    try:
        server = make_server(command, args.host, args.port, token, title)
    except ImportError:
        print(f"jaxtop serve: {INSTALL_HINT}", file=sys.stderr)
        return EXIT_USAGE
    try:
        sock = listen(args.host, args.port)
    except OSError as exc:
        # create_server's message names the address again: the line names it once.
        why = (exc.strerror or str(exc)).split(" (while attempting", 1)[0]
        if exc.errno == errno.EADDRINUSE:
            why += "; another server has the port: choose another with --port"
        print(f"jaxtop serve: cannot listen on {netloc_of(args.host, args.port)}: {why}", file=sys.stderr)
        return EXIT_LISTEN
    print(f"jaxtop serve: open http://{netloc_of(args.host, args.port)}/{token}/  (Ctrl+C stops it)", flush=True)
    server.serve_socket(sock)
    return 0
