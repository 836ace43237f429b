"""The model's state of one process, turned into frozen views.

:meth:`jaxtop.dashboard.model.Model.snapshot` calls these under its lock;
they read a process's state and its latest sample and build the typed
views of :mod:`jaxtop.dashboard.views`, so no wire object reaches a widget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jaxtop.advice import Report
from jaxtop.wire import protocol
from jaxtop.dashboard.accelerator import AcceleratorView
from jaxtop.dashboard.history import Window
from jaxtop.dashboard.ledger import JitFunction
from jaxtop.wire.timeline import LIVE_COUNT_NA
from jaxtop.dashboard.oom_views import OomCensus
from jaxtop.wire.records import OomCensus as CensusRecord
from jaxtop.dashboard.readings import (
    AgentView, BufferView, CaptureView, CompileView, DonationView, GpuView, HostView, NvmlStatusView, NvmlView, ProfileView,
    TopShapeView, TransferView,
)
from jaxtop.dashboard.rows import gpus_by_index
from jaxtop.wire.records import LiveArrays
from jaxtop.dashboard.views import DISCONNECTED, EXITED, LIVE, REPLAY, STALE, DeviceView, ProcessView, unheld_of

if TYPE_CHECKING:
    from jaxtop.dashboard.state import ProcessModel, _DeviceState
    from jaxtop.dashboard.transfer_sites import TransferSitesView

#: A device's live arrays before a scan said anything.
NO_LIVE = LiveArrays()
#: The shortest time axis drawn: a run's first sample alone still gets one.
MIN_SPAN_S = 1.0
#: Census views a model keeps built (a process keeps at most 20 censuses).
CENSUS_VIEWS_KEPT = 64

#: Census views by the id of their record, each kept with its record so
#: that the id is not reused meanwhile: a census never changes once in,
#: and snapshots are taken a few times a second.
CensusViews = dict[int, tuple[CensusRecord, OomCensus]]


def process_view(p: ProcessModel, window_s: float | None, wall: float, mono: float, replaying: bool,
                 census_views: CensusViews, largest_call: JitFunction | None = None,
                 advice: Report | None = None) -> ProcessView:
    """The view of one process.

    Args:
        p: The process's state.
        window_s: The timelines' window (None: the whole run).
        wall: The wall clock now (uptime of a live process).
        mono: The model's clock now (the age of the last sample).
        replaying: A recording plays: uptime is measured to the last sample.
        census_views: The model's census views built so far (added to).
        largest_call: The ledger's :meth:`LedgerView.largest_call`, if any.
        advice: The advisor's report, if the model evaluated one.
    """
    end_t = p.last_t
    age = (mono - p.last_recv) if (p.last_recv is not None and p.state in (LIVE, STALE)) else None
    started = _started_t(p)
    ref = p.last_t if p.state in (EXITED, DISCONNECTED, REPLAY) or replaying else wall
    latest, hello = p.latest, p.hello
    history = p.history.window(window_s, end_t)
    shapes = latest.transfers.top_shapes if latest.transfers is not None else None
    seq, own_pid = latest.seq, hello.pid
    sites = p.transfer_sites.view(p.last_t, p.tick_s)
    return ProcessView(
        pid=p.pid,
        argv=tuple(a for a in hello.argv or () if isinstance(a, str)),
        backend=p.backend,
        versions=dict(p.versions),
        state=p.state,
        sample_age_s=age,
        uptime_s=(ref - started) if (started and ref) else None,
        interval_s=p.interval_s,
        seq=seq if isinstance(seq, int) else None,
        # A process that exited (or whose agent left) transfers nothing now:
        # its last interval's rates are not a current rate. Totals stay.
        transfers=_with_lines({d: r.ended() if p.state in (EXITED, DISCONNECTED) else r for d, r in p.rates.items()},
                              sites),
        top_shapes=tuple(TopShapeView.from_wire(s) for s in shapes or ()),
        # The newest status wins: a sample's, else the hello's.
        capture=CaptureView.from_wire(latest.transfer_capture or hello.transfer_capture),
        process=HostView.from_wire(latest.process),
        compile=CompileView.from_wire(latest.compile),
        donation=DonationView.from_wire(latest.donation),
        nvml_status=NvmlStatusView.from_wire(p.nvml_status),
        history=history,
        host=hello.host,
        own_pid=own_pid if isinstance(own_pid, int) else None,
        job=hello.job,
        detail_na=hello.detail_na,
        last_profile=ProfileView.from_wire(p.last_profile),
        span=_span(history, window_s, end_t),
        demo=p.demo,
        external=hello.external.note or None if hello.external is not None else None,
        nvml=NvmlView.from_wire(latest.nvml),
        holders=p.holders.view(),
        transfer_sites=sites,
        oom_censuses=tuple(census_view(c, census_views) for c in p.oom_censuses),
        jax_version=protocol.text_of(p.versions.get("jax")),
        accelerator=AcceleratorView.from_wire(p.accelerator),
        largest_call=largest_call,
        agent=AgentView.from_wire(p.agent),
        advice=advice,
    )


def _with_lines(rates: dict[str, TransferView], sites: TransferSitesView | None) -> dict[str, TransferView]:
    """Each direction's bytes never below the sum of its lines' (the guard
    log gives no size for a cached call's copies; the lines do, from the
    arguments)."""
    if sites is None or not sites.sites:
        return rates
    out = {}
    for d, r in rates.items():
        total, counted = sites.bytes_of(d)
        # The rate: the direction's own count rate times the lines' bytes
        # per transfer, so that count/s and bytes/s speak of the same window.
        per = total / counted if total and counted else None
        rate = r.count_per_s * per if per is not None and r.count_per_s is not None else None
        # And never below the sum of its lines' own rates (each line's mix of
        # sizes is its own: a TPU loop's 1 MiB line read 199 MiB/s beside a
        # direction at 195.6 MiB/s, averaged with the direction's tiny copies).
        lines = [s.bytes_per_s for s in sites.sites if s.direction == d and s.bytes_per_s is not None]
        if lines and r.count_per_s is not None and (rate is None or sum(lines) > rate):
            rate = sum(lines)
        out[d] = r.with_lines(total, rate)
    return out


def device_view(p: ProcessModel, s: _DeviceState, window_s: float | None, end_t: float | None) -> DeviceView:
    """The view of one device of ``p``."""
    d = s.latest
    live = d.live_arrays or NO_LIVE
    index = p.jax_to_nvml.get(s.id)
    gpu = gpus_by_index(p.latest.nvml).get(index) if index is not None else None
    allocs_reason = LIVE_COUNT_NA if s.allocs.live else None
    if d.num_allocs is None:
        allocs_reason = "allocator reports no num_allocs" if d.source == "memory_stats" else "no allocator statistics on this backend"
    source = d.source or "?"
    frag_na = protocol.fragmentation_na(s.platform)
    live_age_s = _age(end_t, live.scanned_t)
    unheld = unheld_of(source, d.bytes_in_use, live.bytes, live_age_s, live.in_use_bytes)
    return DeviceView(
        pid=p.pid,
        id=s.id,
        platform=s.platform,
        source=source,
        bytes_in_use=d.bytes_in_use,
        pool_bytes=d.pool_bytes,
        bytes_limit=d.bytes_limit,
        peak_bytes_in_use=d.peak_bytes_in_use,
        largest_free_block_bytes=d.largest_free_block_bytes,
        num_allocs=d.num_allocs,
        live_bytes=live.bytes,
        live_count=live.count,
        nvml=GpuView.from_wire(gpu) if gpu is not None else None,
        # A recording from an agent that still sent the TPU's figure: the
        # rule of today's agent applies (protocol.fragmentation_na).
        fragmentation=None if frag_na else d.fragmentation,
        fragmentation_reason=frag_na or d.fragmentation_reason or None,
        allocs_per_s=s.allocs.per_s if d.num_allocs is not None else None,
        allocs_reason=allocs_reason,
        buffer_map=s.buffer_map,
        map_complete=s.map_complete,
        top_buffers=tuple(BufferView.from_wire(b) for b in s.top_buffers),
        timeline=s.history.window(window_s, end_t),
        map_live_count=s.map_live_count,
        map_live_bytes=s.map_live_bytes,
        unmapped=dict(s.unmapped),
        live_holes=live.holes,
        live_age_s=live_age_s,
        live_held=live.held,
        live_held_pause_s=live.held_pause_s if live.held else None,
        map_age_s=_age(end_t, s.map_t),
        in_use_at_scan_bytes=live.in_use_bytes,
        # Older agents said it only in the map's samples (``unmapped``).
        not_ready_count=live.not_ready_count or s.unmapped.get("not_ready"),
        not_ready_bytes=live.not_ready_bytes,
        free_block_note=protocol.TPU_FREE_BLOCK_NOTE if s.platform == "tpu" else None,
        unheld_bytes=unheld[0] if unheld else None,
        unheld_exact=unheld[1] if unheld else False,
    )


def census_view(census: CensusRecord, views: CensusViews) -> OomCensus:
    """The view of a census record, built once per record and kept in ``views``."""
    kept = views.get(id(census))
    if kept is not None and kept[0] is census:
        return kept[1]
    view = OomCensus.from_wire(census)
    if len(views) >= CENSUS_VIEWS_KEPT:
        views.pop(next(iter(views)))
    views[id(census)] = (census, view)
    return view


def _age(end_t: float | None, t: float | None) -> float | None:
    """Seconds from ``t`` to ``end_t`` (never below 0), None if either is unknown."""
    if end_t is None or t is None:
        return None
    return max(0.0, float(end_t) - t)


def _started_t(p: ProcessModel) -> float | None:
    """When the program started: the process's own start time when the
    probe reports it, else the agent's (hello), which is later when the
    agent was injected into a running program."""
    if p.started_t is not None:
        return p.started_t
    return p.hello.started_t


def _span(history: Window, window_s: float | None, end_t: float | None) -> tuple[float, float] | None:
    """The time axis all timelines of a process share.

    It ends at the last sample and reaches back ``window_s`` (the whole run
    for None), but not before the first sample: a run shorter than the
    window fills the chart instead of a sliver at its right edge. Devices
    appear after the process's first samples (when the program creates its
    backend), so their strips start blank at the left: that is when there
    was no device memory yet.
    """
    if end_t is None:
        return None
    first = float(history.t[0]) if len(history.t) else end_t
    start = max(end_t - window_s, first) if window_s else first
    return (min(start, end_t - MIN_SPAN_S), float(end_t))
