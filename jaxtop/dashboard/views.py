"""The frozen views the model hands the widgets: one :class:`Snapshot` per
frame, a :class:`ProcessView` per process and a :class:`DeviceView` per
device.

Every field is typed (see :mod:`jaxtop.dashboard.readings` for the
sample's objects): a widget reads attributes, never a wire key.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jaxtop.advice import Report
from jaxtop.wire import protocol
from jaxtop.dashboard.accelerator import AcceleratorView
from jaxtop.dashboard.history import Window
from jaxtop.dashboard.holders import HoldersView
from jaxtop.dashboard.ledger import JitFunction
from jaxtop.dashboard.oom_views import OomCensus
from jaxtop.dashboard.transfer_sites import TransferSitesView
from jaxtop.dashboard.readings import (
    AgentView, BufferView, CaptureView, CompileView, DonationView, GpuView, HostView, NvmlStatusView, NvmlView, ProfileView,
    TopShapeView, TransferView,
)

if TYPE_CHECKING:
    from jaxtop.dashboard.events import Event

__all__ = [
    "unheld_of", "D2D", "D2H", "DIRECTIONS", "H2D", "CONNECTING", "DISCONNECTED", "EXITED", "LIVE", "REPLAY", "STALE", "DeviceView", "ProcessView", "ReplayView",
    "Snapshot",
]

_THIS_HOST = platform.node()

#: The directions of a transfer, keys of ``ProcessView.transfers``.
H2D, D2H, D2D, DIRECTIONS = protocol.H2D, protocol.D2H, protocol.D2D, protocol.DIRECTIONS

#: Seconds a sample's in-use figure may be newer than the scan it is paired
#: with, for recordings whose scans did not read the allocator themselves.
UNHELD_PAIR_S = 1.5

#: Connection states shown in the header (``ProcessView.state``).
CONNECTING, LIVE, STALE, DISCONNECTED, EXITED, REPLAY = "connecting", "live", "stale", "disconnected", "exited", "replay"


def unheld_of(source: str, bytes_in_use: int | None, live_bytes: int | None, live_age_s: float | None,
              in_use_at_scan: int | None) -> tuple[int, bool] | None:
    """Device memory in use that belonged to no live array, and whether the
    two figures are of one moment.

    On an accelerator jax dispatches asynchronously: the program runs steps
    ahead of the device, and every queued step holds its outputs and
    temporaries, and keeps the inputs it reads after the program dropped
    them (measured on a TPU v5e: 10-11 GiB in use against 2.4 GiB of live
    arrays in an MLP loop). That memory is no live array's. Newer agents
    read ``bytes_in_use`` right after their scan (exact as of the scan);
    with older recordings the sample's own figure is paired with a scan at
    most :data:`UNHELD_PAIR_S` older, and the pair is marked approximate.

    Returns:
        ``(bytes, exact)``, or None where either figure is missing (no
        allocator statistics: CPU) or they are too far apart in time.
    """
    if source != "memory_stats" or live_bytes is None:
        return None
    if in_use_at_scan is not None:
        return max(0, in_use_at_scan - live_bytes), True
    if bytes_in_use is None or live_age_s is None or live_age_s > UNHELD_PAIR_S:
        return None
    return max(0, bytes_in_use - live_bytes), False


@dataclass(frozen=True)
class DeviceView:
    """Everything the screen shows for one device, at one moment."""

    pid: int
    id: int
    platform: str
    source: str  # memory_stats | live_arrays
    bytes_in_use: int | None
    pool_bytes: int | None
    bytes_limit: int | None
    peak_bytes_in_use: int | None
    largest_free_block_bytes: int | None
    num_allocs: int | None
    live_bytes: int | None
    live_count: int | None
    nvml: GpuView | None  # the matching NVML GPU, if any
    fragmentation: float | None
    fragmentation_reason: str | None
    allocs_per_s: float | None
    allocs_reason: str | None
    buffer_map: tuple[tuple[int, int], ...]
    map_complete: bool
    top_buffers: tuple[BufferView, ...]
    timeline: Window
    # The scan the map comes from: its buffer count and bytes, and the
    # buffers it could not place, by kind (the model's UNMAPPED_KINDS). The
    # latest live_bytes/live_count may come from a later scan than the map.
    map_live_count: int | None = None
    map_live_bytes: int | None = None
    unmapped: dict[str, int] = field(default_factory=dict)
    #: Holes among live buffers' addresses (0-1), the latest scan's; None
    #: when some buffer has no address or no scan measured it.
    live_holes: float | None = None
    #: Seconds between the live-array scan behind ``live_bytes`` and this
    #: view's moment, and the same for the map: the agent scans less often
    #: when scanning costs more (many arrays), and says when it did. None
    #: where the stream does not say (older agents).
    live_age_s: float | None = None
    map_age_s: float | None = None
    #: Why the agent takes no scheduled scan (the next would pause the
    #: program past $JAXTOP_MAX_PAUSE_MS, 1 ms by default), with the figures;
    #: None while it scans.
    live_held: str | None = None
    #: The pause the next scan is predicted to put on the program (seconds), where the agent says.
    live_held_pause_s: float | None = None
    #: The allocator's bytes in use read right after that scan (newer
    #: agents; None without allocator statistics): compared with
    #: ``live_bytes`` it gives the memory that belonged to no live array.
    in_use_at_scan_bytes: int | None = None
    #: Live arrays of that scan still being computed, and their bytes: on an
    #: accelerator, outputs of work the program queued ahead of the device.
    not_ready_count: int | None = None
    not_ready_bytes: int | None = None
    #: Said beside the allocator's largest free block where it is known not
    #: to bound a request (TPU), else None.
    free_block_note: str | None = None
    #: Device memory in use that belonged to no live array
    #: (:func:`unheld_of`), and whether its two figures are of one moment.
    unheld_bytes: int | None = None
    unheld_exact: bool = False

    @property
    def unheld(self) -> tuple[int, bool] | None:
        """``(unheld_bytes, unheld_exact)``, None where it is not known."""
        return None if self.unheld_bytes is None else (self.unheld_bytes, self.unheld_exact)

    @property
    def unheld_base(self) -> int | None:
        """The bytes in use that :attr:`unheld_bytes` is a part of: the
        allocator's figure at the scan where the agent read one, else this
        sample's."""
        return self.in_use_at_scan_bytes if self.unheld_exact and self.in_use_at_scan_bytes is not None \
            else self.bytes_in_use

    @property
    def scan_in_use_differs(self) -> bool:
        """Whether in use at the scan is far from in use now, so that live
        arrays and memory not in arrays (of the scan) do not add up to the
        in-use figure shown (of the latest sample). With run-ahead the
        allocator's figure swings within a step: on a TPU v5e an MLP loop
        read 6.1 GiB in a sample while its scan 0.3 s before read 10.9 GiB."""
        now, then = self.bytes_in_use, self.in_use_at_scan_bytes
        if not self.unheld_exact or now is None or then is None:
            return False
        return abs(now - then) >= max(64 << 20, 0.1 * max(now, then))

    @property
    def label(self) -> str:
        return f"{self.platform}:{self.id}"

    @property
    def cached_unused_bytes(self) -> int | None:
        if self.pool_bytes is None or self.bytes_in_use is None:
            return None
        return self.pool_bytes - self.bytes_in_use

    @property
    def headroom_bytes(self) -> int | None:
        if self.bytes_limit is None or self.pool_bytes is None:
            return None
        return self.bytes_limit - self.pool_bytes


