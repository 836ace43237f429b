"""Typed views of what a sample (and a hello) reports, for the widgets.

The wire's objects (``process``, ``compile``, ``donation``, ``nvml``,
``transfer_capture``, a profile reply…) become frozen dataclasses here, so
that no widget reads a wire key. A figure the agent could not measure stays
None, never 0; where the wire says why, the view carries the reason
(``na_reason``, or a ``*_reason`` beside the figure).

Each view is built by its ``from_wire`` classmethod, which takes whatever
the stream held (a dict, or anything else from an odd record) and never
raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from jaxtop.wire import protocol

__all__ = [
    "BufferView", "CaptureView", "CompileView", "DonationView", "GpuView", "HostView", "NvmlStatusView",
    "NvmlView", "ProfileSiteView", "ProfileView", "TopShapeView", "TransferView",
]


def _obj(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a wire object, else an empty one."""
    return value if isinstance(value, dict) else {}


def _number(value: Any) -> int | float | None:
    """A JSON number as it came (int or float), None for anything else."""
    # The decoder makes exactly int or float (a bool is neither): a class
    # check, since every snapshot reads a few dozen of these.
    kind = value.__class__
    return value if kind is int or kind is float else None


def _int(value: Any) -> int | None:
    return int(value) if protocol.is_number(value) else None


def _text(value: Any) -> str | None:
    """A non-empty string, else None."""
    return value if isinstance(value, str) and value else None


def _said_available(obj: Mapping[str, Any]) -> bool | None:
    """The object's ``available`` flag: None when it does not say."""
    flag = obj.get("available")
    return flag if isinstance(flag, bool) else None


def _reason(obj: Mapping[str, Any]) -> str | None:
    reason = obj.get("reason")
    return str(reason) if reason else None


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
    cpu_percent: float | None = None  # 100 = one core, over the last interval
    threads: int | None = None
    started_t: float | None = None  # when the process started (Unix s)

    @classmethod
    def from_wire(cls, value: Any) -> HostView:
        p = _obj(value)
        if p.get("available") is False:
            return cls(available=False, na_reason=_reason(p))
        return cls(
            rss_bytes=_number(p.get("rss_bytes")),
            vms_bytes=_number(p.get("vms_bytes")),
            peak_rss_bytes=_number(p.get("peak_rss_bytes")),
            cpu_percent=_number(p.get("cpu_percent")),
            threads=_number(p.get("threads")),
            started_t=_number(p.get("started_t")),
        )


@dataclass(frozen=True)
class CompileView:
    """Backend compiles (the sample's ``compile``); None where not reported."""

    count: int | None = None  # in the sample's interval
    count_total: int | None = None
    seconds_total: float | None = None
    cache_hits_total: int | None = None  # persistent compilation cache hits

    @classmethod
    def from_wire(cls, value: Any) -> CompileView:
        c = _obj(value)
        return cls(count=_number(c.get("count")), count_total=_number(c.get("count_total")),
                   seconds_total=_number(c.get("seconds_total")), cache_hits_total=_number(c.get("cache_hits_total")))


@dataclass(frozen=True)
class DonationView:
    """Failed buffer donations (the sample's ``donation``)."""

    failed: int | None = None  # in the sample's interval
    failed_total: int | None = None
    last_message: str | None = None

    @classmethod
    def from_wire(cls, value: Any) -> DonationView:
        d = _obj(value)
        return cls(failed=_number(d.get("failed")), failed_total=_number(d.get("failed_total")),
                   last_message=_text(d.get("last_message")))


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
    def from_wire(cls, value: Any) -> GpuView:
        g = _obj(value)
        return cls(
            index=_int(g.get("index")),
            memory_used_bytes=_number(g.get("memory_used_bytes")),
            memory_total_bytes=_number(g.get("memory_total_bytes")),
            gpu_util_percent=_number(g.get("gpu_util_percent")),
            mem_util_percent=_number(g.get("mem_util_percent")),
            temperature_c=_number(g.get("temperature_c")),
            power_w=_number(g.get("power_w")),
            pcie_tx_bytes_per_s=_number(g.get("pcie_tx_bytes_per_s")),
            pcie_rx_bytes_per_s=_number(g.get("pcie_rx_bytes_per_s")),
            process_memory_bytes=_number(g.get("process_memory_bytes")),
            process_memory_reason=_text(g.get("process_memory_reason")),
        )


