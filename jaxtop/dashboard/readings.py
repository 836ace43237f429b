"""Typed views of what a sample (and a hello) reports, for the widgets.

The decoded records' parts (:mod:`jaxtop.wire.records`: ``process``,
``compile``, ``donation``, ``nvml``, ``transfer_capture``…) become the
frozen dataclasses here that the widgets draw, so that no widget reads a
record. A figure the agent could not measure stays None, never 0; where the
wire says why, the view carries the reason (``na_reason``, or a
``*_reason`` beside the figure).

Each view is built by its ``from_wire`` classmethod from a decoded part
(or None where the sample had none): its fields were checked by the
decoder, so nothing here checks one again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from jaxtop.wire import protocol
from jaxtop.wire.records import (
    AgentStats, Capture, Compile, Donation, Gpu, MemoryProfile, Nvml, Process, TopBuffer, TopShape,
)
from jaxtop.wire.units import fmt_bytes

__all__ = [
    "NO_NVML", "AgentView", "BufferView", "CaptureView", "CompileView", "DonationView", "GpuView", "HostView",
    "NvmlStatusView", "NvmlView", "ProfileSiteView", "ProfileView", "TopShapeView", "TransferView", "device_order",
    "is_device_id", "nvml_of_devices",
]

#: The hello's ``nvml`` before one came (or from an agent that sent none).
NO_NVML = Nvml()


def _int(value: Any) -> int | None:
    value = protocol.number(value)
    return None if value is None else int(value)


def is_device_id(value: Any) -> bool:
    """Whether a device's ``id`` can name one: an integer (the agent's jax
    id) or a string (a Prometheus label that is not a number). A bool, a
    float (``0.0`` would be device 0 as a key), null or a container cannot.
    (The decoder holds records' ids to this; the coarse history's rows,
    positional, are checked with it.)"""
    return value.__class__ is int or (value.__class__ is str and 0 < len(value) <= 200)


def device_order(device_id: int | str) -> tuple[int, int, str]:
    """Sort key of device ids: integers in order, then names (ids of both
    kinds do not compare with ``<``)."""
    if isinstance(device_id, int):
        return (0, device_id, "")
    return (1, 0, device_id)


def nvml_of_devices(nvml_status: Nvml) -> dict[int | str, int]:
    """jax device id -> NVML index, from the hello's ``nvml``."""
    return {g.jax_id: g.index for g in nvml_status.devices or () if g.jax_id is not None and g.index is not None}


def _reason(reason: str | None) -> str | None:
    return protocol.shown(reason) if reason else None


@dataclass(frozen=True)
class HostView:
    """The host's view of the process (the sample's ``process``).

    ``available`` is False when the probe failed as a whole; ``na_reason``
    says why (None when the agent gave no reason). Each figure is None
    where the agent did not report it.
    """

    available: bool = True
    na_reason: str | None = None
    rss_bytes: int | None = None
    vms_bytes: int | None = None
    peak_rss_bytes: int | None = None  # ru_maxrss: the true peak
    rss_anon_bytes: int | None = None  # the resident set's parts (Linux /proc/PID/status)
    rss_file_bytes: int | None = None
    rss_shmem_bytes: int | None = None
    cpu_percent: float | None = None  # 100 = one core, over the last interval
    threads: int | None = None
    started_t: float | None = None  # when the process started (Unix s)

    @classmethod
    def from_wire(cls, p: Process | None) -> HostView:
        if p is None:
            return cls()
        if p.available is False:
            return cls(available=False, na_reason=_reason(p.reason))
        return cls(rss_bytes=_int(p.rss_bytes), vms_bytes=_int(p.vms_bytes), peak_rss_bytes=_int(p.peak_rss_bytes),
                   rss_anon_bytes=_int(p.rss_anon_bytes), rss_file_bytes=_int(p.rss_file_bytes),
                   rss_shmem_bytes=_int(p.rss_shmem_bytes),
                   cpu_percent=p.cpu_percent, threads=_int(p.threads), started_t=p.started_t)

    def rss_parts(self) -> str | None:
        """The resident set's parts in a phrase, largest first: ``shm 12.9
        GiB, anon 1.20 GiB, files 402 MiB`` (those not 0 B; None where the
        agent read none).
        A runtime's shared buffers or mapped files can be most of the RSS
        of a program whose own arrays are small: this says which."""
        parts = [(b, name) for b, name in ((self.rss_shmem_bytes, "shm"), (self.rss_anon_bytes, "anon"),
                                           (self.rss_file_bytes, "files")) if b]  # a part of 0 B says nothing
        if not parts:
            return None
        parts.sort(key=lambda p: -p[0])
        return ", ".join(f"{name} {fmt_bytes(b)}" for b, name in parts)


