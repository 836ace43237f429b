"""The parts of an ``oom_census`` record: what held the memory when the
program ran out (docs/protocol.md, "OOM census").

The producer is ``probes/oom/`` (:func:`build_census` in ``census.py``
puts the parts together; ``lines.py`` parses the request and the
allocator's lines, ``parts.py`` the host, the live arrays and the
timeline, ``sites.py`` the allocation sites, ``monitor.py`` adds
``suppressed_before``, ``path`` and ``file_error``). The record itself is
:class:`jaxtop.wire.records.core.OomCensus`; it comes as a record of its
own, or (older agents) inside a sample's ``oom_census`` field.

Sizes are bytes unless the name says otherwise.
"""

from __future__ import annotations

from jaxtop.wire.records.base import DeviceId, Num, Rec, Time

__all__ = [
    "AllocatorStats", "AllocatorSummary", "CensusAllocatorLog", "CensusArrayGroup", "CensusArrays", "CensusDevice",
    "CensusFrame", "CensusHost", "CensusRequest", "CensusSite", "CensusSites", "CensusSkipped", "CensusTimeline",
    "CensusTiming", "CensusTrigger", "CudaMemory",
]


class CensusFrame(Rec):
    """A frame of the user's code (``trigger.raised_at``): the innermost
    one where the error was raised."""

    file: str | None = None  # the full path
    line: Num = None
    function: str | None = None
    site: str | None = None  # "train.py:120 in step": how the census names it


class CensusTrigger(Rec):
    """``trigger``: how the out-of-memory error was seen."""

    # raised (seen when jax made the error), failed_array (made by jaxtop's
    # own look at an array whose computation failed), uncaught (seen first by
    # an excepthook), allocator_log (an allocator line, no exception).
    how: str | None = None
    exception: str | None = None  # the error's qualified class name
    message: str | None = None  # the error's text (at most 2000 characters)
    thread: str | None = None
    uncaught: bool | None = None  # it ended the program or its thread
    raised_at: CensusFrame | None = None
    reported_as: str | None = None  # the class of the exception that carried it as its cause


class CensusRequest(Rec):
    """``request`` (and an allocator event's ``request``): the failed
    request, parsed from the error's text and the allocator's line."""

    bytes: Num = None  # the request (None: the text gives no size)
    human: str | None = None  # the size as the text printed it ("1.00GiB")
    rounded_bytes: Num = None  # the allocator's rounded request
    allocator: str | None = None  # "GPU_0_bfc"
    device_ordinal: Num = None  # the local ordinal the text names
    op: str | None = None  # the op that asked
    form: str | None = None  # cpu, gpu, gpu_bfc, gpu_cuda_async, tpu, tpu_compile, unknown
    not_a_failure: bool | None = None  # the BFC allocator's note that the caller copes
    freed_by_count: Num = None  # the BFC allocator's freed_by_count
    # A TPU compile that does not fit (form tpu_compile) instead of ``bytes``:
    used_bytes: Num = None
    capacity_bytes: Num = None
    over_bytes: Num = None
    memory_space: str | None = None
    text: str | None = None  # the line it was parsed from (at most 2000 characters)
    device: str | None = None  # "gpu:0": the device the request was for
    device_id: DeviceId | None = None


class CensusDevice(Rec):
    """One local device at the failure (``devices[]``): its
    ``memory_stats()`` where the backend reports them."""

    id: DeviceId | None = None
    platform: str | None = None
    kind: str | None = None  # the device kind ("TPU v5 lite")
    source: str | None = None  # memory_stats, or live_arrays (no allocator statistics: bytes_in_use is the live arrays')
    bytes_in_use: Num = None
    peak_bytes_in_use: Num = None
    bytes_limit: Num = None
    pool_bytes: Num = None
    largest_free_block_bytes: Num = None
    bytes_reserved: Num = None
    num_allocs: Num = None
    largest_alloc_size: Num = None
    stats_error: str | None = None  # memory_stats() raised: why
    fragmentation: Num = None  # 0-1, as in samples
    fragmentation_reason: str | None = None  # why fragmentation is n/a
    live_array_bytes: Num = None  # the live arrays' bytes on this device (None: the scan was cut short)
    unheld_bytes: Num = None  # in use that no live array holds (a complete scan with allocator statistics)
    failed: bool | None = None  # the request was for this device
    verdict: str | None = None  # one line; None without allocator statistics


class CensusHost(Rec):
    """``host``: the process's memory as the OS sees it, and its limits
    (a limit None: unlimited, or not said)."""

    rss_bytes: Num = None
    vms_bytes: Num = None  # address space: what RLIMIT_AS counts
    peak_rss_bytes: Num = None
    rlimit_as_bytes: Num = None
    rlimit_data_bytes: Num = None
    mem_total_bytes: Num = None
    mem_available_bytes: Num = None
    cgroup_limit_bytes: Num = None  # cgroup v2 memory.max
    cgroup_current_bytes: Num = None


