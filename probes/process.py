"""Host-side view of the process (psutil): RSS, CPU %, threads."""

from __future__ import annotations

import os
import resource
from typing import Any


class ProcessProbe:
    """Samples one process; ``pid`` defaults to the calling one.

    CPU % is measured between consecutive calls (100 = one full core).
    """

    def __init__(self, pid: int | None = None) -> None:
        import psutil

        self._psutil = psutil
        self.pid = pid if pid is not None else os.getpid()
        self._proc = psutil.Process(self.pid)
        self._proc.cpu_percent(None)  # prime the first interval
        self._own = self.pid == os.getpid()

    def sample(self) -> dict[str, Any]:
        try:
            with self._proc.oneshot():
                mem = self._proc.memory_info()
                out: dict[str, Any] = {
                    "rss_bytes": mem.rss,
                    "vms_bytes": mem.vms,
                    "cpu_percent": self._proc.cpu_percent(None),
                    "threads": self._proc.num_threads(),
                }
        except (self._psutil.Error, OSError) as exc:
            return {"available": False, "reason": f"psutil: {exc}"}
        if self._own:
            # ru_maxrss is KiB on Linux: the true process peak, which a 0.1 s
            # poll of RSS can miss.
            out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return out
