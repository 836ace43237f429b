"""Pure layer: fragmentation where the allocator has no pool (TPU) and the
holes among live buffers' addresses where it has no figure at all (CPU)."""

from __future__ import annotations

import pytest

from jaxtop.probes import live_arrays as live_arrays_module
from jaxtop.probes.jax_memory import fragmentation, normalize_stats

GiB = 1 << 30


def test_holes_are_not_read_among_small_buffers():
    """Five float32 scalars alive on CPU, malloc'd among the program's heap
    objects (measured: 99.9996 % "holes"): no hole figure at all; and small
    buffers between large ones do not fill the large ones' holes."""
    scalars = [(0x5600_0000_0000 + k * 300_000, 4) for k in range(5)]
    assert live_arrays_module.hole_ratio(scalars) is None
    mib = 1 << 20
    spans = [(0x10_0000_0000, mib), (0x10_0000_0000 + 2 * mib, mib), (0x10_0000_0000 + mib + 4096, 16)]
    assert live_arrays_module.hole_ratio(spans) == pytest.approx(0.5 * mib / (0.5 * mib + mib))


#: memory_stats() of a TPU v5e chip (jax 0.10.2), read on one through the
#: device tool: no pool fields; the allocator owns the chip up to bytes_limit.
TPU_V5E = {"num_allocs": 1, "bytes_in_use": 26624, "peak_bytes_in_use": 26624, "largest_alloc_size": 26624,
           "bytes_limit": 16909336064, "bytes_reserved": 0, "peak_bytes_reserved": 0,
           "bytes_reservable_limit": 16909336064, "largest_free_block_bytes": 16909309440}


def test_fragmentation_on_tpu_reads_the_chip_as_the_pool():
    assert fragmentation(normalize_stats(TPU_V5E), "tpu") == (0.0, None)  # all the rest is one block
    split = dict(TPU_V5E, bytes_in_use=GiB, largest_free_block_bytes=(16909336064 - GiB) // 4)
    assert fragmentation(split, "tpu")[0] == pytest.approx(0.75)
    # The same dict from another backend: no pool, no figure.
    assert fragmentation(normalize_stats(TPU_V5E), "gpu")[0] is None
