"""Dashboard panels. Each one renders what the snapshot hands it and keeps
no history of its own; drawing is done by the pure renderables in
:mod:`jaxtop.widgets.render`."""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import numpy as np
from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from jaxtop.dashboard.history import Window
from jaxtop.dashboard.model import (
    DEVICE_SERIES, DISCONNECTED, EXITED, LIVE, PROCESS_SERIES, REPLAY, STALE, DeviceView, ProcessView, Snapshot,
)
from jaxtop.dashboard.readings import TransferView
from jaxtop.dashboard.views import D2D, D2H, DIRECTIONS, H2D
from jaxtop.widgets.accelerator_lines import host_accelerator_line, host_title, pcie_shown
from jaxtop.widgets.render import Gauge, LayersBar, MemoryMap, Series, Strip, TimelineStack, fmt_bytes, fmt_duration, fmt_rate

#: Seconds after which the memory and map panels say how old their live-array
#: figures are (the agent scans many arrays less often, to stay cheap).
STALE_DETAIL_S = 3.0

STATE_STYLE = {LIVE: "bold green", STALE: "bold yellow", DISCONNECTED: "bold red", EXITED: "bold magenta", REPLAY: "bold cyan"}
WINDOW_LABEL = {60.0: "1 min", 600.0: "10 min", 3600.0: "1 h", None: "whole run"}


def panel_title(text: str, extra: str = "") -> Text:
    line = Text(f" {text} ", style="bold reverse", no_wrap=True, overflow="ellipsis")
    if extra:
        line.append(f" {extra}", style="dim")
    return line


def fitting(choices: list[str], width: int) -> str:
    """The first of ``choices`` (most detailed first) that fits in ``width``
    cells, else the last: a narrow panel drops words, not halves of them."""
    return next((c for c in choices if cell_len(c) <= width), choices[-1])


def fitted_title(text: str, extras: list[str], width: int) -> Text:
    """A panel title with the first of ``extras`` that fits beside it, or none."""
    return panel_title(text, fitting([*extras, ""], width - cell_len(text) - 3))


def _na(reason: str | None) -> Text:
    return Text(f"n/a ({reason})" if reason else "n/a", style="dim")


def _or_na(value: object) -> object:
    """A figure as it is shown in running text: n/a when not measured."""
    return "n/a" if value is None else value


def short_command(argv: list[str]) -> str:
    """The part of a command line that tells runs apart: no interpreter path,
    no ``jaxtop run`` wrapper, the script by its file name."""
    args = list(argv)
    if args and os.path.basename(args[0]).startswith("python"):
        args = args[1:]
    if args[:3] == ["-m", "jaxtop", "run"]:
        args = args[3:]
    elif len(args) >= 2 and os.path.basename(args[0]) == "jaxtop" and args[1] == "run":
        args = args[2:]
    if args and os.sep in args[0]:
        args[0] = os.path.basename(args[0])
    return " ".join(args) or "?"


class Panel(Widget):
    """A titled box fed with snapshots."""

    snapshot: reactive[Snapshot | None] = reactive(None, layout=False, always_update=True)
    """The snapshot to draw; None until the first one arrives."""

    TITLE = ""

    draw: Callable[[Snapshot, int, int], RenderableType]
    """Each panel's drawing: the snapshot into ``width`` x ``height`` cells."""

    def render(self) -> RenderableType:
        snap = self.snapshot
        if snap is None:
            return Group(panel_title(self.TITLE), Text("waiting for data…", style="dim"))
        try:
            return self.draw(snap, max(1, self.size.width), max(1, self.size.height))
        except Exception as exc:  # a drawing bug must not take the dashboard down
            return Group(panel_title(self.TITLE), Text(f"render error: {exc}", style="red"))

