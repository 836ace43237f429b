"""Which accelerator a process runs on, whether its NVML status matters,
and the TPU runtime's own readings (the sample's ``accelerator``).

The dashboard names its panels after the backend and speaks of NVML only
where the devices are NVIDIA GPUs: on a TPU or CPU machine without NVIDIA's
library, "NVML unavailable" is true and says nothing about the program. The
backend is read from what a stream records (the ``hello``'s or ``backend``
record's ``backend``, else the devices' ``platform``), so recordings made
before these rules read the same way.

No Textual here: the model and the widgets both use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

from jaxtop.wire import protocol
from jaxtop.wire.records import Accelerator, AcceleratorMetrics, Nvml

#: An ``accelerator`` whose runtime answered no metric.
_NO_METRICS = AcceleratorMetrics()
#: A stream that said nothing of NVML.
_NO_STATUS = Nvml()

__all__ = ["AcceleratorView", "CPU", "GPU", "TPU", "backend_kind", "kind_label", "nvml_absent", "nvml_worth_saying"]

#: Kinds of backend (``backend_kind``); a CPU backend is "cpu".
GPU, TPU, CPU = "gpu", "tpu", "cpu"
#: Platform names jax gives NVIDIA and AMD GPUs (``gpu`` before jax named the
#: CUDA and ROCm plugins' platforms).
_GPU_PLATFORMS = frozenset(("gpu", "cuda", "rocm"))
#: NVML reasons that mean the library or driver is not on this machine at
#: all (pynvml's NVMLError_LibraryNotFound / NVMLError_DriverNotLoaded, the
#: agent's own "not installed" and "disabled", a Prometheus source's "not
#: exported"), rather than NVML failing on a machine that has GPUs.
_ABSENT = re.compile(r"LibraryNotFound|DriverNotLoaded|Shared Library Not Found|Driver Not Loaded"
                     r"|nvidia-ml-py is not installed|^disabled$|not exported to Prometheus", re.I)


def backend_kind(backend: Any, platforms: Iterable[Any] = ()) -> str | None:
    """``"gpu"``, ``"tpu"``, ``"cpu"``, another platform's name in lower
    case, or None while neither the backend nor a device is known.

    Args:
        backend: the stream's ``backend`` (``jax.default_backend()``).
        platforms: its devices' ``platform`` s, used where the backend is not said.
    """
    for name in (backend, *platforms):
        text = protocol.text_of(name)
        if text is None or text == "?":
            continue
        text = text.lower()
        return GPU if text in _GPU_PLATFORMS else text
    return None


def kind_label(kind: str | None) -> str | None:
    """The word a panel title uses for an accelerator: "GPU", "TPU", none on CPU."""
    if kind is None or kind == CPU:
        return None
    return kind.upper()


def nvml_absent(status: Nvml) -> bool:
    """Whether an NVML status (the ``hello``'s ``nvml``) says there is no
    NVIDIA library or driver on the machine at all."""
    if status.available is not False:
        return False
    return bool(_ABSENT.search(status.reason or ""))


@dataclass(frozen=True)
class AcceleratorView:
    """The TPU runtime's readings of a process (its latest ``accelerator``).

    Each per-accelerator tuple holds one value per chip (or TensorCore) in the
    runtime's order, None where that one was unreadable; an empty tuple with
    a reason in :meth:`reason` where the runtime gave nothing.

    Attributes:
        kind: what read them ("tpu").
        available: False when the runtime's monitoring could not be read at all.
        na_reason: why, then.
        t: when the reading that last changed was taken (Unix s).
        duty_cycle_pct: percent of time each accelerator computed.
        tensorcore_util_pct: TensorCore utilisation, percent.
        hbm_used_bytes, hbm_total_bytes: HBM in use and in all, as the runtime counts it.
        hlo_queue_size: programs waiting to execute, all cores together (the
            figure a reader plots beside the memory queued work holds).
        unavailable: ``(metric, reason)`` for each metric the runtime did not answer.
    """

    kind: str | None = None
    available: bool = True
    na_reason: str | None = None
    t: float | None = None
    duty_cycle_pct: tuple[float | None, ...] = ()
    tensorcore_util_pct: tuple[float | None, ...] = ()
    hbm_used_bytes: tuple[float | None, ...] = ()
    hbm_total_bytes: tuple[float | None, ...] = ()
    hlo_queue_size: int | None = None
    unavailable: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_wire(cls, a: Accelerator | None) -> AcceleratorView | None:
        """The view, or None where the stream carried no ``accelerator``."""
        if a is None:
            return None
        kind = a.kind or None
        if a.available is False:
            return cls(kind=kind, available=False, na_reason=protocol.shown(a.reason) if a.reason else None, t=a.t)
        m = a.metrics or _NO_METRICS
        queue = a.hlo_queue_size
        return cls(
            kind=kind,
            t=a.t,
            duty_cycle_pct=tuple(m.duty_cycle_pct or ()),
            tensorcore_util_pct=tuple(m.tensorcore_util or ()),
            hbm_used_bytes=tuple(m.hbm_capacity_usage or ()),
            hbm_total_bytes=tuple(m.hbm_capacity_total or ()),
            hlo_queue_size=int(queue) if queue is not None and queue >= 0 else None,
            unavailable=tuple((k, v) for k, v in (a.unavailable or {}).items()),
        )

    def reason(self, metric: str) -> str | None:
        """Why ``metric`` (its wire name: ``duty_cycle_pct``...) is n/a, if the agent said."""
        return next((r for k, r in self.unavailable if k == metric), None)


def nvml_worth_saying(status: Nvml, backend: Any, external: bool = False) -> bool | None:
    """Whether a stream's NVML failure (the ``hello``'s ``nvml``) is news.

    It is on a GPU backend (why the driver's figures are missing), in the
    external view (NVML is one of its two sources) and where NVML failed on a
    machine that has NVIDIA's library; not on a TPU or CPU backend of a
    machine without it, where it says nothing of the program.

    Returns:
        True or False; None while the backend is not known (the ``hello``
        comes before the program imports jax: its ``backend`` record decides),
        or where NVML did not fail.
    """
    if status.available or status == _NO_STATUS:  # NVML works, or nothing was said
        return None
    kind = backend_kind(backend)
    if external:
        return True
    if kind is None:
        return None
    return kind == GPU or not nvml_absent(status)
