"""The interface every source of records implements (live agents, a
recording, records pushed in by code). The app talks to its source through
this interface only: it never asks which kind of source it holds.
"""

from __future__ import annotations

import abc
from typing import Any, Callable

from jaxtop.dashboard.model import Model

OnUpdate = Callable[[], None]


class Source(abc.ABC):
    """Base: a set of processes whose records go into a model."""

    kind = "base"

    def __init__(self) -> None:
        self.model: Model | None = None
        self.on_update: OnUpdate = lambda: None

    @property
    @abc.abstractmethod
    def pids(self) -> list[int]:
        """The processes this source follows, in display order."""

    def start(self, model: Model, on_update: OnUpdate) -> None:
        self.model, self.on_update = model, on_update

    def stop(self) -> None:
        pass

    def send_command(self, pid: int, name: str, args: dict[str, Any] | None = None) -> str | None:
        """Send a command to the agent; None when sent, else why not."""
        return "commands need a live agent"

    @abc.abstractmethod
    def save(self, path: str) -> list[str]:
        """Write the session as JSON lines; returns the files written."""

    def replay_state(self) -> dict[str, Any] | None:
        return None
