"""Adversarial: recordings whose values are of any size, type or shape.

The hostile recordings of ``test_recordings.py``, value by value: every
field of a real sample (and hello) replaced by a number no float holds
(``10**4000``), one beyond 64 bits, inf, NaN, 1e308, a string, an array, an
object, null, a bool; device ids and pids of every JSON type. Whatever the
recording holds, replay (headless stepping and seeking, and the dashboard),
export and a live attach go on: a line that cannot be read is skipped and
counted, a field that cannot be shown reads n/a, and each says so once. The
screen is drawn at every step (each panel's renderable, as Textual would
draw it), since a value that passes the model can still stop a drawing.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from rich.console import Console

from jaxtop.wire import protocol
from jaxtop.testing import synthetic
from jaxtop.dashboard.model import Model
from jaxtop.dashboard.oom_views import OomCensus
from jaxtop.dashboard.sources import ReplaySource
from jaxtop.dashboard.sources.live import ingest
from jaxtop.wire.records import decode
from jaxtop.widgets.holders import HoldersReport
from jaxtop.widgets.jit import JitLedgerTable
from jaxtop.widgets.oom import OomCensusView
from jaxtop.widgets.panels import (
    EventsPanel, FragmentationPanel, HeaderBar, HostPanel, MemoryMapPanel, MemoryPanel, OverviewPanel, TimelinePanel,
    TransfersPanel,
)

PY = sys.executable
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
PID = 7
T0 = 1_000_000.0
HUGE = 10**4000  # 4,001 digits: json.loads reads it (its limit is 4,300), float() does not
HOSTILE: list[Any] = [
    HUGE, -HUGE, 2**64, -(2**63) - 1, math.inf, -math.inf, math.nan, 1e308, -1e308, "x", "", [1], [], {"a": 1}, {},
    None, True, [[1, 2]], ["x"], [{"a": 1}], -1,
]
IDS: list[Any] = ["1", "gpu:0", 1.0, -0.5, [1], {"id": 0}, True, None, HUGE, 2**64, math.nan]


def encode(rec: dict[str, Any]) -> bytes:
    """One line, whatever it holds (NaN and inf as Python's json writes them)."""
    return (json.dumps(rec, separators=(",", ":")) + "\n").encode()


def paths(obj: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every place in a record: each object's keys, an array's first item."""
    yield prefix
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from paths(value, prefix + (key,))
    elif isinstance(obj, list) and obj:
        yield from paths(obj[0], prefix + (0,))


def replaced(rec: dict[str, Any], path: tuple, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(rec)
    place = out
    for key in path[:-1]:
        place = place[key]
    place[path[-1]] = value
    return out


def base(kind: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A hello and samples: a real CPU recording (jit ledger, holders, host
    syncs, labels) or a synthetic GPU one (NVML, allocator figures, maps)."""
    if kind == "synthetic":
        return synthetic.hello(PID, 2, T0), list(synthetic.samples(PID, 2, T0, 12, map_every=3))
    recs = [json.loads(line) for line in (FIXTURES / "demo_worker.jsonl").read_text().splitlines()]
    samples = [r for r in recs if r["type"] == "sample"]
    richest = max(samples, key=lambda r: sum(1 for _ in paths(r)))
    hello = dict(recs[0], pid=PID, t=T0)
    return hello, [dict(s, t=T0 + 0.1 * (k + 1)) for k, s in enumerate(samples[:11] + [richest])]


def hostile_lines(kind: str) -> list[bytes]:
    """A recording: good samples, then one sample per (place, hostile value),
    three values a place, then bad device ids, then good samples again."""
    hello, samples = base(kind)
    richest = samples[-1]
    lines = [encode(hello)] + [encode(s) for s in samples]
    t = samples[-1]["t"]
    places = [p for p in paths(richest) if p and p != ("type",)]
    n = 0
    for k, place in enumerate(places):
        for m in range(3):
            t += 0.1
            rec = dict(richest, t=t, seq=10_000 + n)
            n += 1
            lines.append(encode(replaced(rec, place, HOSTILE[(3 * k + m) % len(HOSTILE)])))
    for bad in IDS:
        t += 0.1
        rec = copy.deepcopy(dict(richest, t=t))
        rec["devices"] = [dict(rec["devices"][0], id=bad)] + rec["devices"]
        lines.append(encode(rec))
    lines.append(b'{"type":"sample","t":%.1f,"seq":%s}\n' % (t + 0.05, b"9" * 5000))  # beyond int()'s digits
    for good in samples:
        t += 0.1
        lines.append(encode(dict(good, t=t, seq=20_000)))
    return lines


# -- drawing a snapshot as the dashboard would ----------------------------------------------------------

PANELS = [panel() for panel in (HeaderBar, MemoryPanel, FragmentationPanel, MemoryMapPanel, HostPanel, TimelinePanel,
                                TransfersPanel, OverviewPanel, EventsPanel)]


def draw(model: Model, pid: int = PID) -> str:
    """Every panel (device view and overview), the Jit, Holders and OOM
    screens, rendered to text; a drawing that raises fails the test, as it
    would stop Textual's compositor."""
    console = Console(width=120, file=io.StringIO(), record=True, color_system=None, legacy_windows=False)
    replay = {"playing": False, "speed": 1.0, "position": 1, "length": 2, "t": T0, "t_start": T0, "t_end": T0 + 9}
    for selected in (0, -1):
        snap = model.snapshot(selected=selected, replay=replay)
        for panel in PANELS:
            console.print(panel.draw(snap, 120, 14))
    console.print(JitLedgerTable(model.ledgers.view(pid)))
    proc = model.processes.get(pid)
    if proc is not None:
        console.print(HoldersReport(proc.holders.view()))
        for census in proc.oom_censuses:
            console.print(OomCensusView(OomCensus.from_wire(census)))
    text = console.export_text()
    assert "render error" not in text
    return text


@contextlib.contextmanager
def replaying(path: Path) -> Iterator[tuple[ReplaySource, Model]]:
    """A recording opened paused on a fresh model; stopped afterwards."""
    src = ReplaySource(str(path), start_playing=False)
    model = Model()
    src.start(model, lambda: None)
    try:
        yield src, model
    finally:
        src.stop()


def has_time(rec: dict[str, Any]) -> bool:
    t = rec.get("t")
    return type(t) in (int, float) and math.isfinite(t) and abs(t) < 1e11


def events(model: Model) -> str:
    return "\n".join(e.text for e in model.snapshot().events)


# -- the tests ---------------------------------------------------------------------------------------

REFUSED = protocol.ProtocolError


@pytest.mark.parametrize(("text", "want"), [
    (str(HUGE), REFUSED), ("-" + str(HUGE), REFUSED), ("9" * 5000, REFUSED), ("9" * 309, REFUSED),
    ("9" * 308, float("9" * 308)), (str(2**64), float(2**64)), (str(-(2**63) - 1), float(-(2**63) - 1)),
    (str(2**63 - 1), 2**63 - 1), (str(2**63), float(2**63)), (str(-(2**63)), -(2**63)), ("1e308", 1e308),
    ("12", 12),
])
def test_the_dashboard_reads_integers_within_64_bits_and_refuses_those_beyond_a_float(text, want):
    # A figure's integers are signed 64-bit (byte counts, addresses); a
    # bigger one reads as a float, one beyond a float's range refuses the line.
    line = b'{"type":"sample","t":1,"devices":[{"id":0,"bytes_in_use":%s}]}\n' % text.encode()
    if want is REFUSED:
        with pytest.raises(REFUSED, match="an integer beyond a float's range"):
            decode(line)
        if len(text) < 4300:  # an export keeps it exact
            assert protocol.decode(line)["devices"][0]["bytes_in_use"] == int(text)
    else:
        got = decode(line).devices[0].bytes_in_use
        assert got == want and type(got) is type(want)


@pytest.mark.parametrize("kind", ["synthetic", "demo_worker"])
def test_replay_steps_and_seeks_through_any_value_and_draws_every_step(tmp_path, kind):
    lines = hostile_lines(kind)
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(b"".join(lines))
    with replaying(path) as (src, model):
        # Every line is a record but those with an integer no float holds
        # (10**4000, 5000 digits), or without a time.
        huge = [line for line in lines if str(HUGE).encode() in line or b"9" * 5000 in line]
        timeless = [line for line in lines if line not in huge and not has_time(json.loads(line))]
        assert huge and timeless
        assert src.length == len(lines) - len(huge) - len(timeless)
        assert src.stats.malformed == len(huge) + len(timeless)
        assert "an integer beyond a float's range" in (src.stats.first_error or ""), src.stats.errors
        while src.position < src.length:
            src.step(1)
            draw(model)
        for t in (T0 + 1.5, float(src.index.times[src.length // 2]), T0, float(src.index.times[-1])):
            src.seek(t)  # from checkpoints the index took of the odd states
            draw(model)
        assert src._thread is not None and src._thread.is_alive()
        assert model.processes[PID].latest.seq == 20_000  # the good samples after the bad ones are shown
        said = events(model)
        assert "malformed 'sample' record" in said, said
        assert "is left out" in said and "not an integer or a name" in said, said  # a bad device id
        ids = [d.id for d in model.snapshot().devices]  # numbered ones in order, then names
        numbered = [i for i in ids if type(i) is int]
        assert ids == sorted(numbered) + [i for i in ids if type(i) is str] and "gpu:0" in ids, ids
        assert not [n for n in model.notices if "could not be shown" in n], model.notices


def test_a_string_device_id_is_drawn_after_the_numbered_ones(tmp_path):
    hello, samples = base("synthetic")
    lines = [encode(hello)]
    for k, s in enumerate(samples):
        s = copy.deepcopy(s)
        if k >= 4:
            s["devices"].append(dict(s["devices"][0], id="1"))
            s["devices"].append(dict(s["devices"][0], id="tpu-a"))
        lines.append(encode(s))
    path = tmp_path / "names.jsonl"
    path.write_bytes(b"".join(lines))
    with replaying(path) as (src, model):
        src.seek(float(src.index.times[-1]))
        text = draw(model)
        assert [d.id for d in model.snapshot().devices] == [0, 1, "1", "tpu-a"]
        assert "gpu:0" in text and "snapshot failed" not in text
        assert model.device_keys() == [(PID, 0), (PID, 1), (PID, "1"), (PID, "tpu-a")]


@pytest.mark.parametrize("pid", ["7", 7.0, [7], {"pid": 7}, None, True, HUGE])
def test_a_hello_whose_pid_is_not_a_pid_replays_as_pid_0(tmp_path, pid):
    hello, samples = base("synthetic")
    path = tmp_path / "pid.jsonl"
    path.write_bytes(b"".join([encode(dict(hello, pid=pid))] + [encode(s) for s in samples]))
    with replaying(path) as (src, model):
        if pid is HUGE:  # the hello cannot be read: the samples play under pid 0
            assert src.stats.malformed == 1
        assert src.pid == 0
        src.step(5)
        assert "pid 0 " in draw(model, 0)  # the header
        assert model.snapshot().processes[0].own_pid is None


async def test_the_dashboard_replays_hostile_values_to_the_end_without_a_failed_snapshot(tmp_path):
    from jaxtop.dashboard.app import make_app

    path = tmp_path / "hostile.jsonl"
    path.write_bytes(b"".join(hostile_lines("synthetic")))
    source = ReplaySource(str(path), speed=1000.0)
    app = make_app(source, refresh_s=0.05)
    failed: list[str] = []
    notify = app.notify

    def noting(message, *args, **kwargs):
        if "failed" in str(message):  # "snapshot failed: …"
            failed.append(str(message))
        return notify(message, *args, **kwargs)

    app.notify = noting  # type: ignore[method-assign]
    async with app.run_test(size=(140, 45)) as pilot:
        while source.position < (source.length or 0):
            await pilot.pause(0.1)
        await pilot.pause(0.5)
        shown = [app.export_screenshot()]
        # Other devices, the overview, a seek, and the Jit, Holders and OOM screens.
        for key in ("d", "d", "o", "o", "home", "end", "J", "escape", "H", "escape", "O", "escape"):
            await pilot.press(key)
            await pilot.pause(0.3)
            shown.append(app.export_screenshot())
        assert app.return_code is None and app.is_running
    assert not failed, failed
    assert not [s for s in shown if "render error" in s]


def test_a_live_attach_skips_what_cannot_be_read_and_draws_the_rest():
    model = Model()
    lines = hostile_lines("demo_worker")
    for start in range(0, len(lines), 40):  # as an agent's reads arrive
        ingest(model, PID, lines[start:start + 40])
        draw(model)
    said = events(model)
    assert "malformed line from agent skipped: an integer beyond a float's range" in said, said
    assert "malformed 'sample' record" in said
    assert model.processes[PID].latest.seq == 20_000


@pytest.mark.parametrize("kind", ["synthetic", "demo_worker"])
def test_integers_no_float_holds_fed_straight_to_the_model_read_n_a(kind):
    """Records that no line brought (a PushSource, the demo): every number
    of a sample in turn made 10**4000 or -10**4000 is drawn as n/a."""
    hello, samples = base(kind)
    richest = samples[-1]
    numbers = [p for p in paths(richest) if p and type(_at(richest, p)) in (int, float)]
    assert len(numbers) > 40
    model = Model()
    model.feed(PID, hello)
    for s in samples:
        model.feed(PID, s)
    for k, place in enumerate(numbers):
        model.feed(PID, replaced(dict(richest, t=richest["t"] + 1 + k), place, HUGE if k % 2 else -HUGE))
        draw(model)


def _at(rec: Any, path: tuple) -> Any:
    for key in path:
        rec = rec[key]
    return rec


@pytest.mark.parametrize("fmt", ["csv", "perfetto", "holders-csv", "labels-csv", "host-syncs-csv"])
def test_export_of_any_value_writes_what_it_can_and_says_the_rest(tmp_path, fmt):
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(b"".join(hostile_lines("demo_worker")))
    out = tmp_path / "out"
    res = subprocess.run([PY, "-m", "jaxtop", "export", str(path), "--format", fmt, "-o", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert out.stat().st_size > 0
