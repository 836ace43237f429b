"""Which line makes the transfers: the Transfers panel's site lines and the
screen of every site.

Pure Rich renderables of a :class:`~jaxtop.dashboard.transfer_sites.TransferSitesView`:
no Textual, no state. Lines fit the width they are given: detail drops out,
most detailed first (:func:`~jaxtop.widgets.panel_base.fitting`), before
anything is cut. Every string came through the model, which made it
terminal safe; it is put in :class:`~rich.text.Text` as is, never read as
markup (a file named ``[bold]x.py`` shows those brackets).

Python scalars are kept apart from the array lines: each one is a tiny copy
whose cost is the call's, and the cure differs (``jnp.asarray`` once, or
``static_argnums``), so one line sums them.
"""

from __future__ import annotations

import io
from typing import Iterable, Sequence

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.padding import Padding
from rich.text import Text

from jaxtop.dashboard.transfer_sites import SCALAR_ADVICE, ScalarSummary, TransferSiteView, TransferSitesView
from jaxtop.widgets.fmt import fmt_bytes, fmt_rate
from jaxtop.widgets.holders import sparkline

__all__ = [
    "INFERRED_MARK", "SCALAR_ADVICE", "TransferSitesReport", "render_transfer_sites", "scalar_line", "scalar_lines",
    "site_rows",
    "tail_line",
]

#: Put before an argument read from a call at that line after the call
#: (``args_seen == "call"``), not seen passing to the device.
INFERRED_MARK = "~"
SCALAR_STYLE = "yellow"
UNATTRIBUTED_STYLE = "magenta"
#: Columns of the two rates at the right of a site row.
RATE_W, BYTES_W = 7, 10


def _cut(text: str, width: int) -> str:
    """``text`` in ``width`` cells, an ellipsis where it was cut."""
    if width <= 0:
        return ""
    if cell_len(text) <= width:
        return text
    out = ""
    for ch in text:
        if cell_len(out + ch) > width - 1:
            break
        out += ch
    return out + "…"


def _where(site: TransferSiteView, width: int) -> str:
    """``train.py:27`` in ``width`` cells: the file's name is cut, the line number kept."""
    where = site.where
    if cell_len(where) <= width:
        return where
    tail = f":{site.line}"
    return _cut(where[: -len(tail)], width - len(tail)) + tail


def _arg_text(site: TransferSiteView, width: int, callee: bool = False) -> Text:
    """The site's largest argument (name, kind, shape) and how many more,
    fitted; after the called function's name where ``callee``."""
    arg = site.main_arg
    head = f"{site.callee} " if callee else ""
    if arg is None:
        text = Text(_cut(head, width), style="cyan")
        text.append(_cut("args not seen", width - text.cell_len), style="dim")
        return text
    more = len(site.args) - 1
    extra = f" +{more}" if more else ""
    mark = INFERRED_MARK if site.inferred else ""
    name = arg.name or arg.shape or "(unnamed)"  # unnamed (jax's slow path saw it): its shape says more
    choices = [arg.text(kind=True) + extra, arg.text(kind=False) + extra, name + extra, name]
    if site.args_of:  # another callee's call at this line: say whose, where it fits
        choices = [f"{c} (of {site.args_of})" for c in choices[:3]] + choices
    room = max(1, width - len(mark) - cell_len(head))
    body = next((c for c in choices if cell_len(c) <= room), None)
    if body is None and head:  # the argument before the call's name: it is what to change
        head = _cut(head.rstrip(), max(0, width - len(mark) - cell_len(name) - 1))
        head = f"{head} " if head else ""
        room = max(1, width - len(mark) - cell_len(head))
    if body is None:
        body = _cut(choices[-1], room)
    text = Text(head, style="cyan")
    if mark:
        text.append(mark, style="bold yellow")
    text.append(body)
    return text


def _rate_cell(value: float | None, ended: bool, bytes_: bool = False, estimated: bool = False) -> str:
    if ended:
        return "–"
    if value is None:
        return "n/a"
    if bytes_:
        return ("~" if estimated else "") + fmt_bytes(value)
    return fmt_rate(value, "")


