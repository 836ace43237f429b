"""Host-side view of the process (psutil): RSS, CPU %, threads."""

from __future__ import annotations

import os
import resource
import time
from typing import Any


class ProcessProbe:
    """Samples one process; ``pid`` defaults to the calling one.

    CPU % is measured between consecutive calls (100 = one full core).

    For the calling process the fast path costs about a third of a full
    psutil ``oneshot``: RSS from psutil's ``memory_info`` (one read of
    ``/proc/self/statm``), CPU from ``os.times()`` (no file at all), and the
    thread count, which needs ``/proc/self/status``, only when ``slow`` is
    asked for. The agent calls it ten times a second inside a training job,
    so this matters (docs/benchmarks.md).
    """

    def __init__(self, pid: int | None = None) -> None:
        import psutil

        self._psutil = psutil
        self.pid = pid if pid is not None else os.getpid()
        self._proc = psutil.Process(self.pid)
        self._own = self.pid == os.getpid()
        self._threads: int | None = None
        if self._own:
            self._last_cpu = self._own_cpu()
        else:
            self._proc.cpu_percent(None)  # prime the first interval

    @staticmethod
    def _own_cpu() -> tuple[float, float]:
        times = os.times()
        return time.monotonic(), times.user + times.system

    def _cpu_percent(self) -> float:
        if not self._own:
            return self._proc.cpu_percent(None)
        now = self._own_cpu()
        (t0, cpu0), self._last_cpu = self._last_cpu, now
        wall = now[0] - t0
        return round(100.0 * (now[1] - cpu0) / wall, 1) if wall > 0 else 0.0

    def sample(self, slow: bool = True) -> dict[str, Any]:
        """RSS, VMS, CPU % since the last call, thread count.

        Args:
            slow: also re-read the thread count (otherwise the last one is
                reported; the first call always reads it).
        """
        try:
            with self._proc.oneshot():
                mem = self._proc.memory_info()
                if slow or self._threads is None:
                    self._threads = self._proc.num_threads()
                out: dict[str, Any] = {
                    "rss_bytes": mem.rss,
                    "vms_bytes": mem.vms,
                    "cpu_percent": self._cpu_percent(),
                    "threads": self._threads,
                }
        except (self._psutil.Error, OSError) as exc:
            return {"available": False, "reason": f"psutil: {exc}"}
        if self._own:
            # ru_maxrss is KiB on Linux: the true process peak, which a 0.1 s
            # poll of RSS can miss.
            out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return out
