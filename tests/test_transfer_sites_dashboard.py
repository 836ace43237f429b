"""Which line makes the transfers, on the dashboard side: the model's fold of ``transfer_sites``, the Transfers panel's site
lines at three sizes, Python scalars apart, unattributed transfers apart,
the screen of every site, ``jaxtop snapshot`` text, the
``transfer-sites-csv`` export, escapes in a program's file names; and a
real JAX program under ``jaxtop run --log``.

The synthetic stream (:func:`stream`) has the field's shape as
probes/transfer_sites.py sends it: sent only on ticks where a count grew.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import time
from pathlib import Path

import pytest
from rich.console import Console

from conftest import PY
from jaxtop.dashboard.model import Model
from jaxtop.dashboard.snapshot_text import snapshot_text
from jaxtop.dashboard.transfer_sites import TransferArgView, TransferSitesFold, fold_transfer_sites
from jaxtop.widgets.panels import TransfersPanel
from jaxtop.widgets.transfer_sites import render_transfer_sites
from jaxtop.wire.records import Sample, decode, from_dict

T0 = 1_790_000_000.0
TRAIN = "/home/me/proj/train.py"
DATA = "/home/me/proj/data.py"
EVIL = "/tmp/ev\x1b]0;PWNED-TITLE\x07il\u202e.py"
MiB = 1 << 20

#: (direction, file, line, function, callee, transfers per tick, args, args_seen, scalar)
SITES = [
    ("h2d", TRAIN, 27, "main", "step", 3,
     [{"name": "batch['x']", "kind": "NumPy array", "shape": "float32[512,4096]", "bytes": 8 * MiB},
      {"name": "batch['y']", "kind": "NumPy array", "shape": "int32[512]", "bytes": 2048},
      {"name": "lr", "kind": "Python scalar", "shape": "float[]", "bytes": 4}], "call", False),
    ("h2d", DATA, 88, "load", "sin (op)", 1,
     [{"name": "", "kind": "NumPy array", "shape": "float32[3]", "bytes": 12}], "transfer", False),
    ("h2d", TRAIN, 29, "main", "scale", 2,
     [{"name": "factor", "kind": "Python scalar", "shape": "float[]", "bytes": 4}], "call", True),
    ("h2d", TRAIN, 33, "main", "add (op)", 1,
     [{"name": "", "kind": "Python scalar", "shape": "int[]", "bytes": 4}], "transfer", True),
    ("d2h", TRAIN, 40, "main", "host read (float)", 1, [], None, False),
]


def _site(spec, k, quiet_every):
    direction, file, line, function, callee, per_tick, args, seen, scalar = spec
    ticks = [per_tick if (j % quiet_every) else 0 for j in range(1, k + 1)]
    total = sum(ticks)
    size = sum(a["bytes"] for a in args) // max(1, len(args)) if args else None
    return {"direction": direction, "file": file, "line": line, "function": function, "callee": callee,
            "count_total": total, "count": ticks[-1], "calls_total": total // max(1, len(args) or 1),
            "bytes_total": None if size is None else total * size, "args": args, "args_seen": seen,
            "scalar": scalar, "history": ticks[-30:]}


def stream(n=60, pid=4321, evil=False, unattributed=True, sites=SITES):
    """hello, then a sample every 0.1 s; the field on ticks where a count grew
    (every 5th tick is quiet: no field), unattributed lines from tick 20."""
    records = [{"type": "hello", "t": T0, "protocol": 1, "pid": pid, "argv": ["train.py"], "started_t": T0,
                "versions": {"jax": "0.10.2"}, "backend": "cpu", "devices": [{"id": 0, "platform": "cpu"}],
                "interval_s": 0.1, "slow_interval_s": 1.0, "transfer_capture": {"available": True},
                "nvml": {"available": False, "reason": "no driver"}}]
    specs = list(sites)
    if evil:
        specs.append(("h2d", EVIL, 7, "ev\x1b[2Jil", "st\x9bep", 1,
                      [{"name": "x\x1b[6n", "kind": "NumPy array", "shape": "float32[2]", "bytes": 8}], "call", False))
    for k in range(1, n + 1):
        t = T0 + 0.1 * k
        h2d_total = sum(_site(s, k, 5)["count_total"] for s in specs if s[0] == "h2d")
        rec = {"type": "sample", "t": t, "seq": k,
               "transfers": {"h2d": {"count": 8, "bytes_known": 0, "count_total": h2d_total, "bytes_known_total": 4096},
                             "d2h": {"count": 1, "bytes_known": 0, "count_total": k, "bytes_known_total": 0},
                             "d2d": {"count": 0, "bytes_known": 0, "count_total": 0, "bytes_known_total": 0},
                             "top_shapes": [{"direction": "h2d", "shape": "(cached call, shape not logged)", "count": 1739}]},
               "devices": [{"id": 0, "platform": "cpu", "source": "live_arrays", "bytes_in_use": 64 * MiB,
                            "live_arrays": {"bytes": 64 * MiB, "count": 10, "scanned_t": t}}],
               "process": {"rss_bytes": 300 * MiB, "cpu_percent": 50.0, "threads": 8, "started_t": T0},
               "compile": {"count": 0, "count_total": 3, "seconds_total": 0.4}, "donation": {"failed": 0, "failed_total": 0}}
        if k % 5:
            lost = max(0, k - 20)
            rec["transfer_sites"] = {
                "sites": [_site(s, k, 5) for s in specs], "sites_total": len(specs), "other": None,
                "unattributed": {"h2d": lost} if unattributed and lost else {},
                "unattributed_reasons": {"no jax call returned after it on its thread": lost} if unattributed and lost else {},
                "pending": 0}
        records.append(rec)
    return records


def typed(records) -> list:
    """The records as the decoder makes them (what the fold reads)."""
    return [from_dict(rec) for rec in records]


def model_of(records, pid=4321) -> Model:
    model = Model(clock=lambda: 0.0)
    for rec in records:
        model.feed(pid, rec)
    return model


def drawn(snap, width, height) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(TransfersPanel().draw(snap, width, height))
    return console.export_text()


# -- the model ---------------------------------------------------------------------------------------------------

def test_the_fold_keeps_the_last_field_and_rates_come_from_totals_over_time():
    records = stream()
    view = fold_transfer_sites(typed(records))
    by = {(s.where, s.callee): s for s in view.sites}
    step = by[("train.py:27", "step")]
    # 3 a tick on 4 ticks of 5, 10 ticks a second: 48 in the last 2 s.
    assert step.count_per_s == pytest.approx(24.0)
    assert step.bytes_per_s is not None and not step.bytes_estimated
    assert step.inferred and step.args_text().startswith("~batch['x'] NumPy array float32[512,4096]")
    assert step.main_arg.name == "batch['x']"
    assert not by[("data.py:88", "sin (op)")].inferred
    # The last sample carries no field (tick 60 is quiet): its tick reads 0 in the history.
    assert step.history[-1] == 0 and step.history[-2] == 3
    assert view.unattributed == {"h2d": 39} and view.unattributed_total == 39
    assert view.unattributed_per_s == pytest.approx(20 / 2.0)  # 19 at tick 39, 39 at tick 59


def test_a_site_that_stops_transferring_falls_to_zero_per_second():
    records = stream(n=30)
    for k in range(31, 61):  # samples go on, nothing changes: no field
        records.append({"type": "sample", "t": T0 + 0.1 * k, "seq": k})
    view = model_of(records).snapshot(now=0.0).processes[0].transfer_sites
    assert view is not None and all(s.count_per_s == 0.0 for s in view.sites)
    assert all(v == 0 for v in view.sites[0].history[-20:])


def test_one_field_alone_has_its_rate_from_the_agent_s_per_tick_counts():
    """``jaxtop snapshot`` reads the present only: one sample with the field."""
    records = stream(n=44)
    view = model_of([records[0], records[-1]]).snapshot(now=0.0).processes[0].transfer_sites
    step = next(s for s in view.sites if s.callee == "step")
    assert step.count_per_s == pytest.approx(24.0)  # 16 ticks of 3 in the last 20
    assert step.bytes_estimated and step.bytes_per_s == pytest.approx(24.0 * step.bytes_total / step.count_total)


def test_one_field_alone_reads_its_history_at_the_agents_batch_period():
    """The agent ties lines in batches of ticks: each history entry is that
    many sample intervals, not one (a rate five times too high otherwise)."""
    records = stream(n=44)
    last = records[-1]
    for site in last["transfer_sites"]["sites"]:
        site["history"] = [15] * 30  # 15 transfers per half second
    last["transfer_sites"]["history_ticks"] = 5
    view = model_of([records[0], last]).snapshot(now=0.0).processes[0].transfer_sites
    step = next(s for s in view.sites if s.callee == "step")
    assert step.count_per_s == pytest.approx(30.0)


def test_one_field_alone_reads_its_history_at_the_seconds_the_agent_measured():
    """An agent at its CPU ceiling ticks less often than the hello's interval:
    its batches span the seconds it says (history_s), not 10 intervals."""
    records = stream(n=44)
    last = records[-1]
    for site in last["transfer_sites"]["sites"]:
        site["history"] = [15] * 30
    last["transfer_sites"]["history_ticks"] = 10
    last["transfer_sites"]["history_s"] = 2.5  # ticks 0.25 s apart, not 0.1 s
    view = model_of([records[0], last]).snapshot(now=0.0).processes[0].transfer_sites
    step = next(s for s in view.sites if s.callee == "step")
    assert step.count_per_s == pytest.approx(6.0) and view.history_s == 2.5
    for odd in (float("nan"), -1.0, 1e9, "2.5", True):  # a hostile or broken field: the ticks' period
        last["transfer_sites"]["history_s"] = odd
        view = model_of([records[0], last]).snapshot(now=0.0).processes[0].transfer_sites
        assert view.history_s == pytest.approx(1.0)


def test_a_recording_whose_clock_stands_still_does_not_grow_the_fold():
    from jaxtop.dashboard.transfer_sites import TOTALS_KEPT

    fold = TransferSitesFold()
    records = [r for r in stream(n=40) if r.get("transfer_sites")]
    for k in range(5000):
        rec = dict(records[k % len(records)], t=T0 + 1.0 + (k // 2500) * 1e-9)  # stands, creeps by a nanosecond
        rec["transfer_sites"] = records[-1]["transfer_sites"]
        fold.feed(from_dict(rec))
    assert all(len(state.totals) <= 2 for state in fold._sites.values())
    assert len(fold._unattributed) <= TOTALS_KEPT
    for k in range(3 * TOTALS_KEPT):  # a clock creeping a nanosecond a field: bounded all the same
        rec = dict(records[-1], t=T0 + 2.0 + k * 1e-9)
        fold.feed(from_dict(rec))
    assert max(len(state.totals) for state in fold._sites.values()) <= TOTALS_KEPT


def test_scalars_apart_and_the_summary_names_the_busiest():
    view = fold_transfer_sites(typed(stream()))
    assert [s.callee for s in view.arrays] == ["step", "sin (op)", "host read (float)"]
    assert {s.callee for s in view.scalars} == {"scale", "add (op)"}
    summary = view.scalar_summary()
    # The step line's `lr` beside its NumPy batch is a scalar too: a third
    # of that line's 24 transfers a second.
    assert summary.lines == 3 and summary.busiest.callee == "scale" and summary.names == "factor"
    assert summary.count_per_s == pytest.approx(16.0 + 8.0 + 24.0 / 3)


def test_an_older_agent_sends_no_field_and_the_panel_keeps_its_top_shape():
    records = [r for r in stream(n=20)]
    for r in records:
        r.pop("transfer_sites", None)
    snap = model_of(records).snapshot(now=0.0)
    assert snap.processes[0].transfer_sites is None
    text = drawn(snap, 59, 7)
    assert "top: h2d (cached call, shape not logged) ×1739" in text


def test_a_history_sent_after_the_present_is_folded_in_time_order():
    records = stream(n=40)
    hello, samples = records[0], records[1:]
    present = dict(samples[-2], present=True)  # the newest with a field
    model = Model(clock=lambda: 0.0)
    model.feed(1, dict(hello, history={"present_first": True, "backfill_s": 10}))
    model.feed(1, present)
    for rec in samples[:-2]:
        model.feed(1, dict(rec, type="backfill"))
    model.feed(1, {"type": "history_end", "t": present["t"]})
    view = model.snapshot(now=0.0).processes[0].transfer_sites
    assert view.t == present["t"]
    assert {s.callee: s.count_total for s in view.sites}["step"] == present["transfer_sites"]["sites"][0]["count_total"]
    assert view.sites[0].count_per_s == pytest.approx(24.0, rel=0.2)


def test_a_field_of_the_wrong_shape_reads_n_a_where_it_is_wrong_and_never_raises():
    """The decoder reads each wrong-typed part n/a (noted once), the rest
    as sent; the fold, the report and the snapshot text draw what is left."""
    records = stream(n=12)
    hello, last = records[0], records[-2]  # the 11th tick carries the field
    good = last["transfer_sites"]["sites"][0]
    broken = dict(good, direction=5, line="27", count_total="x", scalar="yes", args_seen="elsewhere",
                  args=[1, {"name": 3, "kind": "NumPy array", "shape": "float32[2]", "bytes": "big"}],
                  history=["a", 1, None, 2])
    cases = [
        ({"sites": "nope", "unattributed": [1]}, ("transfer_sites.sites", "transfer_sites.unattributed")),
        ({"sites": ["str", 3, broken], "unattributed": {"h2d": "many", "d2h": 2}, "unattributed_reasons": [1],
          "other": 5, "pending": {}, "sites_total": "6", "history_ticks": "x", "history_s": [1]},
         ("transfer_sites.sites[0]", "transfer_sites.sites[1]", "transfer_sites.sites[].direction",
          "transfer_sites.sites[].line", "transfer_sites.sites[].count_total", "transfer_sites.sites[].scalar",
          "transfer_sites.sites[].args[0]", "transfer_sites.sites[].args[].name",
          "transfer_sites.sites[].args[].bytes", "transfer_sites.sites[].history[0]",
          "transfer_sites.unattributed.h2d", "transfer_sites.unattributed_reasons",
          "transfer_sites.other", "transfer_sites.pending", "transfer_sites.sites_total",
          "transfer_sites.history_ticks", "transfer_sites.history_s")),
    ]
    for field, odd in cases:
        rec = decode(json.dumps(dict(last, transfer_sites=field)))
        assert sorted(o.where for o in rec.odd) == sorted(odd)
        view = fold_transfer_sites([decode(json.dumps(hello)), rec])
        if not isinstance(field["sites"], list):
            assert view.sites == () and view.unattributed == {} and view.sites_total == 0
            continue
        (site,) = view.sites
        assert (site.direction, site.file, site.line, site.function, site.callee) == ("", TRAIN, 0, "main", "step")
        assert site.count_total == 0 and site.calls_total == good["calls_total"]
        assert site.args == (TransferArgView(name="", kind="NumPy array", shape="float32[2]", bytes=None),)
        assert site.args_seen is None and not site.scalar and site.history == (1, 2)
        assert view.unattributed == {"d2h": 2} and view.unattributed_reasons == {}
        assert view.other_count_total is None and view.pending == 0 and view.sites_total == 1
        assert view.history_s == pytest.approx(0.1)  # neither history_s nor history_ticks: one sample interval
        assert "train.py:0" in render_transfer_sites(view, 100)
        model = Model(clock=lambda: 0.0)
        model.feed(1, decode(json.dumps(hello)))
        model.feed(1, rec)
        assert "transfer sites: 1 line" in snapshot_text(model.snapshot(now=0.0))


def test_a_sample_whose_probe_raised_keeps_the_last_sites_and_says_why():
    """``{"error": ...}`` in place of the field (jaxtop.agent.probe_list) says
    nothing of the lines: the last field's sites stand, and the view says why
    until the next field."""
    records = typed(stream(n=12))
    fold = TransferSitesFold()
    assert not fold.feed(from_dict({"type": "sample", "t": T0, "transfer_sites": {"error": "ValueError: boom"}}))
    assert fold.empty  # nothing to keep yet
    for rec in records[1:-1]:  # to the 11th tick's field
        fold.feed(rec)
    before = fold.view(T0 + 1.15)
    assert before.error is None and before.sites
    failed = from_dict({"type": "sample", "t": T0 + 1.15, "transfer_sites": {"error": "ValueError: boom"}})
    assert failed.odd == () and fold.feed(failed)
    view = fold.view(T0 + 1.15)
    assert view.error == "ValueError: boom" and view.t == before.t
    assert [(s.key, s.count_total) for s in view.sites] == [(s.key, s.count_total) for s in before.sites]
    assert records[-1].transfer_sites is not None and fold.feed(records[-1])  # the 12th tick's field
    assert fold.view(T0 + 1.2).error is None


def test_the_chips_recording_decodes_clean_and_folds_to_its_last_field():
    import gzip

    path = Path(__file__).parent / "fixtures" / "tpu" / "transfer-sites.jsonl.gz"
    with gzip.open(path, "rb") as f:
        lines = [line for line in f if line.strip()]
    records = [decode(line) for line in lines]
    assert not [r.odd for r in records if getattr(r, "odd", ())]
    fields = [json.loads(line)["transfer_sites"] for line in lines if b'"transfer_sites"' in line]
    view = fold_transfer_sites(records)
    assert len(fields) > 1 and len(view.sites) == len(fields[-1]["sites"])
    for site, sent in zip(view.sites, fields[-1]["sites"]):
        assert (site.direction, site.file, site.line, site.function, site.callee) == \
            (sent["direction"], sent["file"], sent["line"], sent["function"], sent["callee"])
        assert (site.count_total, site.calls_total, site.bytes_total) == \
            (sent["count_total"], sent["calls_total"], sent["bytes_total"])
        assert [(a.name, a.kind, a.shape, a.bytes) for a in site.args] == \
            [(a["name"], a["kind"], a["shape"], a["bytes"]) for a in sent["args"]]
        assert site.args_seen == sent["args_seen"] and site.scalar == sent["scalar"]


# -- the panel at three sizes -----------------------------------------------------------------------------------

@pytest.mark.parametrize("width,height", [(39, 7), (59, 12), (99, 19)], ids=["80x24", "120x40", "200x60"])
def test_the_panel_lists_lines_calls_arguments_and_rates(width, height):
    snap = model_of(stream()).snapshot(now=0.0)
    text = drawn(snap, width, height)
    lines = text.rstrip("\n").split("\n")
    assert len(lines) <= height and all(len(line) <= width for line in lines), text
    assert "top: h2d" not in text  # sites replace the most frequent shape
    assert "train.py:27" in text and "step" in text and "~batch['x']" in text
    assert "24/s" in text
    # Python scalars: on one line of their own, never among the array lines.
    scalar = [line for line in lines if "scalars" in line]
    assert len(scalar) == 1 and "factor" in scalar[0] and "32/s" in scalar[0], text
    assert not any("scale " in line and "/s" in line and "scalars" not in line for line in lines)
    if width >= 59:
        assert "~inferred" in text.replace("~ ", "~") and "keep them on the device" in text
        assert "3 lines" in scalar[0]
        # Sized by the calls read: an estimate, never claimed as a lower bound.
        assert "~bytes/s" in text and "bytes/s≥" not in text.split("line")[-1]
    if width >= 99:
        assert "float32[512,4096]" in text and " main " in text


def test_unattributed_are_counted_apart_never_in_a_site():
    snap = model_of(stream()).snapshot(now=0.0)
    for width, height in ((39, 7), (59, 12), (99, 19)):
        text = drawn(snap, width, height)
        tail = [line for line in text.split("\n") if "unattributed" in line]
        assert len(tail) == 1 and "39 unattributed" in tail[0], text
        assert "train.py" not in tail[0]
    # With room for every line the tail says only that; without, what is left out too.
    assert "more" not in drawn(snap, 59, 8)
    assert "+1 more line · 39 unattributed" in drawn(snap, 59, 7)


def test_the_panel_after_the_process_exited_shows_totals_only():
    records = stream() + [{"type": "exit", "t": T0 + 6.1}]
    text = drawn(model_of(records).snapshot(now=0.0), 59, 12)
    assert "exited: totals only" in text
    assert "Python scalars ×" in text and "24/s" not in text


def test_escapes_in_file_function_and_argument_names_are_shown_not_obeyed():
    snap = model_of(stream(evil=True)).snapshot(now=0.0)
    view = snap.processes[0].transfer_sites
    evil = next(s for s in view.sites if s.line == 7)
    assert "\x1b" not in evil.file and "\\x1b]0;PWNED-TITLE\\x07" in evil.file and "\\u202e" in evil.file
    assert evil.function == "ev\\x1b[2Jil" and evil.callee == "st\\x9bep" and evil.args[0].name == "x\\x1b[6n"
    outputs = [drawn(snap, 99, 30), render_transfer_sites(view, 200), snapshot_text(snap)]
    for text in outputs:
        assert "\x1b" not in text and "\x9b" not in text and "\u202e" not in text and "\x07" not in text
    assert "\\x1b]0;PWNED-TITLE" in outputs[1] and "\\x1b]0;PWNED-TITLE" in outputs[2]


# -- the screen of every site, snapshot text, export -------------------------------------------------------------

def test_the_sites_report_lists_every_site_with_history_and_reasons():
    view = fold_transfer_sites(typed(stream()))
    text = render_transfer_sites(view, 160)
    for where in ("train.py:27", "data.py:88", "train.py:29", "train.py:33", "train.py:40"):
        assert where in text
    assert "batch['x'] NumPy array float32[512,4096] 8.00 MiB; batch['y']" in text
    assert "/home/me/proj/train.py:27" in text  # the full path under the figures
    assert "39 transfers not tied to a line (h2d 39)" in text
    assert "no jax call returned after it on its thread" in text
    assert "▁" in text or "█" in text  # the per-tick sparkline
    narrow = render_transfer_sites(view, 78)
    assert all(len(line) <= 78 for line in narrow.split("\n"))
    assert "train.py:40" in narrow and "Python scalars" in narrow
    assert "No transfer sites yet" in render_transfer_sites(None, 80)


def test_snapshot_text_lists_the_top_sites_and_the_unattributed_count():
    text = snapshot_text(model_of(stream()).snapshot(now=0.0))
    assert "transfer sites: 5 lines, 39 unattributed" in text
    assert "train.py:27 in main: step  ~batch['x'] NumPy array float32[512,4096]" in text
    assert ("Python scalars 32/s at 3 lines (factor in scale, train.py:29): keep them on the device (a jnp array "
            "in the step's state)") in text
    assert "unattributed 39 (h2d 39), never guessed:" in text


def test_snapshot_json_carries_the_field():
    from jaxtop.cli.snapshot import to_json

    doc = to_json(model_of(stream()).snapshot(now=0.0).processes)
    sites = doc[0]["transfer_sites"]
    assert sites["unattributed"] == {"h2d": 39}
    assert sites["sites"][0]["file"] == TRAIN and sites["sites"][0]["args"][0]["name"] == "batch['x']"
    json.dumps(doc)


def _csv(path: Path, fast: bool) -> list[dict]:
    from jaxtop import export

    out = io.StringIO()
    export.write_sparse_csv("transfer-sites-csv", str(path), out, fast=fast)
    return list(csv.DictReader(io.StringIO(out.getvalue())))


@pytest.mark.parametrize("fast", [True, False], ids=["typed", "plain"])
def test_export_a_row_per_site_whose_count_grew_and_the_unattributed_totals(tmp_path, fast):
    path = tmp_path / "rec.jsonl"
    records = stream(n=30)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    rows = _csv(path, fast)
    fields = sum(1 for r in records if "transfer_sites" in r)
    sites = [r for r in rows if r["callee"] != "(unattributed)"]
    assert len(sites) == fields * len(SITES)  # every site grows on every tick that carries the field
    first = sites[0]
    assert (first["direction"], first["file"], first["line"], first["function"], first["callee"]) == \
        ("h2d", TRAIN, "27", "main", "step")
    assert first["args"].startswith("batch['x'] NumPy array float32[512,4096] 8388608 B; batch['y']")
    assert first["args_seen"] == "call" and first["scalar"] == "False" and first["pid"] == "4321"
    lost = [r for r in rows if r["callee"] == "(unattributed)"]
    # Ticks 21-29 lost one line each; the quiet 25th sent no field (its line counts at the 26th).
    assert [(r["count"], r["count_total"]) for r in lost] == \
        [("1", "1"), ("1", "2"), ("1", "3"), ("1", "4"), ("2", "6"), ("1", "7"), ("1", "8"), ("1", "9")]
    assert "no jax call returned after it on its thread" in lost[-1]["args"]


def test_export_from_the_command_line(tmp_path):
    path = tmp_path / "rec.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in stream(n=12)))
    done = subprocess.run([PY, "-m", "jaxtop", "export", str(path), "--format", "transfer-sites-csv"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader((tmp_path / "rec.transfer-sites.csv").open()))
    assert {r["callee"] for r in rows} == {s[4] for s in SITES}


# -- the app: the key, help, palette, the screen ------------------------------------------------------------------

async def test_T_opens_the_screen_of_every_site_and_esc_closes_it(tmp_path):
    from textual.widgets import Static

    from jaxtop.dashboard.app import make_app
    from jaxtop.dashboard.sources import ReplaySource
    from jaxtop.dashboard.transfer_sites_screen import TransferSitesScreen

    path = tmp_path / "rec.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in stream(evil=True)))
    src = ReplaySource(str(path), start_playing=False)
    app = make_app(src)
    async with app.run_test(size=(120, 40)) as pilot:
        src.seek(src.replay_state()["t_end"])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (app.snapshot and app.snapshot.processes
                                                   and app.snapshot.processes[0].transfer_sites):
            await pilot.pause(0.05)
        app.refresh_now()
        await pilot.pause(0.1)
        assert app.query_one("#transfers").has_class("-sites")
        assert any(keys == "T" and "Transfer sites" in text for keys, text, _ in app.help_rows())
        assert any("Transfer sites" in str(c.title) for c in app.get_system_commands(app.screen))
        await pilot.press("T")
        await pilot.pause(0.2)
        assert isinstance(app.screen, TransferSitesScreen)
        body = app.screen.query_one("#sites-body", Static)
        console = Console(width=118, record=True, file=io.StringIO(), color_system=None)
        console.print(body.content)
        text = console.export_text()
        for spec in SITES:
            assert f"{Path(spec[1]).name}:{spec[2]}" in text
        assert "\\x1b]0;PWNED-TITLE" in text and "\x1b" not in text
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, TransferSitesScreen)
        await pilot.press("T")
        await pilot.pause(0.1)
        await pilot.press("q")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, TransferSitesScreen)


def test_the_fold_survives_a_replay_checkpoint():
    """A replay index pickles the model's state at checkpoints: the fold is
    one of the classes its unpickler accepts."""
    import pickle

    from jaxtop.dashboard.sources import replay_index

    fold = TransferSitesFold()
    for rec in typed(stream(n=10)):
        if isinstance(rec, Sample):
            fold.feed(rec)
    restored = replay_index._ModelUnpickler(io.BytesIO(pickle.dumps(fold)), None).load()
    assert restored.view(T0 + 1.0).sites[0].count_total == fold.view(T0 + 1.0).sites[0].count_total


# -- a real program ----------------------------------------------------------------------------------------------

PROGRAM = '''\
import time
import numpy as np, jax, jax.numpy as jnp

@jax.jit
def step(w, batch, lr):
    return w - lr * (batch["x"].sum() + batch["y"].sum())

@jax.jit
def scale(w, factor):
    return w * factor

def main():
    w = jnp.ones((4,))
    end = time.time() + 3.0
    while time.time() < end:
        batch = {"x": np.ones((64, 32), np.float32), "y": np.zeros((64,), np.float32)}
        w = step(w, batch, 0.1)  # LINE:step
        w = scale(w, 1.0001)  # LINE:scale
        time.sleep(0.004)

main()
'''


@pytest.mark.slow
def test_a_real_program_under_jaxtop_run_names_its_lines(tmp_path, child_env):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    lines = {tag: n for n, text in enumerate(PROGRAM.splitlines(), 1) for tag in ("step", "scale")
             if f"# LINE:{tag}" in text}
    log = tmp_path / "run.jsonl"
    done = subprocess.run([PY, "-m", "jaxtop", "run", "--log", str(log), str(script)], env=child_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert any("transfer_sites" in r for r in records)
    snap = model_of(records, pid=records[0]["pid"]).snapshot(now=0.0)
    view = snap.processes[0].transfer_sites
    by = {s.line: s for s in view.sites if s.file == str(script)}
    step, scale = by[lines["step"]], by[lines["scale"]]
    assert step.callee == "step" and step.function == "main" and not step.scalar
    assert {"batch['x']", "batch['y']"} <= {a.name for a in step.args}
    assert scale.scalar and scale.callee == "scale"
    text = drawn(snap, 59, 12)
    # The scalars of both lines together: `lr` beside the step's batch too.
    assert f"prog.py:{lines['step']}" in text and "Python scalars" in text and "at 2 lines" in text
    assert "exited: totals only" in text
    rows = list(csv.DictReader(io.StringIO(_csv_text(log))))
    assert any(r["line"] == str(lines["step"]) and r["callee"] == "step" for r in rows)


def _csv_text(path: Path) -> str:
    from jaxtop import export

    out = io.StringIO()
    export.write_sparse_csv("transfer-sites-csv", str(path), out)
    return out.getvalue()


def test_a_steady_sites_rate_reads_the_same_whatever_the_agents_batches_span():
    """At its CPU ceiling the agent samples every 0.12 s and sends the field
    once a batch, 1.2 s apart: a site making 1,700 transfers a second reads
    1,700/s at every moment, and so does its direction over the same window
    (a window holding one batch or two read 1.0k/s and 2.0k/s by turns)."""
    fold, model = TransferSitesFold(), Model(clock=lambda: 0.0)
    model.feed(9, {"type": "hello", "t": T0, "pid": 9, "argv": ["train.py"], "interval_s": 0.1})
    seen, directions = [], []
    for k in range(1, 200):
        t = T0 + 0.12 * k
        rec = {"type": "sample", "t": t, "seq": k,
               "transfers": {"h2d": {"count": 204, "count_total": 204 * k, "bytes_known": 0, "bytes_known_total": 0}}}
        if k % 10 == 0:
            rec["transfer_sites"] = {"sites": [{"direction": "h2d", "file": "train.py", "line": 14, "function": "<module>",
                                                "callee": "step", "count_total": 204 * k, "count": 2040,
                                                "calls_total": 204 * k}],
                                     "history_ticks": 10, "history_s": 1.2, "pending": 0}
        fold.feed(from_dict(rec))
        model.feed(9, rec)
        if k > 40:
            seen.append(fold.view(t).sites[0].count_per_s)
            directions.append(model.snapshot().processes[0].transfers["h2d"].count_per_s)
    assert min(seen) == pytest.approx(1700.0) and max(seen) == pytest.approx(1700.0)
    assert min(directions) == pytest.approx(1700.0) and max(directions) == pytest.approx(1700.0)