class LoadingLine(Widget):
    """One line shown while a backlog loads: how much is in, how far behind.

    Not a Static: ``Static.update`` asks for a layout of the whole screen
    (its content might change size), and the line changes at every frame
    while a backlog loads; a full layout then cost 25-30 ms a frame on a
    2-core VM, which a key pressed meanwhile waited for. This one's height is
    fixed, so a new text is a repaint of one line.
    """

    DEFAULT_CSS = "LoadingLine { height: 1; }"

    text: reactive[str] = reactive("", layout=False)
    """What the line says ("loading backlog: N samples in, S s behind")."""

    def render(self) -> RenderableType:
        return Text(self.text, no_wrap=True, overflow="ellipsis")


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
            bottom.append(f"  overview: {len(snap.devices)} devices", style="bold")
        elif proc.external:
            bottom.append(f"  EXTERNAL VIEW: {proc.external}", style="bold black on cyan")
        else:
            bottom.append("  no devices yet (waiting for the program to start JAX)", style="yellow")
        bottom.append(f"  window {WINDOW_LABEL.get(snap.window_s, snap.window_s)}", style="dim")
        return Group(top, bottom)


class MemoryPanel(Panel):
    """NVML used ≥ pool ≥ in use ≥ live arrays, against the limit, and the
    in-use memory that belongs to no live array (work queued ahead)."""

    TITLE = "Memory"

    def draw(self, snap: Snapshot, width: int, height: int) -> RenderableType:
        dev = snap.device
        if dev is None:
            return Group(panel_title(self.TITLE), Text("no device", style="dim"))
        proc = snap.process_of(dev)
        narrow = width < 50
        layers = []
        if dev.nvml is not None or dev.platform == "gpu":
            # NVML's view only where NVIDIA GPUs are: on a GPU without it
            # the reason is worth a line, on a TPU or CPU it is noise.
            reason = None if dev.nvml is not None else (proc.nvml_status.na_reason if proc else None) or "no NVML"
            layers.append(("NVML used", dev.nvml.memory_used_bytes if dev.nvml else None, "magenta", reason))
        if dev.pool_bytes is not None or dev.platform != "tpu":
            # The TPU runtime owns all of HBM up to bytes_limit and reports
            # no pool: the limit line below is its pool.
            pool_reason = None if dev.pool_bytes is not None else (
                ("no pool on CPU" if narrow else "no allocator pool on CPU") if dev.source == "live_arrays"
                else ("no pool reported" if narrow else "allocator reports no pool"))
            layers.append(("pool", dev.pool_bytes, "blue", pool_reason))
        layers.append(("in use" if dev.source == "memory_stats" else "in use*", dev.bytes_in_use, "green", None))
        layers.append(("live arrays", dev.live_bytes, "cyan", None))
        unheld = dev.unheld
        if unheld is not None:
            layers.append(("not in arrays", unheld[0], "yellow", None))
        limit = dev.bytes_limit or (dev.nvml.memory_total_bytes if dev.nvml else None)
        extra = []
        if dev.live_age_s is not None and dev.live_age_s >= STALE_DETAIL_S:
            # Many arrays: the agent scans them less often to stay cheap. It
            # qualifies the bars above, so it goes first.
            extra.append(f"live arrays as of {fmt_duration(dev.live_age_s)} ago")
        if dev.cached_unused_bytes is not None:
            extra.append(f"cached unused {fmt_bytes(dev.cached_unused_bytes)}")
        if dev.headroom_bytes is not None:
            extra.append(f"headroom {fmt_bytes(dev.headroom_bytes)}")
        if dev.source == "live_arrays":
            extra.append("*from live arrays")
        label = dev.label
        if dev.source == "live_arrays" and not (extra and height > 6):
            # No room for the note: the asterisk is explained in the title.
            label = fitting([f"{dev.label} · *from live arrays", f"{dev.label} · *live arrays", dev.label],
                            width - len(self.TITLE) - 3)
        body: list[RenderableType] = [panel_title(self.TITLE, label), LayersBar(layers, limit)]
        room = height - len(layers) - 2  # lines left under the bars and the limit
        stale = bool(extra) and extra[0].startswith("live arrays as of")
        if stale and room > 0:
            body.append(Text(extra.pop(0), style="yellow"))
            room -= 1
        if unheld is not None and _queued_matters(unheld[0], dev.bytes_in_use) and room > 0:
            body.append(Text(fitting(queued_notes(dev, proc), width), style="yellow", no_wrap=True, overflow="ellipsis"))
            room -= 1
        if extra and room > 0:
            body.append(Text(" · ".join(extra), style="dim"))
        return Group(*body)


