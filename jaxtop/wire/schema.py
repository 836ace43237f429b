"""The sample's figures: one declaration every reader reads from.

A sample (``type: "sample"``) carries one object per probe. The figures in
them that more than one reader uses (the dashboard's model, the exports,
budgets, the Prometheus exposition, the timelines) are declared here once:
their key, unit, whether they only grow (a counter since the agent
started), and what they mean. Readers take their keys and help texts from
here; ``tests/test_schema.py`` holds a real agent's samples and the
synthetic streams to it, so a field renamed in a probe fails there rather
than reading n/a in one reader and a number in another.

A figure that is missing or None was not measured: readers show it as n/a
with the reason the probe gave (``reason``), never as 0.

Standard library only: the agent side imports the wire.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["COMPILE", "DEVICE", "DEVICE_PARTS", "DONATION", "Figure", "LIVE_ARRAYS", "LIVE_ARRAYS_PARTS", "PROCESS", "SAMPLE_FIELDS", "TRANSFER", "keys"]


class Figure(NamedTuple):
    """One figure of a sample."""

    key: str
    unit: str  # "bytes", "count", "ratio", "percent", "seconds", "time" (Unix seconds), "id", "text"
    help: str
    counter: bool = False  # only grows, from the agent's start


#: The fields of a sample, each filled by one probe (None: the agent's own).
SAMPLE_FIELDS = {
    "t": None, "seq": None, "events": None, "agent": None, "final": None,
    "transfer_capture": "transfer_capture", "devices": "devices", "transfers": "transfers",
    "process": "process", "compile": "compile", "donation": "donation", "nvml": "nvml", "jit": "jit",
    "holders": "holders", "host_syncs": "host_syncs", "labels": "labels", "accelerator": "accelerator",
    "transfer_sites": "transfer_sites",
}

#: One device of ``devices``.
DEVICE = (
    Figure("id", "id", "The device's jax id."),
    Figure("platform", "text", "cpu, gpu or tpu."),
    Figure("source", "text", "memory_stats (the allocator's figures) or live_arrays (CPU: the live arrays' bytes)."),
    Figure("bytes_in_use", "bytes",
           "Bytes held by live buffers on the device (allocator's bytes_in_use; live arrays on CPU)."),
    Figure("peak_bytes_in_use", "bytes", "Allocator's peak bytes in use since start."),
    Figure("peak_rise_bytes", "bytes", "How far the peak rose since the previous sample."),
    Figure("pool_bytes", "bytes", "Bytes the allocator reserved from the device (its pool)."),
    Figure("bytes_limit", "bytes", "Allocator's limit on the device."),
    Figure("largest_free_block_bytes", "bytes", "Largest free block in the allocator's pool."),
    Figure("fragmentation", "ratio", "1 - largest free block / free bytes in the pool (BFC allocator)."),
    Figure("num_allocs", "count", "The allocator's allocation count: made since start on GPU (BFC), alive now on TPU "
           "(it falls there, so it is no counter).", counter=False),
    # memory_stats() passes these through where the allocator keeps them (GPU, TPU).
    Figure("largest_alloc_size", "bytes", "The largest allocation the allocator made."),
    Figure("bytes_reserved", "bytes", "Bytes reserved by the allocator beyond its pool."),
    Figure("peak_bytes_reserved", "bytes", "Peak of bytes_reserved."),
    Figure("bytes_reservable_limit", "bytes", "Limit on bytes_reserved."),
    Figure("peak_pool_bytes", "bytes", "Peak of pool_bytes."),
)

#: A device's parts that are not figures: the live arrays' totals and detail,
#: and why a figure is n/a.
DEVICE_PARTS = ("live_arrays", "fragmentation_reason")

#: A device's ``live_arrays``: the exact totals of the last live-array scan.
LIVE_ARRAYS = (
    Figure("bytes", "bytes", "Bytes of the live arrays' buffers on the device, each buffer once."),
    Figure("count", "count", "Live buffers on the device."),
    Figure("largest_bytes", "bytes", "The largest live buffer."),
    Figure("scanned_t", "time", "When the scan ran."),
    Figure("holes", "ratio", "Share of the span of the device's buffer addresses that no live buffer covers."),
)

#: The detail derived from the scans, in ``live_arrays`` when it changed:
#: the largest buffers, the buffer map (address, size) and whether it is whole.
LIVE_ARRAYS_PARTS = ("top", "map", "map_complete", "map_t", "unmapped")

#: One direction (h2d, d2h, d2d) of ``transfers``: implicit transfers the guard logged.
TRANSFER = (
    Figure("count", "count", "Transfers since the previous sample."),
    Figure("bytes_known", "bytes", "Their bytes, where the guard line gave the shape."),
    Figure("count_bytes_unknown", "count", "Transfers since the previous sample whose size is not known."),
    Figure("count_total", "count", "Implicit transfers since start (transfer guard lines).", counter=True),
    Figure("bytes_known_total", "bytes", "Bytes of implicit transfers since start, where the shape was logged.",
           counter=True),
    Figure("count_bytes_unknown_total", "count", "Transfers since start whose size is not known.", counter=True),
)

#: ``process``: the host's view of the program.
PROCESS = (
    Figure("rss_bytes", "bytes", "Resident set size of the process."),
    Figure("vms_bytes", "bytes", "Virtual memory size of the process."),
    Figure("peak_rss_bytes", "bytes", "Largest resident set size so far (the kernel's high-water mark)."),
    Figure("rss_anon_bytes", "bytes", "Anonymous memory of the resident set: heaps, NumPy and CPU-backend arrays."),
    Figure("rss_file_bytes", "bytes", "File-backed pages of the resident set: mapped libraries and files."),
    Figure("rss_shmem_bytes", "bytes", "Shared memory of the resident set (shmem, tmpfs, memfd): a runtime's "
                                       "shared buffers."),
    Figure("cpu_percent", "percent", "CPU use of the process since the previous reading (100 = one core)."),
    Figure("threads", "count", "Threads of the process."),
    Figure("started_t", "time", "When the process started."),
)

#: ``compile``: backend compiles (jax.monitoring).
COMPILE = (
    Figure("count", "count", "Backend compiles since the previous sample."),
    Figure("count_total", "count", "Backend compiles since start.", counter=True),
    Figure("seconds_total", "seconds", "Seconds spent in backend compiles since start.", counter=True),
    Figure("cache_hits_total", "count", "Persistent compilation cache hits since start.", counter=True),
)

#: ``donation``: donated buffers jax could not reuse (its warnings).
DONATION = (
    Figure("failed", "count", "Donations that failed since the previous sample."),
    Figure("failed_total", "count", "Donations that failed since start (jax's 'not usable' warnings).",
           counter=True),
    Figure("last_message", "text", "The last such warning."),
)


def keys(figures: tuple[Figure, ...]) -> tuple[str, ...]:
    """The keys of ``figures``, in order."""
    return tuple(f.key for f in figures)


def figure(figures: tuple[Figure, ...], key: str) -> Figure:
    """The figure of ``figures`` named ``key`` (KeyError: not declared)."""
    for f in figures:
        if f.key == key:
            return f
    raise KeyError(key)
