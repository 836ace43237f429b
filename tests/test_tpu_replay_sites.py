"""Which line made each implicit transfer, as the TPU v5e showed it.

``tests/fixtures/tpu/transfer-sites.jsonl.gz`` is ``jaxtop run --log`` of the
chip tests' training loop (tests/tpu/targets/train.py --steps 200 --width 1024
--layers 4 --batch 256) on the chip; ``transfer-sites-oracle.json`` is
tests/transfer_oracle.py on the same program and arguments there (JAX's own
guard, line by line). Both came from ``tools/tpu/run.sh chip --steps sites``.
Where the Transfers panel once read ``h2d (cached call, shape not logged)
x1739``, the chip's recording names each line; no chip in CI, so these tests
keep what it showed: the counts equal the oracle's, nothing unattributed,
and what a user reads (snapshot text, a budget on the line) says so.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from jaxtop.budgets import WindowState, check, parse_spec
from jaxtop.budgets.reading import Reading
from jaxtop.dashboard.model import Model
from jaxtop.dashboard.snapshot_text import snapshot_text
from jaxtop.wire import protocol

TPU = Path(__file__).parent / "fixtures" / "tpu"
RECORDING = TPU / "transfer-sites.jsonl.gz"
ORACLE = TPU / "transfer-sites-oracle.json"


def _records() -> list[dict]:
    with gzip.open(RECORDING, "rt") as f:
        return [json.loads(line) for line in f]


def _last_field() -> dict:
    return [r["transfer_sites"] for r in _records() if r.get("type") == "sample" and r.get("transfer_sites")][-1]


def test_the_chips_lines_equal_jaxs_own_guard_line_by_line():
    field = _last_field()
    ours = {}
    for site in field["sites"]:
        key = (os.path.basename(site["file"]), site["line"], site["direction"])
        ours[key] = ours.get(key, 0) + site["count_total"]
    oracle = {(r["file"], r["line"], r["direction"]): r["count"] for r in json.loads(ORACLE.read_text())["lines"]}
    assert ours == oracle
    assert field["unattributed"] == {}
    # The step's two NumPy batches, every call, named.
    step = max(field["sites"], key=lambda s: s["count_total"])
    assert (step["line"], step["callee"], step["count_total"]) == (62, "step", 398)
    assert [(a["name"], a["kind"], a["shape"]) for a in step["args"]] == [
        ("x", "NumPy array", "float32[256,1024]"), ("y", "NumPy array", "float32[256,1024]")]
    # The loss read every 10 steps: a device-to-host transfer the chip logs.
    assert ours[("train.py", 65, "d2h")] == 20


def test_the_chips_sites_add_up_to_jaxs_totals():
    last = [r for r in _records() if r.get("type") == "sample"][-1]
    field = _last_field()
    for direction in ("h2d", "d2h", "d2d"):
        assert sum(s["count_total"] for s in field["sites"] if s["direction"] == direction) == \
            last["transfers"][direction]["count_total"]


def test_snapshot_text_names_the_line_not_a_cached_call():
    model = Model(clock=lambda: 0.0)
    with gzip.open(RECORDING, "rb") as f:
        for rec in protocol.iter_records(f):
            model.feed(1, rec)
    text = snapshot_text(model.snapshot())
    assert "train.py:62" in text and "step" in text
    assert "cached call, shape not logged" not in text


def test_a_budget_on_the_chips_line_fails_and_one_on_a_quiet_line_passes():
    fields: dict = {}
    readings = []
    for rec in _records():
        if rec.get("type") == "sample":
            reading = Reading.from_sample(rec, fields)
            fields = reading.fields
            readings.append(reading)
    budget = parse_spec("h2d@train.py:62=0,h2d@train.py:64=0")
    window = WindowState(budget, None, readings[0].t)
    for reading in readings:
        window.observe(reading)
    report = check(budget, window.finish(readings[-1], readings[-1].t), {"name": "the chip's run"})
    assert [(r.limit.name, r.status, r.measured.value) for r in report.results] == [
        ("h2d@train.py:62", "exceeded", 398.0), ("h2d@train.py:64", "ok", 0.0)]
