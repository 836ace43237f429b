"""The Host panel's title and accelerator line, named after the backend.

On a GPU the line is NVML's (utilisation, temperature, power, this pid's
memory) or why NVML is n/a; on a TPU it is the runtime's own monitoring
(duty cycle, TensorCore utilisation, HBM in use of its total, programs
queued), each n/a with the runtime's reason where it gave nothing; on a CPU
there is no line, and nothing is said of NVML, which has nothing to say of
a CPU or TPU program on a machine without NVIDIA's library.

Pure functions of the snapshot's views, drawn to Rich text: the panel
(:class:`jaxtop.widgets.panels.HostPanel`) places them.
"""

from __future__ import annotations

from typing import Sequence

from rich.text import Text

from jaxtop.dashboard.accelerator import GPU, TPU, AcceleratorView, backend_kind, kind_label
from jaxtop.dashboard.views import DeviceView, ProcessView
from jaxtop.widgets.fmt import fmt_count, longest, pct
from jaxtop.wire.units import fmt_bytes, fmt_bytes_pair

__all__ = ["host_accelerator_line", "host_title", "pcie_shown", "process_kind", "tpu_line"]

#: What the TPU line says before the stream carried any reading: an agent
#: from before the tpumonitoring probe, or the first reading still to come.
NO_READING = "not in this stream (an older agent, or no reading yet)"
#: The runtime's reasons, as short as a crowded line needs them.
_SHORT_REASONS = (("the runtime reports nothing", "none reported"), ("not offered", "not offered"),
                  ("unreadable", "unreadable"), ("data() gave", "unreadable"))


def process_kind(proc: ProcessView | None, dev: DeviceView | None, devices: Sequence[DeviceView] = ()) -> str | None:
    """The process's backend kind (``accelerator.backend_kind``): its
    recorded backend, else the platform of the device shown or of its others."""
    if proc is None:
        return None
    platforms = [dev.platform] if dev is not None else []
    platforms += [d.platform for d in devices if d.pid == proc.pid]
    return backend_kind(proc.backend, platforms)


def host_title(proc: ProcessView | None, dev: DeviceView | None, devices: Sequence[DeviceView] = ()) -> str:
    """"Host & GPU", "Host & TPU", or "Host" on CPU and while the backend is unknown
    (an external view that reads GPUs through NVML says GPU)."""
    label = kind_label(process_kind(proc, dev, devices))
    if label is None and proc is not None and proc.nvml is not None and proc.nvml.gpus:
        label = "GPU"
    return f"Host & {label}" if label else "Host"


def pcie_shown(proc: ProcessView | None, dev: DeviceView | None, devices: Sequence[DeviceView] = ()) -> bool:
    """Whether the transfers panel has a PCIe line: on a GPU backend only (NVML's)."""
    return (dev is not None and dev.nvml is not None) or process_kind(proc, dev, devices) == GPU


def host_accelerator_line(proc: ProcessView, dev: DeviceView | None, devices: Sequence[DeviceView],
                          width: int) -> Text | None:
    """The Host panel's accelerator line for the backend, or None (CPU; a
    stream whose backend is not known yet)."""
    if dev is not None and dev.nvml:
        g = dev.nvml
        return Text(f" GPU {_or_na(g.gpu_util_percent)}%  {_or_na(g.temperature_c)}°C  {_or_na(g.power_w)} W  "
                    f"proc {fmt_bytes(g.process_memory_bytes)}", no_wrap=True, overflow="ellipsis")
    if dev is None and proc.nvml is not None and proc.nvml.gpus:
        # No JAX devices (an external view): this pid's memory on each GPU.
        parts = [f"gpu{g.index} {fmt_bytes(g.process_memory_bytes)}" for g in proc.nvml.gpus]
        return Text(" GPU memory of this pid: " + ", ".join(parts), no_wrap=True, overflow="ellipsis")
    kind = process_kind(proc, dev, devices)
    if kind == TPU:
        return tpu_line(proc.accelerator, _chip(proc, dev, devices), width)
    if kind == GPU or (kind is None and proc.external):
        reason = proc.nvml_status.na_reason or "no NVML device for this JAX device"
        # A narrow panel keeps the reason's head ("NVML unavailable"), not a word cut in two.
        parts = reason.split(":")
        choices = [f" GPU n/a — {':'.join(parts[:k])}" for k in range(len(parts), 0, -1)]
        return Text(longest(choices, width), style="dim", no_wrap=True, overflow="ellipsis")
    return None


