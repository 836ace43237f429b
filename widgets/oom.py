"""The OOM census as a Rich renderable: a census view and a width in, text out.

Nothing here knows about Textual (the pattern of
:mod:`jaxtop.widgets.render`): :class:`jaxtop.dashboard.oom_screen.OomScreen`
shows it, tests render it to a string. It reads the census through its
typed view (:class:`~jaxtop.dashboard.oom_views.OomCensus`); the words are
those of ``jaxtop oom`` (:mod:`jaxtop.dashboard.oom_report`), so the screen and the
text report never say different things.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from jaxtop.dashboard.oom_report import (
    arrays_summary, host_line, request_line, site_line, timeline_rows, timeline_span, timing_line, trigger_line,
)
from jaxtop.dashboard.oom_views import OomCensus
from jaxtop.wire.units import fmt_bytes

__all__ = ["NO_CENSUS", "OomCensusView"]

#: What the screen says before any census arrived.
NO_CENSUS = ("No out-of-memory census yet. jaxtop takes one inside the program when it runs out of "
             "memory (RESOURCE_EXHAUSTED): the failed request, what held the memory, and where it was allocated.")


def _dims(shape: Any, dtype: Any) -> str:
    if isinstance(shape, (list, tuple)):
        return f"{dtype}[{', '.join(str(s) for s in shape)}]"
    return f"{dtype}{shape}"


class OomCensusView:
    """One census, laid out for a screen.

    Args:
        census: the census's view (:meth:`OomCensus.from_wire` of a
            decoded ``oom_census`` record), or None.
        position: ``(index, total)`` when the process has several censuses,
            shown in the title ("census 2 of 3").
    """

    def __init__(self, census: OomCensus | None, position: tuple[int, int] | None = None) -> None:
        self.census = census
        self.position = position

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        census = self.census
        width = options.max_width
        if census is None or not census.record:
            yield Text(NO_CENSUS, style="dim")
            return
        title = Text(f" OUT OF MEMORY · pid {census.pid if census.pid is not None else '?'} ", style="bold reverse red")
        argv = " ".join(census.argv)
        if argv:
            title.append(f" {argv}", style="dim")
        if self.position and self.position[1] > 1:
            title.append(f"  census {self.position[0] + 1} of {self.position[1]} (n/N)", style="dim")
        title.truncate(width, overflow="ellipsis")
        yield title
        record = census.record
        yield Text(trigger_line(record), style="bold")
        message = census.message
        if message and message.strip():
            yield Text("  " + message.strip().splitlines()[0], style="red", overflow="ellipsis", no_wrap=True)
        yield Text(request_line(record))
        verdict = Text("Verdict: ", style="bold")
        verdict.append(census.verdict or "n/a", style="bold yellow")
        yield verdict
        yield Text("")

        if census.devices:
            table = Table(box=box.SIMPLE_HEAD, expand=False, pad_edge=False, title="Devices", title_justify="left",
                          title_style="bold")
            for name, justify in (("device", "left"), ("in use", "right"), ("limit", "right"), ("pool", "right"),
                                  ("largest free", "right"), ("frag", "right"), ("live arrays", "right"), ("", "left")):
                table.add_column(name, justify=justify, no_wrap=name != "")  # type: ignore[arg-type]
            for d in census.devices:
                table.add_row(
                    d.label,
                    fmt_bytes(d.bytes_in_use),
                    fmt_bytes(d.bytes_limit) if d.bytes_limit is not None else "-",
                    fmt_bytes(d.pool_bytes) if d.pool_bytes is not None else "-",
                    fmt_bytes(d.largest_free_block_bytes) if d.largest_free_block_bytes is not None else "-",
                    f"{d.fragmentation:.2f}" if d.fragmentation is not None else "-",
                    fmt_bytes(d.live_array_bytes),
                    Text("← failed here" if d.failed else "", style="bold red"),
                    style="bold" if d.failed else None,
                )
            yield table
        if census.host:
            yield Text("Host: " + host_line(census.host), style="dim")
        yield Text("")

        arrays = census.arrays
        if arrays:
            table = Table(box=box.SIMPLE_HEAD, expand=False, pad_edge=False, title_justify="left", title_style="bold",
                          title="Largest live arrays: " + arrays_summary(record))
            table.add_column("count", justify="right", no_wrap=True)
            table.add_column("bytes", justify="right", no_wrap=True)
            table.add_column("each", justify="right", no_wrap=True)
            table.add_column("array", overflow="ellipsis", no_wrap=True, max_width=max(16, width // 3))
            table.add_column("where", overflow="ellipsis", no_wrap=True)
            for g in arrays.groups:
                table.add_row(str(g.count), fmt_bytes(g.bytes), fmt_bytes(g.bytes_each), _dims(g.shape, g.dtype),
                              g.placement)
            more = arrays.groups_not_shown
            if more > 0:
                table.add_row("", fmt_bytes(arrays.bytes_not_shown), "", Text(f"… {more} more groups", style="dim"), "")
            yield table
        else:
            yield Text("Largest live arrays: n/a (not scanned)", style="dim")

        if census.sites:
            yield Text("Allocation sites holding the most (innermost frame of your code)", style="bold")
            for site in census.sites:
                line = Text("  ")
                line.append(site_line(site.record), style=None if site.user else "dim")
                line.truncate(width, overflow="ellipsis")
                yield line
        else:
            skipped = "sites" in census.skipped_parts
            yield Text("Allocation sites: n/a" + (" (skipped: time budget)" if skipped else ""), style="dim")

        rows = timeline_rows(record, width=max(10, min(60, width - 40)))
        if rows:
            span = timeline_span(record)
            yield Text("")
            yield Text("Before the OOM (bytes in use" + (f", last {span:.0f} s)" if span else ")"), style="bold")
            for label, spark, change in rows:
                line = Text(f"  {label:<8} ")
                line.append(spark, style="yellow")
                line.append(f"  {change}", style="dim")
                yield line

        if census.allocator_stats or census.allocator_occupancy:
            yield Text("")
            yield Text("Allocator at the failure", style="bold")
            if census.allocator_stats:
                yield Text("  " + ", ".join(f"{k} {v if k == 'num_allocs' else fmt_bytes(v)}"
                                            for k, v in census.allocator_stats))
            if census.allocator_occupancy:
                pool = Text("  pool ")
                pool.append(census.allocator_occupancy[: max(10, width - 8)], style="yellow")
                yield pool
        yield Text("")
        yield Text(timing_line(record), style="dim")
        if census.path:
            yield Text(f"File: {census.path}", style="dim", overflow="ellipsis", no_wrap=True)
