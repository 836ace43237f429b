"""Dashboard panels. Each one renders what the snapshot hands it and keeps
no history of its own; drawing is done by the pure renderables in
:mod:`jaxtop.widgets.render`. The panel base lives in
:mod:`jaxtop.widgets.panel_base`, the memory panels in
:mod:`jaxtop.widgets.memory_panels` (both re-exported here)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.reactive import reactive

from jaxtop.dashboard.history import Window
from jaxtop.dashboard.model import DEVICE_SERIES, DISCONNECTED, EXITED, PROCESS_SERIES, DeviceView, ProcessView, Snapshot
from jaxtop.dashboard.readings import TransferView
from jaxtop.dashboard.views import D2D, D2H, DIRECTIONS, H2D
from jaxtop.widgets.accelerator_lines import host_accelerator_line, host_title, pcie_shown
from jaxtop.widgets.advice import line_of
from jaxtop.widgets.memory_panels import FragmentationPanel, MemoryMapPanel, MemoryPanel, queued_matters, queued_notes
from jaxtop.widgets.panel_base import (
    STALE_DETAIL_S, STATE_STYLE, WINDOW_LABEL, LoadingLine, Panel, _na, _or_na, fitted_title, fitting, panel_title,
    short_command,
)
from jaxtop.widgets.render import Series, Strip, TimelineStack, fmt_bytes, fmt_duration, fmt_rate
from jaxtop.widgets.transfer_sites import scalar_lines, site_rows, tail_line

__all__ = [
    "STALE_DETAIL_S", "EventsPanel", "FragmentationPanel", "HeaderBar", "HostPanel", "LoadingLine", "MemoryMapPanel",
    "MemoryPanel", "OverviewPanel", "Panel", "TimelinePanel", "TransfersPanel", "fitted_title", "fitting",
    "memory_strip", "panel_title", "queued_notes", "short_command",
]


class HeaderBar(Panel):
    """pid, command, backend, versions, uptime, connection state, sample age."""

    paused: reactive[bool] = reactive(False)
    """True while the live view is frozen with space."""

    def draw(self, snap: Snapshot, width: int, height: int) -> RenderableType:
        dev = snap.device
        proc = snap.process_of(dev)
        # One line each, cut with an ellipsis: a long command must not push
        # the state line off the header.
        top = Text(" jaxtop ", style="bold white on dark_green", no_wrap=True, overflow="ellipsis")
        bottom = Text()
        if proc is None:
            top.append(" no process", style="dim")
            return Group(top, bottom)
        cmd = short_command(proc.argv)
        top.append(f" {proc.who} ", style="bold")
        room = max(10, width - 50)
        top.append(cmd if len(cmd) <= room else cmd[: room - 1] + "…")
        backend = proc.backend or ("backend unknown (no agent)" if proc.external else "backend not started")
        top.append(f"  {backend} · jax {proc.jax_version or '?'}", style="cyan")
        if len(snap.processes) > 1:
            top.append(f"  ({len(snap.processes)} processes)", style="dim")
        state = proc.state
        bottom.append(f" ● {state}", style=STATE_STYLE.get(state, "bold"))
        if snap.replay:
            r = snap.replay
            bottom.append(f" {'▶' if r.playing else '❚❚'} {r.speed:g}× ", style="cyan")
            t_start = r.t_start if r.t_start is not None else r.t
            played = fmt_duration(r.t - t_start if r.t is not None and t_start is not None else None)
            if r.t_end is not None and t_start is not None:
                bottom.append(f"{played}/{fmt_duration(max(1e-9, r.t_end - t_start))}")
            else:  # the length is known once the index is in
                bottom.append(f"{played}/?")
            if r.indexing:
                done, total = r.indexing
                bottom.append(f"  indexing {min(100, done * 100 // max(total, 1))}%", style="yellow")
                if r.pending_seek is not None:
                    bottom.append(f", then seek to {r.pending_seek}", style="yellow")
            elif r.index_error:
                bottom.append("  seek n/a (see notices)", style="yellow")
        elif proc.sample_age_s is not None:
            bottom.append(f" (sample {proc.sample_age_s:.1f}s ago)", style="dim")
        if self.paused:
            bottom.append("  PAUSED", style="bold black on yellow")
        if proc.uptime_s is not None:
            bottom.append(f"  up {fmt_duration(proc.uptime_s)}")
        if dev is not None:
            bottom.append(f"  device {dev.label} ({snap.selected + 1}/{len(snap.devices)})", style="bold")
        elif snap.devices:
            n = len(snap.devices)
            bottom.append(f"  overview: {n} device{'' if n == 1 else 's'}", style="bold")
        elif proc.external:
            bottom.append(f"  EXTERNAL VIEW: {proc.external}", style="bold black on cyan")
        else:
            bottom.append("  no devices yet (waiting for the program to start JAX)", style="yellow")
        bottom.append(f"  window {WINDOW_LABEL.get(snap.window_s, snap.window_s)}", style="dim")
        return Group(top, bottom)


class TimelinePanel(Panel):
    """Allocation, fragmentation and transfers over the selected window.

    One panel with stacked strips over one time axis (see
    :class:`~jaxtop.widgets.render.TimelineStack`), rather than a panel per
    timeline: the strips then share the window, its start and end, the
    label width and so every column, and a burst of transfers or a rise in
    fragmentation sits right above the memory climb it goes with. The axis
    is the process's (``ProcessView.span``), the same for all its devices.

    Strips, top to bottom: memory (in use, peak, pool, NVML), fragmentation
    with the largest free block, implicit transfers per second, and their
    known bytes per second. The largest free block and the bytes go first
    when the panel is short. A quantity that cannot be measured (no
    allocator on CPU, no transfer capture) is a line "n/a — reason", not a
    flat zero. Each column shows the min..max of the samples or history
    buckets it covers, so a peak survives any window.
    """

    TITLE = "Timelines"

    def draw(self, snap: Snapshot, width: int, height: int) -> RenderableType:
        dev = snap.device
        proc = snap.process_of(dev)
        if dev is None or proc is None or proc.span is None:
            return Group(panel_title(self.TITLE))
        start, end = proc.span
        window = WINDOW_LABEL.get(snap.window_s, "")
        if snap.window_s is not None and end - start < snap.window_s - 1:
            # The run is shorter than the window: the axis spans the run, and
            # the title says so rather than a window the chart does not show.
            # A coarse level's first row is stamped with its bucket's start,
            # up to a bucket before the run began: the run's length is never
            # said longer than the header's uptime (it read "24s so far"
            # beside "up 20s").
            so_far = end - start if proc.uptime_s is None else min(end - start, proc.uptime_s)
            window = f"{fmt_duration(so_far)} so far"
        bucket = max(dev.timeline.bucket_s, proc.history.bucket_s)
        buckets = f"{bucket:g}s buckets (min/max)" if bucket else "raw samples"
        rate = fmt_rate(dev.allocs_per_s, "allocs") if dev.allocs_per_s is not None else f"allocs/s n/a ({dev.allocs_reason})"
        title = fitted_title(self.TITLE, [f"{window} · {buckets} · {rate}", f"{window} · {rate}", f"{window} · {buckets}", window], width)
        strips = [memory_strip(dev), *fragmentation_strips(dev), *transfer_strips(proc)]
        return Group(title, TimelineStack(strips, start, end, height=max(2, height - 1)))


def _series(win: Window, names: tuple[str, ...], name: str, label: str, style: str, kind: str) -> Series | None:
    """One series of a history window, or None when it has no value in it."""
    t, lo, hi = win.series(names.index(name))
    if not len(t) or _all_nan(hi):
        return None
    return Series(label, t, lo, hi, style, kind)


def _present(*series: Series | None) -> list[Series]:
    return [s for s in series if s is not None]


def memory_strip(dev: DeviceView) -> Strip:
    """The device's bytes: in use (filled), its peak, the pool, NVML's view
    and, where the allocator reports in use, the live arrays: the gap
    between the fill and that line is memory no live array holds (work
    queued ahead on an accelerator)."""
    live = None
    if dev.source == "memory_stats":  # on CPU "in use" is the live arrays' sum
        live = _series(dev.timeline, DEVICE_SERIES, "live_bytes", "live arrays", "cyan", "line")
    series = _present(
        _series(dev.timeline, DEVICE_SERIES, "bytes_in_use", "in use", "green", "fill"),
        _series(dev.timeline, DEVICE_SERIES, "peak_bytes_in_use", "peak", "red", "line"),
        _series(dev.timeline, DEVICE_SERIES, "pool_bytes", "pool", "blue", "line"),
        _series(dev.timeline, DEVICE_SERIES, "nvml_used_bytes", "NVML", "magenta", "line"),
        live,
    )
    notes = []
    unheld = dev.unheld
    if unheld is not None and queued_matters(unheld[0], dev.unheld_base):
        at_scan = " at the scan" if dev.scan_in_use_differs else ""
        notes.append(f"{'≈' if not unheld[1] else ''}{fmt_bytes(unheld[0])} not in arrays{at_scan}")
    if dev.allocs_per_s is not None:
        notes.append(fmt_rate(dev.allocs_per_s, "allocs"))
    return Strip("memory", series, unit="bytes", weight=4, note="  ".join(notes), min_rows=3)


def fragmentation_strips(dev: DeviceView) -> list[Strip]:
    """Fragmentation (0-100 %) and the largest free block (bytes).

    Without an allocator's figures (CPU) neither exists. Then the strip
    draws the one measure left, the holes between live buffers' addresses
    (the agent's ``live_arrays.holes``), under its own name; without those
    either, one n/a line with the allocator's reason stands for both.
    """
    frag = _series(dev.timeline, DEVICE_SERIES, "fragmentation", "fragmentation", "yellow", "fill")
    free_label = f"largest free block ({dev.free_block_note})" if dev.free_block_note else "largest free block"
    free = _series(dev.timeline, DEVICE_SERIES, "largest_free_block_bytes", free_label, "green", "fill")
    reason = dev.fragmentation_reason or "the allocator reports no fragmentation"
    if frag is None and dev.free_block_note:
        # The runtime's largest free block is known to be no bound (TPU):
        # one line says so, no chart of a figure that says nothing.
        return [Strip("fragmentation", reason=reason)]
    if frag is None and free is None:
        holes = _series(dev.timeline, DEVICE_SERIES, "live_holes", "holes among live buffers", "yellow", "fill")
        if holes is not None:
            return [Strip("", [holes], unit="%", y_max=1.0,
                          note=f"allocator n/a ({reason}): gaps of 4 KiB–4 MiB between live buffers' addresses")]
        return [Strip("fragmentation", reason=reason)]
    strips = [Strip("", [frag], unit="%", y_max=1.0) if frag else Strip("fragmentation", reason=reason)]
    if free is not None:
        strips.append(Strip("", [free], unit="bytes", optional=True))
    else:
        strips.append(Strip("largest free block", reason="the allocator does not report it", optional=True))
    return strips


def transfer_strips(proc: ProcessView) -> list[Strip]:
    """Implicit transfers per second by direction, then their known bytes per second."""
    cap = proc.capture
    if cap.available is False:
        return [Strip("implicit transfers", reason=cap.na_reason or "transfer capture unavailable")]
    styles = ((H2D, "cyan", "fill"), (D2H, "yellow", "line"), (D2D, "magenta", "line"))
    counts = _present(*(_series(proc.history, PROCESS_SERIES, f"{d}_per_s", d, style, kind) for d, style, kind in styles))
    known = _present(*(_series(proc.history, PROCESS_SERIES, f"{d}_bytes_per_s", d, style, kind) for d, style, kind in styles))
    return [
        Strip("transfers/s", counts, unit="/s", weight=2, min_rows=2),
        # Cached jit calls log no shapes: the bytes are a lower bound.
        Strip("known bytes/s ≥", known, unit="bytes", optional=True),
    ]


def _all_nan(values: Any) -> bool:
    return bool(np.all(np.isnan(values))) if len(values) else True


class TransfersPanel(Panel):
    """Implicit h2d / d2h / d2d per second and totals, then which lines make
    them (the ``transfer_sites`` field: :mod:`jaxtop.widgets.transfer_sites`),
    or, from an agent that names no line, the most frequent shape; PCIe (GPU).

    While there are sites to show the panel takes the class ``-sites`` and
    asks for the lines they need (the app's CSS caps them); short panels fold
    the direction table into one line so that the busiest lines still fit at
    80x24.
    """

    TITLE = "Transfers (implicit)"
    #: Panels shorter than this fold the direction table into one line.
    TABLE_MIN_HEIGHT = 10

    _rows_wanted: int | None = None

    def watch_snapshot(self, snap: Snapshot | None) -> None:
        """Take the lines the sites need: every array line, the scalar and
        the tail lines under the direction table (the app's CSS caps it at
        a share of the column); the CSS's own height without sites."""
        proc = snap.process_of(snap.device) if snap is not None else None
        has_sites = _has_sites(proc)
        self.set_class(has_sites, "-sites")
        wanted = None
        if has_sites and snap is not None and proc is not None and proc.transfer_sites is not None:
            view = proc.transfer_sites
            summary = view.scalar_summary()
            width = self.size.width or 200
            extra = ((len(scalar_lines(summary, width)) if summary is not None else 0)
                     + (tail_line(view, width, 0) is not None) + (self._pcie_line(snap, proc) is not None))
            arrays = len(view.arrays)
            wanted = max(self.TABLE_MIN_HEIGHT, 5 + (1 + arrays if arrays else 0) + extra)
        if wanted != self._rows_wanted:
            self._rows_wanted = wanted
            self.styles.height = wanted  # None: the app's CSS decides

    def draw(self, snap: Snapshot, width: int, height: int) -> RenderableType:
        proc = snap.process_of(snap.device)
        if proc is None:
            return Group(panel_title(self.TITLE))
        cap = proc.capture
        if cap.available is False:
            return Group(panel_title(self.TITLE), _na(cap.na_reason))
        ended = proc.state in (EXITED, DISCONNECTED)  # no rate now; the totals stand
        note = f"{proc.state}: totals only" if ended else "bytes are a lower bound"
        title = panel_title(self.TITLE, note if width >= 46 else "")
        pcie = self._pcie_line(snap, proc) if height > 6 else None
        if _has_sites(proc):
            return self._with_sites(proc, title, pcie, width, height, ended)
        parts: list[RenderableType] = [title, self._direction_table(proc, width, ended)]
        if proc.top_shapes and height > 5:
            top = proc.top_shapes[0]
            parts.append(Text(f" top: {top.direction} {top.shape} ×{top.count}", style="dim", no_wrap=True, overflow="ellipsis"))
        if pcie is not None:
            parts.append(pcie)
        return Group(*parts)

    @staticmethod
    def _direction_table(proc: ProcessView, width: int, ended: bool) -> Table:
        # Narrow panels drop the byte rate; the direction and the totals are
        # what must stay legible at 80x24. Their history is a strip of the
        # timelines, on the same time axis as memory.
        show_rate_bytes = width >= 38
        table = Table.grid(padding=(0, 1))
        table.add_column(no_wrap=True, min_width=3)
        headers = ["/s" if width < 44 else "count/s"] + (["bytes/s≥"] if show_rate_bytes else []) + ["total (bytes≥)"]
        # "~": the lines' sum of their calls' argument sizes, above what
        # JAX's log gave (a cached call logs no shape).
        for _ in headers:
            table.add_column(no_wrap=True, overflow="ellipsis")
        table.add_row(Text("dir", style="dim"), *(Text(h, style="dim") for h in headers))
        for d in DIRECTIONS:
            r = proc.transfers.get(d) or TransferView()
            cells: list[RenderableType] = [Text(d, style="bold"), Text("–" if ended else fmt_rate(r.count_per_s, ""))]
            if show_rate_bytes:
                cells.append(Text("–" if ended else _approx(r.bytes_per_s_inferred) + fmt_bytes(r.bytes_per_s)))
            cells.append(Text(f"{_or_na(r.count_total)} ({_approx(r.bytes_total_inferred)}{fmt_bytes(r.bytes_total)})"))
            table.add_row(*cells)
        return table

    @staticmethod
    def _direction_line(proc: ProcessView, width: int, ended: bool) -> Text:
        """The three directions on one line, detail dropped to fit."""
        def each(detail: int) -> str:
            parts = []
            for d in DIRECTIONS:
                r = proc.transfers.get(d) or TransferView()
                rate = "–" if ended else fmt_rate(r.count_per_s, "")
                if detail == 2:
                    nbytes = "–" if ended else _approx(r.bytes_per_s_inferred) + fmt_bytes(r.bytes_per_s)
                    parts.append(f"{d} {rate} ≥{nbytes}/s ×{_or_na(r.count_total)}")
                elif detail == 1 or (detail == 0 and r.count_total):
                    parts.append(f"{d} {rate} ×{_or_na(r.count_total)}")
                elif detail == 0:
                    parts.append(f"{d} 0")  # none ever: its rate says nothing more
                else:
                    parts.append(f"{d} {rate}")
            return " " + " · ".join(parts)

        # The totals outlast the rates: a narrow panel keeps them where there were any.
        return Text(fitting([each(2), each(1), each(0), each(-1)], width), no_wrap=True, overflow="ellipsis")

    def _with_sites(self, proc: ProcessView, title: Text, pcie: Text | None, width: int, height: int,
                    ended: bool) -> RenderableType:
        view = proc.transfer_sites
        assert view is not None
        parts: list[RenderableType] = [title]
        if height >= self.TABLE_MIN_HEIGHT:
            parts.append(self._direction_table(proc, width, ended))
            used = 5
        else:
            parts.append(self._direction_line(proc, width, ended))
            used = 2
        summary = view.scalar_summary()
        scalars = scalar_lines(summary, width, ended) if summary is not None else []
        arrays = view.arrays
        room = height - used - min(1, len(scalars)) - (1 if pcie is not None else 0)
        # The last line says what is not among the lines above (more lines,
        # unattributed transfers); it takes a line only when there is any.
        header = room >= 3
        fit = max(0, room - (1 if header else 0))
        if tail_line(view, width, max(0, len(arrays) - fit)) is not None:
            fit = max(0, fit - 1)
        shown = arrays[:fit]
        rows = site_rows(shown, width, ended, header=header and bool(shown))
        parts.extend(rows)
        tail = tail_line(view, width, len(arrays) - len(shown), ended)
        left = height - used - len(rows) - (tail is not None) - (pcie is not None)
        parts.extend(scalars[:max(1, left)] if scalars else [])  # the advice where a line is left for it
        if tail is not None:
            parts.append(tail)
        if pcie is not None:
            parts.append(pcie)
        return Group(*parts)

    @staticmethod
    def _pcie_line(snap: Snapshot, proc: ProcessView) -> Text | None:
        dev = snap.device
        if dev is not None and dev.nvml:
            return Text(
                f" PCIe TX {fmt_bytes(dev.nvml.pcie_tx_bytes_per_s)}/s  RX {fmt_bytes(dev.nvml.pcie_rx_bytes_per_s)}/s",
                no_wrap=True)
        if pcie_shown(proc, dev, snap.devices):  # NVML's, so a GPU's only
            return Text(" PCIe n/a (no NVML device)", style="dim")
        return None


def _has_sites(proc: ProcessView | None) -> bool:
    """Whether the panel lists transfer sites for ``proc`` (some line or
    some unattributed transfer is known)."""
    view = proc.transfer_sites if proc is not None else None
    return view is not None and bool(view.sites or view.unattributed_total)


class HostPanel(Panel):
    """RSS, CPU %, compiles, and the accelerator's own view, named after the
    backend (:mod:`jaxtop.widgets.accelerator_lines`): NVML's on a GPU, the
    runtime's monitoring on a TPU, none on CPU."""

    TITLE = "Host"

    def draw(self, snap: Snapshot, width: int, height: int) -> RenderableType:
        proc = snap.process_of(snap.device)
        title = host_title(proc, snap.device, snap.devices)
        if proc is None:
            return Group(panel_title(title))
        host = proc.process
        if not host.available:
            line1 = _na(host.na_reason)
        else:
            rss = f" RSS {fmt_bytes(host.rss_bytes)} (peak {fmt_bytes(host.peak_rss_bytes)})"
            parts = host.rss_parts()
            # One decimal whatever the source (Prometheus carries the float as
            # computed: "3.3000000000000003").
            cpu_text = f"  CPU {_or_na(None if host.cpu_percent is None else round(host.cpu_percent, 1))}%"
            # Narrow panels drop the thread count before anything is cut.
            # The resident set's parts (what a runtime's shared buffers or
            # mapped files add) where they fit, before the thread count.
            threads = f"  threads {_or_na(host.threads)}"
            parted = [f"{rss[:-1]}; {parts}){cpu_text}{threads}", f"{rss[:-1]}; {parts}){cpu_text}"] if parts else []
            choices = [*parted, f"{rss}{cpu_text}{threads}", f"{rss}{cpu_text}", f"{rss}{cpu_text[1:]}", rss]
            line1 = Text(fitting(choices, width), no_wrap=True, overflow="ellipsis")
        total, seconds = proc.compile.count_total, proc.compile.seconds_total
        if total is None:
            compiles = "n/a"
        else:
            compiles = f"{total} ({seconds:.1f}s)" if seconds is not None else str(total)
        base = f" compiles {compiles}  failed donations {_or_na(proc.donation.failed_total)}"
        choices3 = [base]
        agent = proc.agent
        if agent is not None and agent.over_ceiling():
            # Past what sampling less often can save: said with the figure.
            over = f"jaxtop {agent.cpu_share:.1%} of a core, over its {agent.ceiling_share:.1%} ceiling"
            choices3 = [f"{base}  {over} (per-transfer work)", f"{base}  {over}", f" {over}"]
        elif agent is not None and agent.stretched(proc.interval_s):
            # jaxtop's own thread hit its CPU ceiling: it samples less often
            # than asked, and the screen says so rather than look slow.
            every = f"sampled every {agent.tick_s:.2g} s"
            ceiling = f" (jaxtop at its {agent.ceiling_share:.1%} CPU ceiling)" if agent.ceiling_share else ""
            choices3 = [f"{base}  {every}{ceiling}", f"{base}  {every}", f" compiles {compiles}  {every}", f" {every}"]
        line3 = Text(fitting(choices3, width), no_wrap=True, overflow="ellipsis")
        line2 = host_accelerator_line(proc, snap.device, snap.devices, width)
        return Group(panel_title(title), line1, *([line2] if line2 is not None else []), line3)


class EventsPanel(Panel):
    """Compiles, failed donations, drops, disconnects, errors: newest last."""

    TITLE = "Events"
    #: Compiles, failed donations, drops, disconnects, errors: newest last;
    #: above them, the advisor's top advice on the shown process (A: all).
    STYLE = {"error": "red", "donation": "yellow", "dropped": "yellow", "disconnect": "red", "exit": "magenta", "compile": "cyan", "profile": "green"}

    def draw(self, snap: Snapshot, width: int, height: int) -> RenderableType:
        lines: list[RenderableType] = [panel_title(self.TITLE, f"{len(snap.events)} shown of the last 500")]
        for note in snap.notices:
            lines.append(Text(f" ! {note}", style="bold yellow", no_wrap=True, overflow="ellipsis"))
        shown = snap.process_of(snap.device)
        advice = line_of(shown.advice if shown is not None else None)
        if advice:  # the top advice, first: what to do before what happened
            lines.append(Text(advice, style="bold yellow", no_wrap=True, overflow="ellipsis"))
        room = max(0, height - len(lines))
        multi = len(snap.processes) > 1
        names = {p.pid: p.who for p in snap.processes}
        for ev in list(snap.events)[-room:] if room else []:
            stamp = time.strftime("%H:%M:%S", time.localtime(ev.t))
            who = f"[{names.get(ev.pid, ev.pid)}] " if multi else ""
            lines.append(Text(f" {stamp} {who}{ev.kind:<9} {ev.text}", style=self.STYLE.get(ev.kind, ""), no_wrap=True, overflow="ellipsis"))
        return Group(*lines)


class OverviewPanel(Panel):
    """Every device of every process, side by side."""

    TITLE = "All devices"

    def draw(self, snap: Snapshot, width: int, height: int) -> RenderableType:
        table = Table(expand=True, box=None, padding=(0, 1), header_style="dim")
        # h2d/s is the process's (jax's guard logs no device): on its first
        # device's row only, not repeated on each of its devices.
        for col in ("process", "device", "in use", "pool", "limit", "frag", "h2d/s", "state"):
            table.add_column(col, no_wrap=True)
        procs = {p.pid: p for p in snap.processes}
        rated: set[int] = set()
        for dev in snap.devices:
            p = procs.get(dev.pid)
            frag = f"{dev.fragmentation:.0%}" if dev.fragmentation is not None else "n/a"
            if dev.pid in rated:
                # The same process's rate as the row above. Not the ditto mark
                # (U+3003): a wide CJK glyph that terminal and browser fonts
                # often lack (a box in a served dashboard).
                rate = "↑"
            else:
                rated.add(dev.pid)
                h2d_view = p.transfers.get(H2D) if p else None
                h2d = h2d_view.count_per_s if h2d_view else None
                rate = "–" if p is not None and p.state in (EXITED, DISCONNECTED) else fmt_rate(h2d, "")
            table.add_row(p.who if p else str(dev.pid), dev.label, fmt_bytes(dev.bytes_in_use), fmt_bytes(dev.pool_bytes),
                          fmt_bytes(dev.bytes_limit), frag, rate, p.state if p else "?")
        if not snap.devices:
            return Group(panel_title(self.TITLE), Text("no devices yet", style="dim"))
        return Group(panel_title(self.TITLE, "tab: next device"), table)


def _approx(inferred: bool) -> str:
    """``~`` before a figure inferred from the lines' argument sizes."""
    return "~" if inferred else ""
