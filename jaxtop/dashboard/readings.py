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
from typing import Any, Iterator, Mapping

from jaxtop.wire import protocol, schema

__all__ = [
    "AgentView", "BufferView", "CaptureView", "CompileView", "DonationView", "GpuView", "HostView", "NvmlStatusView",
    "NvmlView", "ProfileSiteView", "ProfileView", "TopShapeView", "TransferView", "device_order", "gpus_by_index",
    "is_device_id", "number", "nvml_of_devices", "odd_figures", "odd_fields",
]

_obj = protocol.obj_of
_text = protocol.text_of


number = protocol.number



def _int(value: Any) -> int | None:
    value = number(value)
    return None if value is None else int(value)


def is_device_id(value: Any) -> bool:
    """Whether a device's ``id`` can name one: an integer (the agent's jax
    id) or a string (a Prometheus label that is not a number). A bool, a
    float (``0.0`` would be device 0 as a key), null or a container cannot."""
    return value.__class__ is int or (value.__class__ is str and 0 < len(value) <= 200)


def device_order(device_id: int | str) -> tuple[int, int, str]:
    """Sort key of device ids: integers in order, then names (ids of both
    kinds do not compare with ``<``)."""
    return (0, device_id, "") if device_id.__class__ is int else (1, 0, device_id)  # type: ignore[return-value]


#: Units of the figures that are numbers (wire.schema's "id" and "text" are not).
_NUMERIC_UNITS = frozenset(("bytes", "count", "ratio", "percent", "seconds", "time"))
#: A device's figures the dashboard shows (a DeviceView's), and its live
#: arrays': the others (largest_alloc_size, bytes_reserved…) are never read.
_DEVICE_NUMBERS = ("bytes_in_use", "pool_bytes", "bytes_limit", "peak_bytes_in_use", "largest_free_block_bytes",
                   "num_allocs", "fragmentation")
_LIVE_NUMBERS = ("bytes", "count", "holes", "scanned_t")
_TRANSFER_NUMBERS = tuple(f.key for f in schema.TRANSFER if f.unit in _NUMERIC_UNITS)
#: A sample's parts whose figures are numbers, and those figures.
_PART_NUMBERS = {part: tuple(f.key for f in figures if f.unit in _NUMERIC_UNITS)
                 for part, figures in (("process", schema.PROCESS), ("compile", schema.COMPILE),
                                       ("donation", schema.DONATION))}
#: The JSON type each record type's parts must have: (type, its name in a message).
_SHAPES: dict[str, dict[str, tuple[type, str]]] = {
    protocol.HELLO: {"argv": (list, "an array"), "versions": (dict, "an object"), "nvml": (dict, "an object"),
                     "transfer_capture": (dict, "an object"), "devices": (list, "an array"),
                     "history": (dict, "an object"), "backend": (str, "a string")},
    protocol.BACKEND: {"versions": (dict, "an object"), "devices": (list, "an array"), "backend": (str, "a string")},
    protocol.SAMPLE: {"devices": (list, "an array"), "transfers": (dict, "an object"), "nvml": (dict, "an object"),
                      "jit": (dict, "an object"), "events": (list, "an array"),
                      "transfer_capture": (dict, "an object"), "accelerator": (dict, "an object"),
                      **{part: (dict, "an object") for part in _PART_NUMBERS}},
}


def _by_type(shapes: dict[str, tuple[type, str]]) -> tuple[tuple[tuple[str, ...], frozenset[type], str], ...]:
    """A record type's parts grouped by the type they must have:
    ``(keys, the classes they may have (null too), the type's name)``."""
    groups: dict[tuple[type, str], list[str]] = {}
    for key, (kind_of, name) in shapes.items():
        groups.setdefault((kind_of, name), []).append(key)
    return tuple((tuple(keys), frozenset((kind_of, type(None))), name) for (kind_of, name), keys in groups.items())


_SHAPE_GROUPS = {kind: _by_type(shapes) for kind, shapes in _SHAPES.items()}
#: The classes a figure may have: a JSON number, or null (not measured).
#: NaN and inf are floats: not measured too (they read n/a, as null does).
_FIGURE_CLASSES = frozenset((int, float, type(None)))
_OBJECT_CLASSES = frozenset((dict, type(None)))


