"""The advisor's report drawn: the Advice screen's body (:func:`advice_text`)
and the main screen's one line (:func:`line_of`, atop the Events panel)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from jaxtop.advice import Advice, Report

__all__ = ["advice_text", "line_of"]

#: Colour of each strategy's tag.
STYLE = {"placement": "cyan", "donation": "magenta", "in_place": "magenta", "batching": "cyan", "jit": "yellow",
         "host_sync": "yellow", "runahead": "red", "checkpointing": "red", "guard": "blue", "leak": "bold red",
         "fragmentation": "red"}


def advice_text(report: Report | None, ended: bool = False) -> RenderableType:
    """Every piece of advice, highest expected gain first, with its
    evidence, gain and fix (wrapped under their labels); then what could
    not be judged and why."""
    if report is None:
        return Text("advice: n/a (no sample yet, or the history is still loading)", style="dim")
    if report.t is None:
        return Text("advice: n/a (no sample yet)", style="dim")
    head = f"over the last {report.span_s:.0f} s of samples (window {report.window_s:.0f} s)"
    if ended:
        head += ", up to the process's last sample"
    parts: list[RenderableType] = [Text(head, style="dim")]
    if not report.advice:
        parts.append(Text("\nno strategy missed: nothing in the window gave evidence for one", style="green"))
    for i, advice in enumerate(report.advice, 1):
        parts.append(Text(""))
        parts.append(_block(advice, i))
    if report.not_judged:
        parts.append(Text("\nnot judged", style="bold"))
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True, style="dim bold")
        grid.add_column(ratio=1, style="dim")
        for n in report.not_judged:
            grid.add_row(f"  {n.strategy}", f"n/a ({n.why})")
        parts.append(grid)
    return Group(*parts)


def _block(advice: Advice, rank: int) -> RenderableType:
    head = Text()
    head.append(f"{rank}. ", style="bold")
    head.append(f" {advice.strategy} ", style=f"reverse {STYLE.get(advice.strategy, 'white')}")
    head.append(f" {advice.where}", style="bold")
    if advice.function:
        head.append(f" in {advice.function}")
    if advice.jitted:
        head.append(f" ({advice.jitted})", style="cyan")
    head.append(f"  {advice.basis}", style="dim")
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, style="dim", min_width=11)
    grid.add_column(ratio=1)
    grid.add_row("", Text(advice.title, style="bold"))
    grid.add_row("   evidence", Text(advice.evidence))
    grid.add_row("   gain", Text(advice.gain, style="green"))
    grid.add_row("   fix", Text(advice.fix, style="yellow"))
    return Group(head, grid)


def line_of(report: Report | None) -> str:
    """The main screen's line: the top advice and how many more; "" where
    there is none (the line is hidden then)."""
    if report is None or not report.advice:
        return ""
    top = report.advice[0]
    n = len(report.advice)
    count = f"1 of {n}" if n > 1 else "1"
    return f" ★ advice ({count}, A): {top.strategy} {top.where}: {top.title}"