@dataclass(frozen=True)
class AgentView:
    """What jaxtop's agent thread costs the process (the sample's ``agent``,
    once a second): its share of one core over its last 10 s (None for the
    first 10 s), the share it stays under, and the interval it samples at
    (longer than asked while it is at that ceiling)."""

    cpu_share: float | None = None
    ceiling_share: float | None = None
    tick_s: float | None = None

    @classmethod
    def from_wire(cls, a: AgentStats | None) -> AgentView | None:
        if a is None:
            return None
        tick = a.tick_s
        return cls(cpu_share=a.cpu_share, ceiling_share=a.ceiling_share,
                   tick_s=tick if tick is not None and 0 < tick <= 86400 else None)

    def stretched(self, interval_s: float) -> bool:
        """True while the agent samples less often than asked (at its CPU ceiling)."""
        return self.tick_s is not None and self.tick_s > interval_s * 1.05

    def over_ceiling(self) -> bool:
        """True when the thread's measured share is over its ceiling by more
        than the window-to-window spread: work that does not shrink with
        the ticks (each implicit transfer tied to its line, client
        requests) outgrew what sampling less often can save."""
        return (self.cpu_share is not None and self.ceiling_share is not None
                and self.cpu_share > self.ceiling_share * 1.2)


@dataclass(frozen=True)
class CompileView:
    """Backend compiles (the sample's ``compile``); None where not reported."""

    count: int | None = None  # in the sample's interval
    count_total: int | None = None
    seconds_total: float | None = None
    cache_hits_total: int | None = None  # persistent compilation cache hits

    @classmethod
    def from_wire(cls, c: Compile | None) -> CompileView:
        if c is None:
            return cls()
        return cls(count=_int(c.count), count_total=_int(c.count_total), seconds_total=c.seconds_total,
                   cache_hits_total=_int(c.cache_hits_total))


@dataclass(frozen=True)
class DonationView:
    """Failed buffer donations (the sample's ``donation``)."""

    failed: int | None = None  # in the sample's interval
    failed_total: int | None = None
    last_message: str | None = None

    @classmethod
    def from_wire(cls, d: Donation | None) -> DonationView:
        if d is None:
            return cls()
        return cls(failed=_int(d.failed), failed_total=_int(d.failed_total), last_message=d.last_message or None)


@dataclass(frozen=True)
class GpuView:
    """One GPU as NVML read it (an entry of the sample's ``nvml.devices``).

    ``process_memory_bytes`` is None with ``process_memory_reason`` where
    the driver cannot tell this pid's memory (a container PID namespace).
    """

    index: int | None = None
    memory_used_bytes: int | None = None  # the driver's view: pool and CUDA context included
    memory_total_bytes: int | None = None
    gpu_util_percent: float | None = None
    mem_util_percent: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    process_memory_bytes: int | None = None
    process_memory_reason: str | None = None

    @classmethod
    def from_wire(cls, g: Gpu) -> GpuView:
        return cls(
            index=g.index,
            memory_used_bytes=_int(g.memory_used_bytes),
            memory_total_bytes=_int(g.memory_total_bytes),
            gpu_util_percent=g.gpu_util_percent,
            mem_util_percent=g.mem_util_percent,
            temperature_c=g.temperature_c,
            power_w=g.power_w,
            pcie_tx_bytes_per_s=g.pcie_tx_bytes_per_s,
            pcie_rx_bytes_per_s=g.pcie_rx_bytes_per_s,
            process_memory_bytes=_int(g.process_memory_bytes),
            process_memory_reason=g.process_memory_reason or None,
        )


@dataclass(frozen=True)
class NvmlView:
    """The latest NVML reading of a process (the sample's ``nvml``)."""

    t: float | None = None  # when NVML was polled
    gpus: tuple[GpuView, ...] = ()
    available: bool = True
    na_reason: str | None = None

    @classmethod
    def from_wire(cls, n: Nvml | None) -> NvmlView | None:
        """The view, or None when the sample carried no NVML reading."""
        if n is None or n == NO_NVML:
            return None
        return cls(t=n.t, gpus=tuple(GpuView.from_wire(g) for g in n.devices or ()), available=n.available is not False,
                   na_reason=_reason(n.reason))


@dataclass(frozen=True)
class NvmlStatusView:
    """Whether the agent reads NVML at all (the hello's ``nvml``).

    ``available`` is None when the hello did not say (an older agent, an
    external view); ``na_reason`` is the agent's reason when it is False.
    """

    available: bool | None = None
    na_reason: str | None = None

    @classmethod
    def from_wire(cls, n: Nvml) -> NvmlStatusView:
        return cls(available=n.available, na_reason=_reason(n.reason))