def _or_na(value: object) -> object:
    return "n/a" if value is None else value


def _chip(proc: ProcessView, dev: DeviceView | None, devices: Sequence[DeviceView]) -> tuple[int, int]:
    """(the shown device's place among the process's devices, how many it
    has): the runtime lists its values in the same local order."""
    mine = [d.id for d in devices if d.pid == proc.pid]
    if dev is None or dev.id not in mine:
        return 0, max(1, len(mine))
    return mine.index(dev.id), len(mine)


def _pick(values: tuple[float | None, ...], chip: tuple[int, int]) -> float | None:
    """The shown device's value: one per device, or one per chip of several
    devices (TPU v2/v3 list a duty cycle per chip of two cores)."""
    i, n = chip
    if not values:
        return None
    if len(values) == n:
        return values[i]
    if n % len(values) == 0:
        return values[i // (n // len(values))]
    return values[0] if len(values) == 1 else None


def _short(reason: str | None) -> str:
    if not reason:
        return "n/a"
    for head, short in _SHORT_REASONS:
        if reason.startswith(head):
            return short
    return "error"


def _head(reason: str) -> str:
    """A reason without its parenthesis ("not in this stream")."""
    return reason.split(" (")[0]


def _na_line(reason: str, short: str, width: int) -> Text:
    """One dim line for the whole runtime: its reason, as long as fits."""
    choices = [f" TPU runtime metrics n/a — {r}" for r in (reason, _head(reason), short)]
    choices += [f" TPU metrics n/a — {short}", " TPU metrics n/a"]
    return Text(longest(choices, width), style="dim", no_wrap=True, overflow="ellipsis")


def tpu_line(acc: AcceleratorView | None, chip: tuple[int, int], width: int) -> Text:
    """The runtime's readings of one chip (TPU), each n/a with the runtime's
    reason where it gave nothing: one reason for all where it is one.

    Args:
        acc: the process's latest readings, None where the stream has none.
        chip: (the device's place, devices of the process).
        width: cells the line may take.
    """
    if acc is None or not acc.available:
        reason = NO_READING if acc is None else (acc.na_reason or "the runtime's monitoring could not be read")
        return _na_line(reason, _head(reason), width)
    duty, tc = _pick(acc.duty_cycle_pct, chip), _pick(acc.tensorcore_util_pct, chip)
    used, total = _pick(acc.hbm_used_bytes, chip), _pick(acc.hbm_total_bytes, chip)
    queue = acc.hlo_queue_size
    figures = {"duty_cycle_pct": duty, "tensorcore_util": tc, "hbm_capacity_usage": used,
               "hbm_capacity_total": total, "hlo_queue_size": queue}
    missing = {k: acc.reason(k) for k, v in figures.items() if v is None}
    reasons = set(missing.values())
    if len(missing) == len(figures) and len(reasons) == 1:
        # Nothing answered, for one reason: said once, not five times.
        reason = reasons.pop() or "the runtime gave no value"
        return _na_line(reason, _short(reason), width)

    def shown(key: str, text: str, why: bool) -> str:
        return f"n/a ({_short(missing[key])})" if key in missing and why else ("n/a" if key in missing else text)

    if used is None and total is None:
        hbm_key, hbm = "hbm_capacity_usage", ""
    else:
        hbm_key, hbm = "", fmt_bytes_pair(used, total)
    choices = []
    for why in (True, False):
        duty_s = shown("duty_cycle_pct", pct(duty), why)
        tc_s = shown("tensorcore_util", pct(tc), why)
        hbm_s = shown(hbm_key, hbm, why) if hbm_key else hbm
        queue_s = shown("hlo_queue_size", fmt_count(queue), why)
        choices.append(f" TPU duty {duty_s}  TensorCore {tc_s}  HBM {hbm_s}  queued {queue_s}")
        choices.append(f" TPU duty {duty_s}  TC {tc_s}  HBM {hbm_s}  queued {queue_s}")
        choices.append(f" duty {duty_s}  TC {tc_s}  HBM {hbm_s}  queue {queue_s}")
    pair = fmt_bytes_pair(used, total).replace(" of ", "/")
    choices.append(f" duty {pct(duty)} TC {pct(tc)} HBM {pair} q {fmt_count(queue)}")
    choices.append(f" duty {pct(duty)} TC {pct(tc)} HBM {fmt_bytes(used)} q {fmt_count(queue)}")
    return Text(longest(choices, width), no_wrap=True, overflow="ellipsis")
