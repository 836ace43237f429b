"""NVIDIA driver's view (nvidia-ml-py, module ``pynvml``).

Per GPU: memory used/total (what ``nvidia-smi`` shows, the outer layer of the
memory picture), utilisation, temperature, power, PCIe TX/RX, and this
process's own GPU memory. Every call goes through one wrapper that turns an
``NVMLError`` into a missing value with a reason, as nvitop does; without a
driver the probe reports ``available: false`` with the reason, once.

NVML calls can take milliseconds (PCIe throughput samples for 20 ms), so the
probe polls on its own thread and the agent reads the latest readings.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

from jaxtop.probes.base import Tick

FAST_INTERVAL_S = 0.5
SLOW_INTERVAL_S = 1.0


def visible_index_map(count: int, env: str | None) -> dict[int, int | str]:
    """JAX device ordinal -> NVML index or UUID, from ``CUDA_VISIBLE_DEVICES``."""
    if env is None or env.strip() == "":
        return {i: i for i in range(count)} if env is None else {}
    out: dict[int, int | str] = {}
    for k, item in enumerate(p.strip() for p in env.split(",")):
        if not item:
            continue
        if item.lstrip("-").isdigit():
            if int(item) < 0:
                break  # CUDA stops at the first invalid ordinal
            out[k] = int(item)
        else:
            out[k] = item  # a UUID (GPU-…) or MIG id
    return out


#: The library pynvml loads on Linux (``nvmlInit`` opens it by this name).
NVML_LIBRARY = "libnvidia-ml.so.1"


def _library_missing() -> str | None:
    """Why NVML cannot be there, told without importing pynvml; None when
    it may be. Importing pynvml costs ~28 ms and ~6,600 objects the cyclic
    collector follows (nvidia-ml-py 13.615, measured), in every CPU or TPU program the
    agent joins, for an ``nvmlInit`` that then fails to find the driver's
    library. The library is opened the way pynvml opens it (same name, same
    search path), in ~0.3 ms; where it is absent the reason is pynvml's own
    (the dashboard reads it as "no NVIDIA driver here", not as a fault)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        ctypes.CDLL(NVML_LIBRARY)
    except OSError as exc:
        return f"NVML unavailable: NVMLError_LibraryNotFound: NVML Shared Library Not Found ({exc})"
    except Exception:
        return None
    return None


