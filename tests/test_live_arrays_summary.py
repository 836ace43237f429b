"""Pure layer: the live arrays' summary per device (probes/live_arrays.py):
totals, the largest buffers, the address map and the holes among the large
buffers, from ``(device, nbytes, address, dtype, shape)`` rows."""

from __future__ import annotations

import pytest

from jaxtop.probes import buffer_detail
from jaxtop.probes.buffer_detail import summarize_live_arrays


def test_summary_per_device():
    rows = [
        (0, 400, 0x7000, "float32", "[100]"),
        (0, 4000, 0x1000, "float32", "[1000]"),
        (0, 40, 0x9000, "int32", "[10]"),
        (1, 800, 0x2000, "float64", "[100]"),
    ]
    out = summarize_live_arrays(rows)
    assert set(out) == {0, 1}
    d0 = out[0]
    assert (d0["bytes"], d0["count"], d0["largest_bytes"]) == (4440, 3, 4000)
    assert [t["nbytes"] for t in d0["top"]] == [4000, 400, 40]
    assert d0["top"][0] == {"nbytes": 4000, "dtype": "float32", "shape": "[1000]", "ptr": 0x1000}
    assert d0["map"] == [[0x1000, 4000], [0x7000, 400], [0x9000, 40]]  # address order
    assert d0["map_complete"] is True
    assert (out[1]["bytes"], out[1]["count"]) == (800, 1)


def test_summary_top_is_limited_and_pointerless_buffers_are_not_mapped():
    rows = [(0, n, (None if n % 2 else 0x10000 - n), "uint8", f"[{n}]") for n in range(1, 31)]
    out = summarize_live_arrays(rows)[0]
    assert len(out["top"]) == buffer_detail.TOP_BUFFERS
    assert [t["nbytes"] for t in out["top"]] == list(range(30, 30 - buffer_detail.TOP_BUFFERS, -1))
    assert out["count"] == 30 and out["bytes"] == sum(range(1, 31))
    assert all(ptr is not None for ptr, _ in out["map"])
    assert len(out["map"]) == 15
    assert [p for p, _ in out["map"]] == sorted(p for p, _ in out["map"])


def test_summary_map_truncated_keeps_the_largest(monkeypatch):
    monkeypatch.setattr(buffer_detail, "BUFFER_MAP_MAX", 4)
    rows = [(0, n * 10, 0x100 * (20 - n), "float32", "[x]") for n in range(1, 11)]
    out = summarize_live_arrays(rows)[0]
    assert out["map_complete"] is False
    assert sorted(n for _, n in out["map"]) == [70, 80, 90, 100]
    assert [p for p, _ in out["map"]] == sorted(p for p, _ in out["map"])
    assert out["count"] == 10 and out["bytes"] == 550  # accounting is never truncated


def test_summary_of_nothing():
    assert summarize_live_arrays([]) == {}


def test_hole_ratio_counts_gaps_between_neighbours_not_between_regions():
    mib = 1 << 20
    # Three 1 MiB buffers with a 1 MiB hole, then one 64 MiB away (another region).
    spans = [(0x10_0000_0000, mib), (0x10_0000_0000 + 2 * mib, mib), (0x10_0000_0000 + 3 * mib, mib),
             (0x10_0000_0000 + 67 * mib, mib)]
    assert buffer_detail.hole_ratio(spans) == pytest.approx(mib / (mib + 4 * mib))
    assert buffer_detail.hole_ratio(list(reversed(spans))) == buffer_detail.hole_ratio(spans)  # any order
    # Allocator headers and alignment (under 4 KiB) are not holes.
    big = buffer_detail.MIN_HOLE_BUFFER
    assert buffer_detail.hole_ratio([(0, big), (big + 64, big)]) == 0.0
    assert buffer_detail.hole_ratio([(0, big)]) is None and buffer_detail.hole_ratio([]) is None


def test_summary_holes_only_when_every_large_buffer_has_an_address(monkeypatch):
    n = 64 << 10
    placed = [(0, n, 0x100000, "f32", "[16384]"), (0, n, 0x100000 + 3 * n, "f32", "[16384]")]
    out = summarize_live_arrays(placed)[0]
    assert out["holes"] == pytest.approx(2 * n / (2 * n + 2 * n))
    # A small buffer without an address could sit in the "hole": the holes
    # count that much less (a lower bound), never more.
    out = summarize_live_arrays(placed + [(0, 4096, None, "f32", "[1024]")])[0]
    assert out["holes"] == pytest.approx((2 * n - 4096) / (2 * n - 4096 + 2 * n))
    # A large one without an address: its place could be anywhere, no measure.
    assert "holes" not in summarize_live_arrays(placed + [(0, n, None, "f32", "[16384]")])[0]
    monkeypatch.setattr(buffer_detail, "BUFFER_MAP_MAX", 1)  # a map cut short: one large one left out
    assert "holes" not in summarize_live_arrays(placed)[0]
