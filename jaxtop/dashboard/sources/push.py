"""Records pushed in by code (embedding the dashboard, tests, benchmarks)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from jaxtop.wire import paths, protocol
from jaxtop.dashboard.sources.base import Source


class PushSource(Source):
    """Records pushed in by code: embedding the dashboard, tests, benchmarks.

    ``push`` may be called from any thread; commands are recorded in
    ``commands`` (and answered by ``on_command`` if given). It stands in for
    live agents (``live``), and plays nothing: the replay controls are the
    base class's no-ops.
    """

    kind = "live"

    def __init__(self, pids: list[int] | None = None, on_command: Callable[[int, str, dict], dict | None] | None = None) -> None:
        super().__init__()
        self._pids = list(pids or [])
        self.commands: list[tuple[int, str, dict[str, Any]]] = []
        self._on_command = on_command
        self._lines: list[bytes] = []

    @property
    def pids(self) -> list[int]:
        return list(self._pids)

    def push(self, pid: int, record: dict[str, Any], update: bool = True) -> None:
        assert self.model is not None, "start() the source first (mount the app)"
        if pid not in self._pids:
            self._pids.append(pid)
        self.model.feed(pid, record)
        if len(self._lines) < 100_000:
            self._lines.append(protocol.encode(record))
        if update:
            self.on_update()

    def send_command(self, pid: int, name: str, args: dict[str, Any] | None = None) -> str | None:
        self.commands.append((pid, name, dict(args or {})))
        if self._on_command is not None:
            reply = self._on_command(pid, name, dict(args or {}))
            if reply is not None and self.model is not None:
                self.push(pid, {"type": "reply", "t": time.time(), "ok": True, "result": reply})
        return None

    def save(self, path: str) -> list[str]:
        with paths.replacing(path) as f:
            f.writelines(self._lines)
        return [path]
