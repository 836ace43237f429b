"""Pure layer: fragmentation where the allocator has no pool (TPU) and the
holes among live buffers' addresses where it has no figure at all (CPU)."""

from __future__ import annotations

import pytest

from jaxtop.probes import buffer_detail
from jaxtop.probes.jax_memory import fragmentation, normalize_stats

GiB = 1 << 30


def test_holes_are_not_read_among_small_buffers():
    """Five float32 scalars alive on CPU, malloc'd among the program's heap
    objects (measured: 99.9996 % "holes"): no hole figure at all; and small
    buffers between large ones do not fill the large ones' holes."""
    scalars = [(0x5600_0000_0000 + k * 300_000, 4) for k in range(5)]
    assert buffer_detail.hole_ratio(scalars) is None
    mib = 1 << 20
    spans = [(0x10_0000_0000, mib), (0x10_0000_0000 + 2 * mib, mib), (0x10_0000_0000 + mib + 4096, 16)]
    assert buffer_detail.hole_ratio(spans) == pytest.approx(0.5 * mib / (0.5 * mib + mib))


#: memory_stats() of a TPU v5e chip (jax 0.10.2), read on one through the
#: device tool: no pool fields; the allocator owns the chip up to bytes_limit.
TPU_V5E = {"num_allocs": 1, "bytes_in_use": 26624, "peak_bytes_in_use": 26624, "largest_alloc_size": 26624,
           "bytes_limit": 16909336064, "bytes_reserved": 0, "peak_bytes_reserved": 0,
           "bytes_reservable_limit": 16909336064, "largest_free_block_bytes": 16909309440}


def test_fragmentation_on_tpu_is_not_shown_until_the_largest_free_block_is_known_to_bound_a_request():
    """On the chip the largest free block stayed at 7.19 GiB while in use grew
    from 1.1 to 3.3 GiB (HBM split in two after the first jitted step); 1 -
    largest/free read 45-55 % with 13 GiB free. Then one 14.7 GiB buffer
    was allocated while it reported 9.69 GiB (benchmarks/largest_free_block.py
    on the chip): the block bounds no request, so no percentage, the reason
    instead."""
    split = dict(TPU_V5E, bytes_in_use=GiB, largest_free_block_bytes=(16909336064 - GiB) // 2)
    value, reason = fragmentation(normalize_stats(split), "tpu")
    assert value is None and "no bound" in reason
    # The same dict from another backend: no pool, no figure either.
    assert fragmentation(normalize_stats(TPU_V5E), "gpu")[0] is None


def test_a_tpu_recording_with_the_old_figure_reads_n_a_and_keeps_the_largest_free_block():
    """Recordings made before the rule (the chip's fixtures) say 52 %: the
    dashboard applies today's rule to them, on the panel and the timeline."""
    import gzip
    import io
    from pathlib import Path

    from rich.console import Console

    from jaxtop.dashboard.model import DEVICE_SERIES, Model
    from jaxtop.widgets.panels import FragmentationPanel
    from jaxtop.wire import protocol

    model = Model(clock=lambda: 0.0)
    with gzip.open(Path(__file__).parent / "fixtures" / "tpu" / "training-loop.jsonl.gz", "rb") as f:
        for rec in protocol.iter_records(f):
            model.feed(1, rec)
    dev = model.snapshot(now=0.0, window_s=None).device
    assert dev.fragmentation is None and "no bound" in dev.fragmentation_reason
    t, _, hi = dev.timeline.series(DEVICE_SERIES.index("fragmentation"))
    assert len(t) and all(v != v for v in hi)  # NaN: not drawn
    console = Console(width=60, record=True, file=io.StringIO(), color_system=None)
    console.print(FragmentationPanel().draw(model.snapshot(now=0.0), 60, 4))
    text = console.export_text()
    assert "largest free block" in text and "n/a" in text and "%" not in text, text


