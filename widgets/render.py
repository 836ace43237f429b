"""Pure Rich renderables for the dashboard: data and a width in, text out.

Each class takes plain data (numbers, lists, numpy arrays) and draws it into
the width Rich offers (``options.max_width``), never wider and never wrapped.
Nothing here knows about Textual, sockets or the model: the widgets hold
reactive attributes and hand their data to these classes, and the tests render
them to strings without an app (the pattern of Textual's own ``Sparkline``).

A missing value is drawn as "n/a", with a reason where one is given, never as
zero (docs/protocol.md: values that cannot be measured are ``null``).
"""

from __future__ import annotations

import io
import math
import re
import statistics
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby

import numpy as np
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.style import Style
from rich.text import Text

__all__ = [
    "Gauge", "LayersBar", "MemoryMap", "MiniBars", "Series", "Strip", "Timeline", "TimelineStack",
    "fmt_bytes", "fmt_duration", "fmt_rate",
]

H_EIGHTHS = " ▏▎▍▌▋▊▉█"  # index = eighths of a cell filled from the left
V_EIGHTHS = " ▁▂▃▄▅▆▇█"  # index = eighths of a cell filled from the bottom
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def _missing(x: object) -> bool:
    """True for None, NaN and infinities: values to show as n/a."""
    if x is None:
        return True
    try:
        return not math.isfinite(x)  # type: ignore[arg-type]
    except TypeError:
        return False


def _sig3(v: float) -> str:
    """A non-negative number below 999.5 with 3 significant digits, zeros kept."""
    if v < 1:
        # Only reached for 1000..1023 of the unit below, e.g. 0.977 MiB.
        text = f"{v:.3f}"
        return "1.00" if text == "1.000" else text
    if v < 9.995:
        return f"{v:.2f}"
    if v < 99.95:
        return f"{v:.1f}"
    return f"{v:.0f}"


def _si3(x: float) -> str:
    """A count with 3 significant digits and a k/M/G/T suffix: 12.3, 1.23k."""
    sign = "-" if x < 0 else ""
    v = abs(float(x))
    for suffix in ("", "k", "M", "G"):
        if float(f"{v:.3g}") < 1000:
            return f"{sign}{v:.3g}{suffix}"
        v /= 1000
    return f"{sign}{v:.3g}T"


def _pct(p: float) -> str:
    """A percentage that never rounds a non-zero share to 0% or a partial one to 100%."""
    if 0 < p < 1:
        return "<1%"
    if 99 < p < 100:
        return ">99%"
    return f"{p:.0f}%"


def fmt_bytes(n: int | float | None) -> str:
    """Bytes in binary units with 3 significant digits.

    Whole bytes stay exact below 1 KiB ("512 B"); a value that would print as
    1000 or more of a unit moves to the next one ("0.977 MiB").

    Args:
        n: a byte count; None, NaN or infinity means "not measured".

    Returns:
        e.g. "0 B", "1.50 KiB", "12.3 MiB", "1.02 GiB", or "n/a".
    """
    if _missing(n):
        return "n/a"
    sign = "-" if n < 0 else ""  # type: ignore[operator]
    value = abs(float(n))  # type: ignore[arg-type]
    if value < 1023.5:
        return f"{sign}{value:.0f} B"
    unit = _UNITS[0]
    for unit in _UNITS[1:]:
        value /= 1024
        if value < 999.5:
            break
    return f"{sign}{_sig3(value)} {unit}"


def fmt_rate(x: float | None, unit: str = "") -> str:
    """A per-second value: "12.3/s", "1.23k allocs/s"; bytes go through fmt_bytes.

    Args:
        x: the rate; None or NaN means "not measured".
        unit: what is counted ("" for a bare count, "B" or "bytes" for bytes).
    """
    if _missing(x):
        return "n/a"
    if unit in ("B", "bytes"):
        return f"{fmt_bytes(x)}/s"
    return f"{_si3(x)} {unit}/s" if unit else f"{_si3(x)}/s"  # type: ignore[arg-type]


