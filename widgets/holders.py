"""The Holders report: who holds the memory, what grows, who syncs with the host.

A pure Rich renderable of a :class:`~jaxtop.dashboard.holders.HoldersView`:
no Textual, no state. It fits the width it is given (columns drop out, most
detailed first, on narrow screens) and prints times relative to the
process's latest sample, never to the wall clock, so a replay or a test
renders the same text each time.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from jaxtop.dashboard.holders import HoldersView, LabelView, SiteView
from jaxtop.wire.units import fmt_count_rate
from jaxtop.widgets.render import V_EIGHTHS, fmt_bytes, fmt_duration

SUSPECT_STYLE = "bold red"
GROW_STYLE = "yellow"
SHRINK_STYLE = "green"


def sparkline(values: Sequence[float | None], width: int) -> Text:
    """The last ``width`` values as ▁▂▃▄▅▆▇█, scaled from 0 to their maximum.

    An unknown value (None: the site was not listed in that profile) is a
    dim dot, a zero the lowest bar, so that "gone" and "unknown" differ.
    """
    width = max(1, width)
    shown = list(values)[-width:]
    peak = max((v for v in shown if v is not None), default=0.0)
    text = Text(" " * (width - len(shown)))
    for v in shown:
        if v is None:
            text.append("·", style="dim")
        elif peak <= 0:
            text.append(V_EIGHTHS[1])
        else:
            # 1..8 eighths: a site with bytes never draws as empty.
            text.append(V_EIGHTHS[max(1, min(8, round(v / peak * 8)))])
    return text


def _signed_bytes(n: int | None) -> str:
    if n is None:
        return ""
    if n == 0:
        return "±0"
    return ("+" if n > 0 else "") + fmt_bytes(n)


def _signed(n: int | None) -> str:
    if n is None:
        return ""
    return f"{n:+,d}" if n else "±0"


def _pct(share: float | None) -> str:
    if share is None:
        return "n/a"
    value = share * 100
    if 0 < value < 0.1:
        return "<0.1%"
    return f"{value:.1f}%"


def growth_text(site: SiteView) -> str:
    """``+64 arrays/min, +2.0 MiB/min, for 31m00s``; "" without growth."""
    g = site.growth
    if g is None:
        return ""
    parts = []
    if g.count_per_min:
        parts.append(f"{fmt_count_rate(g.count_per_min)} arrays/min")
    if g.bytes_per_min:
        parts.append(f"{_signed_bytes(int(round(g.bytes_per_min)))}/min")
    parts.append(f"for {fmt_duration(g.for_s)}")
    return ", ".join(parts)


def _site_values(site: SiteView, device: str | None) -> tuple[int, int]:
    if device is None:
        return site.bytes, site.count
    return site.devices.get(device, (0, 0))


class HoldersReport:
    """Everything of one :class:`HoldersView`, as lines for a scrolling screen.

    Args:
        view: what to show (None: nothing received yet).
        device: show one device's bytes (a profile ``device`` label), or all.
        max_sites: rows of the site table at most (the rest are summed).
        spark_width: cells of each sparkline (narrow screens get fewer).
    """

    def __init__(self, view: HoldersView | None, device: str | None = None, max_sites: int = 40,
                 spark_width: int = 16) -> None:
        self.view = view
        self.device = device
        self.max_sites = max_sites
        self.spark_width = spark_width

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(20, options.max_width)
        view = self.view
        if view is None or view.empty:
            yield Text("No holders data yet: the agent sends a memory profile every few seconds once the "
                       "program has started JAX (an agent without the holders probe sends none).", style="dim")
            return
        yield from self._summary(view, width)
        yield Text("")
        yield self._sites(view, width)
        yield Text("")
        yield from self._labels(view, width)
        yield Text("")
        yield from self._syncs(view, width)

    # -- summary ------------------------------------------------------------------------
    def _summary(self, view: HoldersView, width: int) -> Iterable[Text]:
        line = Text()
        if view.t is None:
            line.append("no memory profile yet", style="dim")
            if view.error:
                line.append(f" (last attempt failed: {view.error})", style="red")
        else:
            line.append(f"profile #{view.seq}", style="bold")
            if view.last_t is not None:
                line.append(f" {fmt_duration(max(0.0, view.last_t - view.t))} ago", style="dim")
            if view.seconds is not None:
                line.append(f" · took {view.seconds * 1000:.3g} ms", style="dim")
            if view.interval_s is not None:
                line.append(f" · every {view.interval_s:.3g} s", style="dim")
            total_bytes, total_count = view.bytes, view.count
            if self.device is not None:
                total_bytes, total_count = view.by_device.get(self.device, (0, 0))
            line.append("  ·  ")
            line.append(f"{fmt_bytes(total_bytes)} in {total_count:,} buffers", style="bold")
            line.append(f" over {view.sites_total} sites")
            if self.device is not None:
                line.append(f" on {self.device}", style="bold cyan")
            if view.in_use_bytes is not None and self.device is None:
                line.append(f" · allocator in use {fmt_bytes(view.in_use_bytes)}", style="dim")
        yield line
        if view.mark_t is not None:
            mark = Text("since mark", style="bold magenta")
            if view.last_t is not None:
                mark.append(f" ({fmt_duration(max(0.0, view.last_t - view.mark_t))} ago)", style="magenta")
            mark.append(f": {_signed_bytes(view.mark_bytes)}, {_signed(view.mark_count)} buffers")
            yield mark
        for site in view.suspects:
            text = Text("⚠ leak suspect ", style=SUSPECT_STYLE)
            text.append(f"{site.site} {site.function}: ", style="bold")
            text.append(growth_text(site), style=SUSPECT_STYLE)
            yield text
        if view.error and view.t is not None:
            yield Text(f"last profile failed: {view.error}", style="red")

    # -- sites ----------------------------------------------------------------------------
    def _sites(self, view: HoldersView, width: int) -> Table:
        marked = view.mark_t is not None
        wide = width >= 110
        spark_w = max(4, min(self.spark_width, (width - 60) // 3)) if width >= 70 else 0
        table = Table(box=None, expand=True, padding=(0, 1), show_edge=False, header_style="bold")
        table.add_column("allocation site", ratio=3, no_wrap=True, overflow="ellipsis")
        if wide:
            table.add_column("function", ratio=2, no_wrap=True, overflow="ellipsis")
        table.add_column("bytes", justify="right", no_wrap=True)
        table.add_column("bufs", justify="right", no_wrap=True)
        table.add_column("share", justify="right", no_wrap=True)
        if spark_w:
            table.add_column("history", width=spark_w, no_wrap=True)
        if marked:
            table.add_column("Δ mark", justify="right", no_wrap=True)
            if wide:
                table.add_column("Δ bufs", justify="right", no_wrap=True)
        if wide:
            table.add_column("growth", no_wrap=True, overflow="ellipsis")

        device = self.device
        rows = []
        for site in view.sites:
            nbytes, count = _site_values(site, device)
            if device is not None and not nbytes and not count and site.mark_bytes is None:
                continue
            rows.append((site, nbytes, count))
        rows.sort(key=lambda r: (-r[1], -r[2], r[0].site))
        shown, rest = rows[:self.max_sites], rows[self.max_sites:]
        denominator = None
        if device is not None:
            denominator = view.by_device.get(device, (0, 0))[0] or None
        for site, nbytes, count in shown:
            style = SUSPECT_STYLE if site.suspect else ("dim" if site.library else None)
            label = ("⚠ " if site.suspect else "") + site.site
            if not wide:
                label += f" {site.function}"
            share = (nbytes / denominator) if denominator else (site.share if device is None else None)
            cells: list[Text | str] = [Text(label, style=style or "")]
            if wide:
                cells.append(Text(site.function, style=style or "cyan"))
            cells += [fmt_bytes(nbytes), f"{count:,}", _pct(share)]
            if spark_w:
                cells.append(sparkline(site.history, spark_w))
            if marked:
                delta_style = GROW_STYLE if (site.mark_bytes or 0) > 0 else (SHRINK_STYLE if (site.mark_bytes or 0) < 0 else "dim")
                cells.append(Text(_signed_bytes(site.mark_bytes), style=delta_style))
                if wide:
                    cells.append(Text(_signed(site.mark_count), style=delta_style))
            if wide:
                cells.append(_growth_cell(site))
            table.add_row(*cells)
        other_bytes = view.other_bytes + sum(n for _, n, _ in rest)
        other_count = view.other_count + sum(c for _, _, c in rest)
        other_sites = view.other_sites + len(rest)
        if other_sites and device is None:
            cells = [Text(f"… {other_sites} more sites", style="dim")]
            if wide:
                cells.append("")
            cells += [fmt_bytes(other_bytes), f"{other_count:,}", ""]
            table.add_row(*cells)
        if not shown:
            table.add_row(Text("no live buffers in the latest profile", style="dim"))
        return table

    # -- named pytrees ---------------------------------------------------------------------
    def _labels(self, view: HoldersView, width: int) -> Iterable[Text | Table]:
        title = Text("Named pytrees", style="bold underline")
        if not view.labels:
            title.append("  none: call jaxtop.label(\"params\", params) in the program", style="dim")
            yield title
            return
        yield title
        table = Table(box=None, expand=False, padding=(0, 1), show_edge=False, header_style="bold")
        table.add_column("name", no_wrap=True, overflow="ellipsis", max_width=max(10, width // 3))
        table.add_column("bytes", justify="right", no_wrap=True)
        table.add_column("arrays alive", justify="right", no_wrap=True)
        table.add_column("share", justify="right", no_wrap=True)
        total = view.in_use_bytes or view.bytes
        replaced = []
        for tree in view.labels:
            table.add_row(
                Text(tree.name, style="bold cyan"),
                fmt_bytes(tree.bytes),
                _alive(tree),
                _pct(tree.bytes / total) if total else "n/a",
            )
            if tree.arrays and not tree.alive and not tree.followed:
                replaced.append(tree.name)
        yield table
        if replaced:
            # A dict/list/tuple is the arrays it held when labelled: the
            # next step made new ones and these were freed.
            yield Text(f"{', '.join(replaced)}: every array labelled is gone (replaced by newer ones): call "
                       "jaxtop.label each step with the current tree, or label the object that holds "
                       "them (an NNX module or optimizer is followed)", style="yellow")

    # -- host syncs -----------------------------------------------------------------------
    def _syncs(self, view: HoldersView, width: int) -> Iterable[Text | Table | Padding]:
        title = Text("Host syncs", style="bold underline")
        if view.syncs_available is None:
            title.append("  not reported by this agent", style="dim")
            yield title
            return
        if not view.syncs_available:
            title.append(f"  n/a ({view.syncs_reason or 'not counting'})", style="dim")
            yield title
            return
        title.append(f"  {view.syncs_total or 0:,} reads of device arrays on the host", style="")
        if view.syncs_by_kind:
            kinds = sorted(view.syncs_by_kind.items(), key=lambda kv: (-kv[1], kv[0]))
            title.append("  (" + ", ".join(f"{k} {v:,}" for k, v in kinds) + ")", style="dim")
        yield title
        if view.syncs_uncounted:
            yield Padding(Text(view.syncs_uncounted, style="dim yellow"), (0, 0, 0, 2))
        if not view.syncs:
            return
        wide = width >= 100
        table = Table(box=None, expand=True, padding=(0, 1), show_edge=False, header_style="bold")
        table.add_column("call site", ratio=3, no_wrap=True, overflow="ellipsis")
        if wide:
            table.add_column("function", ratio=2, no_wrap=True, overflow="ellipsis")
        table.add_column("reads", justify="right", no_wrap=True)
        table.add_column("/s", justify="right", no_wrap=True)
        table.add_column("kinds", ratio=3, no_wrap=True, overflow="ellipsis")
        for site in view.syncs:
            label = site.site if wide else f"{site.site} {site.function}"
            cells: list[Text | str] = [label]
            if wide:
                cells.append(Text(site.function, style="cyan"))
            kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(site.kinds.items(), key=lambda kv: (-kv[1], kv[0])))
            cells += [f"{site.count:,}", _rate(site.per_s), Text(kinds, style="dim")]
            table.add_row(*cells)
        if view.syncs_sites_total > len(view.syncs):
            table.add_row(Text(f"… {view.syncs_sites_total - len(view.syncs)} more sites", style="dim"))
        yield table


#: Rises in a row after which a site that is not (yet) a suspect shows its growth, dimmed.
SHOW_RISES = 3


def _growth_cell(site: SiteView) -> Text:
    """The growth column: bytes per minute of suspects (and, dimmed, of sites
    that rose a few times in a row); empty for the rest, which only wobble."""
    g = site.growth
    if g is None or (not site.suspect and g.rises < SHOW_RISES):
        return Text("")
    if g.bytes_per_min:
        text = f"{_signed_bytes(int(round(g.bytes_per_min)))}/min"
    elif g.count_per_min:
        text = f"{fmt_count_rate(g.count_per_min)} arrays/min"
    else:
        text = f"{g.rises} rises"
    return Text(text, style=SUSPECT_STYLE if site.suspect else "dim " + GROW_STYLE)


def _alive(tree: LabelView) -> str:
    return f"{tree.alive:,}/{tree.arrays:,}"


def _rate(per_s: float | None) -> str:
    if per_s is None:
        return ""
    return f"{per_s:.3g}"


def render_holders(view: HoldersView | None, width: int = 120, device: str | None = None) -> str:
    """The report as plain text (tests, logs)."""
    import io

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(Group(HoldersReport(view, device=device)))
    return console.export_text()
