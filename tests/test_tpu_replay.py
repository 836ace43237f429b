"""What a TPU v5e showed, replayed where there is no chip.

The recordings in ``tests/fixtures/tpu/`` were made by jaxtop on one TPU v5e
chip (15.7 GiB HBM, jax 0.10.2, libtpu 0.0.42.1; their README says how).
No TPU is lent to CI, so these tests keep what the chip showed: each fixture
goes through the code a user's command runs (the dashboard's model and
screens, ``jaxtop export``, ``jaxtop oom``, a budget, ``jaxtop snapshot``'s
text) and the figures a user would check are asserted, read from the
recording where they can be and named here where they are the chip's
headline numbers (docs/accelerators.md quotes the same ones).

The screens' SVG snapshots are in tests/test_tpu_replay_snapshots.py.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import os
import re
import socket
import threading
import time
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from textual.widgets import Static

from jaxtop import budgets
from jaxtop.cli import main as jaxtop_main
from jaxtop.cli import snapshot as snapshot_cli
from jaxtop.dashboard.snapshot_text import snapshot_text
from jaxtop.dashboard.app import HelpScreen, ProfileScreen, make_app
from jaxtop.dashboard.holders_screen import HoldersScreen
from jaxtop.dashboard.jit_screen import JitScreen
from jaxtop.dashboard.model import DEVICE_SERIES, Model
from jaxtop.dashboard.oom_screen import OomScreen
from jaxtop.dashboard.sources import PushSource, ReplaySource
from jaxtop.dashboard.views import DeviceView, ProcessView, Snapshot
from jaxtop.wire import protocol

TPU = Path(__file__).parent / "fixtures" / "tpu"
TRAINING = TPU / "training-loop.jsonl.gz"
STALL = TPU / "training-loop-stall.jsonl.gz"
CENSUS = TPU / "oom-census.json"
SNAPSHOT = TPU / "snapshot.json"

GiB, MiB = 1 << 30, 1 << 20
#: memory_stats()["bytes_limit"] of a v5e chip, as libtpu reported it.
BYTES_LIMIT = 16_909_336_064
#: The highest bytes in use of the training loop: 12.57 GiB, async dispatch
#: running ahead of a program whose live arrays held 2.2-3.4 GiB.
PEAK = 13_498_113_024


def records(path: Path) -> list[dict[str, Any]]:
    """Every record of a recording, read with nothing of jaxtop's: the
    figures the tests expect come from here, not from the code under test."""
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def samples(path: Path) -> list[dict[str, Any]]:
    return [r for r in records(path) if r["type"] == "sample"]


def device_samples(path: Path) -> list[tuple[float, dict[str, Any]]]:
    """(time, the one device's record) of every sample that has a device."""
    return [(r["t"], r["devices"][0]) for r in samples(path) if r["devices"]]


def replayed(path: Path, at: float | None = None, window_s: float | None = None) -> tuple[ReplaySource, Snapshot]:
    """The dashboard's model of ``path`` sought to ``at`` seconds into the
    recording (its end when None), as ``jaxtop replay`` builds it."""
    src = ReplaySource(str(path), start_playing=False)
    src.start(Model(), lambda: None)
    state = src.replay_state()
    src.seek(state["t_end"] if at is None else state["t_start"] + at)
    return src, src.model.snapshot(window_s=window_s)


def series(view: Any, names: tuple[str, ...], name: str, hi: bool = True):
    """Times and one column (per-row max, or min) of a snapshot's timeline window."""
    import numpy as np

    column = (view.hi if hi else view.lo)[:, names.index(name)]
    keep = np.isfinite(column)
    return view.t[keep], column[keep]


def text(renderable: Any, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


# -- the dashboard's model ---------------------------------------------------------------------------

def test_the_model_reads_the_training_loop_as_the_chip_showed_it():
    src, snap = replayed(TRAINING)
    try:
        # Nothing in the recording was odd to the model: no notice, no error event.
        assert snap.notices == ()
        assert [e.text for e in snap.events if e.kind == "error"] == []
        (proc,) = snap.processes
        (dev,) = snap.devices
        last = samples(TRAINING)[-1]
        assert (proc.backend, proc.jax_version, proc.seq) == ("tpu", "0.10.2", last["seq"])
        assert (dev.label, dev.source) == ("tpu:0", "memory_stats")
        assert dev.bytes_limit == BYTES_LIMIT
        # TPU reports no allocator pool (no pool_bytes key): n/a, not 0.
        assert dev.pool_bytes is None and dev.cached_unused_bytes is None
        assert dev.peak_bytes_in_use == PEAK
        assert 12.5 * GiB < PEAK < 12.6 * GiB
        assert dev.bytes_in_use == last["devices"][0]["bytes_in_use"]
        assert dev.live_bytes == last["devices"][0]["live_arrays"]["bytes"]
        assert 2.2 * GiB < dev.live_bytes < 2.3 * GiB and dev.live_count == 168
        # The allocator's fragmentation as the agent recorded it, or n/a with
        # the reason where the dashboard does not trust it on TPU (the
        # largest free block is about half the free HBM after the first jitted
        # step): never 0, never a figure of its own.
        if dev.fragmentation is not None:
            assert dev.fragmentation == pytest.approx(last["devices"][0]["fragmentation"])
        else:
            assert "TPU" in (dev.fragmentation_reason or ""), dev.fragmentation_reason
        assert dev.largest_free_block_bytes == last["devices"][0]["largest_free_block_bytes"]
        assert proc.transfers["h2d"].count_total == 4345  # what JAX's guard log counted on the chip, 2 a step
        assert proc.transfers["d2h"].count_total == 201  # the loss read every 10 steps: logged on TPU
        assert proc.compile.count_total == 309
        assert any(e.text == "JAX backend ready: tpu, 1 device(s)" for e in snap.events)
        # The whole run's timelines keep the peak and the live arrays' range.
        _, in_use = series(dev.timeline, DEVICE_SERIES, "bytes_in_use")
        _, live = series(dev.timeline, DEVICE_SERIES, "live_bytes")
        assert in_use.max() == pytest.approx(PEAK, rel=1e-6)
        assert 3.3 * GiB < live.max() < 3.4 * GiB
    finally:
        src.stop()


def test_in_use_runs_ahead_of_the_live_arrays():
    # Async dispatch: the host queues steps ahead of the chip, and the
    # buffers of the queued steps are allocated before any Python object
    # holds them. Once the loop runs (38 s on), in use reaches 10-12 GiB
    # while the live arrays stay at 2.24 GiB. The dashboard must show both
    # as they are: neither layer is clipped to the other.
    src, snap = replayed(TRAINING)
    try:
        (dev,) = snap.devices
        t0 = records(TRAINING)[0]["t"]
        t, in_use = series(dev.timeline, DEVICE_SERIES, "bytes_in_use")
        tl, live = series(dev.timeline, DEVICE_SERIES, "live_bytes")
        steady = t > t0 + 38.5
        assert in_use[steady].max() == pytest.approx(PEAK, rel=1e-6)  # the peak is run-ahead too
        assert (in_use[steady] > 10 * GiB).sum() >= 10  # and so are many samples, not one
        assert 2.2 * GiB < live[tl > t0 + 38.5].min() and live[tl > t0 + 38.5].max() < 3.2 * GiB
        raw = [(d["bytes_in_use"], d["live_arrays"]["bytes"]) for t_, d in device_samples(TRAINING) if t_ > t0 + 38.5]
        assert max(u / v for u, v in raw) > 4  # more than 4x the live arrays at times
        assert min(u for u, _ in raw) > max(v for _, v in raw if v < 3 * GiB)  # in use is never below them
    finally:
        src.stop()


def test_the_seconds_while_the_chip_opens_are_a_gap_not_zeros():
    # jax.devices() takes ~9 s to open the chip: the agent is up but no
    # device exists yet, and the recording has no sample from 1 s to 9.8 s.
    t0 = records(TRAINING)[0]["t"]
    opened = next(r["t"] for r in records(TRAINING) if r["type"] == "backend") - t0
    assert 9 < opened < 11
    src, snap = replayed(TRAINING, at=5.0)
    try:
        assert snap.devices == () and snap.processes[0].backend is None
        assert snap.processes[0].capture.note == "waiting for jax to be imported"
    finally:
        src.stop()
    src, snap = replayed(TRAINING)
    try:
        t = snap.processes[0].history.t
        assert not ((t > t0 + 1.1) & (t < t0 + opened - 0.1)).any()  # no rows made up for the gap
        (dev,) = snap.devices
        td, in_use = series(dev.timeline, DEVICE_SERIES, "bytes_in_use", hi=False)
        assert in_use[0] == 26_624  # a fresh process holds 26 KiB on the chip
        assert not ((td > t0 + 1.1) & (td < t0 + opened - 0.1)).any()
    finally:
        src.stop()


def test_a_stalled_live_array_scan_shows_its_age():
    # While clients attached on the chip, the agent's live-array scan stopped
    # (the last one 25.9 s in) while bytes in use kept moving: the dashboard
    # must say how old the live arrays are, and catch up at the final scan.
    t0 = records(STALL)[0]["t"]
    scans = sorted({d["live_arrays"]["scanned_t"] - t0 for _, d in device_samples(STALL)})
    assert 25 < scans[-2] < 27 and scans[-1] > 62
    src, snap = replayed(STALL, at=50.0)
    try:
        (dev,) = snap.devices
        assert dev.live_age_s == pytest.approx(50.0 - scans[-2], abs=0.6)
        assert dev.live_bytes == 2_235_113_008 and dev.bytes_in_use > 3 * dev.live_bytes
    finally:
        src.stop()
    src, snap = replayed(STALL)
    try:
        (dev,) = snap.devices
        assert dev.live_age_s < 1.0 and dev.live_bytes == 2_400_467_772
    finally:
        src.stop()


def test_allocs_per_second_are_not_read_from_a_count_that_falls():
    """On TPU memory_stats()['num_allocs'] is the number of live allocations
    (it falls 110 times in this recording), not a running total as on GPU:
    its rises read up to 2,057 'allocs/s', then 0 whenever it fell."""
    falls = sum(b["num_allocs"] < a["num_allocs"] for (_, a), (_, b) in zip(device_samples(TRAINING),
                                                                           device_samples(TRAINING)[1:]))
    assert falls > 100  # a count of live allocations: it is not a running total
    src, snap = replayed(TRAINING)
    try:
        (dev,) = snap.devices
        _, rate = series(dev.timeline, DEVICE_SERIES, "allocs_per_s")
        assert dev.allocs_per_s is None and dev.allocs_reason, "a rate from a live count"
        assert len(rate) == 0
    finally:
        src.stop()


# -- every screen of the app on the recording ---------------------------------------------------------

def widget_text(widget: Any, width: int) -> str:
    content = widget.content if isinstance(widget, Static) else widget.render()
    return text(content, width)


async def open_replay(pilot: Any, app: Any, src: ReplaySource) -> None:
    src.seek(src.replay_state()["t_end"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        await pilot.pause(0.05)
        if app.snapshot is not None and app.snapshot.processes and app.snapshot.processes[0].seq:
            break
    app.refresh_now()
    await pilot.pause(0.05)


@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_every_screen_reads_the_recording(size, utc):
    width = size[0]
    src = ReplaySource(str(TRAINING), start_playing=False)
    app = make_app(src)
    async with app.run_test(size=size) as pilot:
        await open_replay(pilot, app, src)

        def shown(selector: str) -> str:
            widget = app.query_one(selector)
            return widget_text(widget, max(20, widget.size.width))

        header = shown("#header")
        assert "tpu · jax 0.10.2" in header and "device tpu:0 (1/1)" in header and "replay" in header
        memory = shown("#memory")
        assert "2.26 GiB" in memory and "2.24 GiB" in memory and "limit 15.7 GiB" in memory
        frag = shown("#frag")
        assert "6.88 GiB" in frag and "largest free" in frag
        # n/a in one line with the runtime's figure; the reason in full on the
        # timeline's one line for it (no chart of a figure that is no bound).
        assert frag.count("\n") <= 2 and "n/a" in frag
        assert "fragmentation n/a — not shown on TPU" in " ".join(shown("#timeline").split())
        assert "168 buffers" in shown("#map") and "float32[4096, 4096]" in shown("#map")
        assert "12.6 GiB" in shown("#timeline")  # the peak heads the memory strip
        transfers = shown("#transfers")
        assert "4345 (32.0 MiB)" in transfers and "201 (804 B)" in transfers
        assert "process exited" in shown("#events")

        async def open_screen(key: str, kind: type, selector: str) -> str:
            await pilot.press(key)
            deadline = time.monotonic() + 5
            while not isinstance(app.screen, kind) and time.monotonic() < deadline:
                await pilot.pause(0.05)
            assert isinstance(app.screen, kind), f"{key} did not open {kind.__name__}"
            screen = app.screen
            if isinstance(screen, HoldersScreen):
                screen.refresh_view()
            await pilot.pause(0.1)
            out = widget_text(screen.query_one(selector), width - 2)
            await pilot.press("escape")
            await pilot.pause(0.05)
            assert not isinstance(app.screen, kind)
            return out

        jit = await open_screen("J", JitScreen, "#jit-text")
        assert "live executables 309" in jit and "jit_step" in jit and "51.4 MiB" in jit
        holders = await open_screen("H", HoldersScreen, "#holders-body")
        assert "train.py:33" in holders and "1.24 GiB" in holders and "201 reads of device arrays" in holders
        oom = await open_screen("O", OomScreen, "#oom-census")
        assert "No out-of-memory census yet" in oom  # this run never ran out
        profile = await open_screen("p", ProfileScreen, "#profile-text")
        assert "No memory profile yet" in profile  # a replay cannot take one
        helptext = await open_screen("question_mark", HelpScreen, "#help-text")
        assert "Jit ledger" in helptext and "Replay: seek back 10 s" in helptext

        await pilot.press("o")
        await pilot.pause(0.1)
        assert app.query_one("#overview").display
        overview = shown("#overview")
        assert "tpu:0" in overview and "2.26 GiB" in overview and "15.7 GiB" in overview


async def test_the_oom_screen_shows_the_chips_census():
    census = json.loads(CENSUS.read_text())
    src = PushSource()
    app = make_app(src)
    async with app.run_test(size=(120, 46)) as pilot:
        src.push(census["pid"], census)  # as the agent sends it: an oom_census record
        await pilot.pause(0.1)
        assert [c.id for c in app.model.processes[census["pid"]].oom_censuses] == ["6815-1"]
        app.push_screen(OomScreen(app.model.processes[census["pid"]].oom_censuses))
        await pilot.pause(0.1)
        shown = widget_text(app.screen.query_one("#oom-census"), 118)
    assert "Failed request: 1.00 GiB (1073741824 bytes) on tpu:0" in shown
    assert "the request of 1.00 GiB needed 258 MiB more" in shown
    assert "15.0 GiB   15.7 GiB" in shown and "766 MiB" in shown  # in use, limit, largest free block
    assert "oom.py:6 in <module>: 16 arrays, 15.0 GiB" in shown


# -- jaxtop export, every format -------------------------------------------------------------------------

def export(tmp_path: Path, recording: Path, fmt: str) -> str:
    out = tmp_path / f"{recording.name}.{fmt}"
    assert jaxtop_main(["export", str(recording), "--format", fmt, "-o", str(out), "-j", "1"]) == 0
    return out.read_text()


def csv_rows(data: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(data)))


@pytest.mark.parametrize("recording", [TRAINING, STALL], ids=["training-loop", "stall"])
def test_export_csv_has_a_row_per_sample_with_the_chips_figures(tmp_path, recording):
    rows = csv_rows(export(tmp_path, recording, "csv"))
    raw = samples(recording)
    assert len(rows) == len(raw)  # one device: a row per sample (before the chip opened, an empty device)
    tpu = [r for r in rows if r["platform"] == "tpu"]
    assert len(tpu) == len(device_samples(recording)) and {r["source"] for r in tpu} == {"memory_stats"}
    assert {int(r["bytes_limit"]) for r in tpu} == {BYTES_LIMIT}
    assert max(int(r["bytes_in_use"]) for r in tpu) == max(d["bytes_in_use"] for _, d in device_samples(recording))
    assert max(int(r["peak_bytes_in_use"]) for r in tpu) == PEAK
    assert {r["pool_bytes"] for r in tpu} == {""}  # n/a, not 0
    assert int(rows[-1]["h2d_count_total"]) == raw[-1]["transfers"]["h2d"]["count_total"]
    assert int(rows[-1]["compiles_total"]) == raw[-1]["compile"]["count_total"]
    assert max(int(r["live_array_bytes"]) for r in tpu) == max(d["live_arrays"]["bytes"] for _, d in device_samples(recording))


def test_export_perfetto_has_the_memory_track_and_its_peak(tmp_path):
    trace = json.loads(export(tmp_path, TRAINING, "perfetto"))
    events = trace["traceEvents"]
    memory = [e for e in events if e["ph"] == "C" and e["name"] == "device 0 memory (bytes)"]
    assert len(memory) == len(device_samples(TRAINING))
    assert max(e["args"]["bytes_in_use"] for e in memory) == PEAK
    assert {e["args"]["bytes_limit"] for e in memory} == {BYTES_LIMIT}
    # Counter times are the samples' own, in microseconds: the 9 s while the chip opened stay empty.
    ts = sorted(e["ts"] for e in memory)
    assert max(b - a for a, b in zip(ts, ts[1:])) > 8e6
    compiles = sum(int(e["name"].split("×")[1]) for e in events if e["ph"] == "i" and e["name"].startswith("compile"))
    assert compiles == 309
    assert any(e["ph"] == "i" and e["name"] == "process exited" for e in events)


def test_export_holders_csv_has_each_profiles_sites(tmp_path):
    rows = csv_rows(export(tmp_path, TRAINING, "holders-csv"))
    last = max(int(r["profile_seq"]) for r in rows)
    sites = {r["site"]: (int(r["bytes"]), int(r["count"])) for r in rows if int(r["profile_seq"]) == last}
    # The last profile: the odd-sized burst, the 1 GiB of parameters and momentum, the PRNG key.
    assert sites == {"train.py:33": (1_327_034_368, 150), "train.py:27": (1_073_742_336, 17), "train.py:8": (512, 1)}


def test_export_labels_csv_is_a_header_when_nothing_was_labelled(tmp_path):
    # The program called no jaxtop.label(): the file says so by having no row,
    # and still has its columns (a spreadsheet or script reads it the same).
    data = export(tmp_path, TRAINING, "labels-csv")
    assert data.splitlines() == ["t,pid,name,bytes,arrays,alive,leaves,labelled_t"]


def test_export_host_syncs_csv_counts_the_loss_reads(tmp_path):
    rows = csv_rows(export(tmp_path, TRAINING, "host-syncs-csv"))
    assert {r["site"] for r in rows} == {"train.py:30"}  # float(loss), every 10 steps
    last = rows[-1]
    assert (int(last["count"]), last["kinds"]) == (201, "float=201")
    counts = [int(r["count"]) for r in rows]
    assert counts == sorted(counts)  # a running total


# -- jaxtop oom -------------------------------------------------------------------------------------------

def test_jaxtop_oom_prints_the_failed_request_and_the_shortfall(capsys):
    assert jaxtop_main(["oom", str(CENSUS)]) == 0
    out = capsys.readouterr().out
    assert "Failed request: 1.00 GiB (1073741824 bytes) on tpu:0" in out
    assert "Verdict: the pool is full: 15.0 of 15.7 GiB in use; the request of 1.00 GiB needed 258 MiB more" in out
    assert "RESOURCE_EXHAUSTED: E0100: RuntimeBufferAllocationFailure:" in out
    assert re.search(r"^ +15 +15\.0 GiB +1\.00 GiB +float32\[268435456\] +tpu:0", out, re.M)  # 15 arrays of 1 GiB
    assert "Census took 9.1 ms of a 2.0 s budget; complete" in out
    # The shortfall is the request less the largest free block libtpu named.
    census = json.loads(CENSUS.read_text())
    assert "There are 765.93M free." in census["trigger"]["message"]
    assert 1.0 * GiB - 765.93 * MiB == pytest.approx(258 * MiB, abs=1 * MiB)


# -- budgets ----------------------------------------------------------------------------------------------

def check_budget(recording: Path, spec: str) -> Any:
    """``spec`` checked against the whole recording, as ``jaxtop run --budget``
    checks it against a run: one window from the agent's start (no reading
    before it), every sample observed, the last one closing the window."""
    recs = records(recording)
    hello, raw = recs[0], [r for r in recs if r["type"] == "sample"]
    budget = budgets.parse_spec(spec)
    state = budgets.WindowState(budget, None, start_t=hello["t"])
    for rec in raw[:-1]:
        state.observe(budgets.Reading.from_sample(rec))
    measured = state.finish(budgets.Reading.from_sample(raw[-1]), end_t=raw[-1]["t"])
    return budgets.check(budget, measured, {"what": "the recording", "seconds": raw[-1]["t"] - hello["t"]})


def result(report: Any, name: str) -> Any:
    (r,) = [r for r in report.results if r.limit.name == name]
    return r


def test_budgets_pass_on_the_recording_within_its_figures():
    report = check_budget(TRAINING, "peak=13GiB,in_use=3GiB,h2d=5000,d2h=300,compiles=400,peak_rss=16GiB")
    assert report.ok and not report.unchecked, report.text()
    assert result(report, "peak").measured.value == PEAK  # the allocator's own peak on TPU
    assert result(report, "in_use").measured.value == samples(TRAINING)[-1]["devices"][0]["bytes_in_use"]
    assert result(report, "h2d").measured.value == 4345


def test_budgets_fail_on_the_recording_when_they_should_and_say_when():
    t0 = records(TRAINING)[0]["t"]
    first_over_12 = next(t for t, d in device_samples(TRAINING) if d["peak_bytes_in_use"] > 12 * GiB) - t0
    first_over_11 = next(t for t, d in device_samples(TRAINING) if d["peak_bytes_in_use"] > 11 * GiB) - t0
    assert 37 < first_over_12 < 39 and 17 < first_over_11 < 19  # the run-ahead peaks: 11.3 GiB, then 12.6 GiB
    report = check_budget(TRAINING, "peak=12GiB,h2d=4000,in_use=2GiB,host_syncs=100")
    assert [r.limit.name for r in report.exceeded] == ["peak", "h2d", "in_use", "host_syncs"]
    assert result(report, "peak").measured.first_exceeded_s == pytest.approx(first_over_12, abs=1e-6)
    assert result(report, "host_syncs").measured.value == 201
    assert "peak        12.6 GiB > 12.0 GiB" in report.text()
    report = check_budget(TRAINING, "peak=11GiB")
    assert result(report, "peak").measured.first_exceeded_s == pytest.approx(first_over_11, abs=1e-6)


# -- jaxtop snapshot ----------------------------------------------------------------------------------------

def _rebuild(cls: type, data: dict[str, Any]) -> Any:
    """A view dataclass from its ``jaxtop snapshot --json`` form: the JSON
    the chip printed, made into the objects its text printer reads. Fields
    the JSON leaves out (drawing data, and fields added since it was made)
    are None or their default."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kwargs[f.name] = _value(hints[f.name], data[f.name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = None
    return cls(**kwargs)


def _value(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        hint = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _rebuild(hint, value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], v) for v in value)
        return tuple(_value(a, v) for a, v in zip(args, value)) if args else tuple(value)
    if origin is dict and args:
        return {k: _value(args[1], v) for k, v in value.items()}
    return value


def chip_snapshot(**process_changes: Any) -> Snapshot:
    doc = json.loads(SNAPSHOT.read_text())
    procs = tuple(_rebuild(ProcessView, dict(p, **process_changes)) for p in doc["processes"])
    devices = tuple(_rebuild(DeviceView, d) for d in doc["devices"])
    return Snapshot(t=doc["t"], processes=procs, devices=devices, selected=0, window_s=None, events=())


def test_the_chips_snapshot_json_prints_as_text():
    snap = chip_snapshot()
    # The rebuild is faithful: the views give back the JSON the chip printed.
    doc = json.loads(SNAPSHOT.read_text())
    assert snapshot_cli.to_json(snap.devices[0])["bytes_limit"] == doc["devices"][0]["bytes_limit"] == BYTES_LIMIT
    out = snapshot_text(snap)
    assert "pid 2047  acceptance/tpu/train.py 45" in out
    assert "backend tpu  jax 0.10.2  state live  seq 147" in out
    assert "h2d transfers 168  bytes >= 32.0 MiB" in out and "compiles 93" in out
    (line,) = [ln for ln in out.splitlines() if ln.strip().startswith("tpu:0")]
    assert "in use 1.68 GiB  pool n/a  limit 15.7 GiB  peak 11.3 GiB  live arrays 512 MiB" in line
    assert "fragmentation 54.5%" in line  # the views as the chip's snapshot had them
    assert "(scanned 10.3 s ago)" in line  # a stale scan says how stale


def test_snapshot_text_says_why_transfers_are_not_counted():
    """It read a field the view does not have (AttributeError for any process
    whose transfers are not counted)."""
    from jaxtop.dashboard.readings import CaptureView

    snap = chip_snapshot()
    proc = dataclasses.replace(snap.processes[0], capture=CaptureView(available=False, na_reason="stderr capture is off"))
    out = snapshot_text(dataclasses.replace(snap, processes=(proc,)))
    assert "transfers: n/a (stderr capture is off)" in out


class _Agent:
    """A socket at this process's pid that serves records as an agent would."""

    def __init__(self, sockdir: Path, lines: list[bytes]) -> None:
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(str(sockdir / f"{os.getpid()}.sock"))
        self.server.listen(1)
        self.lines = lines
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            for line in self.lines:
                conn.sendall(line)
            time.sleep(2)  # the client leaves first, as from a running program


def test_jaxtop_snapshot_of_a_tpu_stream_keeps_every_field_the_chip_printed(sockdir):
    # `jaxtop snapshot --json` through the real client, on the training
    # loop's greeting 20 s in: the same fields as the chip's own snapshot.json
    # (scripts read them), and the figures of the sample it was given.
    recs = records(TRAINING)
    t0 = recs[0]["t"]
    present = next(r for r in recs if r["type"] == "sample" and r["t"] > t0 + 20)
    greeting = [recs[0], next(r for r in recs if r["type"] == "backend"), present]
    agent = _Agent(sockdir, [protocol.encode(r) for r in greeting])
    try:
        snap, _ = snapshot_cli.snapshot_of(os.getpid(), timeout_s=10)
    finally:
        agent.server.close()
    chip = json.loads(SNAPSHOT.read_text())
    ours = {"processes": snapshot_cli.to_json(snap.processes), "devices": snapshot_cli.to_json(snap.devices)}
    for part in ("processes", "devices"):
        missing = set(chip[part][0]) - set(ours[part][0])
        assert not missing, f"{part}: fields the chip's `jaxtop snapshot --json` had and this one lacks: {missing}"
    (dev,) = ours["devices"]
    expected = present["devices"][0]
    assert (dev["platform"], dev["source"], dev["bytes_limit"]) == ("tpu", "memory_stats", BYTES_LIMIT)
    assert dev["bytes_in_use"] == expected["bytes_in_use"] and dev["live_bytes"] == expected["live_arrays"]["bytes"]
    assert dev["pool_bytes"] is None
    out = snapshot_text(snap)
    assert f"seq {present['seq']}" in out and "tpu:0" in out and "limit 15.7 GiB" in out
