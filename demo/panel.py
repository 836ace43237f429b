"""The Strategies panel of ``jaxtop demo``: which variant runs, and what it
measurably did (value in the first variant → in the second, from the probes).

One line per strategy, then the selected strategy in full: what it does,
each metric with its verdict, and what enter does next.
"""

from __future__ import annotations

import textwrap
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.reactive import reactive

from jaxtop.advice import STRATEGIES, Report
from jaxtop.dashboard.model import Snapshot
from jaxtop.demo.metrics import (NO, NOTHING, WITHIN, YES, fmt_metric, fmt_spread, nothing_text, outcome, spread_of,
                                 why_not, within_text)
from jaxtop.widgets.panels import Panel, panel_title
from jaxtop.widgets.render import fmt_bytes

#: Narrower than this, a row shows the strategy's first metric only.
WIDE = 110


def judge(expect: str, before: Any, after: Any, spread: float | None = None, unit: str = "") -> tuple[str, str]:
    """(mark, style) for a measured change: ✓, ✗, ≈ for a change no
    larger than the metric's spread, or 0 where there was nothing to lower
    (never for a time: ``unit`` "s")."""
    if before is None or after is None:
        return "", "dim"
    result = outcome(expect, before, after, spread, can_be_zero=unit != "s")
    if result == YES:
        return "✓", "green"
    if result == NO:
        return "✗", "red"
    if result == WITHIN:
        return "≈", "yellow"
    if result == NOTHING:
        return "0", "yellow"
    return "", "dim"


def metric_spread(m: dict[str, Any], ra: dict[str, Any] | None, rb: dict[str, Any] | None) -> float | None:
    """The spread of metric ``m`` between two measured variants: the larger
    range of its per-block readings; None for an exact metric."""
    key = f"{m['key']}_spread"
    return spread_of((ra or {}).get(key), (rb or {}).get(key))


