"""Drawing primitives the renderables share: eighth-block characters, the
width to draw in, lines cut to it, a bar, runs of styled cells."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import groupby

from rich.console import Console, ConsoleOptions
from rich.measure import Measurement
from rich.style import Style
from rich.text import Text

__all__ = ["H_EIGHTHS", "V_EIGHTHS", "Sized", "draw_width", "fit", "hbar", "runs"]

H_EIGHTHS = " ▏▎▍▌▋▊▉█"  # index = eighths of a cell filled from the left
V_EIGHTHS = " ▁▂▃▄▅▆▇█"  # index = eighths of a cell filled from the bottom


def draw_width(requested: int | None, options: ConsoleOptions) -> int:
    """The width to draw in: the caller's wish, never more than Rich offers."""
    width = options.max_width if requested is None else min(requested, options.max_width)
    return max(1, width)


def fit(lines: Iterable[Text], width: int) -> Iterator[Text]:
    """Yield lines cut to ``width`` cells so that Rich never wraps them."""
    for line in lines:
        line.no_wrap = True
        line.overflow = "ellipsis"
        line.end = "\n"
        line.truncate(width, overflow="ellipsis")
        yield line


def hbar(fraction: float, width: int, style: str) -> Text:
    """A left-to-right bar of ``width`` cells with 1/8-cell precision.

    Args:
        fraction: the filled share, clamped to 0..1; NaN draws empty.
        width: cells of the bar, track included.
        style: style of the filled part.
    """
    if fraction != fraction:
        fraction = 0.0  # NaN: an undefined share, not a full bar
    eighths = round(min(max(fraction, 0.0), 1.0) * width * 8)
    if fraction > 0 and eighths == 0:
        eighths = 1  # a non-zero value must never look like zero
    full, part = divmod(eighths, 8)
    bar = Text("█" * full + (H_EIGHTHS[part] if part else ""), style=style)
    # A dim track shows where 100% is, which a bare bar cannot.
    bar.append("·" * (width - bar.cell_len), style="dim")
    return bar


def runs(cells: Sequence[tuple[str, str | Style]]) -> Text:
    """One Text from (character, style) cells, merging runs of equal style."""
    text = Text()
    for style, run in groupby(cells, key=lambda cell: cell[1]):
        text.append("".join(ch for ch, _ in run), style=style)
    return text


class Sized:
    """Reports a fixed width to Rich tables when the caller gave one."""

    width: int | None

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        if self.width is None:
            return Measurement(1, options.max_width)
        width = max(1, min(self.width, options.max_width))
        return Measurement(width, width)