class CensusArrayGroup(Rec):
    """Live arrays of one shape, dtype and placement (``arrays.groups[]``)."""

    shape: list[Num] | str | None = None  # dims (an older agent's text for them)
    dtype: str | None = None
    placement: str | None = None  # "cpu:0", or a sharded array's partition spec and device count
    count: Num = None
    bytes: Num = None
    bytes_each: Num = None


class CensusArrays(Rec):
    """``arrays``: the live arrays (``jax.live_arrays()``), each device
    buffer once; ``groups`` lists the largest only."""

    groups: list[CensusArrayGroup] | None = None
    count: Num = None  # arrays counted
    bytes: Num = None  # all of them
    groups_total: Num = None
    shown_bytes: Num = None  # the listed groups'
    per_device: dict[str, Num] | None = None  # device id (as a string) -> bytes
    aliases: Num = None  # arrays on a buffer already counted
    errors: Num = None  # arrays deleted while scanned
    failed: Num = None  # arrays whose computation failed: no buffer, no memory held
    not_scanned: Num = None  # arrays left for lack of time
    complete: bool | None = None


class CensusSite(Rec):
    """An allocation site of the device memory profile (``sites.top[]``)."""

    site: str | None = None  # "train.py:88 in prefetch"
    file: str | None = None
    line: Num = None
    function: str | None = None
    bytes: Num = None
    count: Num = None  # buffers
    user: bool | None = None  # False: no frame of the user's code in its stack (the innermost outside jax, numpy, jaxtop)
    via: str | None = None  # the library frame that made the buffer, when it is not the site
    stack: list[str] | None = None  # up to 6 frames, from the site outwards
    devices: list[str] | None = None  # the profile's device labels


class CensusSites(Rec):
    """``sites``: the sites holding the most bytes, from the device memory profile."""

    top: list[CensusSite] | None = None
    bytes: Num = None
    count: Num = None
    sites_total: Num = None
    executable_bytes: Num = None  # compiled code, not counted in the sites


class CensusTimeline(Rec):
    """``timeline``: the agent's samples of the last 60 s, the census's
    own moment last; each series is aligned with ``t`` (None where a
    sample had no figure)."""

    t: list[Time] | None = None
    bytes_in_use: dict[str, list[Num]] | None = None  # device id (as a string) -> series
    live_bytes: dict[str, list[Num]] | None = None  # device id (as a string) -> series
    rss_bytes: list[Num] | None = None
    last_is_census: bool | None = None


class AllocatorStats(Rec):
    """An allocator event's ``stats``: its ``Stats:`` block at the failure,
    named as ``memory_stats()`` names them, in the order it prints them."""

    bytes_limit: Num = None
    bytes_in_use: Num = None
    peak_bytes_in_use: Num = None
    num_allocs: Num = None  # a count, not bytes
    largest_alloc_size: Num = None
    bytes_reserved: Num = None
    peak_bytes_reserved: Num = None
    largest_free_block_bytes: Num = None

    def items(self) -> tuple[tuple[str, int | float], ...]:
        """``(name, value)`` of each figure the allocator printed."""
        return tuple((name, value) for name in self.__struct_fields__
                     if (value := getattr(self, name)) is not None)


class AllocatorSummary(Rec):
    """An allocator event's ``summary``: its "Allocator memory summary" line."""

    request: Num = None  # the rounded request
    free: Num = None  # total free in the pool
    largest: Num = None  # the largest free chunk usable
    unallocated: Num = None
    pool: Num = None
    limit: Num = None


class CudaMemory(Rec):
    """An allocator event's ``cuda`` (the cuda_async allocator): what CUDA itself said."""

    free_bytes: Num = None
    total_bytes: Num = None


class CensusAllocatorLog(Rec):
    """``allocator_log`` (GPU): what the allocator's lines said about the failure."""

    t: Time = None  # when its failure line came
    request: CensusRequest | None = None
    stats: AllocatorStats | None = None
    summary: AllocatorSummary | None = None
    cuda: CudaMemory | None = None
    in_use_total_bytes: Num = None  # "Sum Total of in-use chunks"
    occupancy: str | None = None  # its 100-character picture of the pool: * used, x wasted, _ free
    lines: list[str] | None = None  # its failure line
    errors: list[str] | None = None  # other out-of-memory lines (the last 4)
    verdict: str | None = None  # the verdict from its own statistics


class CensusTiming(Rec):
    """``timing``: what the census cost."""

    seconds: Num = None  # wall time taken
    budget_s: Num = None
    steps: dict[str, Num] | None = None  # seconds per part: request, stats, arrays, sites, timeline, verdict
    live_arrays: Num = None  # how many there were


class CensusSkipped(Rec):
    """``skipped[]``: a part not taken in full (``arrays``, ``sites``, ``timeline``)."""

    part: str | None = None
    reason: str | None = None
