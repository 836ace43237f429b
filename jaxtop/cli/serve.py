"""``jaxtop serve``: the dashboard in a browser (textual-serve).

The server binds 127.0.0.1 unless told otherwise, and answers only a
browser that shows it the token of its URL: the first page load sets it
as a cookie (HttpOnly, SameSite=Strict), which the page's websocket then
carries. Loopback is open to every local user of the machine; the token
keeps them out. One dashboard process at a time: a second tab is refused
(each tab would otherwise start a process of its own, with its own
connection to the agent). ``w`` and ``s`` deliver their files to the
browser as downloads (``jaxtop.dashboard.web``).
"""

from __future__ import annotations

import argparse
import hmac
import secrets
import shlex
import sys
from typing import Any

from jaxtop.cli.exits import EXIT_USAGE
from jaxtop.wire import paths

__all__ = ["cmd_serve", "make_server"]

INSTALL_HINT = "textual-serve is not installed: pip install 'jaxtop[serve]' (or textual-serve)"
COOKIE = "jaxtop_token"


def make_server(command: str, host: str, port: int, token: str, title: str) -> Any:
    """A textual-serve server for ``command`` that checks ``token`` and
    runs one dashboard at a time. Raises ImportError without textual-serve."""
    from aiohttp import web
    from textual_serve.server import Server

    class JaxtopServer(Server):
        sessions = 0

        async def _make_app(self) -> web.Application:
            app = await super()._make_app()
            app.middlewares.append(check_token)
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

    @web.middleware
    async def check_token(request: web.Request, handler: Any) -> web.StreamResponse:
        given = request.query.get("token") or request.cookies.get(COOKIE) or ""
        if not hmac.compare_digest(given.encode(), token.encode()):
            return web.Response(status=403, text="jaxtop serve: open the URL with its token (printed when the "
                                                 "server started)")
        response = await handler(request)
        if request.query.get("token") and isinstance(response, web.Response):
            response.set_cookie(COOKIE, token, httponly=True, samesite="Strict")
        return response

    return JaxtopServer(command, host=host, port=port, title=title)


def cmd_serve(args: argparse.Namespace) -> int:
    """``jaxtop serve replay FILE | attach PID...``; returns the exit status."""
    what = args.what
    if what == "replay" and len(args.targets) != 1:
        print("jaxtop serve replay: give one recording", file=sys.stderr)
        return EXIT_USAGE
    if what == "attach" and (not args.targets or not all(t.isdigit() for t in args.targets)):
        print("jaxtop serve attach: give one or more PIDs", file=sys.stderr)
        return EXIT_USAGE
    # Each browser's dashboard is a child run by a shell in this directory:
    # paths.python_command keeps it from importing what others put there.
    command = shlex.join(paths.python_command("jaxtop", what, *args.targets))
    token = args.token or secrets.token_urlsafe(18)
    try:
        server = make_server(command, args.host, args.port, token, title=f"jaxtop {what} {' '.join(args.targets)}")
    except ImportError:
        print(f"jaxtop serve: {INSTALL_HINT}", file=sys.stderr)
        return EXIT_USAGE
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"jaxtop serve: open http://{host}:{args.port}/?token={token}", flush=True)
    server.serve()
    return 0
