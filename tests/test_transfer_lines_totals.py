"""What a line says beside its count, read through the model: a
direction's bytes never below the sum of its lines' (JAX's log gives no
size for a cached call's copies; the lines do, from the arguments), in the
Transfers panel, ``snapshot``'s text and the chip's recording; and a line
that calls two things saying whose arguments it shows; and a line's rates
never above its direction's, nor their bytes a second below the lines' sum."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from jaxtop.dashboard.model import Model
from jaxtop.dashboard.snapshot_text import snapshot_text
from jaxtop.widgets.transfer_sites import render_transfer_sites
from jaxtop.wire.records import decode
from test_transfer_sites_dashboard import drawn, model_of, stream

def test_a_directions_bytes_are_never_below_the_sum_of_its_lines():
    """The guard log gave 4 KiB for h2d (a cached call logs no shape), the
    lines' arguments say far more: the direction shows the lines' sum, marked
    inferred; d2h, whose lines have no size, keeps the log's figure."""
    snap = model_of(stream()).snapshot(now=0.0)
    (proc,) = snap.processes
    view = proc.transfer_sites
    lines_total = sum(s.bytes_total for s in view.sites if s.direction == "h2d" and s.bytes_total is not None)
    counted = sum(s.count_total for s in view.sites if s.direction == "h2d" and s.bytes_total is not None)
    h2d = proc.transfers["h2d"]
    assert h2d.bytes_known_total == 4096 < lines_total
    assert (h2d.bytes_total, h2d.bytes_total_inferred) == (lines_total, True)
    # The direction's own count rate at the lines' bytes per transfer: count/s
    # and bytes/s of one window.
    assert h2d.bytes_per_s == pytest.approx(h2d.count_per_s * lines_total / counted) and h2d.bytes_per_s_inferred
    d2h = proc.transfers["d2h"]
    assert (d2h.bytes_total, d2h.bytes_total_inferred) == (0, False)
    # Where the log knows more than the lines, the log's figure stays.
    records = stream()
    for rec in records[1:]:
        rec["transfers"]["h2d"]["bytes_known_total"] = 1 << 40
    (proc,) = model_of(records).snapshot(now=0.0).processes
    assert (proc.transfers["h2d"].bytes_total, proc.transfers["h2d"].bytes_total_inferred) == (1 << 40, False)


def test_the_panel_and_snapshot_text_show_the_lines_sum_marked_inferred():
    snap = model_of(stream()).snapshot(now=0.0)
    (proc,) = snap.processes
    h2d = proc.transfers["h2d"]
    from jaxtop.wire.units import fmt_bytes
    shown = "~" + fmt_bytes(h2d.bytes_total)
    assert f"({shown})" in drawn(snap, 99, 19)
    assert f"h2d transfers {h2d.count_total}  bytes >= {shown}" in snapshot_text(snap)


def test_on_the_chips_recording_no_direction_is_below_its_lines():
    """The chip's training loop: JAX's log gave a few KiB of h2d (its
    cached step calls logged no shape), the step's line MiBs."""
    import gzip

    path = Path(__file__).parent / "fixtures" / "tpu" / "transfer-sites.jsonl.gz"
    model = Model(clock=lambda: 0.0)
    with gzip.open(path, "rb") as f:
        model.feed_many(1, [decode(line) for line in f if line.strip()])
    (proc,) = model.snapshot(now=0.0).processes
    for d, t in proc.transfers.items():
        lines = sum(s.bytes_total or 0 for s in proc.transfer_sites.sites if s.direction == d)
        assert t.bytes_total is not None and t.bytes_total >= lines, (d, t, lines)
        assert t.bytes_total >= (t.bytes_known_total or 0)
    assert proc.transfers["h2d"].bytes_total_inferred


def test_arguments_of_another_callee_at_the_line_say_whose_they_are():
    records = stream()
    for rec in records[1:]:
        for site in (rec.get("transfer_sites") or {}).get("sites", ()):
            if site["line"] == 27:
                site["callee"], site["args_of"] = "dynamic_slice (op)", "step"
    (proc,) = model_of(records).snapshot(now=0.0).processes
    (site,) = [s for s in proc.transfer_sites.sites if s.line == 27]
    assert site.args_of == "step"
    assert "args of step: batch['x']" in " ".join(render_transfer_sites(proc.transfer_sites, 160).split())
    assert "(of step)" in drawn(model_of(records).snapshot(now=0.0), 99, 19)


def test_a_line_whose_transfers_were_all_tied_at_once_reads_no_faster_than_its_direction():
    """A TPU recording (tests/fixtures/tpu/transfer-sites.jsonl.gz) whose
    relay reported the loop's 398 transfers only at the final sample: one
    field, one history entry of 398. Over one entry's span the line read
    8.95k/s beside an h2d of 200/s; over the window, as the direction's
    rate is, it reads at most that."""
    with gzip.open(Path(__file__).parent / "fixtures" / "tpu" / "transfer-sites.jsonl.gz") as f:
        records = [json.loads(line) for line in f if b'"exit"' not in line]
    snap = model_of(records).snapshot(now=0.0)
    proc = snap.processes[0]
    line = next(s for s in proc.transfer_sites.sites if s.line == 62)
    h2d = proc.transfers["h2d"].count_per_s
    assert line.count_total == 398 and h2d is not None
    assert line.count_per_s is not None and line.count_per_s <= h2d * 1.01, (line.count_per_s, h2d)
    # Nor its bytes a second above the direction's.
    lines = sum(s.bytes_per_s or 0 for s in proc.transfer_sites.sites if s.direction == "h2d")
    assert proc.transfers["h2d"].bytes_per_s >= lines, (proc.transfers["h2d"].bytes_per_s, lines)
