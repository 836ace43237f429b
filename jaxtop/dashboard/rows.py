"""A typed sample's timeline rows: what the dashboard's timelines draw.

The series and their rules are the wire's (:mod:`jaxtop.wire.timeline`,
which the agent also folds into its coarse history, from its own dicts):
a transfer rate is the interval's count over the time since the previous
sample (the sample period for the first), a device's allocation rate holds
its last value while a sample has no ``num_allocs``, and a TPU's
fragmentation is never drawn. Here the same rows come from decoded records,
whose fields are already checked: no reader below this re-checks one.
"""

from __future__ import annotations

from typing import Any

from jaxtop.wire.protocol import fragmentation_na
from jaxtop.wire.records import Device, Gpu, Nvml, Sample, Transfer
from jaxtop.wire.timeline import counts_live_allocations

__all__ = ["NO_TOTALS", "NO_TRANSFERS", "AllocationRate", "Cursor", "device_row", "gpus_by_index", "process_row",
           "transfer_totals"]


def gpus_by_index(nvml: Nvml | None) -> dict[int, Gpu]:
    """A sample's NVML GPUs by their index."""
    if nvml is None or not nvml.devices:
        return {}
    return {g.index: g for g in nvml.devices if g.index is not None}


def device_row(dev: Device, gpu: Gpu | None, allocs_per_s: float | None) -> tuple[Any, ...]:
    """One sample's values of a device, in ``DEVICE_SERIES`` order."""
    live = dev.live_arrays
    return (
        dev.bytes_in_use,
        dev.pool_bytes,
        dev.peak_bytes_in_use,
        allocs_per_s,
        None if fragmentation_na(dev.platform) else dev.fragmentation,
        gpu.memory_used_bytes if gpu is not None else None,
        live.bytes if live is not None else None,
        dev.largest_free_block_bytes,
        live.holes if live is not None else None,
    )


#: A sample without ``transfers``: no direction, no total.
NO_TRANSFERS: tuple[None, None, None] = (None, None, None)
NO_TOTALS: tuple[None, ...] = (None,) * 6


def transfer_totals(by_direction: tuple[Transfer | None, Transfer | None, Transfer | None]) -> tuple[Any, ...]:
    """A sample's transfer totals, (count, bytes known) of each direction
    (h2d, d2h, d2d): what the Transfers panel's rates are measured over."""
    h2d, d2h, d2d = by_direction
    return (h2d.count_total if h2d is not None else None, h2d.bytes_known_total if h2d is not None else None,
            d2h.count_total if d2h is not None else None, d2h.bytes_known_total if d2h is not None else None,
            d2d.count_total if d2d is not None else None, d2d.bytes_known_total if d2d is not None else None)


def process_row(rec: Sample, span: float, gpus: dict[int, Gpu]) -> tuple[Any, ...]:
    """One sample's values of the process, in ``PROCESS_SERIES`` order:
    the transfer rates over ``span`` seconds (the time since the previous
    sample), the host's figures and the GPUs' PCIe rates summed."""
    transfers = rec.transfers
    counts: list[Any] = [None] * 6
    if transfers is not None:
        for i, tr in enumerate((transfers.h2d, transfers.d2h, transfers.d2d)):
            if tr is not None:
                counts[i] = tr.count / span if tr.count is not None else None
                counts[3 + i] = tr.bytes_known / span if tr.bytes_known is not None else None
    host = rec.process
    tx = rx = None
    if gpus:
        txs = [g.pcie_tx_bytes_per_s for g in gpus.values() if g.pcie_tx_bytes_per_s is not None]
        rxs = [g.pcie_rx_bytes_per_s for g in gpus.values() if g.pcie_rx_bytes_per_s is not None]
        tx = sum(txs) if txs else None
        rx = sum(rxs) if rxs else None
    return (*counts, host.rss_bytes if host is not None else None, host.cpu_percent if host is not None else None, tx, rx)


class AllocationRate:
    """A device's allocations per second, from the ``num_allocs`` of its
    samples in order: the rise over the time since the previous sample that
    had it, held while a sample has none; none at all once the count is
    known not to be a running total (a TPU's, or one that fell:
    ``jaxtop.wire.timeline.counts_live_allocations``)."""

    __slots__ = ("t", "count", "per_s", "live")

    def __init__(self) -> None:
        self.t: float | None = None  # when the last count came
        self.count: int | float | None = None
        self.per_s: float | None = None
        self.live = False  # the count is of allocations alive, not made

    def feed(self, t: float, num_allocs: int | float | None, platform: str | None) -> None:
        if num_allocs is None:
            return
        count, last_t = self.count, self.t
        if self.live or counts_live_allocations(platform, count, num_allocs):
            self.live, self.per_s = True, None
        elif last_t is not None and count is not None and t > last_t:
            rise = (num_allocs - count) / (t - last_t)
            self.per_s = rise if rise > 0.0 else 0.0
        self.t, self.count = t, num_allocs


class Cursor:
    """The timeline rows of one stream's samples, fed in order (a history's
    fine samples: rates need the previous sample).

    Args:
        interval_s: the stream's sample period (``hello.interval_s``).
        jax_to_nvml: jax device id -> NVML index.
    """

    __slots__ = ("interval_s", "jax_to_nvml", "prev_t", "allocs")

    def __init__(self, interval_s: float, jax_to_nvml: dict[Any, int]) -> None:
        self.interval_s = interval_s
        self.jax_to_nvml = jax_to_nvml
        self.prev_t: float | None = None
        self.allocs: dict[Any, AllocationRate] = {}  # by device id

    def rows(self, rec: Sample) -> tuple[float, tuple[Any, ...], list[tuple[Any, tuple[Any, ...]]]] | None:
        """``(t, process row, [(device id, device row)])`` of one sample;
        None for a sample without a time."""
        t = rec.t
        if t is None:
            return None
        dt = (t - self.prev_t) if self.prev_t is not None else None
        if dt is not None and dt <= 0:
            dt = None
        self.prev_t = t
        gpus = gpus_by_index(rec.nvml)
        devices: list[tuple[Any, tuple[Any, ...]]] = []
        for dev in rec.devices or ():
            did = dev.id
            if did is None:
                continue
            rate = self.allocs.get(did)
            if rate is None:
                rate = self.allocs[did] = AllocationRate()
            rate.feed(t, dev.num_allocs, dev.platform)
            index = self.jax_to_nvml.get(did)
            devices.append((did, device_row(dev, gpus.get(index) if index is not None else None, rate.per_s)))
        return t, process_row(rec, dt if dt is not None else self.interval_s, gpus), devices
