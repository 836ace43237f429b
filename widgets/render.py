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

__all__ = ["Gauge", "LayersBar", "MemoryMap", "MiniBars", "Series", "Timeline", "fmt_bytes", "fmt_duration", "fmt_rate"]

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
            lines.append(Text("limit n/a (bars scaled to the largest value)", style="dim"))
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


class Timeline:
    """A chart of min/max series over time, with a y axis, x axis and legend.

    Exactly ``height`` lines (at least 3): the title and legend, ``height - 2``
    plot rows, and the x axis with relative time labels ("-10m", "-5m", "now").

    Args:
        series: what to draw; "fill" series first, "line" markers on top.
        t_start: left edge of the window, Unix seconds.
        t_end: right edge ("now").
        height: total lines to draw.
        unit: "bytes" for binary sizes on the y axis, else a unit appended to
            plain numbers ("/s" gives "12.3/s").
        title: text before the legend.
    """

    def __init__(self, series: Sequence[Series], t_start: float, t_end: float, height: int, unit: str = "bytes", title: str = "") -> None:
        self.series = list(series)
        self.t_start = float(t_start)
        self.t_end = float(t_end)
        self.height = height
        self.unit = unit
        self.title = title

    def _fmt(self, v: float) -> str:
        if self.unit == "bytes":
            return fmt_bytes(v)
        sep = "" if not self.unit or self.unit.startswith("/") else " "
        return f"{_si3(v)}{sep}{self.unit}"

    def _legend(self) -> Text:
        line = Text(self.title, style="bold")
        for s in self.series:
            if line.plain:
                line.append("  ")
            line.append("█ " if s.kind == "fill" else "─ ", style=s.style)
            line.append(s.name, style=s.style)
        return line

    def _axis(self, plot_w: int) -> str:
        """The x axis: "-10m────-5m────now" fitted to ``plot_w`` cells."""
        chars = ["─"] * plot_w
        span = self.t_end - self.t_start
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

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = _width(None, options)
        rows = max(1, self.height - 2)
        t0, t1 = self.t_start, self.t_end
        points = [_in_window(s, t0, t1) for s in self.series]
        # The scale comes from the raw points, so it does not depend on the
        # plot width (which depends on the width of the y labels).
        scale = max((float(p[2].max()) for p in points if len(p[0])), default=math.nan)
        has_data = math.isfinite(scale)
        if has_data and scale <= 0:
            scale = 1.0  # all zero: draw at the bottom rather than divide by 0
        labels: dict[int, str] = {}
        if has_data:
            labels[0] = self._fmt(scale)
            if rows >= 2:
                labels[rows - 1] = self._fmt(0)
            if rows >= 3:
                # Row rows//2 holds scale/2: at its centre when rows is odd,
                # at its top edge when even (as the top label is row 0's).
                labels[rows // 2] = self._fmt(scale / 2)
        label_w = max((cell_len(v) for v in labels.values()), default=0)
        if width - label_w - 2 < 8:
            label_w = 0  # too narrow for labels: keep the plot
        plot_w = max(1, width - (label_w + 2 if label_w else 1))

        grid: list[list[tuple[str, str | Style]]] = [[(" ", "")] * plot_w for _ in range(rows)]
        full = rows * 8

        def level(v: float) -> int:
            e = min(full, max(0, round(v / scale * full)))
            return 1 if v > 0 and e == 0 else e  # non-zero never draws as zero

        columns = [_columns(*p, t0, t1, plot_w) for p in points]
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
                    style: str | Style = s.style
                    if under_ch == "█":  # keep the fill visible behind the marker
                        style = Style.parse(s.style) + Style(bgcolor=Style.parse(str(under_style)).color)
                    grid[r][c] = ("─", style)

        lines = [self._legend()]
        for r in range(rows):
            if label_w:
                tick = "┤" if r in labels else "│"
                line = Text(f"{labels.get(r, ''):>{label_w}} {tick}", style="dim")
            else:
                line = Text("│", style="dim")
            if not has_data and r == rows // 2:
                line.append("no data".center(plot_w), style="dim")
            else:
                line.append_text(_runs(grid[r]))
            lines.append(line)
        prefix = " " * label_w + " └" if label_w else "└"
        lines.append(Text(prefix + self._axis(plot_w), style="dim"))
        yield from _fit(lines, width)


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


class MemoryMap(_Sized):
    """Live buffers of one device in address order, as a strip of shaded cells.

    Each cell shows how much of its address span buffers cover: █ full,
    ▓ ≥ 2/3, ▒ ≥ 1/3, ░ some, a dim "·" none, a dim "≈" where a compressed
    gap left address space out. Then a caption: the count, the bytes used,
    the span and its share of gaps.

    Args:
        buffers: ``(ptr, nbytes)`` pairs; overlaps and duplicates are allowed.
        width: cells per row at most; None for all that Rich offers.
        rows: lines the strip wraps over.
        total_hint: bytes of all live buffers when ``buffers`` lists only some
            (the agent sends the largest 2000); the caption then gives it.
        style: style of the covered cells.
    """

    def __init__(self, buffers: Iterable[Sequence[int]], width: int | None = None, rows: int = 2, total_hint: int | None = None, style: str = "cyan") -> None:
        self.buffers = list(buffers)
        self.width = width
        self.rows = max(1, rows)
        self.total_hint = total_hint
        self.style = style

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = _width(self.width, options)
        entries = sorted({(int(p), int(n)) for p, n in self.buffers if p is not None and n is not None and n > 0})
        if not entries:
            yield from _fit([Text("no live buffers", style="dim")], width)
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
        real_gaps = np.array([b[0] - a[1] for a, b in zip(merged, merged[1:])], dtype=np.float64)
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
        lines.append(Text(self._caption(len(entries), used, span, compressed, width), style="dim"))
        yield from _fit(lines, width)

    def _caption(self, count: int, used: int, span: int, compressed: bool, width: int) -> str:
        """The longest of a few captions that fits in ``width`` cells."""
        gap = f"{_pct(100 * (span - used) / span) if span else '0%'} gaps"
        what = f"{count} buffer{'s' if count != 1 else ''}"
        sizes = f"{fmt_bytes(used)} of {fmt_bytes(span)}"
        tail = ", gaps compressed" if compressed else ""
        hint = "" if _missing(self.total_hint) else f"; {fmt_bytes(self.total_hint)} live in all"
        # Compression matters more than the gap share: it changes how to read
        # the strip, so it survives longest as the width shrinks.
        choices = [
            f"{what}, {fmt_bytes(used)} used of {fmt_bytes(span)} span ({gap}){tail}{hint}",
            f"{what}, {sizes} ({gap}){tail}",
            f"{what}, {sizes}{tail}" if compressed else f"{sizes} ({gap})",
            f"{sizes}{tail}",
        ]
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
