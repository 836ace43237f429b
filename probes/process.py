"""Host-side view of the process (psutil): RSS, CPU %, threads."""

from __future__ import annotations

import os
import resource
import sys
import time
from typing import Any

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _ProcFiles:
    """``/proc/PID/statm`` and ``status`` of this process, kept open.

    ``pread`` at offset 0 makes procfs render a file afresh, so a sample costs
    one system call per file instead of psutil's open, read and close. The
    agent samples ten times a second inside a training job, and every system
    call lets the GIL go and then waits to take it back from the user's
    thread, so this matters (docs/benchmarks.md).
    """

    def __init__(self, pid: int) -> None:
        self.statm = os.open(f"/proc/{pid}/statm", os.O_RDONLY)
        try:
            self.status = os.open(f"/proc/{pid}/status", os.O_RDONLY)
        except OSError:
            os.close(self.statm)
            raise

    def memory(self) -> tuple[int, int]:
        """(rss_bytes, vms_bytes)."""
        fields = os.pread(self.statm, 256, 0).split()
        return int(fields[1]) * _PAGE, int(fields[0]) * _PAGE

    def threads(self) -> int:
        text = os.pread(self.status, 16384, 0)
        start = text.index(b"\nThreads:") + 9
        return int(text[start : text.index(b"\n", start)])

    def close(self) -> None:
        for fd in (self.statm, self.status):
            try:
                os.close(fd)
            except OSError:
                pass


class ProcessProbe:
    """Samples one process; ``pid`` defaults to the calling one.

    CPU % is measured between consecutive calls (100 = one full core).

    For the calling process on Linux a sample is two system calls: ``pread``
    of ``/proc/self/statm`` (RSS, VMS) and ``getrusage`` (CPU time and peak
    RSS). The thread count, which needs ``/proc/self/status``, is re-read only
    when ``slow`` is asked for. Elsewhere, and for other processes, psutil.
    """

    def __init__(self, pid: int | None = None) -> None:
        import psutil

        self._psutil = psutil
        self.pid = pid if pid is not None else os.getpid()
        self._proc = psutil.Process(self.pid)
        self._own = self.pid == os.getpid()
        self._threads: int | None = None
        self._files: _ProcFiles | None = None
        if self._own:
            try:
                self._files = _ProcFiles(self.pid)
            except OSError:
                pass  # no procfs (macOS): psutil below
            self._last_cpu = self._own_cpu(resource.getrusage(resource.RUSAGE_SELF))
        else:
            self._proc.cpu_percent(None)  # prime the first interval

    @staticmethod
    def _own_cpu(usage: Any) -> tuple[float, float]:
        return time.monotonic(), usage.ru_utime + usage.ru_stime

    def _cpu_percent(self, usage: Any) -> float:
        if not self._own:
            return self._proc.cpu_percent(None)
        now = self._own_cpu(usage)
        (t0, cpu0), self._last_cpu = self._last_cpu, now
        wall = now[0] - t0
        return round(100.0 * (now[1] - cpu0) / wall, 1) if wall > 0 else 0.0

    def sample(self, slow: bool = True) -> dict[str, Any]:
        """RSS, VMS, CPU % since the last call, thread count.

        Args:
            slow: also re-read the thread count (otherwise the last one is
                reported; the first call always reads it).
        """
        if self._files is not None:
            try:
                return self._sample_own(slow)
            except (OSError, ValueError, IndexError):
                self._files.close()  # procfs went odd: psutil from now on
                self._files = None
        try:
            with self._proc.oneshot():
                mem = self._proc.memory_info()
                if slow or self._threads is None:
                    self._threads = self._proc.num_threads()
                usage = resource.getrusage(resource.RUSAGE_SELF) if self._own else None
                out: dict[str, Any] = {
                    "rss_bytes": mem.rss,
                    "vms_bytes": mem.vms,
                    "cpu_percent": self._cpu_percent(usage),
                    "threads": self._threads,
                }
        except (self._psutil.Error, OSError) as exc:
            return {"available": False, "reason": f"psutil: {exc}"}
        if usage is not None:
            out["peak_rss_bytes"] = _peak_rss_bytes(usage)
        return out

    def _sample_own(self, slow: bool) -> dict[str, Any]:
        files = self._files
        rss, vms = files.memory()
        if slow or self._threads is None:
            self._threads = files.threads()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "rss_bytes": rss,
            "vms_bytes": vms,
            "cpu_percent": self._cpu_percent(usage),
            "threads": self._threads,
            "peak_rss_bytes": _peak_rss_bytes(usage),
        }

    def close(self) -> None:
        if self._files is not None:
            self._files.close()
            self._files = None


def _peak_rss_bytes(usage: Any) -> int:
    """ru_maxrss: the true process peak, which a 0.1 s poll of RSS can miss.
    KiB on Linux, bytes on macOS."""
    scale = 1 if sys.platform == "darwin" else 1024
    return usage.ru_maxrss * scale
