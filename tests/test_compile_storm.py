"""Compile storms without jax: the detector's thresholds, the cause the
ledger words from what it knows, the flag in the probe's samples, one folded
event in the dashboard's store, the trend as one series, and the Jit screen.

Real programs storming are in tests/test_compile_storm_programs.py.
"""

from __future__ import annotations

import collections
import io
import time

from rich.console import Console

from jaxtop.dashboard.ledger import LedgerStore
from jaxtop.widgets.jit import JitLedgerTable
from jaxtop.wire.records import from_dict
from test_jit_ledger import FakeClient, FakeExe, FakeFrame, FakeStats, FakeTraceback, fake_probe

T0 = 1_790_000_000.0


# -- the detector's thresholds ----------------------------------------------------------------

def StormDetector(**thresholds):
    # Imported here: the store's and the trend's tests run on a jaxtop
    # without this module too (they failed there, on their assertions).
    from jaxtop.probes.compile_storm import StormDetector as Detector

    return Detector(**thresholds)


def feed(detector, key, start, seconds, per_second):
    """``per_second`` compiles of ``key`` every second from ``start`` for ``seconds``."""
    for s in range(int(seconds)):
        for k in range(per_second):
            detector.note(start + s + k / per_second, key)


def test_one_function_compiling_for_five_seconds_is_a_storm():
    d = StormDetector()  # 30 compiles of one function in 60 s, over at least 5 s
    feed(d, "jit_sin", T0, 5, 6)  # 30 compiles over 4 s: not yet
    assert d.storming(T0 + 5) is None
    d.note(T0 + 5.2, "jit_sin")  # the sixth second: 31 over 5 s
    key, n, first, last = d.storming(T0 + 5.3)
    assert (key, n, last - first) == ("jit_sin", 31, 5)


def test_a_burst_is_no_storm_however_large():
    d = StormDetector()
    feed(d, "jit_sin", T0, 1, 400)  # 400 shapes in one second, then nothing
    assert d.storming(T0 + 1) is None and d.storming(T0 + 30) is None
    # Unless its executables keep growing pass after pass (the leak flag's
    # function): then the count alone makes it, and both flags come together.
    grown = StormDetector()
    feed(grown, "jit_step", T0, 3, 12)
    assert grown.storming(T0 + 3) is None
    assert grown.storming(T0 + 3, sustained="jit_step")[:2] == ("jit_step", 36)
    assert grown.storming(T0 + 3, sustained="jit_other") is None


def test_a_slow_trickle_and_many_functions_a_few_times_each_are_no_storm():
    d = StormDetector()
    feed(d, "jit_step", T0, 58, 0)
    for s in range(0, 58, 2):
        d.note(T0 + s, "jit_step")  # 29 compiles in 58 s: one short of the threshold
    assert d.storming(T0 + 58) is None
    setup = StormDetector()
    for s in range(20):  # a model's set-up: 200 ops, each on a few shapes, over 20 s
        for op in range(10):
            for shape in range(3):
                setup.note(T0 + s + op / 10 + shape / 100, f"jit_op{s}_{op}")
    assert setup.storming(T0 + 20) is None
    assert setup.counts(T0 + 20)[0] == 600


def test_the_window_forgets_and_a_quiet_function_stops():
    d = StormDetector(window_s=60.0, quiet_s=20.0)
    feed(d, "jit_step", T0, 10, 5)
    assert d.storming(T0 + 10)[0] == "jit_step"
    assert d.still_going("jit_step", T0 + 25) and not d.still_going("jit_step", T0 + 31)
    assert d.storming(T0 + 75) is None  # its compiles left the window
    assert d.counts(T0 + 75) == (0, {}) and d.last_compile("jit_step") is None
    # Thresholds are the caller's: a fast test storm.
    fast = StormDetector(min_compiles=5, min_span_s=1.0)
    feed(fast, "jit_f", T0, 2, 3)
    assert fast.storming(T0 + 2)[:2] == ("jit_f", 6)


def test_the_storming_function_is_the_one_with_most_compiles():
    d = StormDetector()
    feed(d, "jit_a", T0, 8, 5)
    feed(d, "jit_b", T0, 8, 9)
    d.note(T0 + 3, None)  # a compile that names no function counts in the total only
    total, per = d.counts(T0 + 8)
    assert total == 8 * 14 + 1 and per["jit_b"][0] == 72
    assert d.storming(T0 + 8)[0] == "jit_b"


# -- the cause, in words -------------------------------------------------------------------