def _queued_matters(unheld_bytes: int, in_use: int | None) -> bool:
    """Worth a sentence: at least 64 MiB and a tenth of what is in use (a
    runtime's own few MiB of scratch are not a finding)."""
    return unheld_bytes >= 64 << 20 and (in_use is None or unheld_bytes >= 0.1 * in_use)


def queued_notes(dev: DeviceView, proc: ProcessView | None) -> list[str]:
    """What is known of the memory that belongs to no live array, longest
    first (for :func:`fitting`): work dispatched ahead of the device (jax
    returns before a step runs), the arrays still being computed, and what
    one call of the largest jitted function holds (its new outputs and
    temporaries, from the jit ledger) — about what each queued step adds."""
    computing = dev.not_ready_count
    call = proc.largest_call if proc is not None else None
    accel = proc.accelerator if proc is not None else None
    queue = accel.hlo_queue_size if accel is not None else None  # the TPU runtime's own count, where it answers
    per_call = fmt_bytes(call.call_held_bytes) if call is not None else None
    long, mid = ["work queued ahead (async dispatch)"], ["queued work (async dispatch)"]
    if computing:
        long.append(f"{computing} arrays still computing")
        mid.append(f"{computing} computing")
    if queue is not None:
        long.append(f"{queue} programs in the runtime's queue")
        mid.append(f"queue {queue}")
    if call is not None:
        long.append(f"one {call.name} call holds {per_call}")
        mid.append(f"{call.name} {per_call}/call")
    if not dev.unheld_exact and dev.live_age_s:
        # An older agent's recording: in use now against a scan a moment older.
        long.append(f"≈: live arrays scanned {fmt_duration(dev.live_age_s)} before")
    short = (["queued work"] + ([f"queue {queue}"] if queue is not None else [])
             + ([f"{call.name} {per_call}/call"] if call is not None else []))
    return [" · ".join(long), " · ".join(mid), " · ".join(short), "queued work (async dispatch)", "queued work"]


class FragmentationPanel(Panel):
    """The allocator's fragmentation now and its largest free block, or
    why there is none (the reason wrapped over the panel, not cut).

    Their history is a strip of :class:`TimelinePanel`.
    """

    TITLE = "Fragmentation"

    def draw(self, snap: Snapshot, width: int, height: int) -> RenderableType:
        dev = snap.device
        if dev is None:
            return Group(panel_title(self.TITLE))
        if dev.fragmentation is None:
            reason = Text(f"n/a — {dev.fragmentation_reason}" if dev.fragmentation_reason else "n/a", style="dim")
            free = dev.largest_free_block_bytes
            if free is not None and dev.bytes_limit is not None and dev.bytes_in_use is not None:
                # No figure of its own (TPU), but what the runtime reports.
                facts = [f"largest free block {fmt_bytes(free)} of {fmt_bytes(dev.bytes_limit - dev.bytes_in_use)} free",
                         f"largest free {fmt_bytes(free)} of {fmt_bytes(dev.bytes_limit - dev.bytes_in_use)}",
                         f"largest free {fmt_bytes(free)}"]
                return Group(panel_title(self.TITLE), Text(fitting(facts, width), no_wrap=True, overflow="ellipsis"),
                             reason)
            if dev.live_holes is None:
                if dev.source == "live_arrays" and height >= 4:
                    # Why the holes between live buffers are not shown either.
                    return Group(panel_title(self.TITLE), reason,
                                 Text(fitting(["no holes figure: it needs two live buffers of 64 KiB or more",
                                               "holes: need two buffers ≥ 64 KiB", ""], width), style="dim"))
                return Group(panel_title(self.TITLE), reason)
            # No allocator figure (CPU): the holes between live buffers
            # instead, under their own name, and why the allocator's is n/a.
            extra = fitting(["holes between live buffers", "live-buffer holes", ""], width - len(self.TITLE) - 3)
            why = dev.fragmentation_reason or "the allocator reports none"
            full = f"the allocator's figure n/a — {why}"
            if height >= 4:  # room to wrap the whole reason
                note = Text(full, style="dim")
            else:
                note = Text(fitting([full, "the allocator's figure n/a on this backend", "allocator's n/a"], width),
                            style="dim", no_wrap=True, overflow="ellipsis")
            return Group(panel_title(self.TITLE, extra), Gauge(dev.live_holes, label="holes"), note)
        parts: list[RenderableType] = [panel_title(self.TITLE), Gauge(dev.fragmentation, label="frag")]
        free, pool_free = dev.largest_free_block_bytes, dev.cached_unused_bytes
        if free is not None and height > 2:
            choices = [f"largest free block {fmt_bytes(free)}", f"largest free {fmt_bytes(free)}"]
            if pool_free is not None:
                choices[:0] = [f"largest free block {fmt_bytes(free)} of {fmt_bytes(pool_free)} free in the pool",
                               f"largest free block {fmt_bytes(free)} of {fmt_bytes(pool_free)} free",
                               f"largest free {fmt_bytes(free)} of {fmt_bytes(pool_free)} free"]
            parts.append(Text(fitting(choices, width), no_wrap=True, overflow="ellipsis"))
        return Group(*parts)