@dataclass(frozen=True)
class CaptureView:
    """Whether implicit transfers are counted (``transfer_capture``).

    ``available`` is None before jax is imported (nothing said yet).
    """

    available: bool | None = None
    na_reason: str | None = None
    guard: tuple[tuple[str, str], ...] = ()  # (direction, the level the user chose)
    note: str | None = None

    @classmethod
    def from_wire(cls, c: Capture | None) -> CaptureView:
        if c is None:
            return cls()
        return cls(available=c.available, na_reason=_reason(c.reason),
                   guard=tuple((d, protocol.shown(level)) for d, level in (c.guard or {}).items()), note=c.note or None)


@dataclass(frozen=True)
class TransferView:
    """Implicit transfers of one direction: rates over the last seconds of
    samples (``jaxtop.dashboard.counter_window``; the first sample's own
    interval until there are two), and totals since the agent started.

    Two sources give bytes, both lower bounds: JAX's guard log
    (``bytes_known_*``: a cached jit call's log line gives no shape, so
    most of a training loop's copies have no size there) and the lines the
    transfers were tied to (each call's arguments' sizes, inferred). The
    shown figures (``bytes_total``, ``bytes_per_s``) are the larger of the
    two, so a direction's total is never below the sum of its own lines;
    ``*_inferred`` says the lines' sum won (shown with ``~``).
    """

    count_per_s: float | None = None
    bytes_known_per_s: float | None = None
    count_total: int | None = None
    bytes_known_total: int | None = None
    count_bytes_unknown_total: int | None = None
    bytes_total: int | None = None
    bytes_total_inferred: bool = False
    bytes_per_s: float | None = None
    bytes_per_s_inferred: bool = False

    def __post_init__(self) -> None:
        # Without lines, the shown figures are the log's.
        if self.bytes_total is None and not self.bytes_total_inferred:
            object.__setattr__(self, "bytes_total", self.bytes_known_total)
        if self.bytes_per_s is None and not self.bytes_per_s_inferred:
            object.__setattr__(self, "bytes_per_s", self.bytes_known_per_s)

    def ended(self) -> TransferView:
        """The same totals, without rates (the process is gone)."""
        return TransferView(count_total=self.count_total, bytes_known_total=self.bytes_known_total,
                            count_bytes_unknown_total=self.count_bytes_unknown_total,
                            bytes_total=self.bytes_total, bytes_total_inferred=self.bytes_total_inferred)

    def with_lines(self, lines_bytes_total: int | None, lines_bytes_per_s: float | None) -> TransferView:
        """This direction with its lines' sums of bytes (since start, and
        per second) taken where they exceed what the guard log gave."""
        total, total_inferred = _larger(self.bytes_known_total, lines_bytes_total)
        rate, rate_inferred = _larger(self.bytes_known_per_s, lines_bytes_per_s)
        return dataclasses.replace(self, bytes_total=None if total is None else int(total),
                                   bytes_total_inferred=total_inferred, bytes_per_s=rate,
                                   bytes_per_s_inferred=rate_inferred)


def _larger(logged: float | None, lines: float | None) -> tuple[float | None, bool]:
    """The larger of two lower bounds, and whether it is the lines'."""
    if lines is not None and (logged is None or lines > logged):
        return lines, True
    return logged, False


@dataclass(frozen=True)
class TopShapeView:
    """One of the most frequent transferred shapes since start."""

    direction: str
    shape: str
    count: int | None

    @classmethod
    def from_wire(cls, s: TopShape) -> TopShapeView:
        return cls(direction=protocol.shown(s.direction if s.direction is not None else "?"),
                   shape=protocol.shown(s.shape if s.shape is not None else "?"), count=_int(s.count))


@dataclass(frozen=True)
class BufferView:
    """One of a device's largest live buffers (``live_arrays.top``)."""

    nbytes: int | None
    dtype: str | None
    shape: str | None  # as the agent wrote it: "[8192, 16384]"
    ptr: int | None

    @classmethod
    def from_wire(cls, b: TopBuffer) -> BufferView:
        return cls(nbytes=_int(b.nbytes), dtype=b.dtype, shape=None if b.shape is None else protocol.shown(b.shape),
                   ptr=_int(b.ptr))


@dataclass(frozen=True)
class ProfileSiteView:
    """One allocation site of a memory profile."""

    site: str
    bytes: int | None
    allocations: int | None


@dataclass(frozen=True)
class ProfileView:
    """The last device memory profile's result: its file and top sites, or
    the error that stopped it."""

    path: str | None = None
    error: str | None = None
    total_bytes: int | None = None
    top_sites: tuple[ProfileSiteView, ...] = ()

    @classmethod
    def from_wire(cls, p: MemoryProfile | None) -> ProfileView | None:
        """From a ``memory_profile`` command's result."""
        if p is None:
            return None
        top = tuple(ProfileSiteView(site=protocol.shown(s.site), bytes=_int(s.bytes), allocations=_int(s.allocations))
                    for s in p.top_sites or ())
        return cls(path=p.path, error=protocol.shown(p.error) if p.error else None, total_bytes=_int(p.total_bytes),
                   top_sites=top)