def site_rows(sites: Sequence[TransferSiteView], width: int, ended: bool = False, header: bool = True) -> list[Text]:
    """One line per site (``train.py:27  step  batch['x'] NumPy array float32[8,4] +2   55/s  9.1 KiB``),
    with a header line first where ``header``.

    Columns drop out as the width shrinks: the user's function first, then
    the direction (kept while the sites go more than one way), then the
    bytes per second; the argument is cut last.
    """
    if not sites:
        return []
    narrow = width < 56  # the call and its argument share one column
    show_bytes = width >= 46
    show_function = width >= 90
    show_dir = width >= 90 or len({s.direction for s in sites}) > 1
    where_w = min(24 if not narrow else 14, max(cell_len(s.where) for s in sites))
    call_w = 0 if narrow else min(18 if width >= 70 else 10, max(4, max(cell_len(s.callee) for s in sites)))
    func_w = min(16, max(cell_len(s.function) for s in sites)) if show_function else 0
    fixed = ((4 if show_dir else 0) + where_w + 1 + (func_w + 1 if show_function else 0) + (call_w + 1 if call_w else 0)
             + RATE_W + (BYTES_W if show_bytes else 0) + 1)  # every column but the argument
    arg_w = max(0, width - fixed)
    rows = []
    if header:
        line = Text(style="dim", no_wrap=True, overflow="ellipsis")
        if show_dir:
            line.append("dir ")
        line.append("line".ljust(where_w) + " ")
        if show_function:
            line.append(_cut("in", func_w).ljust(func_w) + " ")
        if call_w:
            line.append(_cut("calls", call_w).ljust(call_w) + " ")
        legends = [f"argument ({INFERRED_MARK} inferred)", f"arg ({INFERRED_MARK} inferred)",
                   f"arg, {INFERRED_MARK} inferred", f"arg {INFERRED_MARK}inferred", "argument", "arg"]
        if narrow:
            legends = [f"call argument ({INFERRED_MARK} inferred)", f"call arg ({INFERRED_MARK} inferred)",
                       f"call ({INFERRED_MARK} inferred)", "call arg", "call"]
        line.append(_cut(next((c for c in legends if len(c) <= arg_w), legends[-1]), arg_w).ljust(arg_w) + " ")
        line.append("/s".rjust(RATE_W))
        if show_bytes:
            # A line's bytes are its transfers sized by the calls read (a
            # cached call logs no shape): an estimate, not a lower bound.
            line.append("~bytes/s".rjust(BYTES_W))
        rows.append(line)
    for site in sites:
        line = Text(no_wrap=True, overflow="ellipsis")
        if show_dir:
            line.append(f"{site.direction:<3} ", style="bold")
        line.append(_where(site, where_w).ljust(where_w) + " ", style="bold")
        if show_function:
            line.append(_cut(site.function, func_w).ljust(func_w) + " ", style="dim")
        if call_w:
            line.append(_cut(site.callee, call_w).ljust(call_w) + " ", style="cyan")
        arg = _arg_text(site, arg_w, callee=narrow) if arg_w > 0 else Text()
        arg.pad_right(max(0, arg_w - arg.cell_len))
        line.append_text(arg)
        line.append(" ")
        line.append(_rate_cell(site.count_per_s, ended).rjust(RATE_W))
        if show_bytes:
            line.append(_rate_cell(site.bytes_per_s, ended, True, site.bytes_estimated).rjust(BYTES_W))
        rows.append(line)
    return rows


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def scalar_lines(summary: ScalarSummary, width: int, ended: bool = False) -> list[Text]:
    """``Python scalars 100/s at 2 lines (lr in step, train.py:27): keep them on the device …``,
    in one line where it fits, else the facts and the advice on a second line."""
    rate = f"×{summary.count_total:,}" if ended or summary.count_per_s is None else fmt_rate(summary.count_per_s, "")
    site = summary.busiest
    names = summary.names
    where = site.where if site is not None else ""
    callee = site.callee if site is not None else ""
    about = f"{names} in {callee}" if names and callee else (names or callee)
    detail = f"{about}, {where}" if about else where
    lines = _plural(summary.lines, "line")
    full = f" Python scalars {rate} at {lines} ({detail}): {SCALAR_ADVICE}"
    if cell_len(full) <= width:
        return [Text(full, style=SCALAR_STYLE, no_wrap=True, overflow="ellipsis")]
    choices = [
        f" Python scalars {rate} at {lines} ({detail})",
        f" Python scalars {rate} at {lines} ({names or callee}, {where})",
        f" Py scalars {rate} ({names or callee}, {where})",
        f" Py scalars {rate}, {lines}",
    ]
    facts = next((c for c in choices if cell_len(c) <= width), choices[-1])
    advice = next((c for c in (f"   {SCALAR_ADVICE}", "   keep them on the device (in the step's state)",
                               "   keep them on the device") if cell_len(c) <= width), "   on the device")
    return [Text(facts, style=SCALAR_STYLE, no_wrap=True, overflow="ellipsis"),
            Text(advice, style="dim " + SCALAR_STYLE, no_wrap=True, overflow="ellipsis")]