def types(old, new, arg="x"):
    return {"kind": "types", "arg": arg, "old": old, "new": new, "call_site": "/src/train.py:9"}


def test_causes_say_what_the_ledger_knows():
    from jaxtop.probes.compile_storm import change_summary, display_name, storm_cause

    shapes = [types("f32[10]", "f32[11]")] + [types("f32[10]", f"f32[{n}]") for n in (100, 200, 4000)]
    kind, text = storm_cause("jit_step", 150, False, shapes, True)
    assert kind == "types"
    assert text == ("149 recompiles of step: the shape of x changed (f32[10] → f32[11] → … → f32[4000]): "
                    "pad or bucket shapes")
    assert storm_cause("jit_sin", 400, True, [], True) == (
        "eager", "eager op sin compiled for 400 shapes: run it under jit or pad shapes")
    dtype = storm_cause("jit_step", 3, False, [types("f32[3]", "f16[3]"), types("f32[3]", "bf16[3]")], True)
    assert dtype == ("types",
                     "2 recompiles of step: the dtype of x changed (f32[3] → f16[3] → bf16[3]): keep one dtype")
    static = {"kind": "static", "arg": "train", "old": "True", "new": "False"}
    assert storm_cause("jit_step", 5, False, [static], True)[1] == (
        "4 recompiles of step: static argument train: True → False")
    closures = storm_cause("jit__lambda", 300, False, [{"kind": "redefined"}], True)
    assert closures[0] == "redefined" and closures[1].startswith("<lambda> compiled 300 times: a new function object")
    assert "reasons are off" in storm_cause("jit_step", 40, False, [], False)[1]
    assert storm_cause("jit_step", 40, False, [], True) == (
        "unknown", "step compiled 40 times: no recompile reason recorded")
    assert display_name("jit__lambda") == "<lambda>" and display_name("sin") == "sin"
    two_args = dict(types("f32[3]", "f32[4]"), diffs=[["x", "f32[3]", "f32[4]"], ["y", "i32[3]", "i32[4]"]])
    assert change_summary([two_args]) == "x f32[3] → f32[4] (+1 more argument(s))"
    assert change_summary([]) is None and len(change_summary([{"kind": "other", "text": "k" * 500}])) == 120


def test_a_storm_is_worded_by_most_of_its_reasons_not_the_newest():
    """``jaxtop demo``'s in-place "off" variant grows a buffer one row a step
    and makes its jit anew every 32 rows: the newest reason said "a new
    function object" one time in 32, the storm was called a closure storm
    and the in-place advice (which wants a shape storm) went missing (CI
    at 67b8a39)."""
    from jaxtop.probes.compile_storm import change_summary, storm_cause

    grown = [types("f32[1,128]", f"f32[{n},128]", arg="b") for n in range(20, 27)] + [{"kind": "redefined"}]
    kind, text = storm_cause("jit__lambda", 373, False, grown, True)
    assert kind == "types" and "the shape of b changed" in text and "f32[26,128]" in text
    assert change_summary(grown).startswith("b f32[1,128]")
    # Half and half: the newer kind.
    assert storm_cause("jit__lambda", 4, False, [types("f32[1]", "f32[2]"), {"kind": "redefined"}], True)[0] == "redefined"
    assert storm_cause("jit__lambda", 4, False, [{"kind": "redefined"}, types("f32[1]", "f32[2]")], True)[0] == "types"


# -- the flag in the probe's samples ----------------------------------------------------------

