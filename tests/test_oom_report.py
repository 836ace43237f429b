"""The OOM census as people read it: `jaxtop oom`, the report text, the view at any width and the OOM screen."""

from __future__ import annotations

import copy
import gzip
import io
import json
import re
from pathlib import Path

from rich.console import Console

from jaxtop.dashboard import oom_report
from jaxtop.dashboard.oom_views import OomCensus
from jaxtop.probes import oom
from jaxtop.probes.oom import (
    build_census,
)
from jaxtop.wire.records import decode, from_dict
from jaxtop.widgets.oom import OomCensusView

MiB, GiB = 1 << 20, 1 << 30
TPU = Path(__file__).parent / "fixtures" / "tpu"

#: How a comprehension's frame is named (Python < 3.12 runs it in a frame of its own).


# ---------------------------------------------------------------------------
# The report: `jaxtop oom FILE`
# ---------------------------------------------------------------------------

def sample_census() -> dict:
    """A GPU census with fragmentation, fixed in time and place."""
    t = 1_790_000_000.0
    return {
        "type": "oom_census", "t": t, "version": 1, "id": "4242-1", "pid": 4242, "argv": ["train.py", "--big"],
        "trigger": {"how": "raised", "exception": "jax.errors.JaxRuntimeError", "uncaught": True, "thread": "MainThread",
                    "message": "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1073741824 bytes.",
                    "raised_at": {"file": "/src/train.py", "line": 120, "function": "step", "site": "train.py:120 in step"}},
        "request": {"bytes": 1073741824, "rounded_bytes": 1073741824, "form": "gpu", "device": "gpu:0", "device_id": 0,
                    "allocator": "GPU_0_bfc", "op": "jit(step)/dot_general", "device_ordinal": 0},
        "devices": [
            {"id": 0, "platform": "gpu", "source": "memory_stats", "bytes_in_use": int(76 * GiB),
             "bytes_limit": int(79.1 * GiB), "pool_bytes": int(79.1 * GiB), "largest_free_block_bytes": int(0.4 * GiB),
             "fragmentation": 0.87, "live_array_bytes": int(75 * GiB), "failed": True,
             "verdict": "fragmentation: 3.10 GiB free in the pool but the largest free block is 410 MiB; the request was 1.00 GiB"},
            {"id": 1, "platform": "gpu", "source": "memory_stats", "bytes_in_use": 10 * GiB, "bytes_limit": int(79.1 * GiB),
             "pool_bytes": 12 * GiB, "largest_free_block_bytes": 2 * GiB, "fragmentation": 0.0,
             "live_array_bytes": 10 * GiB, "failed": False, "verdict": "the pool is full: 10.0 of 79.1 GiB in use"},
        ],
        "host": {"rss_bytes": 8 * GiB, "vms_bytes": 90 * GiB, "rlimit_as_bytes": None, "mem_total_bytes": 512 * GiB,
                 "mem_available_bytes": 400 * GiB},
        "verdict": "fragmentation: 3.10 GiB free in the pool but the largest free block is 410 MiB; the request was 1.00 GiB",
        "arrays": {"groups": [
            {"shape": [12, 8192, 8192], "dtype": "float32", "placement": "gpu:0", "count": 12, "bytes": 12 * 3 * GiB,
             "bytes_each": 3 * GiB},
            {"shape": [8192, 8192], "dtype": "bfloat16", "placement": "PartitionSpec('data',) on 2 devices",
             "count": 4, "bytes": 4 * 128 * MiB, "bytes_each": 128 * MiB}],
            "count": 40, "bytes": int(85 * GiB), "groups_total": 5, "shown_bytes": 36 * GiB + 512 * MiB,
            "per_device": {"0": int(75 * GiB), "1": 10 * GiB}, "aliases": 1, "errors": 0, "not_scanned": 0, "complete": True},
        "sites": {"top": [
            {"site": "train.py:88 in prefetch", "file": "/src/train.py", "line": 88, "function": "prefetch",
             "bytes": int(9.4 * GiB), "count": 12, "user": True, "via": None, "stack": ["train.py:88 in prefetch"]},
            {"site": "model.py:40 in init", "file": "/src/model.py", "line": 40, "function": "init", "bytes": 2 * GiB,
             "count": 300, "user": True, "via": "linear.py:12 in param", "stack": []}],
            "bytes": int(85 * GiB), "count": 40, "sites_total": 7, "executable_bytes": 0},
        "timeline": {"t": [t - 9 + i for i in range(10)],
                     "bytes_in_use": {"0": [int((40 + 4 * i) * GiB) for i in range(10)], "1": [10 * GiB] * 10},
                     "live_bytes": {"0": [None] * 10, "1": [None] * 10}, "rss_bytes": [8 * GiB] * 10},
        "allocator_log": {"t": t, "stats": {"bytes_limit": int(79.1 * GiB), "largest_free_block_bytes": int(0.4 * GiB)},
                          "occupancy": "*" * 90 + "x" * 3 + "_" * 7, "lines": []},
        "timing": {"seconds": 0.142, "budget_s": 2.0, "steps": {}, "live_arrays": 40},
        "skipped": [], "errors": [], "complete": True, "path": "/runs/jaxtop-oom-4242-20260922-000000.json",
    }


