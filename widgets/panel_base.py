"""What every dashboard panel shares: the :class:`Panel` base (a titled box
fed with snapshots, which draws n/a rather than fail), its title line, and
the small text helpers that fit a figure's words to a panel's width."""

from __future__ import annotations

import os
from typing import Callable

from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from jaxtop.dashboard.views import DISCONNECTED, EXITED, LIVE, REPLAY, STALE, Snapshot

#: Seconds after which the memory and map panels say how old their live-array
#: figures are (the agent scans many arrays less often, to stay cheap).
STALE_DETAIL_S = 3.0

STATE_STYLE = {LIVE: "bold green", STALE: "bold yellow", DISCONNECTED: "bold red", EXITED: "bold magenta", REPLAY: "bold cyan"}
WINDOW_LABEL = {60.0: "1 min", 600.0: "10 min", 3600.0: "1 h", None: "whole run"}


def panel_title(text: str, extra: str = "") -> Text:
    line = Text(f" {text} ", style="bold reverse", no_wrap=True, overflow="ellipsis")
    if extra:
        line.append(f" {extra}", style="dim")
    return line


def fitting(choices: list[str], width: int) -> str:
    """The first of ``choices`` (most detailed first) that fits in ``width``
    cells, else the last: a narrow panel drops words, not halves of them."""
    return next((c for c in choices if cell_len(c) <= width), choices[-1])


def fitted_title(text: str, extras: list[str], width: int) -> Text:
    """A panel title with the first of ``extras`` that fits beside it, or none."""
    return panel_title(text, fitting([*extras, ""], width - cell_len(text) - 3))


def _na(reason: str | None) -> Text:
    return Text(f"n/a ({reason})" if reason else "n/a", style="dim")


def _or_na(value: object) -> object:
    """A figure as it is shown in running text: n/a when not measured."""
    return "n/a" if value is None else value


def short_command(argv: list[str]) -> str:
    """The part of a command line that tells runs apart: no interpreter path,
    no ``jaxtop run`` wrapper, the script by its file name."""
    args = list(argv)
    if args and os.path.basename(args[0]).startswith("python"):
        args = args[1:]
    if args[:3] == ["-m", "jaxtop", "run"]:
        args = args[3:]
    elif len(args) >= 2 and os.path.basename(args[0]) == "jaxtop" and args[1] == "run":
        args = args[2:]
    if args and os.sep in args[0]:
        args[0] = os.path.basename(args[0])
    return " ".join(args) or "?"


class Panel(Widget):
    """A titled box fed with snapshots."""

    snapshot: reactive[Snapshot | None] = reactive(None, layout=False, always_update=True)
    """The snapshot to draw; None until the first one arrives."""

    TITLE = ""

    draw: Callable[[Snapshot, int, int], RenderableType]
    """Each panel's drawing: the snapshot into ``width`` x ``height`` cells."""

    def render(self) -> RenderableType:
        snap = self.snapshot
        if snap is None:
            return Group(panel_title(self.TITLE), Text("waiting for data…", style="dim"))
        try:
            return self.draw(snap, max(1, self.size.width), max(1, self.size.height))
        except Exception as exc:  # a drawing bug must not take the dashboard down
            return Group(panel_title(self.TITLE), Text(f"render error: {exc}", style="red"))

class LoadingLine(Widget):
    """One line shown while a backlog loads: how much is in, how far behind.

    Not a Static: ``Static.update`` asks for a layout of the whole screen
    (its content might change size), and the line changes at every frame
    while a backlog loads; a full layout then cost 25-30 ms a frame on a
    2-core VM, which a key pressed meanwhile waited for. This one's height is
    fixed, so a new text is a repaint of one line.
    """

    DEFAULT_CSS = "LoadingLine { height: 1; }"

    text: reactive[str] = reactive("", layout=False)
    """What the line says ("loading backlog: N samples in, S s behind")."""

    def render(self) -> RenderableType:
        return Text(self.text, no_wrap=True, overflow="ellipsis")
