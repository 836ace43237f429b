"""The memory map: live buffers of one device in address order, as a strip
of shaded cells with a caption saying what it places and what it cannot.

Addresses and sizes stay Python integers until the strip is measured: they
may exceed float64's exact range, and a hostile recording may hold integers
beyond any float (``10**4000``), which are then measured in a coarser unit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

from jaxtop.widgets.cells import Sized, draw_width, fit, runs
from jaxtop.widgets.fmt import fmt_bytes, fmt_count, longest, pct, plural_s
from jaxtop.widgets.safe_math import percent
from jaxtop.wire.units import is_missing

__all__ = ["REGION_GAP_BYTES", "MemoryMap"]

#: A gap between two buffers wider than this separates address regions: on
#: CPU, malloc arenas and mmap'd blocks lie terabytes apart, and a span across
#: them says nothing about how the memory is used.
REGION_GAP_BYTES = 64 << 20

#: Below one in this many of the scan's bytes placed, no strip is drawn (its
#: cells would stand for buffers the map cannot place). An integer: sizes
#: may be integers beyond a float's range.
MIN_PLACED_FRACTION = 10

# Floats reach 2**1024; measured in units of 2**(bits - _FLOAT_BITS) bytes,
# any span keeps its cumulative sums well inside that.
_FLOAT_BITS = 960


class MemoryMap(Sized):
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
            A pair with a value not measured (None, NaN, infinity) is skipped.
        width: cells per row at most; None for all that Rich offers.
        rows: lines the strip wraps over.
        total_hint: bytes of all live buffers of the scan, placed or not;
            the caption says how much of it the map places.
        style: style of the covered cells.
        count: live buffers of the scan, placed or not (None: unknown).
        unmapped: buffers without their own address in the scan, by kind:
            ``not_ready`` (still being computed), ``last_address`` (being
            computed again: drawn at the address last seen), ``sharded``
            (shards of multi-device arrays), ``no_address`` (arrays jax
            assembled in Python, e.g. ``device_put`` of host data, and
            before jaxlib 0.10.1 every array: asking their address would
            add an Array to the program's ``jax.live_arrays()``).
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
        self.total_hint = None if is_missing(total_hint) else total_hint
        self.style = style
        # Counts as integers: a float count beside integer ones of any size
        # would have to become a float, which they may not fit.
        self.count = None if is_missing(count) else int(count)
        self.unmapped = {k: int(v) for k, v in (unmapped or {}).items() if not is_missing(v) and v}
        self.complete = complete
        self.caption_lines = max(1, caption_lines)
        self._entries = sorted({(int(p), int(n)) for p, n in self.buffers if not is_missing(p) and not is_missing(n) and n > 0})

    @property
    def has_note(self) -> bool:
        """True when the caption has to say why buffers are missing from the strip."""
        return bool(self._why(short=True))

    def _unexplained(self) -> int:
        """Live buffers neither placed nor accounted for by ``unmapped``."""
        if self.count is None or not self.complete:
            return 0
        skipped = self.unmapped.get("not_ready", 0) + self.unmapped.get("sharded", 0) + self.unmapped.get("no_address", 0)
        return max(0, self.count - len(self._entries) - skipped)

    def _why(self, short: bool, placed: bool = True) -> str:
        """Why some live buffers are not (or not exactly) where the strip puts them."""
        u = self.unmapped
        parts = []
        if u.get("not_ready"):
            n, s = fmt_count(u["not_ready"]), plural_s(u["not_ready"])
            parts.append(f"{n} computing" if short else f"{n} buffer{s} still computing" + (", no address yet" if placed else ""))
        if u.get("last_address"):
            n = fmt_count(u["last_address"])
            parts.append(f"{n} at last address" if short else f"{n} computing again, drawn at last scan's address")
        if u.get("sharded"):
            n, s = fmt_count(u["sharded"]), plural_s(u["sharded"])
            parts.append(f"{n} shard{s} unplaced" if short else f"{n} shard{s} of sharded arrays have no address")
        if u.get("no_address"):
            n, s = fmt_count(u["no_address"]), plural_s(u["no_address"])
            parts.append(f"{n} not asked" if short else
                         f"{n} buffer{s} not asked (asking adds arrays to the program's live_arrays)")
        if self._unexplained():
            n = fmt_count(self._unexplained())
            parts.append(f"{n} unplaced" if short else f"{n} without an address")
        return ", ".join(parts)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = draw_width(self.width, options)
        entries = self._entries
        if not entries:
            yield from fit([Text(c, style="dim") for c in self._empty_caption(width)], width)
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
        regions = 1 + sum(g > REGION_GAP_BYTES for g in gap_ints)
        # Every length, gap and size is at most the span. Ordinary spans are
        # measured in bytes (unit 1, and int / 1 is float(int) exactly);
        # beyond a float's range, in a unit that brings the span within it.
        unit = 1 << max(0, span.bit_length() - _FLOAT_BITS)
        real_gaps = np.array([g / unit for g in gap_ints], dtype=np.float64)
        lengths = np.array([(end - start) / unit for start, end in merged], dtype=np.float64)
        # Two clusters terabytes apart would turn every cell into a gap; past
        # 64x, clamp each gap to the median buffer so the buffers stay visible.
        compressed = span > 64 * used
        shown = np.minimum(real_gaps, _median_size(entries, unit)) if compressed else real_gaps
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
        lines = [runs(strip[r * width : (r + 1) * width]) for r in range(self.rows)]
        if not is_missing(self.total_hint) and self.total_hint > 0 and used * MIN_PLACED_FRACTION < self.total_hint:
            # A few bytes placed out of many (one shard of a sharded array
            # with an address) would fill the strip with a full bar, as if
            # the device's memory were one solid block: no strip, the caption.
            lines = [Text(f"no map: {pct(percent(used, self.total_hint))} of the bytes have an address",
                          style="dim", no_wrap=True, overflow="ellipsis")]
            lines += [Text("") for _ in range(self.rows - 1)]  # the panel's layout stays as it was
        extent = _Extent(len(entries), used, span, compressed, regions if compressed else 1)
        lines.extend(Text(c, style="dim") for c in self._caption(extent, width))
        yield from fit(lines, width)

    def _empty_caption(self, width: int) -> list[str]:
        """Nothing to draw: no buffers at all, or none with an address yet."""
        live = (self.count or 0) > 0 or (self.total_hint is not None and self.total_hint > 0)
        if not live:
            return ["no live buffers"]
        if not self.unmapped:
            what = f"{fmt_count(self.count)} buffer{plural_s(self.count)}" if self.count else fmt_bytes(self.total_hint)
            return [longest([f"no buffer addresses in this scan ({what} live)", "no buffer addresses yet"], width)]
        # Buffers still computing get one soon; shards never do.
        yet = " yet" if self.unmapped.get("not_ready") else ""
        why, short = self._why(short=False, placed=False), self._why(short=True)
        one_line = f"no buffer addresses{yet}: {why}"
        if cell_len(one_line) <= width or self.caption_lines < 2:
            return [longest([one_line, f"no addresses{yet}: {short}"], width)]
        return [f"no buffer addresses{yet}:", longest([why, short], width)]

    def _caption(self, e: _Extent, width: int) -> list[str]:
        """The caption's lines: what the strip shows, then why some buffers are missing."""
        partial = self.count is not None and self.count > e.placed
        count = fmt_count(self.count)
        if partial and not self.complete:
            who, who_short = f"largest {e.placed} of {count} buffers", f"largest {e.placed}/{count}"
        elif partial:
            who, who_short = f"{e.placed} of {count} buffers placed", f"{e.placed}/{count} placed"
        else:
            who = who_short = f"{e.placed} buffer{plural_s(e.placed)}"
        main = self._main_choices(e, who, who_short, says_placed=partial and self.complete)
        why, why_short = self._why(short=False), self._why(short=True)
        if not why:
            return [longest(main, width)]
        if self.caption_lines >= 2:
            return [longest(main, width), longest([why, why_short], width)]
        # One line: which buffers are placed and why the others are not
        # outlive the sizes (main[:3] still name the buffers, main[3:] not).
        choices = [f"{m} · {why}" for m in main[:3]] + [f"{m} · {why_short}" for m in main[:3]]
        return [longest(choices + [f"{who_short} · {why_short}"], width)]

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
        total = None if self.total_hint is None else int(self.total_hint)
        used = fmt_bytes(e.used)
        # Integer division is exact at any size, and the gaps are at most the span.
        gap = f"{pct(percent(e.span - e.used, e.span)) if e.span else '0%'} gaps"
        if e.regions > 1:
            # Across compressed gaps between regions a span is terabytes of
            # nothing: the count of regions is what means something, and it
            # says that the gaps between them are left out.
            where_long = where = f" in {fmt_count(e.regions)} regions"
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


def _median_size(entries: Sequence[tuple[int, int]], unit: int) -> float:
    """The median buffer size in ``unit``: ``statistics.median`` of the sizes,
    divided as integers so that sizes beyond a float's range do not overflow."""
    sizes = sorted(n for _, n in entries)
    mid = len(sizes) // 2
    return sizes[mid] / unit if len(sizes) % 2 else (sizes[mid - 1] + sizes[mid]) / (2 * unit)
