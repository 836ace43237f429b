"""Pure layer: the memory map renderable as text — coverage per cell, rows,
overlaps, compressed gaps and regions, and the caption that says what it
places, what it cannot and why (no widget, no app)."""

from __future__ import annotations

import pytest

from rich.cells import cell_len

from test_render import MiB, render
from jaxtop.widgets.render import MemoryMap

def test_memory_map_shades_coverage_per_cell():
    # 1000 bytes over 50 cells: 20 bytes per cell.
    bufs = [(0, 20), (20, 10), (40, 15), (60, 1), (980, 20)]
    lines = render(MemoryMap(bufs, rows=1), 50)
    assert lines[0] == "█▒▓░" + "·" * 45 + "█"
    assert lines[1] == "5 buffers, 66 B used of 1000 B span (93% gaps)"


def test_memory_map_wraps_the_strip_over_rows():
    lines = render(MemoryMap([(0, 100), (300, 100)], width=20, rows=2), 20)
    # 400 bytes over 2 x 20 cells: 10 bytes per cell, row by row.
    assert lines[0] == "█" * 10 + "·" * 10
    assert lines[1] == "·" * 10 + "█" * 10


def test_memory_map_overlaps_and_duplicates_count_once():
    lines = render(MemoryMap([(0, 100), (0, 100), (50, 100)], rows=1), 60)
    assert lines[0] == "█" * 60
    assert lines[1].startswith("2 buffers, 150 B used of 150 B span (0% gaps)")


def test_memory_map_compresses_huge_gaps():
    base = 0x7F00_0000_0000
    bufs = [(base + i * MiB, MiB) for i in range(10)] + [(base + 100 * 10**12 + i * MiB, MiB) for i in range(10)]
    lines = render(MemoryMap(bufs, rows=2), 80)
    strip = lines[0] + lines[1]
    assert strip.count("█") > 0.8 * len(strip)  # not "everything is a gap"
    assert "≈" in strip  # the cut is marked
    # Across the compressed gap the span (90.9 TiB) means nothing: regions do.
    assert lines[2] == "20 buffers, 20.0 MiB used in 2 regions"
    # A narrow caption keeps the regions: they say how to read the strip.
    assert render(MemoryMap(bufs, rows=2), 34)[2] == "20 buffers, 20.0 MiB in 2 regions"
    # Compressed gaps within one region (under 64 MiB each) are said as such.
    small = [(base + i * 16 * MiB, 1024) for i in range(4)]
    assert render(MemoryMap(small, rows=1), 100)[1].endswith(", gaps compressed")


def test_memory_map_cpu_arenas_count_regions_not_span():
    # Buffers from malloc: a heap arena and mmap'd blocks terabytes apart.
    heap, mmapped = 0x5600_0000_0000, 0x7F00_0000_0000
    bufs = [(heap + i * 64, 8) for i in range(3)] + [(mmapped, 256 * 1024), (mmapped + 2**30, 4096)]
    (_, caption) = render(MemoryMap(bufs, rows=1), 100)
    assert caption.startswith("5 buffers, 260 KiB used in 3 regions") and "TiB" not in caption
    # Gaps under 64 MiB are one region: there the span is real and shown.
    near = [(heap + i * MiB, 8) for i in range(4)]
    assert "span" in render(MemoryMap(near, rows=1), 100)[1]


def test_memory_map_does_not_compress_ordinary_gaps():
    lines = render(MemoryMap([(0, MiB), (3 * MiB, MiB)], rows=1), 40)
    assert "compressed" not in lines[1] and "≈" not in lines[0]
    assert lines[0].count("·") == 20


def test_memory_map_empty_and_total_hint():
    assert render(MemoryMap([]), 40) == ["no live buffers"]
    assert render(MemoryMap([(0, 0)]), 40) == ["no live buffers"]
    lines = render(MemoryMap([[4096, 1024]], rows=1, total_hint=5 * MiB), 120)  # JSON gives lists
    # 1 KiB placed of 5 MiB: a strip would draw it as one solid block, as if
    # it were the device's memory; the caption says what is placed instead.
    assert lines[0].startswith("no map: <1% of the bytes have an address")
    assert lines[1] == "1 buffer, placed: 1.00 KiB of 5.00 MiB, span 1.00 KiB (0% gaps)"
    lines = render(MemoryMap([[4096, 1024], [8192, 1024]], rows=1, total_hint=10 * 1024), 120)
    assert lines[0].count("█") > 40  # a fifth placed: the strip is drawn


