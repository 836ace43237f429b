"""The Strategies panel of ``jaxtop demo``: which variant runs, and what it
measurably did (value before → after, from the probes)."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.reactive import reactive

from jaxtop.dashboard.model import Snapshot
from jaxtop.widgets.panels import Panel, panel_title
from jaxtop.demo.metrics import fmt_metric, verdict
from jaxtop.widgets.render import fmt_bytes



def judge(expect: str, before: Any, after: Any) -> tuple[str, str]:
    """(mark, style) for a measured change."""
    if before is None or after is None:
        return "", "dim"
    ok = verdict(expect, before, after)
    if ok is None:
        return "", "dim"
    return ("✓", "green") if ok else ("✗", "red")


class StrategiesPanel(Panel):
    """One line per strategy; the selected one explains itself below."""

    TITLE = "Strategies"
    cursor: reactive[int] = reactive(0)
    """Index of the highlighted strategy (↑/↓)."""

    def draw(self, snap: Snapshot, width: int, height: int) -> RenderableType:
        demo = demo_state(snap)
        if demo is None:
            return Group(panel_title(self.TITLE), Text("waiting for the demo workload (compiling every variant)…", style="dim"))
        strategies = demo.get("strategies") or []
        # Narrow terminals: the current variant only, and the measured values
        # before the metric's name, so that "1 → 0 ✓" survives the cut.
        compact = width < 110
        rows = []
        for i, s in enumerate(strategies):
            active = s["name"] == demo.get("active")
            mark = "▶" if active else " "
            name = Text(f"{mark}{i + 1} {s['title']}", style="bold reverse" if i == self.cursor else ("bold" if active else ""))
            shown = [s["variant"]] if compact else s["variants"]
            variant = Text(" / ".join(v.upper() if v == s["variant"] else v for v in shown),
                           style="cyan" if active else "dim")
            rows.append((name, variant, self._effect(s, values_first=compact)))
        # Name and variant keep their width; only the effect is cut short.
        table = Table.grid(padding=(0, 1), expand=True)
        table.add_column(no_wrap=True, overflow="ellipsis", max_width=20 if compact else 32)
        table.add_column(no_wrap=True, min_width=max((r[1].cell_len for r in rows), default=1))
        table.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
        for row in rows:
            table.add_row(*row)
        parts: list[RenderableType] = [panel_title(self.TITLE, f"{demo.get('backend')} · step {demo.get('steps')} · enter: run, then toggle · ↑↓ select"), table]
        if 0 <= self.cursor < len(strategies) and height >= len(strategies) + 2:
            parts.append(Text(" " + strategies[self.cursor]["about"], style="dim", overflow="ellipsis"))
        return Group(*parts)

    def _effect(self, s: dict[str, Any], values_first: bool = False) -> Text:
        results = s.get("results") or {}
        text = Text()
        for m in s.get("metrics") or []:
            a, b = m.get("pair") or s["variants"][:2]
            before = (results.get(a) or {}).get(m["key"])
            after = (results.get(b) or {}).get(m["key"])
            if before is None and after is None:
                continue
            mark, style = judge(m.get("expect", ""), before, after)
            if text:
                text.append("  ")
            if not values_first:
                text.append(f"{m['label']} ")
            text.append(f"{fmt_metric(before, m['unit'])} → {fmt_metric(after, m['unit'])}", style="bold")
            if mark:
                text.append(f" {mark}", style=style)
            if values_first:
                text.append(f" {m['label']}", style="dim")
        if s["name"] == "profiling":
            snap = results.get("snapshot") or {}
            if snap.get("profile_path"):
                text = Text(f"{fmt_bytes(snap.get('profile_bytes'))} in {snap.get('profile_path')}; top: {snap.get('top_site')}")
        if not text:
            text = Text("not measured yet: enter runs it, enter again toggles", style="dim")
        return text


def demo_state(snap: Snapshot) -> dict[str, Any] | None:
    for p in snap.processes:
        if p.demo:
            return p.demo
    return None
