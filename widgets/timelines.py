"""Charts over time: one :class:`Timeline`, or a :class:`TimelineStack` of
strips over one shared time axis.

Exactly ``height`` lines each, never wider than Rich offers; the cells come
from :mod:`jaxtop.widgets.plot`.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

from jaxtop.widgets.cells import draw_width, fit
from jaxtop.widgets.plot import Plot, Series, axis_line, legend, plot_width
from jaxtop.widgets.safe_math import float_of
from jaxtop.wire.units import is_missing

__all__ = ["Strip", "Timeline", "TimelineStack"]

# Far below a float's range: a terminal's rows times weights up to this,
# summed over the strips, stay finite.
_WEIGHT_MAX = 1e300


class Timeline:
    """A chart of min/max series over time, with a y axis, x axis and legend.

    Exactly ``height`` lines (at least 3): the title and legend, ``height - 2``
    plot rows, and the x axis with relative time labels ("-10m", "-5m", "now").

    Args:
        series: what to draw; "fill" series first, "line" markers on top.
        t_start: left edge of the window, Unix seconds.
        t_end: right edge ("now").
        height: total lines to draw.
        unit: "bytes" for binary sizes on the y axis, "%" for a ratio in
            percent, else a unit appended to plain numbers ("/s" gives "12.3/s").
        title: text before the legend.
    """

    def __init__(self, series: Sequence[Series], t_start: float, t_end: float, height: int, unit: str = "bytes", title: str = "") -> None:
        self.series = list(series)
        self.t_start = float_of(t_start)
        self.t_end = float_of(t_end)
        self.height = height
        self.unit = unit
        self.title = title

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = draw_width(None, options)
        plot = Plot(self.series, self.t_start, self.t_end, self.height - 2, self.unit)
        label_w, plot_w = plot_width(width, plot.label_width)
        lines = [legend(self.title, self.series), *plot.lines(label_w, plot_w)]
        lines.append(axis_line(self.t_start, self.t_end, label_w, plot_w))
        yield from fit(lines, width)


@dataclass(frozen=True, eq=False)
class Strip:
    """One strip of a :class:`TimelineStack`: a legend line over plot rows.

    Attributes:
        title: the strip's name, first on its legend line.
        series: what to draw, as in :class:`Timeline`.
        unit: "bytes", "%" (a ratio drawn in percent) or a unit appended to
            plain numbers ("/s").
        weight: the strip's share of the rows left once every strip has
            what it wants.
        reason: set when the strip's quantity cannot be measured: the strip
            is then "title n/a — reason" (wrapped over its lines), no plot.
        optional: dropped, last first, when the stack is too short for all.
        y_max: a fixed top of the scale (1.0 for a ratio); None scales to the
            data in the window.
        note: dim text after the legend, dropped first when the line is short.
        min_rows: plot rows the strip should have before any optional strip
            is shown (it may get fewer, down to one, on a very short stack).
    """

    title: str
    series: Sequence[Series] = ()
    unit: str = "bytes"
    weight: float = 1.0
    reason: str | None = None
    optional: bool = False
    y_max: float | None = None
    note: str = ""
    min_rows: int = 1


class TimelineStack:
    """Several strips over ONE time axis: a column is the same time in all.

    Each strip has its own legend line and y scale; all share the window
    (``t_start``..``t_end``), the label width and so the plot width, and one
    x axis at the bottom. A burst of transfers and the memory it brings in
    therefore land in the same column, which separate charts with labels of
    different widths ("48.5 GiB" against "160/s") would not give.

    Exactly ``height`` lines. A plotted strip wants its legend and
    ``min_rows`` rows, an n/a strip its wrapped reason (up to
    ``NA_MAX_LINES``). Optional strips go, the last first, until the others
    get that; if they still do not fit, each gets its least (a legend and one
    row; one line of reason) and strips go from the bottom. The rows left
    over are shared by weight.

    Args:
        strips: top to bottom.
        t_start: left edge of the window, Unix seconds.
        t_end: right edge ("now").
        height: total lines to draw, the axis included.
    """

    NA_MAX_LINES = 3  # an n/a reason wraps over at most this many lines

    def __init__(self, strips: Sequence[Strip], t_start: float, t_end: float, height: int) -> None:
        self.strips = list(strips)
        self.t_start = float_of(t_start)
        self.t_end = float_of(t_end)
        self.height = max(2, height)

    def _na_lines(self, strip: Strip, width: int) -> list[Text]:
        text = Text(f"{strip.title} n/a", style="bold dim")
        text.append(f" — {strip.reason}", style="dim")
        return list(text.wrap(_console_for(width), width, overflow="ellipsis"))

    def _na_block(self, strip: Strip, width: int, n: int) -> list[Text]:
        """An n/a strip in exactly ``n`` lines; a reason cut short ends in "…"."""
        wrapped = self._na_lines(strip, width)
        block = wrapped[:n]
        if len(wrapped) > n:
            block[-1].truncate(max(0, width - 1))
            block[-1].rstrip()
            block[-1].append("…", style="dim")
        return block + [Text("") for _ in range(n - len(block))]

    def _na_want(self, strip: Strip, width: int) -> int:
        """Lines an n/a strip's wrapped reason wants (at most NA_MAX_LINES)."""
        return min(len(self._na_lines(strip, width)), self.NA_MAX_LINES)

    def _wanted(self, strip: Strip, width: int) -> int:
        """Lines a strip wants before any optional strip is shown."""
        return self._na_want(strip, width) if strip.reason else 1 + max(1, strip.min_rows)

    @staticmethod
    def _least(strip: Strip) -> int:
        """Lines a strip cannot do without: one line of reason, or a legend and a row."""
        return 1 if strip.reason else 2

    def _chosen(self, width: int) -> list[Strip]:
        """The strips that fit (see the class docstring)."""
        kept = list(self.strips)
        room = self.height - 1  # the axis
        while any(s.optional for s in kept) and sum(self._wanted(s, width) for s in kept) > room:
            kept.pop(max(i for i, s in enumerate(kept) if s.optional))
        while kept and sum(self._least(s) for s in kept) > room:
            kept.pop()
        return kept

    def _allot(self, kept: list[Strip], width: int) -> list[int]:
        """Lines per strip: its least, then toward what it wants (n/a reasons
        first: a cut reason says less than a plot one row shorter), then the
        rest by weight."""
        wanted = [self._wanted(s, width) for s in kept]
        lines = [self._least(s) for s in kept]
        spare = self.height - 1 - sum(lines)
        for i in sorted(range(len(kept)), key=lambda i: not kept[i].reason):
            extra = max(0, min(wanted[i] - lines[i], spare))
            lines[i] += extra
            spare -= extra
        plotted = [i for i, s in enumerate(kept) if not s.reason]
        weight = _weights(kept, plotted)
        total = sum(weight.values())
        if plotted and spare > 0 and total > 0:
            shares = {i: spare * weight[i] / total for i in plotted}
            given = {i: int(shares[i]) for i in plotted}
            # Largest remainders get the rows that rounding down left over.
            left = spare - sum(given.values())
            for i in sorted(plotted, key=lambda i: shares[i] - given[i], reverse=True)[:left]:
                given[i] += 1
            for i in plotted:
                lines[i] += given[i]
        return lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = draw_width(None, options)
        t0, t1 = self.t_start, self.t_end
        kept = self._chosen(width)
        allotted = self._allot(kept, width)
        plots = {i: Plot(s.series, t0, t1, n - 1, s.unit, s.y_max) for i, (s, n) in enumerate(zip(kept, allotted)) if not s.reason}
        # One label width for all strips: the same plot columns in each.
        label_w, plot_w = plot_width(width, max((p.label_width for p in plots.values()), default=0))
        lines: list[Text] = []
        for i, (strip, n) in enumerate(zip(kept, allotted)):
            if strip.reason:
                lines.extend(self._na_block(strip, width, n))
                continue
            lines.append(_fitted_legend(strip, width))
            lines.extend(plots[i].lines(label_w, plot_w))
        lines.extend(Text("") for _ in range(self.height - 1 - len(lines)))
        lines.append(axis_line(t0, t1, label_w, plot_w))
        yield from fit(lines, width)


def _weights(kept: list[Strip], plotted: list[int]) -> dict[int, float]:
    """The weights the plotted strips share spare rows by.

    A weight not measured (NaN, infinity) counts as 0. Weights so large
    that their sum, or rows times one of them, could overflow a float are
    scaled down together, which keeps their ratios; ordinary weights are
    used as given.
    """
    weight = {i: 0.0 if is_missing(kept[i].weight) else float_of(kept[i].weight) for i in plotted}
    top = max((abs(w) for w in weight.values()), default=0.0)
    if top > _WEIGHT_MAX:
        weight = {i: w / top for i, w in weight.items()}
    return weight


def _fitted_legend(strip: Strip, width: int) -> Text:
    """The most complete legend that fits: the note goes first, then the
    spacing, then the title (the y labels still give the unit)."""
    choices = [
        legend(strip.title, strip.series, strip.note),
        legend(strip.title, strip.series),
        legend(strip.title, strip.series, sep=" "),
        legend("", strip.series, sep=" "),
    ]
    return next((c for c in choices if c.cell_len <= width), choices[-1])


def _console_for(width: int) -> Console:
    """A console that only measures and wraps text (nothing is printed)."""
    return Console(width=width, color_system=None, file=io.StringIO(), legacy_windows=False)
