"""The timeline series: what the dashboard's timelines draw, per sample.

One definition for both ends of the wire. The agent folds these values into
its coarse history (the min and max of each series per 10 s bucket, see
:class:`jaxtop.agent.history.Coarse`); the dashboard computes the same rows
from the samples it is sent (:mod:`jaxtop.dashboard.model`). So a bucket of
the agent's coarse history holds exactly what the dashboard would have made
of every sample in it: a day-long run's timeline is right at coarse zoom
without the dashboard reading 864,000 samples.

Stdlib only: the agent imports it inside the user's program.
"""

from __future__ import annotations

import math
from typing import Any

from jaxtop.wire.protocol import DIRECTIONS, finite, fragmentation_na, list_of, obj_of, timestamp

#: A device's series, in column order.
DEVICE_SERIES = ("bytes_in_use", "pool_bytes", "peak_bytes_in_use", "allocs_per_s", "fragmentation", "nvml_used_bytes",
                 "live_bytes", "largest_free_block_bytes", "live_holes")
#: The process's series, in column order.
PROCESS_SERIES = ("h2d_per_s", "d2h_per_s", "d2d_per_s", "h2d_bytes_per_s", "d2h_bytes_per_s", "d2d_bytes_per_s",
                  "rss_bytes", "cpu_percent", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s")
#: Counters a coarse bucket sums (transfers in the bucket, by direction).
SUM_SERIES = tuple(f"{d}_{what}" for d in DIRECTIONS for what in ("count", "bytes_known"))


def nvml_map(hello: dict[str, Any]) -> dict[Any, Any]:
    """jax device id -> NVML index, from a ``hello``'s ``nvml.devices``."""
    devices = list_of(obj_of(hello.get("nvml")).get("devices"))
    return {d.get("jax_id"): d.get("index") for d in devices
            if isinstance(d, dict) and d.get("jax_id").__class__ in (int, str)}  # a key: hashable


#: Why a device that reports ``num_allocs`` has no allocation rate. On GPU
#: (BFC) it counts allocations made, a running total; on a TPU v5e it counts
#: the allocations alive (it fell 110 times in a 54 s training loop, so the
#: rate of its rises read 2,057 "allocs/s" and then 0).
LIVE_COUNT_NA = "num_allocs counts the allocations alive on this backend, not those made: no rate"


def counts_live_allocations(platform: Any, prev: Any, num_allocs: Any) -> bool:
    """True when ``num_allocs`` is known not to be a running total: on a TPU,
    or once it has fallen (``prev``: the previous count, or None)."""
    return platform == "tpu" or (prev is not None and num_allocs is not None and num_allocs < prev)


class Cursor:
    """The timeline rows of one stream's samples, fed in order.

    Rates need the previous sample (transfers per second over the time since
    it; allocations per second from ``num_allocs``), so a cursor follows one
    stream. The rules are the dashboard's: a transfer rate is the interval's
    count over the time since the previous sample (the sample period for
    the first one), and a device's allocation rate holds its last value
    while a sample has no ``num_allocs``.

    Args:
        interval_s: the stream's sample period (``hello.interval_s``).
        jax_to_nvml: jax device id -> NVML index (:func:`nvml_map`).
    """

    __slots__ = ("interval_s", "jax_to_nvml", "prev_t", "allocs")

    def __init__(self, interval_s: float = 0.1, jax_to_nvml: dict[Any, Any] | None = None) -> None:
        self.interval_s = interval_s
        self.jax_to_nvml = jax_to_nvml or {}
        self.prev_t: float | None = None
        self.allocs: dict[Any, list[Any]] = {}  # device id -> [t, num_allocs, rate, counts live allocations]

    def rows(self, rec: dict[str, Any]) -> tuple[float, list[Any], list[tuple[Any, list[Any]]], list[Any]] | None:
        """``(t, process row, [(device id, device row)], transfer counts)`` of
        one sample, values as the sample has them (None: missing); None for a
        sample without a time."""
        t = timestamp(rec.get("t"))
        if t is None:
            return None
        dt = (t - self.prev_t) if self.prev_t is not None else None
        if dt is not None and dt <= 0:
            dt = None
        self.prev_t = t
        nvml_by_index = {g["index"]: g for g in list_of(obj_of(rec.get("nvml")).get("devices"))
                         if isinstance(g, dict) and g.get("index").__class__ is int}
        jax_to_nvml = self.jax_to_nvml
        devices: list[tuple[Any, list[Any]]] = []
        for dev in list_of(rec.get("devices")):
            if not isinstance(dev, dict) or dev.get("id").__class__ not in (int, str):  # a key: hashable, comparable
                continue
            did = dev["id"]
            state = self.allocs.get(did)
            if state is None:
                state = self.allocs[did] = [None, None, None, False]
            num_allocs = finite(dev.get("num_allocs"))
            if num_allocs is not None:
                if state[3] or counts_live_allocations(dev.get("platform"), state[1], num_allocs):
                    state[2], state[3] = None, True
                elif state[0] is not None and t > state[0]:
                    state[2] = max(0.0, (num_allocs - state[1]) / (t - state[0]))
                state[0], state[1] = t, num_allocs
            index = jax_to_nvml.get(did)
            devices.append((did, device_row(dev, nvml_by_index.get(index) if index.__class__ is int else None, state[2])))
        transfers = obj_of(rec.get("transfers"))
        span = dt if dt is not None else self.interval_s
        rates: list[Any] = []
        byte_rates: list[Any] = []
        sums: list[Any] = []
        for d in DIRECTIONS:
            tr = obj_of(transfers.get(d))
            count, nbytes = tr.get("count"), tr.get("bytes_known")
            rates.append(count / span if finite(count) is not None else None)
            byte_rates.append(nbytes / span if finite(nbytes) is not None else None)
            sums.append(count)
            sums.append(nbytes)
        host = obj_of(rec.get("process"))
        tx = rx = None
        if nvml_by_index:
            txs = [x for x in (finite(g.get("pcie_tx_bytes_per_s")) for g in nvml_by_index.values()) if x is not None]
            rxs = [x for x in (finite(g.get("pcie_rx_bytes_per_s")) for g in nvml_by_index.values()) if x is not None]
            tx = sum(txs) if txs else None
            rx = sum(rxs) if rxs else None
        process = rates + byte_rates + [host.get("rss_bytes"), host.get("cpu_percent"), tx, rx]
        return t, process, devices, sums


def device_row(dev: dict[str, Any], gpu: dict[str, Any] | None, allocs_per_s: float | None) -> list[Any]:
    """One sample's values of a device, in :data:`DEVICE_SERIES` order.

    Args:
        dev: the sample's record of the device (``devices[]``).
        gpu: the NVML record of the GPU behind it, if any.
        allocs_per_s: allocations per second, worked out by the caller
            (it needs the previous sample).
    """
    live = obj_of(dev.get("live_arrays"))
    return [
        dev.get("bytes_in_use"),
        dev.get("pool_bytes"),
        dev.get("peak_bytes_in_use"),
        allocs_per_s,
        None if fragmentation_na(dev.get("platform")) else dev.get("fragmentation"),
        gpu.get("memory_used_bytes") if gpu else None,
        live.get("bytes"),
        dev.get("largest_free_block_bytes"),
        live.get("holes"),
    ]


def number(value: Any) -> float | int | None:
    """A value as a JSON number for a bucket: ints stay exact, floats keep 7
    significant digits (the dashboard stores float32), anything else
    (None, a bool, a string, NaN) is None."""
    cls = value.__class__
    if cls is int:
        return value
    if cls is not float:
        if value is None or isinstance(value, bool):
            return None
        try:
            value = float(value)
        except (TypeError, ValueError):
            return None
    if not math.isfinite(value):
        return None
    if value == int(value) and abs(value) < 2 ** 53:
        return int(value)
    return float(f"{value:.7g}")