SEVEN = [(0x7F00_0000_0000 + i * MiB, MiB) for i in range(7)]


def test_memory_map_says_which_buffers_it_places_and_why_not_the_others():
    # 10 live buffers, 3 still being computed: 7 on the map.
    m = MemoryMap(SEVEN, rows=1, count=10, total_hint=10 * MiB, unmapped={"not_ready": 3})
    (_, caption) = render(m, 120)
    assert caption.startswith("7 of 10 buffers placed, 7.00 MiB of 10.0 MiB")
    assert caption.endswith("· 3 buffers still computing, no address yet")
    # Narrow: the bytes go, the placement and the reason stay.
    assert render(m, 40)[1] == "7/10 placed · 3 computing"
    # With two caption lines the reason gets its own.
    assert render(MemoryMap(SEVEN, rows=1, count=10, total_hint=10 * MiB, unmapped={"not_ready": 3}, caption_lines=2), 120)[1:] == [
        "7 of 10 buffers placed, 7.00 MiB of 10.0 MiB, span 7.00 MiB (0% gaps)",
        "3 buffers still computing, no address yet",
    ]


def test_memory_map_buffers_at_their_last_address_are_placed_but_flagged():
    (_, caption) = render(MemoryMap(SEVEN, rows=1, count=7, total_hint=7 * MiB, unmapped={"last_address": 3}), 120)
    assert caption.startswith("7 buffers, 7.00 MiB used of 7.00 MiB span")
    assert caption.endswith("· 3 computing again, drawn at last scan's address")


def test_memory_map_shards_of_sharded_arrays_have_no_address():
    (_, caption) = render(MemoryMap(SEVEN, rows=1, count=15, total_hint=15 * MiB, unmapped={"sharded": 8}), 120)
    assert caption.startswith("7 of 15 buffers placed, 7.00 MiB of 15.0 MiB")
    assert caption.endswith("8 shards of sharded arrays have no address")


def test_memory_map_unexplained_missing_buffers_are_counted():
    # An agent that does not send "unmapped": the gap is still said.
    (_, caption) = render(MemoryMap(SEVEN, rows=1, count=10, total_hint=10 * MiB), 120)
    assert "7 of 10 buffers placed" in caption and caption.endswith("3 without an address")
    # Only the largest buffers listed: that is why, not missing addresses.
    (_, caption) = render(MemoryMap(SEVEN, rows=1, count=5000, total_hint=1 << 30, complete=False), 120)
    assert caption.startswith("largest 7 of 5000 buffers") and "without" not in caption


@pytest.mark.parametrize(("unmapped", "text"), [
    ({"not_ready": 3}, "no buffer addresses yet: 3 buffers still computing"), ({}, "no buffer addresses in this scan (3 buffers live)"),
    ({"sharded": 8}, "no buffer addresses: 8 shards of sharded arrays have no address"),
    ({"not_ready": 1, "sharded": 2}, "no buffer addresses yet: 1 buffer still computing, 2 shards of sharded arrays have no address"),
])
def test_memory_map_without_addresses_never_says_no_live_buffers(unmapped, text):
    count = sum(unmapped.values()) or 3
    assert render(MemoryMap([], count=count, total_hint=8 * MiB, unmapped=unmapped), 120) == [text]
    narrow = render(MemoryMap([], count=count, total_hint=8 * MiB, unmapped=unmapped), 40)
    assert "no live buffers" not in narrow[0] and narrow[0].startswith("no ") and cell_len(narrow[0]) <= 40


def test_memory_map_without_addresses_wraps_over_two_caption_lines():
    lines = render(MemoryMap([], count=8, total_hint=MiB, unmapped={"sharded": 8}, caption_lines=2), 48)
    assert lines == ["no buffer addresses:", "8 shards of sharded arrays have no address"]


