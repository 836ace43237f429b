"""The plot under a timeline: series of min/max points binned into columns,
drawn in eighth blocks with y labels, a legend line and a time axis.

:class:`jaxtop.widgets.timelines.Timeline` and ``TimelineStack`` arrange
these parts; this module turns points into cells.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from rich.cells import cell_len
from rich.style import Style
from rich.text import Text

from jaxtop.widgets.cells import V_EIGHTHS, runs
from jaxtop.widgets.fmt import ago, axis_value
from jaxtop.widgets.safe_math import FLOAT_MAX, float_of
from jaxtop.wire.units import is_missing

__all__ = ["Plot", "Series", "axis_line", "legend", "plot_width"]


@dataclass(frozen=True, eq=False)
class Series:
    """One series of a :class:`~jaxtop.widgets.timelines.Timeline`: per point a time and a min/max.

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


def _floats(values: Sequence[float]) -> np.ndarray:
    """``values`` as float64; an integer beyond a float's range (numpy refuses
    it) becomes the largest float of its sign, None becomes NaN."""
    try:
        return np.asarray(values, dtype=np.float64)
    except OverflowError:
        return np.array([float_of(v) for v in values], dtype=np.float64)


def _in_window(s: Series, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The points of ``s`` inside [t0, t1] that carry a value, sorted by time."""
    n = min(len(s.t), len(s.lo), len(s.hi))
    t, lo, hi = _floats(s.t[:n]), _floats(s.lo[:n]), _floats(s.hi[:n])
    if not math.isfinite(t1 - t0):
        # A window without finite edges has no columns to put points in.
        t, lo, hi = t[:0], lo[:0], hi[:0]
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
    # Multiplied first, as always; divided first only where the product
    # would overflow (a window of 1e308 s in a hostile recording).
    starts = t0 + (np.arange(cols) * span / cols if span < FLOAT_MAX / cols else np.arange(cols) * (span / cols))
    k = np.searchsorted(t, starts, side="right") - 1
    kc = np.maximum(k, 0)
    held = ~has & (k >= 0) & (starts < t[kc] + cover[kc])
    hi_col[held], lo_col[held] = hi[kc[held]], lo[kc[held]]
    return lo_col, hi_col


def legend(title: str, series: Sequence[Series], note: str = "", sep: str = "  ") -> Text:
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
    right, left, mid = "now", f"-{ago(span)}", f"-{ago(span / 2)}"
    if len(right) <= plot_w:
        chars[plot_w - len(right):] = right
    if span > 0 and len(left) + len(right) + 1 <= plot_w:
        chars[: len(left)] = left
        start = plot_w // 2 - len(mid) // 2
        # The middle label only where it leaves a gap on both sides.
        if start > len(left) and start + len(mid) < plot_w - len(right):
            chars[start : start + len(mid)] = mid
    return "".join(chars)


class Plot:
    """The plot rows of one chart: its scale, y labels and cells.

    The scale comes from the raw points (or a fixed ``y_max``), so it does
    not depend on the plot width, which depends on the width of the labels.

    Args:
        series: what to draw; "fill" series first, "line" markers on top.
        t0: left edge of the window, Unix seconds.
        t1: right edge.
        rows: plot rows (at least one is drawn).
        unit: the y labels' unit, as :func:`jaxtop.widgets.fmt.axis_value` takes it.
        y_max: a fixed top of the scale; None (or a value not measured)
            scales to the data in the window.
    """

    def __init__(self, series: Sequence[Series], t0: float, t1: float, rows: int, unit: str, y_max: float | None = None) -> None:
        self.series = list(series)
        self.t0, self.t1 = t0, t1
        self.rows = max(1, rows)
        self.points = [_in_window(s, t0, t1) for s in self.series]
        data_max = max((float(p[2].max()) for p in self.points if len(p[0])), default=math.nan)
        self.has_data = math.isfinite(data_max)
        scale = data_max if is_missing(y_max) else float_of(y_max)
        if self.has_data and scale <= 0:
            scale = 1.0  # all zero: draw at the bottom rather than divide by 0
        self.scale = scale
        self.labels: dict[int, str] = {}
        if self.has_data:
            rows = self.rows
            self.labels[0] = axis_value(scale, unit)
            if rows >= 2:
                self.labels[rows - 1] = axis_value(0, unit)
            if rows >= 3:
                # Row rows//2 holds scale/2: at its centre when rows is odd,
                # at its top edge when even (as the top label is row 0's).
                middle = axis_value(scale / 2, unit)
                # A scale of 1 B reads "1 B / 0 B / 0 B": a middle label that
                # repeats a neighbour's is rounding, not a tick.
                if middle not in (self.labels[0], self.labels.get(rows - 1)):
                    self.labels[rows // 2] = middle

    @property
    def label_width(self) -> int:
        """Cells the widest y label takes (0 without data)."""
        return max((cell_len(v) for v in self.labels.values()), default=0)

    def _grid(self, plot_w: int) -> list[list[tuple[str, str | Style]]]:
        rows, scale = self.rows, self.scale
        grid: list[list[tuple[str, str | Style]]] = [[(" ", "")] * plot_w for _ in range(rows)]
        full = rows * 8

        def level(v: float) -> int:
            # Clamped before rounding: a value far above a fixed y_max gives
            # an infinite level, which round() refuses.
            e = round(min(full, max(0, v / scale * full)))
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
                            # Cells above the column's minimum are the range the
                            # value moved through within the column (a burst of
                            # 33 transfers in one sample of a 10 s bucket), not
                            # what it held: dimmed, and a full one drawn ░ so
                            # that it reads so without colour too.
                            if bottom < lo_level:
                                grid[r][c] = (V_EIGHTHS[n], s.style)
                            else:
                                grid[r][c] = ("░" if n == 8 else V_EIGHTHS[n], f"dim {s.style}")
                else:
                    r = rows - 1 - min(rows - 1, max(e - 1, 0) // 8)
                    under_ch, under_style = grid[r][c]
                    if e == 0 and under_ch != " ":
                        continue  # a zero line would hide the fill it lies on
                    style: str | Style = s.style
                    if under_ch in ("█", "░"):  # keep the fill visible behind the marker
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
                line.append_text(runs(grid[r]))
            out.append(line)
        return out


def plot_width(width: int, label_w: int) -> tuple[int, int]:
    """(label width, plot width): labels go when they would leave under 8 cells."""
    if width - label_w - 2 < 8:
        label_w = 0  # too narrow for labels: keep the plot
    return label_w, max(1, width - (label_w + 2 if label_w else 1))


def axis_line(t0: float, t1: float, label_w: int, plot_w: int) -> Text:
    """The x axis under the plot rows, its corner under their ticks."""
    prefix = " " * label_w + " └" if label_w else "└"
    return Text(prefix + _axis(t0, t1, plot_w), style="dim")
