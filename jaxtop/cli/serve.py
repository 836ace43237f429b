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
import os
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
#: Seconds a dashboard whose tab went has to quit before it is terminated,
#: then again before it is killed.
QUIT_S = 2.0
KILL_S = 2.0
#: Seconds the server waits for its connections once told to stop (each
#: dashboard is ended first, so none needs longer).
SHUTDOWN_S = 3.0
#: Seconds a new tab waits for the dashboard of a tab that has just gone (a
#: page reloaded: the old websocket closes as the new one opens) before it is
#: refused as a second tab: that dashboard's whole ending, and a margin.
REOPEN_S = QUIT_S + 2 * KILL_S + 1.0
#: prctl's option: the signal a child gets when its parent dies (linux/prctl.h).
PR_SET_PDEATHSIG = 1


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
    from textual_serve.app_service import AppService
    from textual_serve.server import Server

    from jaxtop.dashboard.web_doors import Doors
    from jaxtop.dashboard.web_guard import Guard, RedactingFormatter

    netloc = netloc_of(host, port)
    guard = Guard(token, netloc)
    doors = Doors()
    guard.on_trusted = doors.trust

    class Dashboard(AppService):
        """textual-serve's service for one tab, whose dashboard always ends.

        The dashboard runs in a session of its own (so that its shell and
        everything under it are signalled together), with the kernel told
        to kill it if the server dies first (``PR_SET_PDEATHSIG``). When
        the tab goes, it is asked to quit as textual-serve asks; one that
        has not ended within :data:`QUIT_S` is terminated, then killed: a
        dashboard whose client left must not keep a core busy.
        """

        async def _open_app_process(self, width: int = 80, height: int = 24) -> Any:
            environment = self._build_environment(width=width, height=height)
            self._process = process = await asyncio.create_subprocess_shell(
                self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=environment, start_new_session=True, preexec_fn=_die_with_parent)
            assert process.stdin is not None
            self._stdin = process.stdin
            return process

        async def end(self) -> None:
            """Quit, or be made to: within QUIT_S + KILL_S whatever the dashboard does."""
            try:
                await asyncio.wait_for(self.stop(), QUIT_S)
            except (asyncio.TimeoutError, Exception):
                pass
            await self.kill()
            stdin = getattr(self, "_stdin", None)
            if stdin is not None:
                stdin.close()  # the pipe's transport, before the loop that owns it ends
            process = getattr(self, "_process", None)
            if process is not None and process.returncode is not None:
                try:
                    await asyncio.wait_for(process.communicate(), KILL_S)  # the pipes drained and closed
                except (asyncio.TimeoutError, Exception):
                    pass

        async def kill(self) -> None:
            process = getattr(self, "_process", None)
            if process is None or process.returncode is not None:
                return
            for sig, wait_s in ((signal.SIGTERM, KILL_S), (signal.SIGKILL, KILL_S)):
                try:
                    os.killpg(process.pid, sig)
                except (ProcessLookupError, PermissionError):
                    # Not a session of its own (a textual-serve that no longer
                    # opens the process through _open_app_process): the shell
                    # alone, which runs the dashboard in its place (exec).
                    try:
                        process.send_signal(sig)
                    except ProcessLookupError:
                        return
                try:
                    await asyncio.wait_for(process.wait(), wait_s)
                    return
                except asyncio.TimeoutError:
                    continue

    class JaxtopServer(Server):
        connections = doors
        sessions = 0
        leaving = 0  # of those sessions, the ones whose tab has gone and whose dashboard is ending
        live: set[tuple[Any, Any]] = set()  # (service, websocket) of the open tab
        service_type = Dashboard

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
            if JaxtopServer.sessions and JaxtopServer.sessions == JaxtopServer.leaving:
                # A reloaded page, or a tab reopened: the last one's dashboard
                # is ending (within REOPEN_S, whatever it does); wait for it.
                deadline = asyncio.get_running_loop().time() + REOPEN_S
                while JaxtopServer.sessions and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.05)
            if JaxtopServer.sessions:
                return web.Response(status=409, text="jaxtop serve: the dashboard is open in another tab (one at a "
                                                      "time); close it, or start another jaxtop serve")
            JaxtopServer.sessions += 1
            websocket = web.WebSocketResponse(heartbeat=15)
            service = self.service_type(self.command, write_bytes=websocket.send_bytes, write_str=websocket.send_str,
                                close=websocket.close, download_manager=self.download_manager, debug=self.debug)
            entry = (service, websocket)
            JaxtopServer.live.add(entry)
            try:
                await websocket.prepare(request)
                await service.start(_size(request, "width", 80), _size(request, "height", 24))
                await self._process_messages(websocket, service)
            except asyncio.CancelledError:
                pass
            except Exception as error:  # a client's garbage, a dashboard that failed: logged, the tab ends
                logging.getLogger("jaxtop.serve").error("the dashboard's session ended: %s: %s",
                                                        type(error).__name__, error)
            finally:
                # Whatever ended the session (a close, a dropped connection,
                # a message textual-serve could not read), the dashboard ends.
                JaxtopServer.leaving += 1
                try:
                    await service.end()
                finally:
                    JaxtopServer.live.discard(entry)
                    JaxtopServer.sessions -= 1
                    JaxtopServer.leaving -= 1
                if not websocket.closed:
                    await websocket.close()
            return websocket

        async def on_shutdown(self, app: web.Application) -> None:
            """The server stops: each open tab is closed and its dashboard
            ended now, not when the client chooses to leave."""
            for service, websocket in list(JaxtopServer.live):
                await service.kill()
                await websocket.close(code=1001, message=b"jaxtop serve stopped")

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
            loop.set_exception_handler(_one_line_errors)
            sock = doors.listener(sock)  # connections counted and bounded as they are accepted
            if sys.platform != "win32":  # asyncio has no signal handlers there
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(sig, self.request_exit)
            web.run_app(self._make_app(), sock=sock, handle_signals=False, loop=loop,
                        print=lambda *args: None, access_log=None, shutdown_timeout=SHUTDOWN_S)

    return JaxtopServer(command, host=host, port=port, title=title, public_url=f"http://{netloc}")


_SAID: set[str] = set()


def _one_line_errors(loop: Any, context: dict[str, Any]) -> None:
    """asyncio's errors as one line each, said once (an accept refused for
    want of descriptors printed a traceback per connection: 76,000 in 25 s)."""
    exc = context.get("exception")
    line = f"{context.get('message', 'error')}: {type(exc).__name__}: {exc}" if exc is not None else \
        str(context.get("message", "error"))
    if line not in _SAID and len(_SAID) < 100:
        _SAID.add(line)
        print(f"jaxtop serve: {line} (said once)", file=sys.stderr, flush=True)


def _size(request: Any, key: str, default: int) -> int:
    """The terminal size a page asks for, within what a screen can be."""
    try:
        return min(1000, max(10, int(request.query.get(key, default))))
    except ValueError:
        return default


def _die_with_parent() -> None:
    """In the dashboard's process before it runs: the kernel kills it when
    the server dies, however (SIGKILL included). Linux only; elsewhere the
    server's own shutdown ends its dashboards."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except Exception:
        pass


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
