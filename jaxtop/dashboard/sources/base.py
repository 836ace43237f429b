"""The interface every source of records implements (live agents, a
recording, records pushed in by code). The app talks to its source through
this interface only: it never asks which kind of source it holds.

What differs between sources is said by two capability flags (``replays``,
``live``) and by the replay controls, which every source has: a source that
does not play a recording inherits the defaults here, which do nothing and
return None ("not applicable").
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, ClassVar

from jaxtop.dashboard.model import Model

OnUpdate = Callable[[], None]


class Source(abc.ABC):
    """Base: a set of processes whose records go into a model.

    Attributes:
        kind: A label for people (logs, debugging). The app decides nothing
            on it: it reads the capability flags below.
        replays: The source plays a recording. Its replay controls
            (:meth:`toggle`, :meth:`step`, :meth:`seek`, :meth:`scale_speed`)
            act, and space is its play/pause rather than the app freezing
            the screen.
        live: Records arrive as they happen, from running agents (or code
            standing in for them): commands can reach the agents, and
            :meth:`save` writes the session seen so far. A recording is not
            live: it is a file already, and nothing answers commands.
    """

    kind: ClassVar[str] = "base"
    replays: ClassVar[bool] = False
    live: ClassVar[bool] = True

    def __init__(self) -> None:
        self.model: Model | None = None
        self.on_update: OnUpdate = lambda: None

    @property
    @abc.abstractmethod
    def pids(self) -> list[int]:
        """The processes this source follows, in display order."""

    def start(self, model: Model, on_update: OnUpdate) -> None:
        """Begin feeding ``model``; call ``on_update`` after each change."""
        self.model, self.on_update = model, on_update

    def stop(self) -> None:
        """Stop feeding and release what the source holds (threads, files)."""

    def send_command(self, pid: int, name: str, args: dict[str, Any] | None = None) -> str | None:
        """Send a command to the agent; None when sent, else why not."""
        return "commands need a live agent"

    @abc.abstractmethod
    def save(self, path: str) -> list[str]:
        """Write the session as JSON lines; returns the files written."""

    # -- replay controls: None means "not applicable" (nothing is played) ------
    def replay_state(self) -> dict[str, Any] | None:
        """Position, speed and span of the playback, for the header."""
        return None

    def toggle(self) -> bool | None:
        """Play or pause.

        Returns:
            Whether it plays now; None when the source plays nothing.
        """
        return None

    def step(self, samples: int = 1) -> int | None:
        """Advance by whole samples (and the records between them), paused.

        Returns:
            The playback position after the step; None when nothing plays.
        """
        return None

    def current_t(self) -> float | None:
        """Recording time of the last record played; None when nothing plays."""
        return None

    def seek(self, t: float) -> float | None:
        """Jump to recording time ``t``.

        Returns:
            The recording time reached; None when nothing plays.
        """
        return None

    def seek_by(self, delta_s: float) -> float | None:
        """Jump ``delta_s`` seconds from the current recording time.

        Returns:
            The recording time reached; None when nothing plays.
        """
        t = self.current_t()
        return None if t is None else self.seek(t + delta_s)

    def seek_fraction(self, fraction: float, relative: bool = False) -> float | None:
        """Jump to ``fraction`` of the recording (0: start, 1: end), or by
        ``fraction`` of it from the current time when ``relative``.

        Returns:
            The recording time reached; None when nothing plays.
        """
        return None

    def scale_speed(self, factor: float) -> float | None:
        """Multiply the playback speed by ``factor``.

        Returns:
            The new speed; None when nothing plays.
        """
        return None
