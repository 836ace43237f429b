"""The mutable state the model keeps: one :class:`ProcessModel` per agent's
stream and one device state per device.

The vocabulary below the model: the views built from this state
(:mod:`jaxtop.dashboard.snapshot`), the backlog and batch writers and the
events list read it, and the model (:mod:`jaxtop.dashboard.model`) owns and
changes it; nothing here imports the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from jaxtop.advice import Advisor, Report
from jaxtop.dashboard.counter_window import CounterWindow
from jaxtop.dashboard.history import History
from jaxtop.dashboard.holders import HoldersFold
from jaxtop.dashboard.transfer_sites import TransferSitesFold
from jaxtop.dashboard.views import CONNECTING
from jaxtop.dashboard.readings import NO_NVML, TransferView
from jaxtop.wire.records import Accelerator, AgentStats, Device, Hello, MemoryProfile, Sample, TopBuffer
from jaxtop.wire.records import OomCensus
from jaxtop.dashboard.rows import AllocationRate, Cursor
from jaxtop.wire.timeline import DEVICE_SERIES, PROCESS_SERIES

__all__ = ["NO_DEVICE", "NO_HELLO", "NO_SAMPLE", "ProcessModel", "_DeviceState"]

#: What a process has before its first hello, sample or device reading: nothing said.
NO_HELLO, NO_SAMPLE, NO_DEVICE = Hello(), Sample(), Device()


@dataclass
class _DeviceState:
    id: int
    platform: str
    latest: Device = NO_DEVICE
    history: History = field(default_factory=lambda: History(DEVICE_SERIES))
    allocs: AllocationRate = field(default_factory=AllocationRate)  # from num_allocs (wire.timeline.LIVE_COUNT_NA)
    buffer_map: tuple[tuple[int, int], ...] = ()
    map_complete: bool = True
    top_buffers: tuple[TopBuffer, ...] = ()
    map_live_count: int | None = None
    map_live_bytes: int | None = None
    map_t: float | None = None  # when the agent derived the map (None: not said)
    unmapped: dict[str, int] = field(default_factory=dict)
    past: History | None = None  # history rows received after the present, not yet merged


class ProcessModel:
    """State of one agent's stream."""

    def __init__(self, pid: int, new_history: Callable[[tuple[str, ...]], History] = History) -> None:
        self.pid = pid
        self.hello = NO_HELLO
        self.state = CONNECTING
        self.devices: dict[int, _DeviceState] = {}
        self.history = new_history(PROCESS_SERIES)
        self.latest = NO_SAMPLE
        self.last_t: float | None = None  # agent time of the last sample
        self.last_recv: float | None = None  # our monotonic clock at receipt
        self.rates: dict[str, TransferView] = {}  # by direction: the panel's rates and totals
        # Each direction's count and known bytes since start, per sample: the
        # rates shown are over a window of them, as the per-line rates are.
        self.transfer_window = CounterWindow()
        self.last_profile: MemoryProfile | None = None
        self.holders = HoldersFold()
        self.transfer_sites = TransferSitesFold()  # which line makes each implicit transfer
        self.oom_censuses: list[OomCensus] = []  # oldest first, one per census id
        self.backend: str | None = None
        self.versions: dict[str, Any] = {}
        self.nvml_status = NO_NVML
        self.jax_to_nvml: dict[int | str, int] = {}  # device id -> NVML index (the hello's nvml)
        self.demo: dict[str, Any] | None = None
        # The newest compile line, when its fold began and the compiles in it.
        self.compile_fold: tuple[Any, float, int] | None = None
        self.accelerator: Accelerator | None = None  # the last `accelerator` (sent when it changes)
        self.nvml_said = False  # the hello's NVML failure was weighed (accelerator.nvml_worth_saying)
        self.started_t: float | None = None  # the process's start (process probe), not the agent's
        self.samples = 0  # samples applied so far (a loading indicator counts them)
        self.devices_refused = False  # a device beyond MAX_DEVICES was left out (said once)
        self.interval_s = 0.1  # the hello's interval_s, where it is a positive number
        self.agent: AgentStats | None = None  # the last sample's `agent` (sent once a second)
        self.odd_said: set[str] = set()  # what the stream held that could not be shown (each said once)
        # History sent after the present (hello.history.present_first): the
        # coarse buckets go into the timelines as they come; the fine
        # samples are gathered in `past` histories and merged now and then.
        self.history_loading = False  # between a hello that announces it and history_end
        self.coarse_done = True  # the coarse part of this connection's history is in
        self.present_t: float | None = None  # this connection's present: history is older
        self.history_floor: float | None = None  # the newest sample before it (events up to it were seen)
        self.past: History | None = None
        self.past_cursor: Cursor | None = None  # the history samples' rows (jaxtop.dashboard.rows)
        self.past_samples = 0
        self.past_last_t: float | None = None
        self.past_merged_at = 0.0  # model clock
        self.past_holders: list[Sample] = []  # history samples' Holders fields, oldest first
        # Coarse rows not merged yet: (history, bucket) -> (history, times, lows, highs).
        self.coarse_pending: dict[tuple[int, float], tuple[History, list[Any], list[np.ndarray], list[np.ndarray]]] = {}
        self.coarse_merges = 0  # merges of this connection's coarse history so far
        self.coarse_step: float | None = None  # its bucket: coarser levels need no fine rows…
        self.coarse_first_t: float | None = None  # …from where it starts
        self.coarse_merged_at = 0.0  # model clock
        self.present_holders: list[Sample] = []  # the same of the present and later samples
        # The advisor (jaxtop.advice), fed every sample in time order: the
        # present and live samples that come while the history loads are
        # held and fed after it. Its ledger is the model's.
        self.advisor = Advisor(fold_jit=False)
        self.advice_held: list[Sample] = []
        self.advice: Report | None = None  # the last evaluation

    @property
    def tick_s(self) -> float:
        """The interval the agent samples at now: longer than the hello's
        while the agent is at its CPU ceiling (it says so once a second; it
        stretches twice at most: a figure past ten times is not believed,
        or a broken agent would never read as stale)."""
        tick = self.agent.tick_s if self.agent is not None else None
        if tick is None or not tick > 0:
            return self.interval_s
        return min(max(self.interval_s, tick), 10 * self.interval_s)