def scalar_line(summary: ScalarSummary, width: int, ended: bool = False) -> Text:
    """The first of :func:`scalar_lines` (the facts, with the advice where it fits)."""
    return scalar_lines(summary, width, ended)[0]


def tail_line(view: TransferSitesView, width: int, not_shown: int, ended: bool = False) -> Text | None:
    """``+3 more lines · 12 unattributed · T: every line``; None when there is nothing to say."""
    more = not_shown + max(0, view.sites_total - len(view.sites))
    unattributed = view.unattributed_total
    if not more and not unattributed:
        return None
    rate = ""
    if unattributed and not ended and view.unattributed_per_s:
        rate = f" ({fmt_rate(view.unattributed_per_s, '')})"
    parts_long, parts_short = [], []
    if more:
        parts_long.append(f"+{more} more {'line' if more == 1 else 'lines'}")
        parts_short.append(f"+{more} more")
    if unattributed:
        parts_long.append(f"{unattributed:,} unattributed{rate}")
        parts_short.append(f"{unattributed:,} unattributed")
    choices = [
        " " + " · ".join(parts_long + ["T lists every line"]),
        " " + " · ".join(parts_long + ["T: all"]),
        " " + " · ".join(parts_short + ["T: all"]),
        " " + " · ".join(parts_short),
        " " + (f"{unattributed:,} unattr." if unattributed else f"+{more}"),
    ]
    text = Text(next((c for c in choices if cell_len(c) <= width), choices[-1]), style="dim", no_wrap=True,
                overflow="ellipsis")
    if unattributed:
        text.highlight_words(["unattributed", "unattr."], style=UNATTRIBUTED_STYLE)
    return text


# ------------------------------------------------------------------- the screen

