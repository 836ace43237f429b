"""The picker bare `jaxtop` shows when several processes are instrumented."""

from __future__ import annotations

import time

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, SelectionList, Static

from jaxtop.wire.client import AgentInfo


class PickerApp(App[list[int]]):
    BINDINGS = [Binding("enter", "done", "attach"), Binding("a", "all", "all"), Binding("q,escape", "quit", "cancel")]

    def __init__(self, agents: list[AgentInfo]) -> None:
        super().__init__()
        self.agents = agents

    def compose(self) -> ComposeResult:
        yield Static("Several JAX processes run jaxtop's agent. Space selects, enter attaches (a: all).")
        now = time.time()
        items = []
        for i, a in enumerate(self.agents):
            up = f"{int(now - a.started_t)}s" if a.started_t else "?"
            items.append((f"{a.pid:>8}  up {up:>7}  {a.command}", a.pid, i == 0))
        yield SelectionList[int](*items, id="agents")
        yield Footer()

    def action_done(self) -> None:
        self.exit(list(self.query_one(SelectionList).selected))

    def action_all(self) -> None:
        self.exit([a.pid for a in self.agents])


def pick(agents: list[AgentInfo]) -> list[int]:
    return PickerApp(agents).run() or []
