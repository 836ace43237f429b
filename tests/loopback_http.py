"""A loopback HTTP server for tests that play a hostile or slow peer: it
accepts on 127.0.0.1, counts connections, and hands each to
:meth:`LoopbackServer.handle` on a thread of its own."""

from __future__ import annotations

import socket
import threading


class LoopbackServer:
    """Accepts on an ephemeral 127.0.0.1 port until :meth:`close`."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.stop = threading.Event()
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        """One connection (closed by the subclass's handler)."""
        conn.close()

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