@dataclass(frozen=True)
class NvmlView:
    """The latest NVML reading of a process (the sample's ``nvml``)."""

    t: float | None = None  # when NVML was polled
    gpus: tuple[GpuView, ...] = ()
    available: bool = True
    na_reason: str | None = None

    @classmethod
    def from_wire(cls, value: Any) -> NvmlView | None:
        """The view, or None when the sample carried no NVML reading."""
        n = _obj(value)
        if not n:
            return None
        devices = n.get("devices")
        gpus = tuple(GpuView.from_wire(g) for g in devices if isinstance(g, dict)) if isinstance(devices, list) else ()
        return cls(t=_number(n.get("t")), gpus=gpus, available=n.get("available") is not False, na_reason=_reason(n))


@dataclass(frozen=True)
class NvmlStatusView:
    """Whether the agent reads NVML at all (the hello's ``nvml``).

    ``available`` is None when the hello did not say (an older agent, an
    external view); ``na_reason`` is the agent's reason when it is False.
    """

    available: bool | None = None
    na_reason: str | None = None

    @classmethod
    def from_wire(cls, value: Any) -> NvmlStatusView:
        n = _obj(value)
        return cls(available=_said_available(n), na_reason=_reason(n))


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
    def from_wire(cls, value: Any) -> CaptureView:
        c = _obj(value)
        guard = _obj(c.get("guard"))
        return cls(available=_said_available(c), na_reason=_reason(c),
                   guard=tuple((str(d), str(level)) for d, level in guard.items()), note=_text(c.get("note")))


@dataclass(frozen=True)
class TransferView:
    """Implicit transfers of one direction: this interval's rates, and
    totals since the agent started. Bytes are a lower bound (a cached jit
    call logs no shapes)."""

    count_per_s: float | None = None
    bytes_known_per_s: float | None = None
    count_total: int | None = None
    bytes_known_total: int | None = None
    count_bytes_unknown_total: int | None = None

    def ended(self) -> TransferView:
        """The same totals, without rates (the process is gone)."""
        return TransferView(count_total=self.count_total, bytes_known_total=self.bytes_known_total,
                            count_bytes_unknown_total=self.count_bytes_unknown_total)

    @classmethod
    def from_rates(cls, rates: Any) -> TransferView:
        """From the model's per-direction rates and the sample's totals."""
        r = _obj(rates)
        return cls(count_per_s=_number(r.get("count_per_s")), bytes_known_per_s=_number(r.get("bytes_known_per_s")),
                   count_total=_number(r.get("count_total")), bytes_known_total=_number(r.get("bytes_known_total")),
                   count_bytes_unknown_total=_number(r.get("count_bytes_unknown_total")))


@dataclass(frozen=True)
class TopShapeView:
    """One of the most frequent transferred shapes since start."""

    direction: str
    shape: str
    count: int | None

    @classmethod
    def from_wire(cls, value: Any) -> TopShapeView:
        s = _obj(value)
        return cls(direction=str(s.get("direction", "?")), shape=str(s.get("shape", "?")), count=_number(s.get("count")))


@dataclass(frozen=True)
class BufferView:
    """One of a device's largest live buffers (``live_arrays.top``)."""

    nbytes: int | None
    dtype: str | None
    shape: str | None  # as the agent wrote it: "[8192, 16384]"
    ptr: int | None

    @classmethod
    def from_wire(cls, value: Any) -> BufferView:
        b = _obj(value)
        dtype, shape = b.get("dtype"), b.get("shape")
        return cls(nbytes=_number(b.get("nbytes")), dtype=None if dtype is None else str(dtype),
                   shape=None if shape is None else str(shape), ptr=_int(b.get("ptr")))


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
    def from_wire(cls, value: Any) -> ProfileView | None:
        p = _obj(value)
        if not p:
            return None
        sites = p.get("top_sites")
        top = tuple(ProfileSiteView(site=str(s.get("site")), bytes=_number(s.get("bytes")),
                                    allocations=_number(s.get("allocations")))
                    for s in (sites if isinstance(sites, list) else ()) if isinstance(s, dict))
        path, error = p.get("path"), p.get("error")
        return cls(path=None if path is None else str(path), error=str(error) if error else None,
                   total_bytes=_number(p.get("total_bytes")), top_sites=top)