def odd_fields(kind: Any, record: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """The parts of a record of the wrong JSON type (an array where an
    object belongs): ``(where, value, what it should be)``. The model asks
    it of every record: the parts' classes are compared as a few sets, in C.
    """
    for keys, classes, name in _SHAPE_GROUPS.get(kind, ()):
        if not set(map(type, map(record.get, keys))) <= classes:
            return [(key, record[key], should) for keys, classes, should in _SHAPE_GROUPS[kind]
                    for key in keys if type(record.get(key)) not in classes]
    return []


def odd_figures(sample: dict[str, Any]) -> Iterator[tuple[str, Any, str]]:
    """The figures of a sample that the screen shows (:mod:`jaxtop.wire.schema`)
    and that are not numbers, and its devices' parts of the wrong JSON type:
    ``(where, value, what it should be)``.

    The views show each as n/a (or leave it out); the model says so once.
    A sample of 8 devices holds about 150 such figures: checking them all
    took 29 us, a third of the time the model takes to feed a sample, so
    the model asks this of the sample a batch leaves shown, not of each.
    """
    for i, dev in enumerate(protocol.list_of(sample.get("devices"))):
        if type(dev) is not dict:
            yield f"devices[{i}]", dev, "an object"
            continue
        yield from _odd_figures(dev, _DEVICE_NUMBERS, "devices[].")
        live = dev.get("live_arrays")
        if type(live) not in _OBJECT_CLASSES:
            yield "devices[].live_arrays", live, "an object"
        elif live is not None:
            yield from _odd_figures(live, _LIVE_NUMBERS, "devices[].live_arrays.")
            for key, kind_of, name in (("map", list, "an array"), ("top", list, "an array"),
                                       ("unmapped", dict, "an object")):
                if live.get(key) is not None and not isinstance(live[key], kind_of):
                    yield f"devices[].live_arrays.{key}", live[key], name
    for part, keys in _PART_NUMBERS.items():
        yield from _odd_figures(_obj(sample.get(part)), keys, f"{part}.")
    transfers = _obj(sample.get("transfers"))
    for d in protocol.DIRECTIONS:
        tr = transfers.get(d)
        if type(tr) not in _OBJECT_CLASSES:
            yield f"transfers.{d}", tr, "an object"
        elif tr is not None:
            yield from _odd_figures(tr, _TRANSFER_NUMBERS, f"transfers.{d}.")


def _odd_figures(obj: dict[str, Any], keys: tuple[str, ...], where: str) -> Iterator[tuple[str, Any, str]]:
    """The figures of ``obj`` named ``keys`` that are not numbers (their
    classes compared as a set first, in C: most objects have none)."""
    if set(map(type, map(obj.get, keys))) <= _FIGURE_CLASSES:
        return
    for key in keys:
        if type(obj.get(key)) not in _FIGURE_CLASSES:
            yield f"{where}{key}", obj[key], "a number"


def gpus_by_index(nvml: Any) -> dict[int, dict[str, Any]]:
    """A sample's NVML GPUs (its ``nvml``) by their integer index (a list as
    a key would not even hash)."""
    return {g["index"]: g for g in protocol.list_of(_obj(nvml).get("devices"))
            if isinstance(g, dict) and g.get("index").__class__ is int}


def nvml_of_devices(nvml_status: Any) -> dict[int | str, int]:
    """jax device id -> NVML index, from the hello's ``nvml``: device ids
    that can name one (:func:`is_device_id`), integer indexes."""
    return {d["jax_id"]: d["index"] for d in protocol.list_of(_obj(nvml_status).get("devices"))
            if isinstance(d, dict) and is_device_id(d.get("jax_id")) and d.get("index").__class__ is int}


def _said_available(obj: Mapping[str, Any]) -> bool | None:
    """The object's ``available`` flag: None when it does not say."""
    flag = obj.get("available")
    return flag if isinstance(flag, bool) else None


def _reason(obj: Mapping[str, Any]) -> str | None:
    reason = obj.get("reason")
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
    cpu_percent: float | None = None  # 100 = one core, over the last interval
    threads: int | None = None
    started_t: float | None = None  # when the process started (Unix s)

    @classmethod
    def from_wire(cls, value: Any) -> HostView:
        p = _obj(value)
        if p.get("available") is False:
            return cls(available=False, na_reason=_reason(p))
        return cls(
            rss_bytes=number(p.get("rss_bytes")),
            vms_bytes=number(p.get("vms_bytes")),
            peak_rss_bytes=number(p.get("peak_rss_bytes")),
            cpu_percent=number(p.get("cpu_percent")),
            threads=number(p.get("threads")),
            started_t=number(p.get("started_t")),
        )


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
    def from_wire(cls, value: Any) -> AgentView | None:
        a = _obj(value)
        if not a:
            return None
        tick = number(a.get("tick_s"))
        return cls(cpu_share=number(a.get("cpu_share")), ceiling_share=number(a.get("ceiling_share")),
                   tick_s=tick if tick is not None and 0 < tick <= 86400 else None)

    def stretched(self, interval_s: float) -> bool:
        """True while the agent samples less often than asked (at its CPU ceiling)."""
        return self.tick_s is not None and self.tick_s > interval_s * 1.05


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
        return cls(count=number(c.get("count")), count_total=number(c.get("count_total")),
                   seconds_total=number(c.get("seconds_total")), cache_hits_total=number(c.get("cache_hits_total")))


@dataclass(frozen=True)
class DonationView:
    """Failed buffer donations (the sample's ``donation``)."""

    failed: int | None = None  # in the sample's interval
    failed_total: int | None = None
    last_message: str | None = None

    @classmethod
    def from_wire(cls, value: Any) -> DonationView:
        d = _obj(value)
        return cls(failed=number(d.get("failed")), failed_total=number(d.get("failed_total")),
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
            memory_used_bytes=number(g.get("memory_used_bytes")),
            memory_total_bytes=number(g.get("memory_total_bytes")),
            gpu_util_percent=number(g.get("gpu_util_percent")),
            mem_util_percent=number(g.get("mem_util_percent")),
            temperature_c=number(g.get("temperature_c")),
            power_w=number(g.get("power_w")),
            pcie_tx_bytes_per_s=number(g.get("pcie_tx_bytes_per_s")),
            pcie_rx_bytes_per_s=number(g.get("pcie_rx_bytes_per_s")),
            process_memory_bytes=number(g.get("process_memory_bytes")),
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
        return cls(t=number(n.get("t")), gpus=gpus, available=n.get("available") is not False, na_reason=_reason(n))


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
                   guard=tuple((d, protocol.shown(level)) for d, level in guard.items()), note=_text(c.get("note")))


@dataclass(frozen=True)
class TransferView:
    """Implicit transfers of one direction: rates over the last seconds of
    samples (``jaxtop.dashboard.counter_window``; the first sample's own
    interval until there are two), and totals since the agent started.
    Bytes are a lower bound (a cached jit call logs no shapes)."""

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
        return cls(count_per_s=number(r.get("count_per_s")), bytes_known_per_s=number(r.get("bytes_known_per_s")),
                   count_total=number(r.get("count_total")), bytes_known_total=number(r.get("bytes_known_total")),
                   count_bytes_unknown_total=number(r.get("count_bytes_unknown_total")))


@dataclass(frozen=True)
class TopShapeView:
    """One of the most frequent transferred shapes since start."""

    direction: str
    shape: str
    count: int | None

    @classmethod
    def from_wire(cls, value: Any) -> TopShapeView:
        s = _obj(value)
        return cls(direction=protocol.shown(s.get("direction", "?")), shape=protocol.shown(s.get("shape", "?")),
                   count=number(s.get("count")))


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
        return cls(nbytes=number(b.get("nbytes")), dtype=None if dtype is None else protocol.shown(dtype),
                   shape=None if shape is None else protocol.shown(shape), ptr=_int(b.get("ptr")))


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
        top = tuple(ProfileSiteView(site=protocol.shown(s.get("site")), bytes=number(s.get("bytes")),
                                    allocations=number(s.get("allocations")))
                    for s in (sites if isinstance(sites, list) else ()) if isinstance(s, dict))
        path, error = p.get("path"), p.get("error")
        return cls(path=None if path is None else protocol.shown(path), error=protocol.shown(error) if error else None,
                   total_bytes=number(p.get("total_bytes")), top_sites=top)
