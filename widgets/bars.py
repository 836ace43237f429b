"""Bars: memory layers against a limit, a ratio gauge, a row of small rates.

Each takes plain numbers and a width and draws into what Rich offers, never
wider; a value not measured (None, NaN, infinity) is drawn as "n/a" or a
blank, never as zero, and an integer too large for a float draws as the
largest value there is rather than raising.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.text import Text

from jaxtop.widgets.cells import V_EIGHTHS, Sized, draw_width, fit, hbar
from jaxtop.widgets.fmt import fmt_bytes, longest, pct
from jaxtop.widgets.safe_math import float_of, percent
from jaxtop.wire.units import is_missing

__all__ = ["Gauge", "LayersBar", "MiniBars"]


class LayersBar(Sized):
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
        width = draw_width(self.width, options)
        has_limit = not is_missing(self.limit) and self.limit > 0  # type: ignore[operator]
        values = [None if is_missing(layer[1]) else float_of(layer[1]) for layer in self.layers]
        scale = float_of(self.limit) if has_limit else max((v for v in values if v is not None), default=0.0)
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
                line.append_text(hbar(value / scale if scale > 0 else 0.0, bar_w, style))
                line.append(" ")
            line.append(f"{fmt_bytes(value):>{size_w}}")
            if pct_w:
                line.append(f" {pct(percent(value, scale)):>4}", style="dim")
            lines.append(line)
        if has_limit:
            lines.append(Text(f"limit {fmt_bytes(self.limit)}", style="dim"))
        else:
            note = longest(["limit n/a (bars scaled to the largest value)", "limit n/a (bars scaled to the largest)", "limit n/a"], width)
            lines.append(Text(note, style="dim"))
        yield from fit(lines, width)


class Gauge(Sized):
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
        width = draw_width(self.width, options)
        if is_missing(self.value):
            text = f"{self.label} n/a" + (f" — {self.reason}" if self.reason else "")
            yield from fit([Text(text, style="dim")], width)
            return
        value = float_of(self.value)
        style = "green" if value < 0.3 else "yellow" if value < 0.6 else "red"
        pct_text = f" {pct(100 * value):>4}"
        label = f"{self.label} " if width - cell_len(self.label) - 1 - len(pct_text) >= 4 else ""
        bar_w = width - cell_len(label) - len(pct_text)
        line = Text(label)
        if bar_w >= 1:
            line.append_text(hbar(value, bar_w, style))
        line.append(pct_text, style=f"bold {style}")
        yield from fit([line], width)


class MiniBars(Sized):
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
        width = draw_width(self.width or max(1, len(self.values)), options)
        values = [None if is_missing(v) else float_of(v) for v in self.values[-width:]]
        top = max((v for v in values if v is not None), default=0.0)
        line = Text(" " * (width - len(values)))
        for v in values:
            if v is None:
                line.append(" ")
            elif top <= 0 or v <= 0:
                line.append("▁", style=f"dim {self.style}")
            else:
                line.append(V_EIGHTHS[max(1, round(v / top * 8))], style=self.style)
        yield from fit([line], width)
