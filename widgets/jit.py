"""The jit ledger as a Rich renderable: pure, so tests render it without Textual.

:class:`JitLedgerTable` draws one :class:`~jaxtop.dashboard.ledger.LedgerView`:
a summary line, the live-executable count over time (the compile-storm and
leak flags under it), a table of functions sorted by the chosen key, and the
recompile reasons of the functions that have some, latest first.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

from jaxtop.dashboard.ledger import JitFunction, LedgerView, describe_reason, short_site
from jaxtop.dashboard.ledger_views import LedgerNotes, recompile_t
from jaxtop.widgets.render import V_EIGHTHS, fmt_bytes

#: Sort keys, in the order the ``s`` key cycles through them.
SORTS = ("temp", "total", "compiles", "code")
SORT_LABELS = {"temp": "temp bytes", "total": "total bytes", "compiles": "compiles", "code": "code bytes"}
#: Functions whose recompile reasons are listed under the table, and reasons each.
REASON_FUNCTIONS = 6
REASONS_EACH = 4


def sort_functions(functions: Iterable[JitFunction], key: str = "temp") -> list[JitFunction]:
    """Largest first by ``key`` (one of :data:`SORTS`); n/a last; ties by name."""
    def value(f: JitFunction) -> float:
        v = {"temp": f.temp_bytes, "total": f.total_bytes, "compiles": f.compiles, "code": f.code_bytes}.get(key)
        return -1.0 if v is None else float(v)

    return sorted(functions, key=lambda f: (-value(f), -(f.live or 0), f.name))


def fmt_count(x: float | None) -> str:
    """A count with 3 significant digits and k/M/G/T/P: 66.0k, 1.23G; n/a for None."""
    if x is None:
        return "n/a"
    v = float(x)
    for suffix in ("", "k", "M", "G", "T"):
        if abs(float(f"{v:.3g}")) < 1000:
            return f"{v:.3g}{suffix}"
        v /= 1000
    return f"{v:.3g}P"


def sparkline(values: Sequence[int], width: int) -> Text:
    """The last ``width`` values as eighth-block bars, scaled min..max."""
    if width <= 0 or not values:
        return Text("")
    vals = list(values)[-width:]
    lo, hi = min(vals), max(vals)
    span = hi - lo
    cells = "".join(V_EIGHTHS[8 if span == 0 and hi > 0 else (1 + int(7 * (v - lo) / span) if span else 1)]
                    for v in vals)
    return Text(cells, style="cyan")


def _clock(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "--:--:--"


class JitLedgerTable:
    """One process's jit ledger.

    Args:
        view: the ledger, or None before any arrived.
        sort: one of :data:`SORTS`.
        keys: the key hints line (the screen's bindings), shown first.
    """

    def __init__(self, view: LedgerView | None, sort: str = "temp", keys: str = "") -> None:
        self.view = view
        self.sort = sort if sort in SORTS else SORTS[0]
        self.keys = keys

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        yield Group(*self._parts(width))

    def _parts(self, width: int) -> Iterable[object]:
        title = Text()
        title.append(" JIT LEDGER ", style="bold reverse")
        title.append(f"  sorted by {SORT_LABELS[self.sort]}", style="bold")
        if self.keys:
            title.append(f"  {self.keys}", style="dim")
        yield title
        v = self.view
        if v is None:
            yield Text("No jit ledger from this process yet: it arrives with the samples of an agent "
                       "that runs the ledger (within a few seconds of the first compile).", style="dim")
            return
        if not v.available:
            yield Text(f"jit ledger n/a: {v.reason}", style="yellow")
            return
        notes = LedgerNotes.of(v)
        yield self._summary(v, notes, width)
        yield self._trend(v, width)
        if notes.storm_message is not None:
            yield Text(f"⚠ {notes.storm_message}", style="bold red")
        if notes.leak_message is not None:
            yield Text(f"⚠ {notes.leak_message}", style="bold red")
        for note in v.notes:
            yield Text(f"n/a: {note}", style="yellow")
        if notes.explain_na_reason:
            yield Text(f"recompile reasons n/a: {notes.explain_na_reason}", style="yellow")
        if not v.complete:
            yield Text("changes since joining only: the whole table comes with the agent's next full ledger",
                       style="dim")
        yield Text("")
        yield self._table(v, width)
        if any(f.eager for f in v.functions):
            yield Text("op: jax's own op run outside jit (jnp.sin(x), x * 2, an initialiser), compiled once "
                       "per shape and dtype: not a recompile, nor a leak (a storm when its shapes never end)",
                       style="dim")
        reasons = self._reasons(v, width)
        if reasons is not None:
            yield Text("")
            yield reasons

    def _summary(self, v: LedgerView, notes: LedgerNotes, width: int = 120) -> Text:
        line = Text()
        line.append("live executables ", style="dim")
        line.append(f"{v.live_count if v.live_count is not None else 'n/a'}", style="bold")
        delta = v.trend_delta(60.0)
        if delta:
            line.append(f" ({delta:+d} in 60 s)", style="bold red" if v.leak or v.storm else "yellow")
        if v.pending:
            line.append(f", {v.pending} not analysed yet", style="dim")
        line.append("  code ", style="dim")
        line.append(fmt_bytes(v.code_bytes))
        line.append("  ")
        line.append(str(v.compiles_total) if v.compiles_total is not None else "n/a")
        line.append(" compiles", style="dim")
        line.append("  recompile reasons: " if width >= 100 else "  reasons ", style="dim")
        if notes.explain_enabled:
            # Whose option it is: the program's, or jaxtop's (then hidden from the program).
            by = notes.explain_by
            line.append("on", style="green")
            # jaxtop's: it set jax_explain_cache_misses, hidden from the program.
            line.append(" (your setting)" if by == "user" else " (set by jaxtop)" if by == "jaxtop" else "", style="dim")
        else:
            line.append("off", style="yellow")
        return line

    def _trend(self, v: LedgerView, width: int) -> Text:
        label = Text("trend ", style="dim")
        counts = [n for _, n in v.trend]
        if not counts:
            return label + Text("n/a", style="dim")
        lo, hi = min(counts), max(counts)
        tail = Text(f" {lo}…{hi}" if lo != hi else f" {hi}", style="dim")
        bars = sparkline(counts, max(1, width - label.cell_len - tail.cell_len))
        return label + bars + tail

    def _table(self, v: LedgerView, width: int) -> Table:
        # The columns a terminal of this width can hold: the function's name
        # and the latest reason matter most; the call site is also in the
        # reasons listed under the table.
        columns = ["function", "comp", "live", "temp"]
        if width >= 90:
            columns.append("args")
        if width >= 110:
            columns.append("out")
        columns.append("code")
        if width >= 110:
            columns.append("flops")
        if width >= 90:
            columns.append("call site")
        columns.append("latest recompile reason")
        table = Table(box=None, expand=True, pad_edge=False, padding=(0, 1), header_style="bold")
        for name in columns:
            if name == "function":
                table.add_column(name, no_wrap=True, overflow="ellipsis", ratio=3, min_width=14)
            elif name == "call site":
                table.add_column(name, no_wrap=True, overflow="ellipsis", ratio=2, min_width=9)
            elif name == "latest recompile reason":
                table.add_column(name, no_wrap=True, overflow="ellipsis", ratio=4, min_width=12)
            else:
                table.add_column(name, justify="right", no_wrap=True)
        functions = sort_functions(v.functions, self.sort)
        if not functions:
            table.add_row(Text("no compiled functions yet", style="dim"))
        for f in functions:
            compiles = "n/a" if f.compiles is None else str(f.compiles)
            if f.compiles_source == "executables" and f.compiles is not None:
                compiles += "+"  # a lower bound: executables freed between passes are missed
            if f.eager:
                compiles += " op"  # jax's own op outside jit: once per shape, no recompile
            cells = {
                "function": Text(f.name, style="dim" if not f.live else None),
                "comp": Text(compiles, style="bold yellow" if (f.recompiles or 0) > 0 else None),
                "live": str(f.live),
                "temp": fmt_bytes(f.temp_bytes),
                "args": fmt_bytes(f.argument_bytes),
                "out": fmt_bytes(f.output_bytes),
                "code": fmt_bytes(f.code_bytes),
                "flops": fmt_count(f.flops),
                "call site": short_site(f.call_site) or "n/a",
                "latest recompile reason": describe_reason(f.reasons[0], site=False) if f.reasons else "",
            }
            table.add_row(*(cells[c] for c in columns))
        return table

    def _reasons(self, v: LedgerView, width: int) -> Group | None:
        with_reasons = [f for f in v.functions if f.reasons]
        if not with_reasons:
            return None
        with_reasons.sort(key=lambda f: -(recompile_t(f.reasons[0]) or 0.0))
        lines: list[Text] = [Text("Recompile reasons, latest first", style="bold")]
        for f in with_reasons[:REASON_FUNCTIONS]:
            head = Text(f"{f.name}", style="bold")
            head.append(f"  {f.reasons_total} recompile reason(s)", style="dim")
            if f.defined_at:
                head.append(f"  defined at {short_site(f.defined_at)}", style="dim")
            lines.append(head)
            for r in f.reasons[:REASONS_EACH]:
                line = Text(f"  {_clock(recompile_t(r))}  ", style="dim")
                line.append(describe_reason(r))
                line.truncate(width, overflow="ellipsis")
                lines.append(line)
        left = len(with_reasons) - REASON_FUNCTIONS
        if left > 0:
            lines.append(Text(f"… {left} more function(s) with recompile reasons", style="dim"))
        return Group(*lines)