def view_of(census: dict) -> OomCensus:
    """The OOM screen's view of a census dict, decoded as the dashboard decodes it."""
    return OomCensus.from_wire(from_dict(census))


def test_report_text_names_what_held_the_memory():
    text = oom_report.format_report(from_dict(sample_census()), width=100)
    assert "Out of memory: uncaught jax.errors.JaxRuntimeError in thread MainThread at train.py:120 in step" in text
    assert ("Failed request: 1.00 GiB (1073741824 bytes) on gpu:0 (allocator GPU_0_bfc), op jit(step)/dot_general"
            in text)
    assert "Verdict: fragmentation: 3.10 GiB free in the pool but the largest free block is 410 MiB" in text
    assert "train.py:88 in prefetch: 12 arrays, 9.40 GiB" in text
    assert "model.py:40 in init: 300 arrays, 2.00 GiB (via linear.py:12 in param)" in text
    assert re.search(r"\s12\s+36\.0 GiB\s+3\.00 GiB\s+float32\[12, 8192, 8192\]\s+gpu:0", text)
    assert "… 3 more groups, 48.5 GiB" in text
    assert "gpu:0    ▁▂▃▃▄▅▆▆▇█  40.0 GiB -> 76.0 GiB" in text
    assert "Census took 142.0 ms of a 2.0 s budget; complete" in text