class NvmlProbe:
    """Polls NVML in a daemon thread.

    Args:
        pid: whose GPU memory to report (default: this process).
        nvml: the ``pynvml`` module, or a fake in tests.
    """

    name = "nvml"
    needs_jax = False

    def __init__(self, pid: int | None = None, nvml: Any = None) -> None:
        self.pid = pid if pid is not None else os.getpid()
        self._nvml = nvml
        self.available = False
        self.reason: str | None = None
        self._handles: list[Any] = []
        self._static: list[dict[str, Any]] = []
        self._latest: dict[int, dict[str, Any]] = {}
        self._latest_t: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: dict[str, str] = {}

    # -- one wrapper for every call ------------------------------------------
    def _call(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # pynvml.NVMLError and friends
            self.errors.setdefault(name, f"{type(exc).__name__}: {exc}")
            return None

    def start(self, thread: bool = True) -> bool:
        """Initialise NVML; start polling. Returns availability."""
        try:
            if self._nvml is None:
                missing = _library_missing()
                if missing is not None:
                    self.reason = missing
                    return False
                import pynvml  # type: ignore[import-not-found]

                self._nvml = pynvml
            self._nvml.nvmlInit()
            count = self._nvml.nvmlDeviceGetCount()
        except ImportError as exc:
            self.reason = f"nvidia-ml-py is not installed ({exc})"
            return False
        except Exception as exc:
            self.reason = f"NVML unavailable: {type(exc).__name__}: {exc}".strip()
            return False
        nv = self._nvml
        for i in range(count):
            handle = self._call("handle", nv.nvmlDeviceGetHandleByIndex, i)
            if handle is None:
                continue
            name = self._call("name", nv.nvmlDeviceGetName, handle)
            uuid = self._call("uuid", nv.nvmlDeviceGetUUID, handle)
            self._handles.append(handle)
            self._static.append({
                "index": i,
                "name": name.decode() if isinstance(name, bytes) else name,
                "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
            })
        self.available = True
        self.poll(slow=True)
        if thread:
            self._thread = threading.Thread(target=self._run, name="jaxtop-nvml", daemon=True)
            self._thread.start()
        return True

    def describe(self) -> dict[str, Any]:
        if not self.available:
            return {"available": False, "reason": self.reason}
        mapping = visible_index_map(len(self._static), os.environ.get("CUDA_VISIBLE_DEVICES"))
        jax_of: dict[Any, int] = {v: k for k, v in mapping.items()}
        devices = []
        for s in self._static:
            jid = jax_of.get(s["index"], jax_of.get(s["uuid"]))
            devices.append({**s, "jax_id": jid})
        return {"available": True, "devices": devices}

    def poll(self, slow: bool) -> None:
        """Read every GPU once (``slow`` adds PCIe and the process list)."""
        nv = self._nvml
        now = time.time()
        for s, handle in zip(self._static, self._handles):
            prev = self._latest.get(s["index"], {})
            rec: dict[str, Any] = {"index": s["index"]}
            mem = self._call("memory", nv.nvmlDeviceGetMemoryInfo, handle)
            rec["memory_used_bytes"] = getattr(mem, "used", None)
            rec["memory_total_bytes"] = getattr(mem, "total", None)
            util = self._call("utilization", nv.nvmlDeviceGetUtilizationRates, handle)
            rec["gpu_util_percent"] = getattr(util, "gpu", None)
            rec["mem_util_percent"] = getattr(util, "memory", None)
            rec["temperature_c"] = self._call(
                "temperature", nv.nvmlDeviceGetTemperature, handle, getattr(nv, "NVML_TEMPERATURE_GPU", 0)
            )
            power_mw = self._call("power", nv.nvmlDeviceGetPowerUsage, handle)
            rec["power_w"] = power_mw / 1000.0 if power_mw is not None else None
            if slow:
                tx = self._call("pcie", nv.nvmlDeviceGetPcieThroughput, handle, getattr(nv, "NVML_PCIE_UTIL_TX_BYTES", 0))
                rx = self._call("pcie", nv.nvmlDeviceGetPcieThroughput, handle, getattr(nv, "NVML_PCIE_UTIL_RX_BYTES", 1))
                # NVML reports KB/s averaged over 20 ms.
                rec["pcie_tx_bytes_per_s"] = tx * 1024 if tx is not None else None
                rec["pcie_rx_bytes_per_s"] = rx * 1024 if rx is not None else None
                procs = self._call("processes", nv.nvmlDeviceGetComputeRunningProcesses, handle)
                if procs is None:
                    rec["process_memory_bytes"] = None
                    rec["process_memory_reason"] = self.errors.get("processes", "unavailable")
                else:
                    mine = [p for p in procs if getattr(p, "pid", None) == self.pid]
                    if mine:
                        used = [getattr(p, "usedGpuMemory", None) for p in mine]
                        rec["process_memory_bytes"] = sum(u for u in used if u is not None) if any(u is not None for u in used) else None
                        if rec["process_memory_bytes"] is None:
                            rec["process_memory_reason"] = "driver does not report per-process memory"
                    else:
                        rec["process_memory_bytes"] = None
                        rec["process_memory_reason"] = (
                            f"pid {self.pid} not in this GPU's process list "
                            "(not using it, or a container PID namespace)"
                        )
            else:
                for key in ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "process_memory_bytes", "process_memory_reason"):
                    if key in prev:
                        rec[key] = prev[key]
            with self._lock:
                self._latest[s["index"]] = rec
        self._latest_t = now

    def _run(self) -> None:
        next_slow = time.monotonic() + SLOW_INTERVAL_S
        while not self._stop.wait(FAST_INTERVAL_S):
            try:
                slow = time.monotonic() >= next_slow
                if slow:
                    next_slow = time.monotonic() + SLOW_INTERVAL_S
                self.poll(slow)
            except Exception as exc:  # never let the thread die loudly
                self.errors.setdefault("poll", repr(exc))

    def on_tick(self, tick: Tick) -> dict[str, Any] | None:
        """The sample field ``nvml``: left out of samples where no driver answered
        (the ``hello`` and ``backend`` records say why)."""
        return self.sample() if self.available else None

    def sample(self) -> dict[str, Any]:
        """The latest readings (``available: false`` with a reason otherwise)."""
        if not self.available:
            return {"available": False, "reason": self.reason}
        with self._lock:
            devices = [dict(self._latest[k]) for k in sorted(self._latest)]
        return {"available": True, "t": self._latest_t, "devices": devices}

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self.available:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self.available = False