@dataclass(frozen=True)
class ProcessView:
    """Everything the screen shows for one process, at one moment."""

    pid: int
    argv: tuple[str, ...]
    backend: str | None
    versions: dict[str, Any]  # package name -> version (hello's versions)
    state: str
    sample_age_s: float | None
    uptime_s: float | None
    interval_s: float
    seq: int | None
    transfers: dict[str, TransferView]  # by direction (jaxtop.wire.protocol.DIRECTIONS)
    top_shapes: tuple[TopShapeView, ...]
    capture: CaptureView
    process: HostView
    compile: CompileView
    donation: DonationView
    nvml_status: NvmlStatusView
    history: Window
    last_profile: ProfileView | None
    # The time axis every timeline of this process shares: (start, end),
    # Unix seconds; None before the first sample.
    span: tuple[float, float] | None = None
    demo: dict[str, Any] | None = None  # the demo workload's state, if any
    external: str | None = None  # set for an external view (no agent): what it can see
    nvml: NvmlView | None = None  # the latest NVML reading of the process
    holders: HoldersView | None = None  # memory by allocation site, named pytrees, host syncs
    oom_censuses: tuple[OomCensus, ...] = ()  # out-of-memory censuses, oldest first
    jax_version: str | None = None  # None until the program imports jax
    host: str | None = None  # the machine the process runs on (its hello's)
    own_pid: int | None = None  # its pid there (``pid`` is the model's key, the same for a local agent)
    job: str | None = None  # the run it belongs to (over Prometheus)
    # Why the per-buffer detail (maps, top buffers, shapes) is n/a for the
    # whole process: read from Prometheus, which carries totals only.
    detail_na: str | None = None
    #: The TPU runtime's latest readings (the ``accelerator`` field, sent
    #: when it changes); None where the stream carried none (not a TPU, an
    #: older agent).
    accelerator: AcceleratorView | None = None
    #: What jaxtop's agent thread costs and the interval it samples at
    #: (None before its first report, or from an agent that sends none).
    agent: AgentView | None = None
    #: The jitted function whose call holds the most while queued (outputs
    #: and temporaries: :meth:`LedgerView.largest_call`), from the ledger.
    largest_call: JitFunction | None = None
    #: Which line of the program makes each implicit transfer (the
    #: ``transfer_sites`` field, sent when it changes); None where the
    #: stream carried none (an older agent, transfer capture off).
    transfer_sites: TransferSitesView | None = None
    #: The advisor's report (jaxtop.advice): the strategies the program
    #: misses, line by line; None before the model evaluated it.
    advice: Report | None = None

    @property
    def who(self) -> str:
        """``pid 4101``, or ``node-7 pid 1`` for a process on another machine."""
        pid = self.own_pid if self.own_pid is not None else self.pid
        if self.host and self.host != _THIS_HOST:
            return f"{self.host} pid {pid}"
        return f"pid {pid}"