def fmt_duration(s: float | None) -> str:
    """An uptime in its two largest units: "59s", "3m04s", "2h03m", "1d04h"."""
    if _missing(s):
        return "n/a"
    sign = "-" if s < 0 else ""  # type: ignore[operator]
    total = int(abs(s))  # type: ignore[arg-type]
    for size, unit, sub, sub_unit in ((86400, "d", 3600, "h"), (3600, "h", 60, "m"), (60, "m", 1, "s")):
        if total >= size:
            return f"{sign}{total // size}{unit}{total % size // sub:02d}{sub_unit}"
    return f"{sign}{total}s"


def _ago(s: float) -> str:
    """A compact time offset for axis labels: 600 -> "10m", 90 -> "1m30s"."""
    return re.sub(r"(?<=[a-z])00[smh]$", "", fmt_duration(s))


def _width(requested: int | None, options: ConsoleOptions) -> int:
    """The width to draw in: the caller's wish, never more than Rich offers."""
    width = options.max_width if requested is None else min(requested, options.max_width)
    return max(1, width)


def _fit(lines: Iterable[Text], width: int) -> Iterator[Text]:
    """Yield lines cut to ``width`` cells so that Rich never wraps them."""
    for line in lines:
        line.no_wrap = True
        line.overflow = "ellipsis"
        line.end = "\n"
        line.truncate(width, overflow="ellipsis")
        yield line


def _hbar(fraction: float, width: int, style: str) -> Text:
    """A left-to-right bar of ``width`` cells with 1/8-cell precision."""
    eighths = round(min(max(fraction, 0.0), 1.0) * width * 8)
    if fraction > 0 and eighths == 0:
        eighths = 1  # a non-zero value must never look like zero
    full, part = divmod(eighths, 8)
    bar = Text("█" * full + (H_EIGHTHS[part] if part else ""), style=style)
    # A dim track shows where 100% is, which a bare bar cannot.
    bar.append("·" * (width - bar.cell_len), style="dim")
    return bar


def _runs(cells: Sequence[tuple[str, str | Style]]) -> Text:
    """One Text from (character, style) cells, merging runs of equal style."""
    text = Text()
    for style, run in groupby(cells, key=lambda cell: cell[1]):
        text.append("".join(ch for ch, _ in run), style=style)
    return text


class _Sized:
    """Reports a fixed width to Rich tables when the caller gave one."""

    width: int | None

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        if self.width is None:
            return Measurement(1, options.max_width)
        width = max(1, min(self.width, options.max_width))
        return Measurement(width, width)