def test_jaxtop_oom_main_reads_a_census_file_and_a_recording(tmp_path, capsys):  # (e)
    census = sample_census()
    path = tmp_path / "jaxtop-oom-4242-20260922-000000.json"
    path.write_text(json.dumps(census, indent=1))
    assert oom_report.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert ("train.py:88 in prefetch: 12 arrays, 9.40 GiB" in out
            and out == oom_report.format_report(from_dict(census), width=100))
    # A gzip recording: the census rides in a sample (an older copy) and as a record (the last copy wins).
    older = dict(census, verdict="older copy")
    lines = [{"type": "hello", "t": 1.0, "pid": 4242}, {"type": "sample", "t": 2.0, "seq": 1, "oom_census": older},
             census, {"type": "exit", "t": 3.0, "pid": 4242}]
    rec = tmp_path / "run.jsonl.gz"
    with gzip.open(rec, "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in lines))
    assert oom_report.main([str(rec), "--all"]) == 0
    out = capsys.readouterr().out
    assert "older copy" not in out and out.count("jaxtop OOM census") == 1
    empty = tmp_path / "none.jsonl"
    empty.write_text(json.dumps({"type": "hello", "t": 1.0}) + "\n")
    assert oom_report.main([str(empty)]) == 1
    junk = tmp_path / "junk.txt"
    junk.write_text("not json at all\n")
    assert oom_report.main([str(junk)]) == 2
    assert oom_report.main([str(tmp_path / "missing.json")]) == 2


def test_the_chips_census_decodes_as_written_and_reads_by_attribute():
    # A census a TPU wrote (tests/fixtures/tpu/README.md): every part has its
    # type, on both of the decoder's paths.
    text = (TPU / "oom-census.json").read_text()
    census = decode(json.dumps(json.loads(text)))
    assert census == from_dict(json.loads(text)) and not census.odd
    assert census.id == "6815-1" and census.trigger.raised_at.site == "oom.py:6 in <module>"
    assert census.request.bytes == 1 << 30 and census.request.device_id == 0
    (dev,) = census.devices
    assert (dev.kind, dev.bytes_limit, dev.failed) == ("TPU v5 lite", 16909336064, True)
    assert census.arrays.groups[0].shape == [268435456] and census.arrays.per_device == {"0": 16106127364}
    assert census.sites.top[0].devices == ["TPU_0(process=0,(0,0,0,0))"] and census.timing.steps["sites"] == 0.001458
    assert census.timeline.last_is_census and len(census.timeline.t) == len(census.timeline.bytes_in_use["0"]) == 21
    # As a sample's field (an older agent's form): the same census.
    sample = decode(json.dumps({"type": "sample", "t": 1.0, "seq": 1, "oom_census": json.loads(text)}))
    assert sample.oom_census == census and not sample.odd


def test_a_census_of_the_wrong_types_reads_na_and_says_which_parts(tmp_path, capsys):
    census = sample_census()
    census["pid"] = "4242"
    census["argv"] = ["train.py", 7]
    census["trigger"]["uncaught"] = "yes"
    census["devices"][0]["bytes_in_use"] = "76 GiB"
    census["devices"].append("gpu:2")
    census["host"] = ["rss", 1]
    census["arrays"]["groups"][0]["count"] = {"n": 12}
    census["timeline"]["t"][3] = "later"
    census["allocator_log"]["stats"]["bytes_limit"] = [1]
    census["skipped"] = [{"part": 3, "reason": "time budget"}]
    rec = from_dict(census)
    assert {o.where for o in rec.odd} == {
        "pid", "argv[1]", "trigger.uncaught", "devices[].bytes_in_use", "devices[2]", "host",
        "arrays.groups[].count", "timeline.t[3]", "allocator_log.stats.bytes_limit", "skipped[].part"}
    assert (rec.pid, rec.argv, rec.trigger.uncaught, rec.host) == (None, ["train.py"], None, None)
    assert rec.devices[0].bytes_in_use is None and len(rec.devices) == 2 and len(rec.timeline.t) == 9
    text = oom_report.format_report(rec, width=100)
    assert text.startswith("jaxtop OOM census · pid ? · ") and "gpu:0     in use n/a of 79.1 GiB" in text
    assert "Out of memory: jax.errors.JaxRuntimeError raised" in text  # not "uncaught": that part is n/a
    assert re.search(r"\s\?\s+36\.0 GiB\s+3\.00 GiB\s+float32\[12, 8192, 8192\]", text)
    assert "Host:" not in text and "skipped: None (time budget)" in text
    assert "Not read: pid is 4242, not a number; argv[1] is 7, not a string;" in text
    console = Console(width=100, record=True, file=io.StringIO(), color_system=None)
    console.print(OomCensusView(OomCensus.from_wire(rec)))
    assert "OUT OF MEMORY · pid ?" in console.export_text()
    # `jaxtop oom` reads the file the same way.
    path = tmp_path / "jaxtop-oom-4242-20260922-000000.json"
    path.write_text(json.dumps(census, indent=1))
    assert oom_report.main([str(path)]) == 0
    assert capsys.readouterr().out == oom_report.format_report(rec, width=100)


def _places(obj, at=()):
    """The path of every part of a census (a list's first two items)."""
    yield at
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _places(value, at + (key,))
    elif isinstance(obj, list):
        for i, value in enumerate(obj[:2]):
            yield from _places(value, at + (i,))


def _replaced(obj, at, value):
    obj = copy.deepcopy(obj)
    part = obj
    for key in at[:-1]:
        part = part[key]
    part[at[-1]] = value
    return obj


def test_any_value_in_any_part_of_a_census_reads_na_and_never_raises():
    # A damaged or forged census (a file someone sends with a bug report, a
    # recording): every part of the wrong type reads n/a; the report, the
    # screen's view and the model take whatever is left.
    from jaxtop.dashboard.model import Model

    hostile = ["\x1b]0;T\x07", {"a": 1}, None, -1, 10**30, [1, "a"], {}, True]
    census, n = sample_census(), 0
    model = Model(clock=lambda: 0.0)
    drawn = io.StringIO()
    console = Console(width=80, file=drawn, color_system=None)
    for at in _places(census):
        if at in ((), ("type",)):
            continue
        for value in hostile:
            line = json.dumps(_replaced(census, at, value))
            rec = decode(line)
            assert isinstance(rec.odd, tuple)
            assert "\x1b" not in oom_report.format_report(rec, width=80) + oom_report.census_json(rec)
            view = OomCensus.from_wire(rec)
            if value is hostile[0]:  # drawing is the slow part: once a place, with text where none belongs
                console.print(OomCensusView(view))
            model.feed(4242, decode(b'{"type":"sample","t":1.0,"seq":1,"oom_census":%s}' % line.encode()))
            model.feed(4242, rec)
            n += 1
    assert n > 1000 and "OUT OF MEMORY" in drawn.getvalue() and "\x1b" not in drawn.getvalue()
    snap = model.snapshot()
    assert snap.processes[0].oom_censuses and not [e.text for e in snap.events if "record skipped" in e.text]


def test_jaxtop_oom_json_prints_the_census_as_read(tmp_path, capsys):
    census = sample_census()
    census["argv"] = ["train.py", "\x1b]0;TITLE\x07"]
    census["newer_field"] = {"from": "a newer agent"}
    path = tmp_path / "census.json"
    path.write_text(json.dumps(census))
    assert oom_report.main([str(path), "--json"]) == 0
    out = capsys.readouterr().out
    printed = json.loads(out)
    assert printed["type"] == "oom_census" and printed["id"] == "4242-1"
    # Every field the census has, as read; one it lacks is null.
    said = [{k: v for k, v in site.items() if v is not None} for site in census["sites"]["top"]]
    assert [{k: v for k, v in site.items() if v is not None} for site in printed["sites"]["top"]] == said
    assert printed["sites"]["top"][0]["devices"] is None and printed["file_error"] is None
    assert printed["argv"] == ["train.py", "\\x1b]0;TITLE\\x07"]  # shown, not obeyed
    assert "newer_field" not in printed and all(k.isascii() and k.isidentifier() for k in printed)
    assert "\x1b" not in out and out.isascii()


def test_the_model_keeps_the_last_copy_of_each_census_from_either_form():
    from jaxtop.dashboard.model import Model

    model = Model(clock=lambda: 0.0)
    census = sample_census()
    first = dict(census, trigger=dict(census["trigger"], uncaught=False))
    model.feed(4242, {"type": "hello", "t": census["t"] - 10, "pid": 4242})
    model.feed(4242, {"type": "sample", "t": census["t"] - 1, "seq": 1, "oom_census": first})
    assert [(c.id, c.trigger.uncaught) for c in model.processes[4242].oom_censuses] == [("4242-1", False)]
    model.feed(4242, dict(census, id="4242-2", verdict="another"))
    model.feed(4242, census)  # the same census again, once its OOM turned out uncaught
    kept = model.processes[4242].oom_censuses
    assert [(c.id, c.trigger.uncaught) for c in kept] == [("4242-2", True), ("4242-1", True)]
    views = model.snapshot().processes[0].oom_censuses
    assert [v.verdict for v in views] == ["another", census["verdict"]] and views[1].record is kept[1]
    assert views[1].allocator_stats == (("bytes_limit", int(79.1 * GiB)), ("largest_free_block_bytes", int(0.4 * GiB)))
    assert views[1].sites[1].record.via == "linear.py:12 in param"


def test_report_and_view_take_a_census_that_failed_half_way(monkeypatch):
    from jaxtop.widgets.oom import OomCensusView

    def broken(*args, **kwargs):
        raise ValueError("boom")

    monkeypatch.setattr(oom.census, "_build_census", broken)
    census = build_census(message="RESOURCE_EXHAUSTED: Out of memory allocating 64 bytes.")
    assert census["errors"] == ["census: ValueError: boom"] and census["request"]["bytes"] == 64
    assert not from_dict(census).odd
    text = oom_report.format_report(from_dict(census))
    assert "Failed request: 64 B (64 bytes)" in text and "Errors: census: ValueError: boom" in text
    console = Console(width=80, record=True, file=io.StringIO(), color_system=None)
    console.print(OomCensusView(view_of(census)))
    assert "OUT OF MEMORY" in console.export_text()


def test_view_renders_at_any_width_without_a_census_too():
    from jaxtop.widgets.oom import NO_CENSUS, OomCensusView

    for width in (60, 100, 200):
        console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
        console.print(OomCensusView(view_of(sample_census()), position=(0, 2)))
        text = console.export_text()
        assert "OUT OF MEMORY" in text and "train.py:88 in prefetch" in text
        assert max(len(line) for line in text.splitlines()) <= width
    console = Console(width=80, record=True, file=io.StringIO(), color_system=None)
    console.print(OomCensusView(None))
    assert " ".join(console.export_text().split()) == NO_CENSUS


# ---------------------------------------------------------------------------
# The OOM screen (f)
# ---------------------------------------------------------------------------

def _screen_app():
    from jaxtop.dashboard.app import make_app
    from jaxtop.dashboard.sources import PushSource

    src = PushSource()
    return src, make_app(src)


async def test_oom_screen_shows_a_pushed_census_and_closes():
    from jaxtop.dashboard.oom_screen import OomScreen

    src, app = _screen_app()
    census = sample_census()
    async with app.run_test(size=(120, 50)) as pilot:
        src.push(4242, {"type": "hello", "t": census["t"] - 10, "pid": 4242, "argv": ["train.py"], "interval_s": 0.1,
                        "backend": "gpu"})
        src.push(4242, census)  # an oom_census record on the stream
        proc = app.model.processes[4242]
        if hasattr(proc, "oom_census"):  # once the model keeps censuses
            assert proc.oom_census["id"] == census["id"]
        older = dict(census, id="4242-0", verdict="the pool is full: 70.0 of 79.1 GiB in use")
        app.push_screen(OomScreen([from_dict(older), from_dict(census)]))
        await pilot.pause(0.1)
        assert isinstance(app.screen, OomScreen)
        shown = _static_text(app.screen)
        assert "train.py:88 in prefetch: 12 arrays, 9.40 GiB" in shown and "census 1 of 2" in shown
        await pilot.press("n")
        assert "70.0 of 79.1 GiB" in _static_text(app.screen) and "census 2 of 2" in _static_text(app.screen)
        await pilot.press("escape")
        await pilot.pause(0.05)
        assert not isinstance(app.screen, OomScreen)


def _static_text(screen) -> str:
    from textual.widgets import Static

    static = screen.query_one("#oom-census", Static)
    console = Console(width=118, record=True, file=io.StringIO(), color_system=None)
    console.print(static.content)
    return console.export_text()


def test_oom_screen_snapshot(snap_compare):
    from jaxtop.dashboard.oom_screen import OomScreen

    src, app = _screen_app()

    async def run_before(pilot):
        src.push(4242, sample_census())
        app.push_screen(OomScreen(from_dict(sample_census())))
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=(110, 46), run_before=run_before)
