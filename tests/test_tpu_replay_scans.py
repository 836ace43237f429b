"""The chip's second recording: scans that read the allocator themselves.

``tests/fixtures/tpu/training-loop-scans.jsonl.gz`` was recorded on the TPU
v5e by the agent that reads ``bytes_in_use`` right after each live-array scan
and counts the arrays still computing (the chip tests' training loop, 8
layers of 4096, 40 s). On the chip its in-use figure swung by whole steps
(about 1 GiB each) between samples 0.1 s apart: 3.0 GiB in a sample, 10.1 GiB
at the scan 0.2 s before. Shown side by side as they were, live arrays and
"not in arrays" (of the scan) did not add up to "in use" (of the sample):
"in use 6.09 GiB, live arrays 1.00 GiB, not in arrays 9.8 GiB". These tests
keep that said wherever the two moments differ.

``largest-free-block.json`` is benchmarks/largest_free_block.py on the chip:
the runtime's largest free block is no bound on a request.
"""

from __future__ import annotations

import gzip
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from jaxtop.dashboard.model import Model
from jaxtop.dashboard.snapshot_text import snapshot_text
from jaxtop.widgets.memory_panels import FragmentationPanel, MemoryPanel
from jaxtop.widgets.panels import memory_strip
from jaxtop.widgets.render import fmt_bytes
from jaxtop.wire import protocol

TPU = Path(__file__).parent / "fixtures" / "tpu"
SCANS = TPU / "training-loop-scans.jsonl.gz"
FREE_BLOCK = TPU / "largest-free-block.json"
GiB = 1 << 30


def _records() -> list[dict[str, Any]]:
    with gzip.open(SCANS, "rt") as f:
        return [json.loads(line) for line in f]


def _fed_to(seq: int) -> tuple[Model, dict[str, Any]]:
    """The model fed the recording up to sample ``seq``, and that sample."""
    model = Model(clock=lambda: 0.0)
    for rec in _records():
        model.feed(1, rec)
        if rec.get("type") == "sample" and rec.get("seq") == seq:
            return model, rec
    raise AssertionError(f"no sample {seq}")


def _text(renderable: Any, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def _apart() -> dict[str, Any]:
    """The sample whose in use is furthest below its scan's (read raw)."""
    def gap(rec: dict[str, Any]) -> int:
        dev = rec["devices"][0]
        return dev["live_arrays"].get("in_use_bytes", dev["bytes_in_use"]) - dev["bytes_in_use"]
    samples = [r for r in _records() if r["type"] == "sample" and r["devices"] and r["devices"][0].get("live_arrays")]
    return max(samples, key=gap)


def test_every_scan_on_the_chip_read_the_allocator_and_the_computing_arrays():
    scans = [r["devices"][0]["live_arrays"] for r in _records()
             if r["type"] == "sample" and r["devices"] and r["devices"][0].get("live_arrays")]
    assert len(scans) > 400
    assert all("in_use_bytes" in s for s in scans)
    running = [s for s in scans if s["in_use_bytes"] > 4 * GiB]
    assert running, "the loop never ran ahead"
    # Mid-loop, the parameters are outputs of steps still queued: computing.
    assert max(s.get("not_ready_count") or 0 for s in running) >= 18


def test_the_memory_panel_says_which_moment_its_rows_are_of():
    sample = _apart()
    dev_raw = sample["devices"][0]
    scan = dev_raw["live_arrays"]
    assert scan["in_use_bytes"] - dev_raw["bytes_in_use"] > 5 * GiB  # 10.1 GiB at the scan, 3.0 GiB now
    model, _ = _fed_to(sample["seq"])
    snap = model.snapshot()
    (dev,) = snap.devices
    assert dev.unheld_exact and dev.unheld_bytes == scan["in_use_bytes"] - scan["bytes"]
    assert dev.unheld_bytes > dev.bytes_in_use  # the rows cannot add up without the note
    assert dev.scan_in_use_differs
    for width in (100, 60, 40):
        shown = _text(MemoryPanel().draw(snap, width, 8), width)
        said = re.escape(fmt_bytes(scan["in_use_bytes"]))
        assert re.search(rf"(scan( \S+ ago)?: {said} in use|of the scan( \S+ ago)?,( when)? {said} (was )?in use)", shown), (
            width, shown)
    assert "not in arrays at the scan" in memory_strip(dev).note
    text = snapshot_text(snap)
    assert f"of {fmt_bytes(scan['in_use_bytes'])} in use at the scan" in text, text


def test_when_the_moments_agree_nothing_is_added():
    samples = [r for r in _records() if r["type"] == "sample" and r["devices"]
               and r["devices"][0].get("live_arrays", {}).get("in_use_bytes") == r["devices"][0]["bytes_in_use"]
               and r["devices"][0]["bytes_in_use"] > 4 * GiB]
    assert samples
    model, _ = _fed_to(samples[0]["seq"])
    snap = model.snapshot()
    (dev,) = snap.devices
    assert not dev.scan_in_use_differs
    shown = _text(MemoryPanel().draw(snap, 60, 8), 60)
    assert "scan" not in shown and "not in arrays" in shown, shown


def test_the_largest_free_block_on_tpu_is_shown_as_no_bound():
    measured = json.loads(FREE_BLOCK.read_text())
    # The chip: one buffer larger than the reported block was allocated.
    assert measured["bound"] is False
    assert measured["largest_allocated_bytes"] > measured["reported_largest_free_block_bytes"]
    # The reason names those figures as measured.
    reason = protocol.TPU_FRAGMENTATION_NA
    assert fmt_bytes(measured["largest_allocated_bytes"]).replace(" GiB", "") in reason
    assert fmt_bytes(measured["reported_largest_free_block_bytes"]) in reason
    model, _ = _fed_to(_apart()["seq"])
    snap = model.snapshot()
    shown = _text(FragmentationPanel().draw(snap, 60, 6), 60)
    assert "no bound" in shown and "n/a" in shown, shown


@pytest.mark.parametrize("width", [40, 60])
def test_the_fragmentation_panel_never_shows_a_tpu_figure(width):
    model, _ = _fed_to(_apart()["seq"])
    shown = _text(FragmentationPanel().draw(model.snapshot(), width, 6), width)
    assert "%" not in shown, shown