def test_the_probe_flags_a_storm_with_its_cause_and_lowers_it_when_quiet(monkeypatch):
    """Compile events and cache-miss records as jax sends them, on a clock the
    test moves: the storm shows in the very next sample's ``jit`` field, with
    the shape change the reasons named, and goes once the function is quiet."""
    import jaxtop.probes.executables as module
    from test_jit_ledger import MISS_0_10_2

    now = [T0]
    monkeypatch.setattr(module.time, "time", lambda: now[0])
    monkeypatch.setattr("jaxtop.probes.jit_passes.time.time", lambda: now[0])
    client = FakeClient()
    probe = fake_probe(client, storms=StormDetector(min_compiles=10, min_span_s=3.0, quiet_s=5.0))
    probe.active = True
    probe._names_expected = True
    first = probe.sample()
    assert first["storm"] is None and first["full"] is True
    fields = []
    for k in range(1, 13):  # one compile of step per half second, each for a new shape
        now[0] = T0 + k / 2
        miss = MISS_0_10_2.replace("f32[4]", f"f32[{10 + k}]").replace("f32[3]", f"f32[{9 + k}]")
        probe._on_miss(miss, now[0])
        probe._on_duration(module.BACKEND_COMPILE_EVENT, 0.01, fun_name="jit(step)")
        client.exes.insert(0, FakeExe("jit_step", FakeStats(argument=4 * (10 + k)), {},
                                      FakeTraceback(FakeFrame("/src/train.py", 22, "<module>"))))
        fields.append(probe.sample())  # a pass each time (interval_s 0)
    flagged = [f for f in fields if f and f.get("storm")]
    assert flagged, fields
    storm = flagged[0]["storm"]
    assert storm["function"] == "jit_step" and storm["kind"] == "types" and storm["compiles"] >= 10
    assert storm["message"].startswith("compile storm: ")
    assert "the shape of x changed (f32[10] → f32[11] → … →" in storm["message"]
    assert storm["site"] == "/src/train.py:22" and storm["since_t"] == T0
    # The executables stay alive: the leak flag names the same cause, not closures.
    leak = fields[-1]["leak"]
    assert leak is not None and leak["function"] == "jit_step"
    assert "recompiles of step: the shape of x" in leak["message"]
    assert "closures" not in leak["message"]
    # Quiet for longer than quiet_s: the flag goes, and a field says so.
    now[0] += 6.0
    probe._on_duration(module.BACKEND_COMPILE_EVENT, 0.01, fun_name="jit(other)")
    out = probe.sample()
    assert out is not None and out["storm"] is None


def test_the_trend_is_the_live_count_the_fields_carry():
    """Every pass adds one point, at the field's own time and with its own
    count, ops included: a whole table's trend and the changes' live_count are
    one series (they were two, interleaved: ▁▁▅▅▁▁▆▆)."""
    exes = [FakeExe(f"jit_f{k}", FakeStats(temp=k), {}, FakeTraceback(FakeFrame("/src/a.py", k))) for k in range(3)]
    client = FakeClient(*exes)
    probe = fake_probe(client, budget_s=float("inf"))
    probe.active = True
    probe._names_expected = True
    import jaxtop.probes.executables as module

    fields = [probe.sample()]
    for k in range(6):
        # An op run eagerly for a new shape: its executable is an op.
        probe._on_duration(module.BACKEND_COMPILE_EVENT, 0.01, fun_name="jit(sin)")
        probe._fns["jit_sin"].eager_compiles += 1  # as a live stack through jnp.sin would say
        client.exes.insert(0, FakeExe("jit_sin", FakeStats(temp=k), {}, FakeTraceback(FakeFrame("/src/a.py", 1))))
        fields.append(probe.sample())  # a pass each time (interval_s 0)
        time.sleep(0.002)
    fields.append(probe.sample(full=True))
    deltas = {f["t"]: f["live_count"] for f in fields if f and not f["full"]}
    trend = dict(map(tuple, fields[-1]["trend"]))
    assert deltas and all(trend[t] == n for t, n in deltas.items()), (trend, deltas)
    assert [n for _, n in sorted(trend.items())] == sorted(trend.values())  # it only climbs
    assert probe._eager_live == 6
    assert all(r.get("eager") for r in probe.table()["executables"] if r["name"] == "jit_sin")


# -- the dashboard's store: one series, one event ---------------------------------------------

def jit_sample(sample_t, **field):
    return from_dict({"type": "sample", "t": sample_t, "jit": field})


def test_an_older_agents_two_series_fold_into_one():
    """An agent before the storm flag: whole tables' trend without ops, at
    millisecond times; fields' live_count with them, at microsecond times.
    The reader keeps the fields' series and takes the table's only for what
    came before it joined."""
    store = LedgerStore()
    base = dict(pending=0, compiles_total=0, leak=None, functions=[], executables=[])
    # Joined late: the first whole table brings history (ops left out), then changes.
    history = [[T0 + k + 0.0004, 1] for k in range(3)]
    store.feed_sample(1, jit_sample(T0 + 3.0, full=True, t=T0 + 3.0001, live_count=40, trend=history, **base))
    for k in range(4, 12):
        store.feed_sample(1, jit_sample(T0 + k, full=False, t=T0 + k + 0.0001, live_count=40 + 10 * k, **base))
        if k % 4 == 0:
            mixed = [[round(T0 + j + 0.0001, 3), 1] for j in range(3, k + 1)]  # the same passes, ops left out
            store.feed_sample(1, jit_sample(T0 + k, full=True, t=T0 + k + 0.0001, live_count=40 + 10 * k,
                                            trend=mixed, **base))
    counts = [n for _, n in store.view(1).trend]
    assert counts == [1, 1, 1, 40] + [40 + 10 * k for k in range(4, 12)], counts