class StrategiesPanel(Panel):
    """One line per strategy; the selected one explains itself below."""

    TITLE = "Strategies"
    cursor: reactive[int] = reactive(0)
    """Index of the highlighted strategy (↑/↓)."""
    paged: reactive[bool] = reactive(False)
    """True when the memory panels are on another page (``v``)."""

    def draw(self, snap: Snapshot, width: int, height: int) -> RenderableType:
        demo = demo_state(snap)
        if demo is None:
            return Group(panel_title(self.TITLE), Text("waiting for the demo workload (compiling every variant)…", style="dim"))
        strategies = demo.get("strategies") or []
        keys = "↑↓ select · enter measure" + (" · v memory panels" if self.paged else "")
        title = panel_title(self.TITLE, f"{demo.get('backend')} · step {demo.get('steps')} · {keys}")
        wide = width >= WIDE
        measuring = demo.get("measuring") or [None, None]
        rows = []
        for i, s in enumerate(strategies):
            active = s["name"] == demo.get("active")
            name = Text(f"{'▶' if active else ' '}{i + 1} {s['title']}",
                        style="bold reverse" if i == self.cursor else ("bold" if active else ""))
            shown = s["variants"] if wide else [s["variant"]]
            variant = Text(" / ".join(v.upper() if v == s["variant"] and active else v for v in shown),
                           style="cyan" if active else "dim")
            if measuring[0] == s["name"]:
                effect = Text(f"measuring {measuring[1]}…", style="yellow")
            else:
                effect = self._effect(s, all_metrics=wide)
            rows.append((name, variant, effect))
        # Names and variants are short enough to be shown whole at 80
        # columns; only the measurements are cut.
        table = Table.grid(padding=(0, 1), expand=True)
        table.add_column(no_wrap=True, min_width=max((r[0].cell_len for r in rows), default=1))
        table.add_column(no_wrap=True, min_width=max((r[1].cell_len for r in rows), default=1))
        table.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
        for row in rows:
            table.add_row(*row)
        parts: list[RenderableType] = [title, table]
        if 0 <= self.cursor < len(strategies):
            room = height - 1 - len(strategies)
            parts.extend(self._details(strategies[self.cursor], demo, width, room, demo_advice(snap)))
        return Group(*parts)

    # -- one row -------------------------------------------------------------------
    def _effect(self, s: dict[str, Any], all_metrics: bool) -> Text:
        results = s.get("results") or {}
        if s["name"] == "profiling":
            snap = results.get("snapshot") or {}
            if snap.get("profile_error"):
                return Text(f"n/a: {snap['profile_error']}", style="dim")
            if snap.get("profile_path"):
                return Text.assemble(("profile ", "dim"), (fmt_bytes(snap.get("profile_bytes")), "bold"),
                                     ("  top ", "dim"), str(snap.get("top_site")))
            return Text("–", style="dim")
        text = Text()
        for m in s.get("metrics") or []:
            a, b = m["pair"]
            before = (results.get(a) or {}).get(m["key"])
            after = (results.get(b) or {}).get(m["key"])
            if before is None and after is None:
                continue  # not measured, or n/a: the details say which
            if text:
                text.append("  ")
            text.append(f"{m['short']} ", style="dim")
            text.append(f"{fmt_metric(before, m['unit'])} → {fmt_metric(after, m['unit'])}", style="bold")
            mark, style = judge(m.get("expect", ""), before, after, metric_spread(m, results.get(a), results.get(b)),
                                m["unit"])
            if mark:
                text.append(" nothing to lower" if mark == "0" else f" {mark}", style=style)
            if not all_metrics:
                break
        if not text:
            measured = any(v in results for v in s["variants"])
            text = Text("n/a on this backend" if measured else "–", style="dim")
        return text

    # -- the selected strategy -----------------------------------------------------------
    def _details(self, s: dict[str, Any], demo: dict[str, Any], width: int, room: int,
                 report: Report | None = None) -> list[Text]:
        """What it does, each metric, what the advisor says of it, and what
        enter does: in ``room`` lines.

        The hint, the advisor's line and the metrics come first when lines
        are short; the description gives way (cut with an ellipsis).
        """
        if room <= 0:
            return []
        hint = self._hint(s, demo)
        advised = advice_line(s, demo, report) if room >= 2 else None
        tail = [advised, hint] if advised is not None else [hint]
        metrics = []
        used = len(tail)  # the hint, the advisor's line
        for line in self._metric_lines(s):
            # A ✗ line wraps to keep its reason whole: it may take two.
            need = -(-line.cell_len // max(1, width)) if not line.no_wrap else 1
            if used + need > room:
                break
            metrics.append(line)
            used += need
        about_room = room - used
        about: list[Text] = []
        if about_room > 0:
            lines = textwrap.wrap(f"{s['title']}: {s['about']}", max(20, width - 2))
            if len(lines) > about_room:
                lines = lines[:about_room]
                lines[-1] = lines[-1][: max(0, width - 4)] + "…"
            about = [Text(" " + line, style="dim", no_wrap=True, overflow="ellipsis") for line in lines]
        return about + metrics + tail

    def _metric_lines(self, s: dict[str, Any]) -> list[Text]:
        results = s.get("results") or {}
        if s["name"] == "profiling":
            snap = results.get("snapshot") or {}
            if snap.get("profile_error"):
                return [Text(f"   n/a: {snap['profile_error']}", style="dim", no_wrap=True, overflow="ellipsis")]
            if not snap.get("profile_path"):
                return [Text("   not taken yet", style="dim")]
            return [
                Text.assemble("   top site in the demo's code  ", (str(snap.get("top_site")), "bold"),
                              f", {fmt_bytes(snap.get('top_site_bytes'))}", no_wrap=True, overflow="ellipsis"),
                Text(f"   {fmt_bytes(snap.get('profile_bytes'))} in {snap['profile_path']} "
                     f"(taken in {fmt_metric(snap.get('profile_s'), 's')})", no_wrap=True, overflow="ellipsis"),
            ]
        width = max(len(self._label(s, m)) for m in s["metrics"])
        lines = []
        for m in s["metrics"]:
            a, b = m["pair"]
            ra, rb = results.get(a), results.get(b)
            line = Text(f"   {self._label(s, m).ljust(width)}  ", no_wrap=True, overflow="ellipsis")
            before, after = (ra or {}).get(m["key"]), (rb or {}).get(m["key"])
            if ra is None and rb is None:
                line.append("not measured yet", style="dim")
            elif (ra is not None and before is None) or (rb is not None and after is None):
                reason = (rb or {}).get(f"{m['key']}_reason") or (ra or {}).get(f"{m['key']}_reason")
                line.append(f"n/a: {reason}" if reason else "n/a on this backend", style="dim")
            else:
                line.append(f"{fmt_metric(before, m['unit'])} → {fmt_metric(after, m['unit'])}", style="bold")
                spread = metric_spread(m, ra, rb)
                if spread is not None:
                    line.append(f" {fmt_spread(spread, m['unit'])}", style="dim")
                mark, style = judge(m.get("expect", ""), before, after, spread, m["unit"])
                if mark == "✗":
                    line.append(f" ✗ {why_not(m['expect'], m.get('caveat', ''))}", style=style)
                    line.no_wrap = False
                elif mark == "≈":
                    line.append(f" ≈ {within_text(spread, m['unit'])}", style=style)
                    line.no_wrap = False
                elif mark == "0":
                    line.append(f" {nothing_text(before, spread, m['unit'])}", style=style)
                    line.no_wrap = False
                elif mark:
                    line.append(f" {mark}", style=style)
                elif before is not None and after is not None:
                    line.append("  (informational)", style="dim")
            lines.append(line)
        return lines

    @staticmethod
    def _label(s: dict[str, Any], m: dict[str, Any]) -> str:
        a, b = m["pair"]
        # Where a strategy has more than two variants, say which two.
        return m["label"] + (f" ({a} → {b})" if len(s["variants"]) > 2 else "")

    @staticmethod
    def _hint(s: dict[str, Any], demo: dict[str, Any]) -> Text:
        """What the next enter does, and how a measurement is made."""
        steps = demo.get("measure_steps") or 30
        variants = s["variants"]
        measuring = demo.get("measuring")
        if measuring and measuring[0] == s["name"]:
            text = f"measuring {measuring[1].upper()}: {steps} steps, then the probes are read…"
        elif s["name"] == "profiling":
            text = "enter: take a device memory profile now (saved as a .prof file; open it with pprof)"
        elif demo.get("active") == s["name"]:
            current = s["variant"]
            nxt = variants[(variants.index(current) + 1) % len(variants)]
            text = f"enter: switch to {nxt.upper()} and measure it ({steps} steps, probes read before and after)"
        else:
            nxt = variants[(variants.index(s["variant"]) + 1) % len(variants)]
            text = f"enter: measure {s['variant'].upper()} ({steps} steps); enter again: switch to {nxt.upper()}, measure it"
        return Text(" " + text, style="italic", no_wrap=True, overflow="ellipsis")


#: Strategies the advisor judges from compiled functions (the jit ledger:
#: XLA's memory analysis), not from calls.
COMPILED_EVIDENCE = ("donation", "checkpointing")
#: The advisor's name of a demo strategy, where it differs (the advisor
#: judges the demo's strategies found in any program: jaxtop.advice).
ADVISED = {"inplace": "in_place"}


def demo_advice(snap: Snapshot) -> Report | None:
    """The advisor's report on the demo's workload process."""
    for p in snap.processes:
        if p.demo:
            return p.advice
    return None


def advice_line(s: dict[str, Any], demo: dict[str, Any], report: Report | None) -> Text | None:
    """What the advisor says of the selected strategy while it runs: its
    advice at the demo's own line (the OFF variant should draw it, ON clear
    it), n/a with the reason, or nothing of it. None while the strategy
    does not run, or for one the advisor does not judge (profiling)."""
    name = ADVISED.get(s["name"], s["name"])
    if demo.get("active") != s["name"] or name not in STRATEGIES:
        return None
    line = Text("   advisor ", style="dim", no_wrap=True, overflow="ellipsis")
    if report is None or report.t is None:
        line.append("n/a: no evaluation yet", style="dim")
        return line
    found = [a for a in report.advice if a.strategy == name]
    if found:
        a = found[0]
        if name in COMPILED_EVIDENCE and s["variant"] != s["variants"][0]:
            # Judged from the compiled functions, which the demo compiles for
            # every variant up front: the OFF variant's is still loaded.
            line.append(f"{a.where}: {a.title}", style="dim")
            line.append("  (from the OFF variant's compiled function, loaded since start: XLA's analysis of a "
                        "function says nothing of whether it still runs)", style="dim")
            return line
        line.append(f"{a.where}: {a.title}", style="bold yellow")
        line.append(f"  ({a.evidence})", style="yellow")
        return line
    why = next((n.why for n in report.not_judged if n.strategy == name), None)
    if why is not None:
        line.append(f"n/a: {why}", style="dim")
    else:
        line.append(f"no {name} advice over the last {report.span_s:.0f} s", style="green")
    return line


def demo_state(snap: Snapshot) -> dict[str, Any] | None:
    for p in snap.processes:
        if p.demo:
            return p.demo
    return None
