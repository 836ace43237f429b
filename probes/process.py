"""Host-side view of the process: RSS and its parts, CPU %, threads, start time.

procfs and ``getrusage`` where they exist, psutil elsewhere.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from typing import Any

from jaxtop.probes.base import Tick
from jaxtop.probes.procfs import proc_fields

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


#: The resident set's parts in ``/proc/PID/status`` (Linux 4.5+), by the
#: sample's names. What is not the program's own heap shows here: a
#: runtime's shared-memory buffers (``RssShmem``: shmem, tmpfs and
#: memfd pages), mapped libraries and files (``RssFile``), against
#: anonymous memory (``RssAnon``: heaps, NumPy arrays, a CPU backend's
#: arrays, pinned host buffers made with plain allocations). gVisor (a TPU
#: VM's sandbox) writes none of them in its status file, as its source
#: reads: the sample then has no parts, and says nothing of them.
RSS_PARTS = (("RssAnon", "rss_anon_bytes"), ("RssFile", "rss_file_bytes"), ("RssShmem", "rss_shmem_bytes"))
_STATUS_KEYS = ("Threads", *(key for key, _ in RSS_PARTS))


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
            self.status_fd = os.open(f"/proc/{pid}/status", os.O_RDONLY)
        except OSError:
            os.close(self.statm)
            raise

    def memory(self) -> tuple[int, int]:
        """(rss_bytes, vms_bytes)."""
        fields = os.pread(self.statm, 256, 0).split()
        return int(fields[1]) * _PAGE, int(fields[0]) * _PAGE

    def status(self) -> tuple[int, dict[str, int]]:
        """(threads, the resident set's parts in bytes: ``rss_anon_bytes``,
        ``rss_file_bytes``, ``rss_shmem_bytes``, those the kernel gives)."""
        fields = proc_fields(os.pread(self.status_fd, 16384, 0), _STATUS_KEYS)
        if "Threads" not in fields:
            raise ValueError("no Threads: line in /proc/PID/status")
        return fields["Threads"], {name: fields[key] for key, name in RSS_PARTS if key in fields}

    def close(self) -> None:
        for fd in (self.statm, self.status_fd):
            try:
                os.close(fd)
            except OSError:
                pass


class ProcessProbe:
    """Samples one process; ``pid`` defaults to the calling one.

    CPU % is measured between consecutive calls (100 = one full core).

    For the calling process on Linux a sample is read when ``slow`` is asked
    for (once a second): ``pread`` of ``/proc/self/statm`` (RSS, VMS) and
    ``/proc/self/status`` (threads, the resident set's parts), ``getrusage`` (CPU time and peak RSS);
    the samples between repeat it. Elsewhere, and for other processes,
    psutil at each call.
    """

    def __init__(self, pid: int | None = None) -> None:
        import psutil

        self._psutil = psutil
        self.pid = pid if pid is not None else os.getpid()
        self._proc = psutil.Process(self.pid)
        self._own = self.pid == os.getpid()
        # Read once: a process starts only once. The agent may be injected
        # long after the program started, so its own start time is not the
        # program's.
        self.started_t = process_start_time(self.pid)
        if self.started_t is None:
            try:
                self.started_t = self._proc.create_time()
            except (psutil.Error, OSError):
                pass  # the sample then simply has no started_t
        self._threads: int | None = None
        self._parts: dict[str, int] = {}  # the resident set's parts, read with the threads
        self._usage: tuple[float, Any] | None = None  # (cpu %, getrusage) read on the last slow sample
        self._files: _ProcFiles | None = None
        self._last_own: dict[str, Any] | None = None  # the last slow sample of this process
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

    # -- the probe interface (jaxtop.probes.base.Probe) ------------------------
    name = "process"
    needs_jax = False
    reason: str | None = None

    def start(self) -> None:
        """Nothing to install: the files are opened with the probe."""

    def on_tick(self, tick: Tick) -> dict[str, Any]:
        return self.sample(slow=tick.slow or tick.final)

    def stop(self) -> None:
        self.close()

    def sample(self, slow: bool = True) -> dict[str, Any]:
        """RSS, VMS, CPU % since the last call, thread count, start time.

        Args:
            slow: also re-read the thread count (otherwise the last one is
                reported; the first call always reads it).
        """
        out = self._sample(slow)
        if self.started_t is not None and out.get("available", True):
            out["started_t"] = self.started_t
        return out

    def _sample(self, slow: bool) -> dict[str, Any]:
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
            out["peak_rss_bytes"] = _peak_rss_bytes(usage, mem.rss)
        return out

    def _sample_own(self, slow: bool) -> dict[str, Any]:
        # Everything here is read once a second (``slow``); the ticks between
        # repeat it (a copy: the agent's encoder reuses its bytes). Host
        # memory moves slowly and its peak is the kernel's (``ru_maxrss``),
        # while a read of procfs, beside a busy program, cost the agent's
        # thread ~40 us of its ~500 us tick on a 2-core VM (more under
        # gVisor, a TPU VM's sandbox, where every system call is dearer).
        last = self._last_own
        if not slow and last is not None:
            return dict(last)
        files = self._files
        rss, vms = files.memory()
        if slow or self._threads is None:
            self._threads, self._parts = files.status()
        # CPU % and the peak RSS are read once a second (``slow``): a CPU
        # share over 0.1 s is mostly noise, and each system call here lets
        # the GIL go and waits to take it back from the user's thread.
        if slow or self._usage is None:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            self._usage = (self._cpu_percent(usage), usage)
        cpu_percent, usage = self._usage
        out = self._last_own = {
            "rss_bytes": rss,
            "vms_bytes": vms,
            "cpu_percent": cpu_percent,
            "threads": self._threads,
            "peak_rss_bytes": _peak_rss_bytes(usage, rss),
            **self._parts,
        }
        return dict(out)

    def close(self) -> None:
        if self._files is not None:
            self._files.close()
            self._files = None


def _peak_rss_bytes(usage: Any, rss: int) -> int:
    """The process's peak RSS, never below the current RSS.

    ``ru_maxrss`` is the true peak, which a 0.1 s poll of RSS can miss (KiB
    on Linux, bytes on macOS). But the kernel updates it lazily (when the
    memory map changes or the process exits), and it is read at another
    moment than ``rss``: taken alone it can lag below the RSS just read.
    """
    scale = 1 if sys.platform == "darwin" else 1024
    return max(usage.ru_maxrss * scale, rss)


def process_start_time(pid: int) -> float | None:
    """When process ``pid`` started, in Unix seconds, from procfs.

    ``/proc/PID/stat`` field 22 is the start time in clock ticks since boot;
    ``/proc/stat``'s ``btime`` is the boot time in Unix seconds (whole
    seconds: so is the precision of the result).

    Returns:
        The start time, or None without procfs (macOS) or on a parse error.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        with open("/proc/stat", "rb") as f:
            boot = next(line for line in f if line.startswith(b"btime "))
        return int(boot.split()[1]) + start_ticks(stat) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration, AttributeError):
        return None


def start_ticks(stat: bytes) -> int:
    """Field 22 (``starttime``, clock ticks since boot) of a ``/proc/PID/stat`` line.

    The command name (field 2) is in parentheses and may itself hold spaces
    and ")": the fields after the last ")" are field 3 onwards.
    """
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[22 - 3])
