"""The OOM census as a Rich renderable: a census dict and a width in, text out.

Nothing here knows about Textual or the model (the pattern of
:mod:`jaxtop.widgets.render`): :class:`jaxtop.dashboard.oom_screen.OomScreen`
shows it, tests render it to a string. The words are those of
``jaxtop oom`` (:mod:`jaxtop.oom_report`), so the screen and the text
report never say different things.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from jaxtop.oom_report import (
    arrays_summary, host_line, request_line, site_line, timeline_rows, timeline_span, timing_line, trigger_line,
)
from jaxtop.probes.oom import human_bytes

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
        census: the census dict (``type: "oom_census"``), or None.
        position: ``(index, total)`` when the process has several censuses,
            shown in the title ("census 2 of 3").
    """

    def __init__(self, census: dict[str, Any] | None, position: tuple[int, int] | None = None) -> None:
        self.census = census
        self.position = position

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        census = self.census
        width = options.max_width
        if not census:
            yield Text(NO_CENSUS, style="dim")
            return
        title = Text(f" OUT OF MEMORY · pid {census.get('pid', '?')} ", style="bold reverse red")
        argv = " ".join(census.get("argv") or [])
        if argv:
            title.append(f" {argv}", style="dim")
        if self.position and self.position[1] > 1:
            title.append(f"  census {self.position[0] + 1} of {self.position[1]} (n/N)", style="dim")
        title.truncate(width, overflow="ellipsis")
        yield title
        yield Text(trigger_line(census), style="bold")
        message = (census.get("trigger") or {}).get("message") or (census.get("request") or {}).get("text")
        if message and str(message).strip():
            yield Text("  " + str(message).strip().splitlines()[0], style="red", overflow="ellipsis", no_wrap=True)
        yield Text(request_line(census))
        verdict = Text("Verdict: ", style="bold")
        verdict.append(str(census.get("verdict") or "n/a"), style="bold yellow")
        yield verdict
        yield Text("")

        devices = census.get("devices") or []
        if devices:
            table = Table(box=box.SIMPLE_HEAD, expand=False, pad_edge=False, title="Devices", title_justify="left",
                          title_style="bold")
            for name, justify in (("device", "left"), ("in use", "right"), ("limit", "right"), ("pool", "right"),
                                  ("largest free", "right"), ("frag", "right"), ("live arrays", "right"), ("", "left")):
                table.add_column(name, justify=justify, no_wrap=name != "")  # type: ignore[arg-type]
            for d in devices:
                frag = d.get("fragmentation")
                table.add_row(
                    f"{d.get('platform', '?')}:{d.get('id', '?')}",
                    human_bytes(d.get("bytes_in_use")),
                    human_bytes(d.get("bytes_limit")) if d.get("bytes_limit") is not None else "-",
                    human_bytes(d.get("pool_bytes")) if d.get("pool_bytes") is not None else "-",
                    human_bytes(d.get("largest_free_block_bytes")) if d.get("largest_free_block_bytes") is not None else "-",
                    f"{frag:.2f}" if isinstance(frag, (int, float)) else "-",
                    human_bytes(d.get("live_array_bytes")),
                    Text("← failed here" if d.get("failed") else "", style="bold red"),
                    style="bold" if d.get("failed") else None,
                )
            yield table
        if census.get("host"):
            yield Text("Host: " + host_line(census["host"]), style="dim")
        yield Text("")

        arrays = census.get("arrays")
        if arrays:
            table = Table(box=box.SIMPLE_HEAD, expand=False, pad_edge=False, title_justify="left", title_style="bold",
                          title="Largest live arrays: " + arrays_summary(census))
            table.add_column("count", justify="right", no_wrap=True)
            table.add_column("bytes", justify="right", no_wrap=True)
            table.add_column("each", justify="right", no_wrap=True)
            table.add_column("array", overflow="ellipsis", no_wrap=True, max_width=max(16, width // 3))
            table.add_column("where", overflow="ellipsis", no_wrap=True)
            for g in arrays.get("groups") or []:
                table.add_row(str(g.get("count", 0)), human_bytes(g.get("bytes")), human_bytes(g.get("bytes_each")),
                              _dims(g.get("shape"), g.get("dtype")), str(g.get("placement", "")))
            more = (arrays.get("groups_total") or 0) - len(arrays.get("groups") or [])
            if more > 0:
                rest = (arrays.get("bytes") or 0) - (arrays.get("shown_bytes") or 0)
                table.add_row("", human_bytes(rest), "", Text(f"… {more} more groups", style="dim"), "")
            yield table
        else:
            yield Text("Largest live arrays: n/a (not scanned)", style="dim")

        sites = census.get("sites")
        if sites and sites.get("top"):
            yield Text("Allocation sites holding the most (innermost frame of your code)", style="bold")
            for site in sites["top"]:
                line = Text("  ")
                line.append(site_line(site), style=None if site.get("user", True) else "dim")
                line.truncate(width, overflow="ellipsis")
                yield line
        else:
            skipped = any(s.get("part") == "sites" for s in census.get("skipped") or [])
            yield Text("Allocation sites: n/a" + (" (skipped: time budget)" if skipped else ""), style="dim")

        rows = timeline_rows(census, width=max(10, min(60, width - 40)))
        if rows:
            span = timeline_span(census)
            yield Text("")
            yield Text("Before the OOM (bytes in use" + (f", last {span:.0f} s)" if span else ")"), style="bold")
            for label, spark, change in rows:
                line = Text(f"  {label:<8} ")
                line.append(spark, style="yellow")
                line.append(f"  {change}", style="dim")
                yield line

        log = census.get("allocator_log")
        if isinstance(log, dict) and (log.get("stats") or log.get("occupancy")):
            yield Text("")
            yield Text("Allocator at the failure", style="bold")
            stats = log.get("stats") or {}
            if stats:
                yield Text("  " + ", ".join(f"{k} {v if k == 'num_allocs' else human_bytes(v)}" for k, v in stats.items()))
            if log.get("occupancy"):
                pool = Text("  pool ")
                pool.append(str(log["occupancy"])[: max(10, width - 8)], style="yellow")
                yield pool
        yield Text("")
        yield Text(timing_line(census), style="dim")
        if census.get("path"):
            yield Text(f"File: {census['path']}", style="dim", overflow="ellipsis", no_wrap=True)