class MemoryMapPanel(Panel):
    """Live buffers in address order, and the largest ones."""

    TITLE = "Memory map"

    def draw(self, snap: Snapshot, width: int, height: int) -> RenderableType:
        dev = snap.device
        if dev is None:
            return Group(panel_title(self.TITLE))
        proc = snap.process_of(dev)
        if proc is not None and proc.detail_na:
            return Group(panel_title(self.TITLE), Text(f"n/a — {proc.detail_na}", style="dim"))
        rows = 1 if height < 6 else 2
        # The map and its counts come from the same scan: the latest
        # live_bytes may be from a later one.
        kwargs = {"rows": rows, "count": dev.map_live_count, "total_hint": dev.map_live_bytes, "unmapped": dev.unmapped,
                  "complete": dev.map_complete}
        the_map = MemoryMap(list(dev.buffer_map), **kwargs)
        strip_rows = rows if dev.buffer_map else 0  # no addresses: a caption only
        # Why buffers are missing from the map gets a line of its own when
        # the panel has one to spare: it is what keeps the map consistent
        # with the bytes beside it.
        if the_map.has_note and height >= strip_rows + 4:
            the_map = MemoryMap(list(dev.buffer_map), caption_lines=2, **kwargs)
            used = strip_rows + 3
        else:
            used = strip_rows + 2
        room = width - len(self.TITLE) - 3
        subtitle = fitting(["buffers by address (█ used ▒ part ·free ≈cut)", "by address (█ used ·free)",
                            "buffers by address"], room)
        if dev.map_age_s is not None and dev.map_age_s >= STALE_DETAIL_S:
            subtitle = fitting([f"buffers by address, {fmt_duration(dev.map_age_s)} ago", f"{fmt_duration(dev.map_age_s)} ago"],
                               width - len(self.TITLE) - 3)
        parts: list[RenderableType] = [panel_title(self.TITLE, subtitle), the_map]
        for buf in dev.top_buffers[: max(0, height - used)]:
            parts.append(Text(f" {fmt_bytes(buf.nbytes):>10}  {buf.dtype}{buf.shape}", no_wrap=True, overflow="ellipsis"))
        return Group(*parts)


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
    if unheld is not None and _queued_matters(unheld[0], dev.bytes_in_use):
        notes.append(f"{'≈' if not unheld[1] else ''}{fmt_bytes(unheld[0])} not in arrays")
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
    free = _series(dev.timeline, DEVICE_SERIES, "largest_free_block_bytes", "largest free block", "green", "fill")
    reason = dev.fragmentation_reason or "the allocator reports no fragmentation"
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
    """Implicit h2d / d2h / d2d per second, totals, frequent shapes, PCIe (GPU)."""

    TITLE = "Transfers (implicit)"

    def draw(self, snap: Snapshot, width: int, height: int) -> RenderableType:
        proc = snap.process_of(snap.device)
        if proc is None:
            return Group(panel_title(self.TITLE))
        cap = proc.capture
        if cap.available is False:
            return Group(panel_title(self.TITLE), _na(cap.na_reason))
        # Narrow panels drop the byte rate; the direction and the totals are
        # what must stay legible at 80x24. Their history is a strip of the
        # timelines, on the same time axis as memory.
        show_rate_bytes = width >= 38
        table = Table.grid(padding=(0, 1))
        table.add_column(no_wrap=True, min_width=3)
        headers = ["/s" if width < 44 else "count/s"] + (["bytes/s≥"] if show_rate_bytes else []) + ["total (bytes≥)"]
        for _ in headers:
            table.add_column(no_wrap=True, overflow="ellipsis")
        table.add_row(Text("dir", style="dim"), *(Text(h, style="dim") for h in headers))
        ended = proc.state in (EXITED, DISCONNECTED)  # no rate now; the totals stand
        for d in DIRECTIONS:
            r = proc.transfers.get(d) or TransferView()
            cells: list[RenderableType] = [Text(d, style="bold"), Text("–" if ended else fmt_rate(r.count_per_s, ""))]
            if show_rate_bytes:
                cells.append(Text("–" if ended else fmt_bytes(r.bytes_known_per_s)))
            cells.append(Text(f"{_or_na(r.count_total)} ({fmt_bytes(r.bytes_known_total)})"))
            table.add_row(*cells)
        note = f"{proc.state}: totals only" if ended else "bytes are a lower bound"
        parts: list[RenderableType] = [panel_title(self.TITLE, note if width >= 46 else ""), table]
        if proc.top_shapes and height > 5:
            top = proc.top_shapes[0]
            parts.append(Text(f" top: {top.direction} {top.shape} ×{top.count}", style="dim", no_wrap=True, overflow="ellipsis"))
        dev = snap.device
        if dev is not None and dev.nvml and height > 6:
            parts.append(Text(
                f" PCIe TX {fmt_bytes(dev.nvml.pcie_tx_bytes_per_s)}/s  RX {fmt_bytes(dev.nvml.pcie_rx_bytes_per_s)}/s",
                no_wrap=True))
        elif height > 6 and pcie_shown(proc, dev, snap.devices):  # NVML's, so a GPU's only
            parts.append(Text(" PCIe n/a (no NVML device)", style="dim"))
        return Group(*parts)


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
            cpu_text = f"  CPU {_or_na(host.cpu_percent)}%"
            # Narrow panels drop the thread count before anything is cut.
            choices = [f"{rss}{cpu_text}  threads {_or_na(host.threads)}", f"{rss}{cpu_text}", f"{rss}{cpu_text[1:]}", rss]
            line1 = Text(fitting(choices, width), no_wrap=True, overflow="ellipsis")
        total, seconds = proc.compile.count_total, proc.compile.seconds_total
        if total is None:
            compiles = "n/a"
        else:
            compiles = f"{total} ({seconds:.1f}s)" if seconds is not None else str(total)
        line3 = Text(
            f" compiles {compiles}  failed donations {_or_na(proc.donation.failed_total)}",
            no_wrap=True, overflow="ellipsis")
        line2 = host_accelerator_line(proc, snap.device, snap.devices, width)
        return Group(panel_title(title), line1, *([line2] if line2 is not None else []), line3)


class EventsPanel(Panel):
    """Compiles, failed donations, drops, disconnects, errors: newest last."""

    TITLE = "Events"
    STYLE = {"error": "red", "donation": "yellow", "dropped": "yellow", "disconnect": "red", "exit": "magenta", "compile": "cyan", "profile": "green"}

    def draw(self, snap: Snapshot, width: int, height: int) -> RenderableType:
        lines: list[RenderableType] = [panel_title(self.TITLE, f"{len(snap.events)} shown of the last 500")]
        for note in snap.notices:
            lines.append(Text(f" ! {note}", style="bold yellow", no_wrap=True, overflow="ellipsis"))
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
                rate = "〃"
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