class LayersBar(_Sized):
    """Nested memory layers (NVML used ⊇ pool ⊇ in use ⊇ live arrays) against a limit.

    Drawn one line per layer: label, a bar scaled to the limit, size, % of
    limit; then a line with the limit. This is the picture that explains
    preallocation: a pool of 75% with 15% in use is not a leak.

    Args:
        layers: ``(label, value_bytes, style)`` or ``(label, value_bytes,
            style, reason)``, outer to inner. A None value shows "n/a" and
            the reason, dimmed.
        limit: the byte limit the bars are scaled to; None (or <= 0) scales
            them to the largest value and prints "limit n/a".
        width: cells to use at most; None for all that Rich offers.
    """

    def __init__(self, layers: Sequence[tuple], limit: int | float | None, width: int | None = None) -> None:
        self.layers = list(layers)
        self.limit = limit
        self.width = width

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = _width(self.width, options)
        has_limit = not _missing(self.limit) and self.limit > 0  # type: ignore[operator]
        values = [None if _missing(layer[1]) else float(layer[1]) for layer in self.layers]
        scale = float(self.limit) if has_limit else max((v for v in values if v is not None), default=0.0)  # type: ignore[arg-type]
        label_w = min(max((cell_len(str(layer[0])) for layer in self.layers), default=0), max(4, width // 3))
        size_w, pct_w = 9, 5 if has_limit else 0
        bar_w = width - label_w - 2 - size_w - pct_w
        if bar_w < 4 and pct_w:  # narrow: the size matters more than the percent
            pct_w, bar_w = 0, bar_w + pct_w
        if bar_w < 3:
            bar_w = 0
        lines = []
        for layer, value in zip(self.layers, values):
            label, style = str(layer[0]), layer[2]
            reason = layer[3] if len(layer) > 3 else None
            line = Text(label, style="bold")
            line.truncate(label_w, overflow="ellipsis", pad=True)
            line.append(" ")
            if value is None:
                line.append("n/a", style="dim")
                if reason:
                    line.append(f" — {reason}", style="dim")
                lines.append(line)
                continue
            if bar_w:
                line.append_text(_hbar(value / scale if scale > 0 else 0.0, bar_w, style))
                line.append(" ")
            line.append(f"{fmt_bytes(value):>{size_w}}")
            if pct_w:
                line.append(f" {_pct(100 * value / scale):>4}", style="dim")
            lines.append(line)
        if has_limit:
            lines.append(Text(f"limit {fmt_bytes(self.limit)}", style="dim"))
        else:
            note = _longest(["limit n/a (bars scaled to the largest value)", "limit n/a (bars scaled to the largest)", "limit n/a"], width)
            lines.append(Text(note, style="dim"))
        yield from _fit(lines, width)


@dataclass(frozen=True, eq=False)
class Series:
    """One series of a :class:`Timeline`: per point a time and a min/max.

    Attributes:
        name: legend text.
        t: times, Unix seconds.
        lo: per-point minimum (NaN where missing); for raw samples lo == hi.
        hi: per-point maximum (NaN where missing).
        style: Rich style of the series.
        kind: "fill" (filled columns) or "line" (a marker at each column's max).
    """

    name: str
    t: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    style: str = "green"
    kind: str = "line"

    def __post_init__(self) -> None:
        if self.kind not in ("fill", "line"):
            raise ValueError(f"Series.kind must be 'fill' or 'line', not {self.kind!r}")


def _in_window(s: Series, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The points of ``s`` inside [t0, t1] that carry a value, sorted by time."""
    n = min(len(s.t), len(s.lo), len(s.hi))
    t = np.asarray(s.t[:n], dtype=np.float64)
    lo = np.asarray(s.lo[:n], dtype=np.float64)
    hi = np.asarray(s.hi[:n], dtype=np.float64)
    # A point with only one of min/max still tells us something.
    hi = np.where(np.isfinite(hi), hi, lo)
    lo = np.where(np.isfinite(lo), np.minimum(lo, hi), hi)
    keep = np.isfinite(t) & (t >= t0) & (t <= t1) & np.isfinite(hi)
    order = np.argsort(t[keep], kind="stable")
    return t[keep][order], lo[keep][order], hi[keep][order]


def _columns(t: np.ndarray, lo: np.ndarray, hi: np.ndarray, t0: float, t1: float, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Per column min(lo) and max(hi) of the points falling in it; NaN = no data.

    Taking the max of every point (not a sample of them) is what keeps a
    single spike among thousands of points visible at any width.
    """
    lo_col = np.full(cols, np.nan)
    hi_col = np.full(cols, np.nan)
    if not len(t):
        return lo_col, hi_col
    span = max(t1 - t0, 1e-12)
    idx = np.minimum(((t - t0) / span * cols).astype(np.int64), cols - 1)
    top = np.full(cols, -np.inf)
    bottom = np.full(cols, np.inf)
    np.maximum.at(top, idx, hi)
    np.minimum.at(bottom, idx, lo)
    has = np.isfinite(top)
    hi_col[has], lo_col[has] = top[has], bottom[has]
    # When columns are narrower than the sample period, a sample holds its
    # value until the next one (a step chart); otherwise a wide terminal
    # would show stripes. A pause much longer than usual stays blank.
    if len(t) >= 2:
        step = np.diff(t)
        typical = float(np.median(step))
        cover = np.append(np.where(step <= 2 * typical, step, 0.0), typical)
    else:
        cover = np.zeros(1)
    starts = t0 + np.arange(cols) * span / cols
    k = np.searchsorted(t, starts, side="right") - 1
    kc = np.maximum(k, 0)
    held = ~has & (k >= 0) & (starts < t[kc] + cover[kc])
    hi_col[held], lo_col[held] = hi[kc[held]], lo[kc[held]]
    return lo_col, hi_col


def _fmt_value(v: float, unit: str) -> str:
    """A y-axis value: binary sizes, a ratio in percent, or a plain number."""
    if unit == "bytes":
        return fmt_bytes(v)
    if unit == "%":
        return f"{100 * v:.0f}%"
    sep = "" if not unit or unit.startswith("/") else " "
    return f"{_si3(v)}{sep}{unit}"


def _legend(title: str, series: Sequence[Series], note: str = "", sep: str = "  ") -> Text:
    """A legend line: the title, a key per series ("█ in use", "─ peak"), a dim note."""
    line = Text(title, style="bold")
    for s in series:
        if line.plain:
            line.append(sep)
        line.append("█ " if s.kind == "fill" else "─ ", style=s.style)
        line.append(s.name, style=s.style)
    if note:
        line.append(f"{sep}{note}" if line.plain else note, style="dim")
    return line


def _axis(t_start: float, t_end: float, plot_w: int) -> str:
    """The x axis: "-10m────-5m────now" fitted to ``plot_w`` cells."""
    chars = ["─"] * plot_w
    span = t_end - t_start
    right, left, mid = "now", f"-{_ago(span)}", f"-{_ago(span / 2)}"
    if len(right) <= plot_w:
        chars[plot_w - len(right):] = right
    if span > 0 and len(left) + len(right) + 1 <= plot_w:
        chars[: len(left)] = left
        start = plot_w // 2 - len(mid) // 2
        # The middle label only where it leaves a gap on both sides.
        if start > len(left) and start + len(mid) < plot_w - len(right):
            chars[start : start + len(mid)] = mid
    return "".join(chars)


class _Plot:
    """The plot rows of one chart: its scale, y labels and cells.

    The scale comes from the raw points (or a fixed ``y_max``), so it does
    not depend on the plot width, which depends on the width of the labels.
    """

    def __init__(self, series: Sequence[Series], t0: float, t1: float, rows: int, unit: str, y_max: float | None = None) -> None:
        self.series = list(series)
        self.t0, self.t1 = t0, t1
        self.rows = max(1, rows)
        self.points = [_in_window(s, t0, t1) for s in self.series]
        data_max = max((float(p[2].max()) for p in self.points if len(p[0])), default=math.nan)
        self.has_data = math.isfinite(data_max)
        scale = y_max if y_max is not None else data_max
        if self.has_data and scale <= 0:
            scale = 1.0  # all zero: draw at the bottom rather than divide by 0
        self.scale = scale
        self.labels: dict[int, str] = {}
        if self.has_data:
            rows = self.rows
            self.labels[0] = _fmt_value(scale, unit)
            if rows >= 2:
                self.labels[rows - 1] = _fmt_value(0, unit)
            if rows >= 3:
                # Row rows//2 holds scale/2: at its centre when rows is odd,
                # at its top edge when even (as the top label is row 0's).
                self.labels[rows // 2] = _fmt_value(scale / 2, unit)

    @property
    def label_width(self) -> int:
        return max((cell_len(v) for v in self.labels.values()), default=0)

    def _grid(self, plot_w: int) -> list[list[tuple[str, str | Style]]]:
        rows, scale = self.rows, self.scale
        grid: list[list[tuple[str, str | Style]]] = [[(" ", "")] * plot_w for _ in range(rows)]
        full = rows * 8

        def level(v: float) -> int:
            e = min(full, max(0, round(v / scale * full)))
            return 1 if v > 0 and e == 0 else e  # non-zero never draws as zero

        columns = [_columns(*p, self.t0, self.t1, plot_w) for p in self.points]
        ordered = sorted(zip(self.series, columns), key=lambda sc: sc[0].kind != "fill")
        for s, (lo_col, hi_col) in ordered:
            for c in np.flatnonzero(np.isfinite(hi_col)):
                e = level(float(hi_col[c]))
                if s.kind == "fill":
                    lo_level = float(lo_col[c]) / scale * full
                    for r in range(rows):
                        bottom = (rows - 1 - r) * 8
                        n = min(max(e - bottom, 0), 8)
                        if n:
                            # Cells above the column's minimum are dimmed: the
                            # range the value moved through within the column.
                            grid[r][c] = (V_EIGHTHS[n], s.style if bottom < lo_level else f"dim {s.style}")
                else:
                    r = rows - 1 - min(rows - 1, max(e - 1, 0) // 8)
                    under_ch, under_style = grid[r][c]
                    if e == 0 and under_ch != " ":
                        continue  # a zero line would hide the fill it lies on
                    style: str | Style = s.style
                    if under_ch == "█":  # keep the fill visible behind the marker
                        style = Style.parse(s.style) + Style(bgcolor=Style.parse(str(under_style)).color)
                    grid[r][c] = ("─", style)
        return grid

    def lines(self, label_w: int, plot_w: int) -> list[Text]:
        """The plot rows, each "label ┤cells" (or "│cells" without labels)."""
        grid = self._grid(plot_w) if self.has_data else []
        out = []
        for r in range(self.rows):
            if label_w:
                tick = "┤" if r in self.labels else "│"
                line = Text(f"{self.labels.get(r, ''):>{label_w}} {tick}", style="dim")
            else:
                line = Text("│", style="dim")
            if not self.has_data:
                if r == self.rows // 2:
                    line.append("no data".center(plot_w), style="dim")
            else:
                line.append_text(_runs(grid[r]))
            out.append(line)
        return out


def _plot_width(width: int, label_w: int) -> tuple[int, int]:
    """(label width, plot width): labels go when they would leave under 8 cells."""
    if width - label_w - 2 < 8:
        label_w = 0  # too narrow for labels: keep the plot
    return label_w, max(1, width - (label_w + 2 if label_w else 1))


def _axis_line(t0: float, t1: float, label_w: int, plot_w: int) -> Text:
    prefix = " " * label_w + " └" if label_w else "└"
    return Text(prefix + _axis(t0, t1, plot_w), style="dim")


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
        self.t_start = float(t_start)
        self.t_end = float(t_end)
        self.height = height
        self.unit = unit
        self.title = title

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = _width(None, options)
        plot = _Plot(self.series, self.t_start, self.t_end, self.height - 2, self.unit)
        label_w, plot_w = _plot_width(width, plot.label_width)
        lines = [_legend(self.title, self.series), *plot.lines(label_w, plot_w)]
        lines.append(_axis_line(self.t_start, self.t_end, label_w, plot_w))
        yield from _fit(lines, width)


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
        self.t_start = float(t_start)
        self.t_end = float(t_end)
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
        total = sum(kept[i].weight for i in plotted)
        if plotted and spare > 0 and total > 0:
            shares = {i: spare * kept[i].weight / total for i in plotted}
            given = {i: int(shares[i]) for i in plotted}
            # Largest remainders get the rows that rounding down left over.
            left = spare - sum(given.values())
            for i in sorted(plotted, key=lambda i: shares[i] - given[i], reverse=True)[:left]:
                given[i] += 1
            for i in plotted:
                lines[i] += given[i]
        return lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = _width(None, options)
        t0, t1 = self.t_start, self.t_end
        kept = self._chosen(width)
        allotted = self._allot(kept, width)
        plots = {i: _Plot(s.series, t0, t1, n - 1, s.unit, s.y_max) for i, (s, n) in enumerate(zip(kept, allotted)) if not s.reason}
        # One label width for all strips: the same plot columns in each.
        label_w, plot_w = _plot_width(width, max((p.label_width for p in plots.values()), default=0))
        lines: list[Text] = []
        for i, (strip, n) in enumerate(zip(kept, allotted)):
            if strip.reason:
                lines.extend(self._na_block(strip, width, n))
                continue
            lines.append(_fitted_legend(strip, width))
            lines.extend(plots[i].lines(label_w, plot_w))
        lines.extend(Text("") for _ in range(self.height - 1 - len(lines)))
        lines.append(_axis_line(t0, t1, label_w, plot_w))
        yield from _fit(lines, width)


def _fitted_legend(strip: Strip, width: int) -> Text:
    """The most complete legend that fits: the note goes first, then the
    spacing, then the title (the y labels still give the unit)."""
    choices = [
        _legend(strip.title, strip.series, strip.note),
        _legend(strip.title, strip.series),
        _legend(strip.title, strip.series, sep=" "),
        _legend("", strip.series, sep=" "),
    ]
    return next((c for c in choices if c.cell_len <= width), choices[-1])


def _console_for(width: int) -> Console:
    """A console that only measures and wraps text (nothing is printed)."""
    return Console(width=width, color_system=None, file=io.StringIO(), legacy_windows=False)


class Gauge(_Sized):
    """A 0..1 ratio as a bar with a percent: green < 0.3, yellow < 0.6, red above.

    Args:
        value: the ratio; None (or NaN) shows "n/a — reason", dimmed.
        width: cells to use at most; None for all that Rich offers.
        reason: why the value is missing.
        label: text before the bar.
    """

    def __init__(self, value: float | None, width: int | None = None, reason: str | None = None, label: str = "fragmentation") -> None:
        self.value = value
        self.width = width
        self.reason = reason
        self.label = label

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = _width(self.width, options)
        if _missing(self.value):
            text = f"{self.label} n/a" + (f" — {self.reason}" if self.reason else "")
            yield from _fit([Text(text, style="dim")], width)
            return
        value = float(self.value)  # type: ignore[arg-type]
        style = "green" if value < 0.3 else "yellow" if value < 0.6 else "red"
        pct = f" {_pct(100 * value):>4}"
        label = f"{self.label} " if width - cell_len(self.label) - 1 - len(pct) >= 4 else ""
        bar_w = width - cell_len(label) - len(pct)
        line = Text(label)
        if bar_w >= 1:
            line.append_text(_hbar(value, bar_w, style))
        line.append(pct, style=f"bold {style}")
        yield from _fit([line], width)


#: A gap between two buffers wider than this separates address regions: on
#: CPU, malloc arenas and mmap'd blocks lie terabytes apart, and a span across
#: them says nothing about how the memory is used.
REGION_GAP_BYTES = 64 << 20


class MemoryMap(_Sized):
    """Live buffers of one device in address order, as a strip of shaded cells.

    Each cell shows how much of its address span buffers cover: █ full,
    ▓ ≥ 2/3, ▒ ≥ 1/3, ░ some, a dim "·" none, a dim "≈" where a compressed
    gap left address space out. Then a caption: which buffers the strip
    places and of how many, their bytes, the span (or, across compressed
    gaps between regions, the number of regions), and why the others have
    no place. Only buffers with an address can be drawn, so without the
    "why" the map would contradict the live bytes shown next to it.

    Args:
        buffers: ``(ptr, nbytes)`` pairs; overlaps and duplicates are allowed.
        width: cells per row at most; None for all that Rich offers.
        rows: lines the strip wraps over.
        total_hint: bytes of all live buffers of the scan, placed or not;
            the caption says how much of it the map places.
        style: style of the covered cells.
        count: live buffers of the scan, placed or not (None: unknown).
        unmapped: buffers without their own address in the scan, by kind:
            ``not_ready`` (still being computed), ``last_address`` (being
            computed again: drawn at the address last seen), ``sharded``
            (shards of multi-device arrays).
        complete: False when ``buffers`` lists only the largest ones.
        caption_lines: lines the caption may use (1 or 2): with 2, why some
            buffers are not placed gets a line of its own.
    """

    def __init__(self, buffers: Iterable[Sequence[int]], width: int | None = None, rows: int = 2, total_hint: int | None = None,
                 style: str = "cyan", count: int | None = None, unmapped: dict[str, int] | None = None, complete: bool = True,
                 caption_lines: int = 1) -> None:
        self.buffers = list(buffers)
        self.width = width
        self.rows = max(1, rows)
        self.total_hint = total_hint
        self.style = style
        self.count = count
        self.unmapped = {k: int(v) for k, v in (unmapped or {}).items() if v}
        self.complete = complete
        self.caption_lines = max(1, caption_lines)
        self._entries = sorted({(int(p), int(n)) for p, n in self.buffers if p is not None and n is not None and n > 0})

    @property
    def has_note(self) -> bool:
        """True when the caption has to say why buffers are missing from the strip."""
        return bool(self._why(short=True))

    def _unexplained(self) -> int:
        """Live buffers neither placed nor accounted for by ``unmapped``."""
        if self.count is None or not self.complete:
            return 0
        skipped = self.unmapped.get("not_ready", 0) + self.unmapped.get("sharded", 0)
        return max(0, self.count - len(self._entries) - skipped)

    def _why(self, short: bool, placed: bool = True) -> str:
        """Why some live buffers are not (or not exactly) where the strip puts them."""
        u = self.unmapped
        parts = []
        if u.get("not_ready"):
            n = u["not_ready"]
            parts.append(f"{n} computing" if short else f"{n} buffer{_s(n)} still computing" + (", no address yet" if placed else ""))
        if u.get("last_address"):
            n = u["last_address"]
            parts.append(f"{n} at last address" if short else f"{n} computing again, drawn at last scan's address")
        if u.get("sharded"):
            n = u["sharded"]
            parts.append(f"{n} shard{_s(n)} unplaced" if short else f"{n} shard{_s(n)} of sharded arrays have no address")
        if self._unexplained():
            n = self._unexplained()
            parts.append(f"{n} unplaced" if short else f"{n} without an address")
        return ", ".join(parts)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = _width(self.width, options)
        entries = self._entries
        if not entries:
            yield from _fit([Text(c, style="dim") for c in self._empty_caption(width)], width)
            return
        # The union of [ptr, ptr + n): overlapping entries must not count twice.
        merged: list[list[int]] = []
        for ptr, n in entries:
            if merged and ptr <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], ptr + n)
            else:
                merged.append([ptr, ptr + n])
        used = sum(end - start for start, end in merged)
        span = merged[-1][1] - merged[0][0]
        # Gaps as Python ints first: addresses may exceed float64's exact range.
        gap_ints = [b[0] - a[1] for a, b in zip(merged, merged[1:])]
        real_gaps = np.array(gap_ints, dtype=np.float64)
        regions = 1 + sum(g > REGION_GAP_BYTES for g in gap_ints)
        lengths = np.array([end - start for start, end in merged], dtype=np.float64)
        # Two clusters terabytes apart would turn every cell into a gap; past
        # 64x, clamp each gap to the median buffer so the buffers stay visible.
        compressed = span > 64 * used
        shown = np.minimum(real_gaps, statistics.median(n for _, n in entries)) if compressed else real_gaps
        # Along this axis "bytes covered so far" is piecewise linear between
        # buffer edges, so np.interp measures any cell exactly.
        starts = np.concatenate([[0.0], np.cumsum(lengths[:-1] + shown)])
        done = np.concatenate([[0.0], np.cumsum(lengths)[:-1]])
        xs = np.column_stack([starts, starts + lengths]).ravel()
        covered = np.column_stack([done, done + lengths]).ravel()
        cells = width * self.rows
        edges = np.linspace(0.0, xs[-1], cells + 1)
        share = np.diff(np.interp(edges, xs, covered)) / (xs[-1] / cells)
        chars = np.select([share >= 1 - 1e-9, share >= 2 / 3, share >= 1 / 3, share > 0], ["█", "▓", "▒", "░"], "·")
        # A break mark where a compressed gap left address space out.
        centres = (edges[:-1] + edges[1:]) / 2
        for i in np.flatnonzero(shown < real_gaps):
            chars[(centres >= starts[i] + lengths[i]) & (centres < starts[i + 1]) & (share == 0)] = "≈"
        strip = [(str(ch), "dim" if ch in "·≈" else self.style) for ch in chars]
        lines = [_runs(strip[r * width : (r + 1) * width]) for r in range(self.rows)]
        extent = _Extent(len(entries), used, span, compressed, regions if compressed else 1)
        lines.extend(Text(c, style="dim") for c in self._caption(extent, width))
        yield from _fit(lines, width)

    def _empty_caption(self, width: int) -> list[str]:
        """Nothing to draw: no buffers at all, or none with an address yet."""
        live = (self.count or 0) > 0 or (not _missing(self.total_hint) and self.total_hint > 0)  # type: ignore[operator]
        if not live:
            return ["no live buffers"]
        if not self.unmapped:
            what = f"{self.count} buffer{_s(self.count)}" if self.count else fmt_bytes(self.total_hint)
            return [_longest([f"no buffer addresses in this scan ({what} live)", "no buffer addresses yet"], width)]
        # Buffers still computing get one soon; shards never do.
        yet = " yet" if self.unmapped.get("not_ready") else ""
        why, short = self._why(short=False, placed=False), self._why(short=True)
        one_line = f"no buffer addresses{yet}: {why}"
        if cell_len(one_line) <= width or self.caption_lines < 2:
            return [_longest([one_line, f"no addresses{yet}: {short}"], width)]
        return [f"no buffer addresses{yet}:", _longest([why, short], width)]

    def _caption(self, e: _Extent, width: int) -> list[str]:
        """The caption's lines: what the strip shows, then why some buffers are missing."""
        partial = self.count is not None and self.count > e.placed
        if partial and not self.complete:
            who, who_short = f"largest {e.placed} of {self.count} buffers", f"largest {e.placed}/{self.count}"
        elif partial:
            who, who_short = f"{e.placed} of {self.count} buffers placed", f"{e.placed}/{self.count} placed"
        else:
            who = who_short = f"{e.placed} buffer{_s(e.placed)}"
        main = self._main_choices(e, who, who_short, says_placed=partial and self.complete)
        why, why_short = self._why(short=False), self._why(short=True)
        if not why:
            return [_longest(main, width)]
        if self.caption_lines >= 2:
            return [_longest(main, width), _longest([why, why_short], width)]
        # One line: which buffers are placed and why the others are not
        # outlive the sizes (main[:3] still name the buffers, main[3:] not).
        choices = [f"{m} · {why}" for m in main[:3]] + [f"{m} · {why_short}" for m in main[:3]]
        return [_longest(choices + [f"{who_short} · {why_short}"], width)]

    def _main_choices(self, e: _Extent, who: str, who_short: str, says_placed: bool) -> list[str]:
        """What the strip shows, from the most to the least detailed.

        Args:
            e: what the strip covers.
            who: the buffers placed ("7 of 10 buffers placed", "200 buffers").
            who_short: a short form of ``who``.
            says_placed: whether ``who`` already says "placed".

        Returns:
            Five choices; the first three name the buffers (``who``).
        """
        total = None if _missing(self.total_hint) else int(self.total_hint)  # type: ignore[arg-type]
        used = fmt_bytes(e.used)
        gap = f"{_pct(100 * (e.span - e.used) / e.span) if e.span else '0%'} gaps"
        if e.regions > 1:
            # Across compressed gaps between regions a span is terabytes of
            # nothing: the count of regions is what means something, and it
            # says that the gaps between them are left out.
            where_long = where = f" in {e.regions} regions"
            tail = ""
        else:
            where_long, where = None, None
            tail = ", gaps compressed" if e.compressed else ""
        if total is None or total <= e.used:
            where_long = where_long or f" of {fmt_bytes(e.span)} span ({gap})"
            where = where or f" of {fmt_bytes(e.span)} span"
            return [
                f"{who}, {used} used{where_long}{tail}",
                f"{who}, {used}{where}{tail}",
                f"{who_short}, {used}{where}{tail}",
                f"{who_short}, {used}{tail}",
                f"{used}{tail}",
            ]
        # The strip holds only the placed buffers: their bytes against all
        # live bytes, so that the figure beside "in use" does not look wrong.
        size = f"{used} of {fmt_bytes(total)}"
        placed_size = size if says_placed else f"placed: {size}"
        where_long = where_long or f", span {fmt_bytes(e.span)} ({gap})"
        where = where or ""
        return [
            f"{who}, {placed_size}{where_long}{tail}",
            f"{who}, {placed_size}{where}{tail}",
            f"{who_short}, {size}{where}{tail}",
            f"{who_short}, {size}{tail}",
            f"{size}{tail}",
        ]


@dataclass(frozen=True)
class _Extent:
    """What a memory map's strip covers: placed buffers, their bytes, the span."""

    placed: int
    used: int
    span: int
    compressed: bool
    regions: int


def _s(n: int | None) -> str:
    return "" if n == 1 else "s"


def _longest(choices: Sequence[str], width: int) -> str:
    """The first (most detailed) choice that fits in ``width`` cells, else the last."""
    return next((c for c in choices if cell_len(c) <= width), choices[-1])


class MiniBars(_Sized):
    """A one-row history of small rates: one eighth-block bar per value.

    The newest values are kept when there are more than cells; None (or NaN)
    is a blank, zero a dim baseline "▁" so that "none" differs from "unknown".

    Args:
        values: oldest first.
        width: cells to use; None for one per value.
        style: style of the bars.
    """

    def __init__(self, values: Sequence[float | None], width: int | None = None, style: str = "cyan") -> None:
        self.values = list(values)
        self.width = width
        self.style = style

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        width = max(1, min(self.width or len(self.values) or 1, options.max_width))
        return Measurement(width, width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = _width(self.width or max(1, len(self.values)), options)
        values = self.values[-width:]
        top = max((float(v) for v in values if not _missing(v)), default=0.0)  # type: ignore[arg-type]
        line = Text(" " * (width - len(values)))
        for v in values:
            if _missing(v):
                line.append(" ")
            elif top <= 0 or v <= 0:  # type: ignore[operator]
                line.append("▁", style=f"dim {self.style}")
            else:
                line.append(V_EIGHTHS[max(1, round(float(v) / top * 8))], style=self.style)  # type: ignore[arg-type]
        yield from _fit([line], width)