class TransferSitesReport:
    """Every site of one :class:`TransferSitesView`, for a scrolling screen.

    Args:
        view: what to show (None: nothing received yet).
        ended: the process exited or its agent left: no current rate.
        spark_width: cells of each sparkline (narrow screens get fewer).
    """

    def __init__(self, view: TransferSitesView | None, ended: bool = False, spark_width: int = 30) -> None:
        self.view = view
        self.ended = ended
        self.spark_width = spark_width

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(20, options.max_width)
        view = self.view
        if view is None:
            yield Text("No transfer sites yet: the agent names the line of each implicit transfer once the "
                       "program makes one (an older agent, or one whose transfer capture is off, names none).",
                       style="dim")
            return
        yield self._summary(view)
        yield Text(f"{INFERRED_MARK} before an argument: read from a call's arguments at that line after the "
                   "call (inferred), not seen passing to the device. Bytes are a lower bound; bytes/s with ~ "
                   "are the count per second times a size per transfer (estimated).", style="dim")
        yield Text("")
        yield from self._table(view.arrays, width, "Arrays and other values", view.history_s)
        summary = view.scalar_summary()
        if summary is not None:
            yield Text("")
            yield from scalar_lines(summary, width, self.ended)
            yield from self._table(view.scalars, width, "", view.history_s)
        yield Text("")
        yield from self._unattributed(view)

    def _summary(self, view: TransferSitesView) -> Text:
        line = Text()
        line.append(f"{view.sites_total:,} {'line' if view.sites_total == 1 else 'lines'} made implicit transfers",
                    style="bold")
        if view.sites_total > len(view.sites):
            line.append(f" (the {len(view.sites)} busiest listed", style="dim")
            if view.other_count_total is not None:
                line.append(f"; the rest made {view.other_count_total:,}", style="dim")
            line.append(")", style="dim")
        line.append(f" · {view.unattributed_total:,} unattributed", style=UNATTRIBUTED_STYLE)
        if view.pending:
            line.append(f" · {view.pending:,} waiting for the call that made them", style="dim")
        return line

    def _table(self, sites: Sequence[TransferSiteView], width: int, title: str,
               history_s: float = 0.1) -> Iterable[Text | Padding]:
        """A header, then per site a line of figures and, under it, every
        argument (the arguments are what a user changes: never cut to a
        column's width)."""
        if title:
            yield Text(title if sites else f"{title}: none", style="bold underline" if sites else "dim")
        if not sites:
            return
        wide = width >= 110
        spark_w = max(6, min(self.spark_width, width - 100)) if width >= 96 else 0
        where_w = min(28, max(4, max(cell_len(s.where) for s in sites)))
        func_w = min(20, max(2, max(cell_len(s.function) for s in sites))) if wide else 0
        call_w = min(22 if wide else 14, max(5, max(cell_len(s.callee) for s in sites)))
        columns: list[tuple[str, int, bool]] = [("dir", 3, False), ("line", where_w, False)]
        if wide:
            columns.append(("in", func_w, False))
        columns += [("calls", call_w, False), ("transfers", 10, True), ("/s", 7, True), ("~bytes", 9, True)]
        if wide:
            columns.append(("~bytes/s", 10, True))
        if spark_w:
            columns.append((f"per {history_s:.2g} s", spark_w, False))  # a history entry's span

        def cell(text: str, w: int, right: bool) -> str:
            text = _cut(text, w)
            return text.rjust(w) if right else text.ljust(w)

        yield Text(" ".join(cell(name, w, right) for name, w, right in columns), style="bold", no_wrap=True,
                   overflow="ellipsis")
        for site in sites:
            values = [(site.direction, "bold"), (_where(site, where_w), "bold")]
            if wide:
                values.append((site.function, "dim"))
            values += [(site.callee, "cyan"), (f"{site.count_total:,}", ""),
                       (_rate_cell(site.count_per_s, self.ended), ""),
                       (fmt_bytes(site.bytes_total) if site.bytes_total is not None else "n/a", "")]
            if wide:
                values.append((_rate_cell(site.bytes_per_s, self.ended, True, site.bytes_estimated), ""))
            line = Text(no_wrap=True, overflow="ellipsis")
            for (value, style), (_, w, right) in zip(values, columns):
                line.append(cell(value, w, right) + " ", style=style)
            if spark_w:
                line.append_text(sparkline([float(v) for v in site.history], spark_w) if site.history else Text(""))
            yield line
            args = Text()
            if site.file and site.file != site.where.rsplit(":", 1)[0]:  # where the base name is not all
                args.append(f"{site.file}:{site.line}  ", style="dim")
            if site.inferred:
                args.append(INFERRED_MARK, style="bold yellow")
            if site.args and site.args_of:
                args.append(f"args of {site.args_of}: ", style="dim")
            if site.args:
                args.append("; ".join(a.text() + (f" {fmt_bytes(a.bytes)}" if a.bytes is not None else "")
                                      for a in site.args))
            else:
                args.append("arguments not seen", style="dim")
            yield Padding(args, (0, 0, 0, 4))  # wrapped under the figures, never cut

    def _unattributed(self, view: TransferSitesView) -> Iterable[Text]:
        title = Text("Unattributed", style="bold underline")
        if not view.unattributed_total:
            title.append("  none: every transfer logged was tied to a line", style="dim")
            yield title
            return
        by_dir = ", ".join(f"{d} {n:,}" for d, n in sorted(view.unattributed.items()) if n)
        title.append(f"  {view.unattributed_total:,} transfers not tied to a line ({by_dir}); never guessed",
                     style=UNATTRIBUTED_STYLE)
        yield title
        for reason, n in sorted(view.unattributed_reasons.items(), key=lambda kv: (-kv[1], kv[0])):
            yield Text(f"  {n:>8,}  {reason}", style="dim")


def render_transfer_sites(view: TransferSitesView | None, width: int = 120, ended: bool = False) -> str:
    """The report as plain text (tests, logs)."""
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(Group(TransferSitesReport(view, ended=ended)))
    return console.export_text()