@dataclass(frozen=True)
class ReplayView:
    """Where a recording's playback is, for the header."""

    playing: bool
    speed: float
    t: float | None  # recording time of the last record played
    t_start: float | None
    t_end: float | None  # None until the recording is indexed
    indexing: tuple[int, int] | None = None  # (done, total) while the index is built
    index_error: str | None = None  # why seeking is n/a
    pending_seek: str | None = None  # a seek asked for while indexing

    @classmethod
    def from_state(cls, state: Any) -> ReplayView | None:
        """From a source's ``replay_state()``; None when nothing plays."""
        if not isinstance(state, dict):
            return None
        indexing = state.get("indexing")

        def seconds(key: str) -> float | None:
            v = state.get(key)
            return float(v) if protocol.is_number(v) else None

        pending = state.get("pending_seek")
        return cls(
            playing=bool(state.get("playing")),
            speed=float(state.get("speed") or 1.0),
            t=seconds("t"),
            t_start=seconds("t_start"),
            t_end=seconds("t_end"),
            indexing=(int(indexing[0]), int(indexing[1])) if isinstance(indexing, (list, tuple)) and len(indexing) == 2 else None,
            index_error=str(state.get("index_error")) if state.get("index_error") else None,
            pending_seek=None if pending is None else str(pending),
        )


@dataclass(frozen=True)
class Snapshot:
    """One frozen picture of the model for the widgets."""

    t: float
    processes: tuple[ProcessView, ...]
    devices: tuple[DeviceView, ...]
    selected: int  # index into devices; -1 = overview
    window_s: float | None
    events: tuple[Event, ...]
    notices: tuple[str, ...] = ()
    replay: ReplayView | None = None

    @property
    def device(self) -> DeviceView | None:
        if 0 <= self.selected < len(self.devices):
            return self.devices[self.selected]
        return None

    def process_of(self, device: DeviceView | None) -> ProcessView | None:
        pid = device.pid if device is not None else (self.processes[0].pid if self.processes else None)
        for p in self.processes:
            if p.pid == pid:
                return p
        return None
