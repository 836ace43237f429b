"""The memory panels of one device: its layers against the limit (and the
in-use memory no live array holds), the allocator's fragmentation, and the
live buffers by address."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from jaxtop.dashboard.views import DeviceView, ProcessView, Snapshot
from jaxtop.widgets.panel_base import STALE_DETAIL_S, Panel, fitting, panel_title
from jaxtop.widgets.render import Gauge, LayersBar, MemoryMap, fmt_bytes, fmt_duration

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
        if dev.live_held and dev.live_age_s is not None and dev.live_age_s >= STALE_DETAIL_S:
            # The scans stopped: each would pause the program longer than
            # it allows. The bars' live arrays are the last scan's.
            ago = f"live arrays as of {fmt_duration(dev.live_age_s)} ago"
            figures = dev.live_held.split(" (", 1)[0]  # "... ~9.6 ms at 50,000 arrays"
            each = dev.live_held_pause_s  # the pause a scan would put on the program, where the agent says
            short = [f"{ago}: no scans, each ~{each * 1e3:.1f} ms (over $JAXTOP_MAX_PAUSE_MS)",
                     f"{ago} (no scans: ~{each * 1e3:.1f} ms each)"] if each else []
            extra.append(fitting([f"{ago}: {dev.live_held}", f"{ago}: {figures} ($JAXTOP_MAX_PAUSE_MS)", *short,
                                  f"{ago}: scans stopped ($JAXTOP_MAX_PAUSE_MS)",
                                  f"{ago} (scans stopped)",
                                  f"live arrays {fmt_duration(dev.live_age_s)} old (no scans)"], width - 4))
        elif dev.live_age_s is not None and dev.live_age_s >= STALE_DETAIL_S:
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
        if unheld is not None and queued_matters(unheld[0], dev.unheld_base) and room > 0:
            # Live arrays and what no array holds are of the scan, in use of
            # the latest sample: where they differ it is said first, on a
            # line of its own where there is room for both.
            apart = dev.scan_in_use_differs and room >= 2
            if apart:
                body.append(Text(fitting(scan_notes(dev), width), style="yellow", no_wrap=True, overflow="ellipsis"))
                room -= 1
            body.append(Text(fitting(queued_notes(dev, proc, scan=not apart), width), style="yellow", no_wrap=True,
                             overflow="ellipsis"))
            room -= 1
        if extra and room > 0:
            body.append(Text(" · ".join(extra), style="dim"))
        return Group(*body)


def queued_matters(unheld_bytes: int, in_use: int | None) -> bool:
    """Worth a sentence: at least 64 MiB and a tenth of what is in use (a
    runtime's own few MiB of scratch are not a finding)."""
    return unheld_bytes >= 64 << 20 and (in_use is None or unheld_bytes >= 0.1 * in_use)


def scan_notes(dev: DeviceView) -> list[str]:
    """The moment of the live-array rows where in use has moved since
    (:attr:`DeviceView.scan_in_use_differs`), longest first."""
    at_scan = fmt_bytes(dev.in_use_at_scan_bytes)
    ago = f" {fmt_duration(dev.live_age_s)} ago" if dev.live_age_s is not None and dev.live_age_s >= 1 else ""
    return [f"live arrays and not in arrays: of the scan{ago}, when {at_scan} was in use",
            f"arrays rows: of the scan{ago}, {at_scan} in use", f"scan{ago}: {at_scan} in use", f"scan: {at_scan} in use"]


def queued_notes(dev: DeviceView, proc: ProcessView | None, scan: bool = True) -> list[str]:
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
    first: list[str] = []
    if scan and dev.scan_in_use_differs:
        # No line of its own for the scan's moment: said first, or the rows
        # seem not to add up.
        notes = scan_notes(dev)
        long.insert(0, notes[0])
        mid.insert(0, notes[2])
        first = [notes[3]]
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
    short = (first + ["queued work"] + ([f"queue {queue}"] if queue is not None else [])
             + ([f"{call.name} {per_call}/call"] if call is not None else []))
    shortest = [" · ".join(first + ["queued work"])] if first else []
    return [" · ".join(long), " · ".join(mid), " · ".join(short), *shortest, "queued work (async dispatch)",
            "queued work"]


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
                # No figure of its own (TPU), but what the runtime reports,
                # marked where it is known to be no bound on a request.
                total = fmt_bytes(dev.bytes_limit - dev.bytes_in_use)
                note = f" ({dev.free_block_note})" if dev.free_block_note else ""
                block = fmt_bytes(free)
                if dev.free_block_note:
                    # Nothing can be shown (the one figure is no bound): one
                    # line, the reason first, the runtime's figures after.
                    why = dev.fragmentation_reason or "not reported"
                    line = [f"n/a — {why} · {total} free · largest free block {block}{note}",
                            f"n/a: the largest free block {block} is {dev.free_block_note} · {total} free",
                            f"n/a: largest free block {block}{note}", f"n/a: largest free {block}{note}",
                            f"n/a: block {block}{note}", "n/a"]
                    return Group(panel_title(self.TITLE), Text(fitting(line, width), no_wrap=True,
                                                               overflow="ellipsis", style="dim"))
                facts = [f"{total} free · runtime's largest free block {block}{note}",
                         f"{total} free · largest block {block}{note}",
                         f"largest block {block}{note}", f"block {block}{note}", f"block {block}"]
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
