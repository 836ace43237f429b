"""The sample's ``devices`` field: every local device's allocator figures,
live-array totals and buffer map, each read at the cadence its cost allows.

The allocator's ``memory_stats()`` is cheap and read on every tick. The
live-array scan (exact totals) and the detail derived from it (top buffers,
the address map and its holes) cost in proportion to what the program holds,
so each draws on an allowance of CPU (and the maps on one of bytes on the
wire) that pays for what its last run cost: see :mod:`jaxtop.agent.cadence`.

Standard library and jax only (the agent imports it inside the user's job).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from jaxtop.agent import cadence, scan_pause
from jaxtop.probes.base import Tick
from jaxtop.probes.jax_memory import JaxMemoryProbe, backend_ready
from jaxtop.probes.jaxstate import distributed
from jaxtop.wire import protocol

__all__ = ["DevicesProbe", "MAP_ENTRY_BYTES"]

#: Bytes a buffer of a map (or a top buffer) weighs in a sample, about:
#: ``[140225514849600,16384],`` (the wire's map allowance counts these).
MAP_ENTRY_BYTES = 24


def program_memory(records: list[dict[str, Any]]) -> int | None:
    """The program's memory in a tick's device records: the allocators'
    bytes in use summed, or, where no device reports any (CPU), the
    process's resident bytes (``/proc/self/statm``; None without it)."""
    in_use = [r["bytes_in_use"] for r in records if r.get("source") == "memory_stats"
              and r.get("bytes_in_use").__class__ is int]
    if in_use:
        return sum(in_use)
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read(64).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class DevicesProbe:
    """The memory of every local device (sample field ``devices``).

    Nothing is read before jax has a backend: creating one is the program's
    business (it picks the platform, the memory fraction...). The first tick
    that finds one emits a ``backend`` record describing the devices.

    Args:
        slow_interval_s: least time between two scans, and between two details.
        versions: the ``versions`` of the backend record (a callable: read when it is sent).
    """

    name = "devices"
    needs_jax = True

    def __init__(self, slow_interval_s: float, versions: Callable[[], dict[str, Any]]) -> None:
        self.slow_interval_s = slow_interval_s
        self._versions = versions
        self.reason: str | None = None
        self.memory: JaxMemoryProbe | None = None
        self._jax = False
        # What the costly details may spend.
        self.scan_allowance = cadence.Allowance(cadence.SCAN_SHARE, start=cadence.START_CPU_S,
                                                smooth=cadence.SMOOTH_RUNS)
        self.detail_allowance = cadence.Allowance(cadence.DETAIL_SHARE, start=cadence.START_CPU_S,
                                                  smooth=cadence.SMOOTH_RUNS)
        self.map_bytes = cadence.Allowance(cadence.MAP_BYTES_PER_S, start=cadence.MAP_BYTES_PER_S * 10)
        self._read_credit = cadence.READ_CREDIT_S
        self._scan_next = 0.0  # monotonic: the slow interval at most this often
        self._scan_requested = False
        self._scan_t: float | None = None
        self.scan_interval_s: float | None = None  # between the last two scans
        self.scan_cpu_s: float | None = None
        self._detail_next = 0.0
        self._detail_t: float | None = None
        self.detail_interval_s: float | None = None
        self.detail_cpu_s: float | None = None
        limit, default, self.max_pause_error = scan_pause.limit_from_env()
        #: How long a scan may pause the program, and what the scans measured.
        self.pause = scan_pause.ScanPause(limit, default)
        #: Why no scheduled scan runs (the next would pause the program
        #: longer than the limit allows: jaxtop.agent.scan_pause); None while they run.
        self.scan_held: str | None = None
        #: The program's memory at the last once-a-second tick while the scans are held (see program_memory).
        self._memory_now: int | None = None

    @property
    def allowances(self) -> tuple[cadence.Allowance, ...]:
        return (self.scan_allowance, self.detail_allowance, self.map_bytes)

    def start(self) -> None:
        """jax is imported: from now on each tick looks for a backend."""
        self._jax = True

    def stop(self) -> None:
        """Give ``jax.Array.delete`` back and drop the references to live arrays."""
        memory, self.memory = self.memory, None
        if memory is not None:
            memory.close()

    def request_scan(self) -> None:
        """Scan the live arrays on the next tick whatever the cadence says."""
        self._scan_requested = True

    def shift_deadlines(self, gap: float) -> None:
        """The process was stopped for ``gap`` seconds: nothing changed meanwhile."""
        self._scan_next += gap
        self._detail_next += gap
        for allowance in self.allowances:
            allowance.shift(gap)

    def on_tick(self, tick: Tick) -> list[dict[str, Any]]:
        if self.memory is None:
            if not self._jax or not backend_ready():
                return []
            self.memory = JaxMemoryProbe()
            tick.emit({
                "type": protocol.BACKEND,
                "t": time.time(),
                "backend": self.memory.backend,
                "devices": self.memory.describe(),
                "versions": self._versions(),
                # jax.distributed.initialize comes before the backend: known now.
                "distributed": distributed(),
            })
        self._details(tick.now, tick.final)
        records = self.memory.sample(include_map=True)
        if self.scan_held is not None and tick.slow:
            # Read only while the scans are held (what lets a growing program
            # have one), once a second: a growth a minute apart needs no more.
            self._memory_now = program_memory(records)
            if self.pause.memory_at_scan is None:
                self.pause.memory_at_scan = self._memory_now  # the scan that held them came a tick ago
        elif self.scan_held is None:
            self._memory_now = None
        return records

    def _hold_scans(self, memory: JaxMemoryProbe) -> None:
        """Whether the next scheduled scan would pause the program past the
        limit (asked ones still run: a budget's, the final one),
        said with the figures on every device's live arrays."""
        self.scan_held = memory.scan_held = self.pause.over()
        memory.scan_held_pause_s = self.pause.predicted_s() if self.scan_held else None

    def _details(self, now: float, final: bool) -> None:
        """The live-array scan and the detail derived from it, each when its
        allowance has paid for the last one (both at once for the final
        sample); never more often than ``slow_interval_s``."""
        memory = self.memory
        assert memory is not None
        mono = time.monotonic()
        grown = self.scan_held is not None and self.pause.growth_due(mono, self._memory_now)
        if final or self._scan_requested or grown or (self.scan_held is None and mono >= self._scan_next
                                                      and self.scan_allowance.ready(mono)):
            self._scan_requested = False
            started = time.thread_time()
            memory.scan_live_arrays(now, detail=False)
            cost = self.scan_cpu_s = time.thread_time() - started
            covered = min(memory.arrays.read_cpu_s, self._read_credit)  # see jaxtop.agent.cadence
            self._read_credit -= covered
            self.scan_allowance.spend(cost - covered, mono)
            if self._scan_t is not None:
                self.scan_interval_s = mono - self._scan_t
            self._scan_t, self._scan_next = mono, mono + self.slow_interval_s
            self.pause.measured(memory.arrays.call_s, memory.arrays.call_count, mono, self._memory_now)
            self._hold_scans(memory)
        if final or (mono >= self._detail_next and memory.detail_stale()
                     and self.detail_allowance.ready(mono) and self.map_bytes.ready(mono)):
            started = time.thread_time()
            entries = memory.refresh_detail(now)
            cost = self.detail_cpu_s = time.thread_time() - started
            self.detail_allowance.spend(cost, mono)
            self.map_bytes.spend(entries * MAP_ENTRY_BYTES, mono)
            if self._detail_t is not None:
                self.detail_interval_s = mono - self._detail_t
            self._detail_t, self._detail_next = mono, mono + self.slow_interval_s