def storm_field(t, since, compiles, function="jit_step", reasons=(), **extra):
    storm = {"since_t": since, "t": t, "function": function, "name": "step", "kind": "types",
             "compiles": compiles, "compiles_total": compiles, "window_s": 60.0, "rate_per_s": 9.0,
             "site": "/src/train.py:22",
             "message": f"compile storm: {compiles - 1} recompiles of step: the shape of x changed "
                        f"(f32[10] → f32[11] → … → f32[{9 + compiles}]): pad or bucket shapes; "
                        f"{compiles} compiles in the last 60 s (train.py:22)"}
    fn = {"name": function, "compiles": compiles, "compiles_source": "monitoring", "live": compiles,
          "reasons": list(reasons), "reasons_total": len(reasons), "call_site": "/src/train.py:22"}
    out = dict(t=t, full=False, live_count=compiles, pending=0, compiles_total=compiles, leak=None,
               storm=storm if since is not None else None, functions=[fn], executables=[], gone=[])
    out.update(extra)
    return out


def test_a_storm_is_one_event_and_recompile_events_are_folded():
    store = LedgerStore()
    store.feed_sample(1, jit_sample(T0, full=True, t=T0, live_count=0, pending=0, compiles_total=0, leak=None,
                                    storm=None, functions=[], executables=[], trend=[]))
    events = []
    reasons = []
    for k in range(1, 41):  # a recompile every 0.25 s; the agent flags the storm after 6 s
        t = T0 + k / 4
        reasons = (reasons + [dict(types("f32[10]", f"f32[{10 + k}]"), t=t)])[-8:]
        leak = None
        if k >= 30:
            leak = {"since_t": T0 + 2, "function": "jit_step", "message": "live executables +28 in 6 s: …"}
        events += store.feed_sample(1, jit_sample(t, **storm_field(t, T0 + 0.25 if k >= 24 else None, k + 1,
                                                                    reasons=reasons, leak=leak)))
    kinds = collections.Counter(text.split(":")[0] for _, text, _ in events)
    assert kinds == {"recompile jit_step": 3, "compile storm": 1}, events  # no leak event: the storm's function
    storm_events = [text for _, text, _ in events if text.startswith("compile storm")]
    assert "the shape of x changed (f32[10] → f32[11]" in storm_events[0]
    # The storm ends; the recompiles folded while it lasted are the storm's, a
    # later burst of the same function is folded into one event per minute.
    t = T0 + 80
    events = store.feed_sample(1, jit_sample(t, **storm_field(t, None, 45, reasons=reasons)))
    assert events == []
    more = []
    for k in range(1, 9):
        t = T0 + 80 + k
        reasons = (reasons + [dict(types("f32[10]", f"f32[{100 + k}]"), t=t)])[-8:]
        more += store.feed_sample(1, jit_sample(t, **storm_field(t, None, 45 + k, reasons=reasons)))
    assert [text for _, text, _ in more][:3] == [f"recompile jit_step: x f32[10] → f32[{100 + k}] at train.py:9"
                                                 for k in (1, 2, 3)]
    assert len(more) == 3
    later = store.feed_sample(1, jit_sample(T0 + 150, **storm_field(T0 + 150, None, 53, reasons=reasons)))
    assert [text for _, text, _ in later] == [
        "recompile jit_step: 5 more in 60 s, the latest x f32[10] → f32[108] at train.py:9"]


# -- the Jit screen ---------------------------------------------------------------------------

def render_text(renderable, width=120) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def test_the_jit_screen_shows_the_storm_and_its_cause():
    store = LedgerStore()
    store.feed_sample(1, jit_sample(T0, full=True, t=T0, live_count=0, pending=0, compiles_total=0, leak=None,
                                    storm=None, functions=[], executables=[], trend=[]))
    for k in range(1, 30):
        store.feed_sample(1, jit_sample(T0 + k, **storm_field(T0 + k, T0 + 1 if k > 6 else None, k)))
    text = render_text(JitLedgerTable(store.view(1)))
    line = next(line for line in text.splitlines() if "compile storm" in line)
    assert line.startswith("⚠ compile storm: 28 recompiles of step: the shape of x changed (f32[10] → f32[11]")
    assert "live executables 29 (+29 in 60 s)" in text
