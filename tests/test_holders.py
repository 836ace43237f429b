"""Holders: memory by allocation site and leak suspects (probes/holders.py),
named pytrees (jaxtop/agent/labels.py), host syncs (probes/host_sync.py), their
fold (jaxtop/dashboard/holders.py) and the Holders screen.

Pure layers run on synthetic pprof profiles; the probes also run in this
process on the CPU backend; ``slow`` tests start real programs
(tests/targets/holders_*.py) and read what their agent recorded.
"""

from __future__ import annotations

import gc
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from jaxtop.dashboard.holders import HoldersFold, fold_records
from jaxtop.dashboard.holders_screen import HoldersScreen
from jaxtop.probes.holders import (
    GrowthTracker, HoldersProbe, LibraryFilter, aggregate_profile, describe_growth, pick_site, site_text,
)
from jaxtop.widgets.holders import HoldersReport, render_holders, sparkline

from conftest import PY, TARGETS, wait_for

T0 = 1_790_000_000.0
MiB = 1 << 20
USER = "/home/me/proj/train.py"
DATA = "/home/me/proj/data.py"
JAX = "/venv/lib/python3.11/site-packages/jax/_src/pjit.py"
NUMPYF = "/venv/lib/python3.11/site-packages/numpy/core/numeric.py"
OPTAX = "/venv/lib/python3.11/site-packages/optax/_src/transform.py"


# -- a pprof writer for synthetic profiles ----------------------------------------------------

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, payload: bytes | int) -> bytes:
    if isinstance(payload, int):
        return _varint(number << 3) + _varint(payload)
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def make_pprof(samples) -> bytes:
    """A pprof Profile as jaxlib writes it: ``samples`` are ``(stack, count,
    bytes, labels)`` with stacks of ``(function, file, line)``, innermost first."""
    strings = [""]

    def s(text: str) -> int:
        if text not in strings:
            strings.append(text)
        return strings.index(text)

    functions: dict[tuple[str, str], int] = {}
    locations: dict[tuple[str, str, int], int] = {}
    body = b""
    for type_, unit in (("allocations", "count"), ("space", "bytes")):
        body += _field(1, _field(1, s(type_)) + _field(2, s(unit)))
    loc_msgs = b""
    fn_msgs = b""
    for stack, count, nbytes, labels in samples:
        ids = []
        for name, filename, line in stack:
            fid = functions.get((name, filename))
            if fid is None:
                fid = functions[(name, filename)] = len(functions) + 1
                fn_msgs += _field(5, _field(1, fid) + _field(2, s(name)) + _field(3, s(name)) + _field(4, s(filename)))
            lid = locations.get((name, filename, line))
            if lid is None:
                lid = locations[(name, filename, line)] = len(locations) + 1
                loc_msgs += _field(4, _field(1, lid) + _field(4, _field(1, fid) + _field(2, line)))
            ids.append(lid)
        msg = _field(1, b"".join(_varint(i) for i in ids)) + _field(2, _varint(count) + _varint(nbytes))
        for key, value in labels.items():
            msg += _field(3, _field(1, s(key)) + _field(2, s(value)))
        body += _field(2, msg)
    body += loc_msgs + fn_msgs
    for text in strings:
        body += _field(6, text.encode())
    return body


def jax_stack(*user_frames):
    """A buffer's stack: jax's dispatch frames, then the user's (innermost first)."""
    return [("__call__", "/venv/lib/python3.11/site-packages/jax/_src/interpreters/pxla.py", 395),
            ("cache_miss", JAX, 259), *user_frames]


def buf(stack, count, nbytes, device="cpu:0"):
    return (stack, count, nbytes, {"kind": "buffer", "device": device})


# -- which frames are the user's ---------------------------------------------------------------

def test_library_filter_knows_jax_numpy_stdlib_site_packages_and_jaxtop():
    import jax
    import numpy

    import jaxtop

    filt = LibraryFilter()
    assert filt.is_library(jax.__file__) and filt.is_core(jax.__file__)
    assert filt.is_library(numpy.__file__)
    assert filt.is_library(jaxtop.__file__) and filt.is_core(jaxtop.__file__)
    assert filt.is_library(os.__file__)  # the standard library
    assert filt.is_library(OPTAX) and not filt.is_core(OPTAX)
    assert filt.is_library("<frozen runpy>")
    assert not filt.is_library(__file__)  # a test is user code
    assert not filt.is_library(USER) and not filt.is_library("<string>") and not filt.is_library("<ipython-input-3>")


def test_pick_site_innermost_user_frame_else_first_outside_jax():
    stack = [("apply", JAX, 10), ("update", OPTAX, 20), ("step", USER, 57), ("main", USER, 99)]
    assert pick_site(stack) == ((USER, 57, "step"), False)
    only_libs = [("apply", JAX, 10), ("update", OPTAX, 20)]
    assert pick_site(only_libs) == ((OPTAX, 20, "update"), True)
    assert pick_site([("apply", JAX, 10)]) == ((JAX, 10, "apply"), True)
    comp = [("apply", JAX, 10), ("<listcomp>", USER, 30), ("make_batch", USER, 30)]
    assert pick_site(comp) == ((USER, 30, "make_batch.<listcomp>"), False)
    assert pick_site([])[0][2] == "<no stack>"
    assert site_text((USER, 57, "step")) == "train.py:57"


# -- one frame filter: every probe names the same site for the same frames ---------------------------------

STDLIB_FILE = os.path.join(os.path.dirname(os.__file__), "threading.py")
#: Stacks (innermost first) with the site each must get; each site appears once.
AGREE_STACKS = [
    jax_stack(("step", USER, 57), ("main", USER, 99)),  # the user's frame below jax's
    [("apply", JAX, 11), ("update", OPTAX, 20), ("train", USER, 61)],  # an installed package in between
    [("apply", JAX, 12), ("run", STDLIB_FILE, 1000), ("loop", DATA, 8)],  # the standard library in between
    [("apply", JAX, 13), ("<listcomp>", USER, 30), ("make_batch", USER, 30)],  # a comprehension
    [("apply", JAX, 14), ("init", OPTAX, 21)],  # no user frame: the package's
    [("apply", JAX, 15), ("asarray", NUMPYF, 3)],  # jax and numpy only: the innermost
    [],  # no stack
]


class _TbFrame:
    def __init__(self, function_name, file_name, line_num):
        self.function_name, self.file_name, self.line_num = function_name, file_name, line_num


def test_every_probe_picks_the_same_site_for_the_same_frames():
    """Holders, the on-demand profile, the OOM census and the jit ledger's
    call site agree with the frame filter's choice."""
    from types import SimpleNamespace

    from jaxtop.probes import frames, memory_profile
    from jaxtop.probes.jit_entries import analyse
    from jaxtop.probes.oom import allocation_sites

    data = make_pprof([buf(stack, 1, 1000 * (i + 1)) for i, stack in enumerate(AGREE_STACKS)])
    held = {s.bytes: (k, s.library) for k, s in aggregate_profile(data).sites.items()}
    summary = {s["bytes"]: s for s in memory_profile.summarize_profile(data, top=100)["top_sites"]}
    census = {s["bytes"]: s for s in allocation_sites(data, top=100)["top"]}
    for i, stack in enumerate(AGREE_STACKS):
        site, library = frames.pick_site(stack)
        assert held[1000 * (i + 1)] == (site, library), stack
        filename, line, name = site
        want = f"{name} ({os.path.basename(filename)}:{line})" if filename else name
        assert (summary[1000 * (i + 1)]["site"], summary[1000 * (i + 1)]["file"]) == (want, filename), stack
        in_census = census[1000 * (i + 1)]
        assert (in_census["file"], in_census["line"], in_census["function"]) == site, stack
        assert in_census["user"] == (not library), stack
        assert frames.user_frame(stack) == (None if library else site)
        assert frames.user_frame(iter(stack)) == frames.user_frame(stack)  # a generator is read lazily
        exe = SimpleNamespace(traceback=SimpleNamespace(frames=[_TbFrame(*f) for f in stack]))
        row = analyse(exe, 1, T0).row
        assert row["call_site"] == (None if library else f"{filename}:{line}"), stack
        assert row["call_fn"] == (None if library else name)
    assert [frames.pick_site(s)[0] for s in AGREE_STACKS] == [
        (USER, 57, "step"), (USER, 61, "train"), (DATA, 8, "loop"), (USER, 30, "make_batch.<listcomp>"),
        (OPTAX, 21, "init"), (JAX, 15, "apply"), ("", 0, "<no stack>")]


def test_live_frames_and_tracebacks_agree_with_the_frame_filter():
    """The walk over live frames (host syncs), a traceback and the frame
    sequence they make pick the same frame: library code calling back into
    the test, as jax calls ``__float__``."""
    from jaxtop.probes import frames
    from jaxtop.probes.host_sync import HostSyncProbe

    lib = {}
    exec(compile("import sys\ndef call(cb):\n    return cb(sys._getframe())\n"
                 "def fail():\n    raise ValueError('from the library')\n", JAX, "exec"), lib)
    seen = []

    def check(frame):
        site, library, label = frames.walk(frame, names={"call": "called"}, label="none")
        assert (site, library) == frames.pick_site(frames.python_frames(frame))
        assert label == "called" and not library
        assert frames.user_frame_of(frame) == site
        probe = HostSyncProbe()
        probe._record(frame, None)
        assert list(probe.counts()) == [site]
        seen.append(site)

    line = sys._getframe().f_lineno + 1
    lib["call"](check)
    [lib["call"](check) for _ in range(1)]  # in a comprehension's frame before Python 3.12
    name = sys._getframe().f_code.co_name
    assert seen[0] == (__file__, line, name)
    assert seen[1][:2] == (__file__, line + 1) and seen[1][2] in (name, f"{name}.<listcomp>")
    try:
        lib["fail"]()
    except ValueError as exc:
        tb = exc.__traceback__
    assert frames.user_frame_of(tb) == (__file__, tb.tb_lineno, name)
    # The OOM census names where an error was raised by the same rule.
    from jaxtop.probes.oom.sites import user_frame_of_stack, user_frame_of_traceback

    where = user_frame_of_traceback(tb)
    assert (where["file"], where["line"], where["function"]) == frames.user_frame_of(tb)
    here = sys._getframe()
    where, expected = user_frame_of_stack(here), frames.user_frame_of(here)  # one line: one f_lineno
    assert (where["file"], where["line"], where["function"]) == expected
    assert frames.python_frames(tb)[0][:2] == ("fail", JAX)  # innermost first
    assert frames.user_frame_of(None) is None


# -- one profile -> sites ------------------------------------------------------------------------

def test_aggregate_sums_buffers_per_site_and_device_and_totals_executables():
    data = make_pprof([
        buf(jax_stack(("init", USER, 10)), 4, 4000, "cpu:0"),
        buf(jax_stack(("init", USER, 10)), 4, 4000, "cpu:1"),
        buf(jax_stack(("cache_hit_path", JAX, 77), ("init", USER, 10)), 2, 100, "cpu:0"),  # another stack, same site
        buf(jax_stack(("next_batch", DATA, 31), ("main", USER, 5)), 1, 64 * MiB),
        (jax_stack(("step", USER, 50)), 1, 856, {"kind": "executable"}),
        (jax_stack(("weird", USER, 60)), 3, 30, {"kind": "buffer", "device": "cpu:0", "dtype": "bf16"}),
    ])
    totals = aggregate_profile(data)
    init = totals.sites[(USER, 10, "init")]
    assert (init.bytes, init.count) == (8100, 10)
    assert init.devices == {"cpu:0": [4100, 6], "cpu:1": [4000, 4]}
    batch = totals.sites[(DATA, 31, "next_batch")]
    assert (batch.bytes, batch.count) == (64 * MiB, 1)
    assert (USER, 50, "step") not in totals.sites  # executables are not arrays
    assert (totals.executable_bytes, totals.executable_count) == (856, 1)
    assert totals.bytes == 8100 + 64 * MiB + 30 and totals.count == 14
    assert totals.by_device == {"cpu:0": [4100 + 64 * MiB + 30, 10], "cpu:1": [4000, 4]}
    assert totals.sites[(USER, 60, "weird")].labels == {"dtype": {"bf16": 3}}  # other labels are kept
    import gzip

    assert aggregate_profile(gzip.compress(data)).bytes == totals.bytes  # jax's bytes are gzipped


def test_aggregate_a_real_profile_matches_the_programs_own_accounting(jax_cpu):
    import jax
    import numpy as np

    def make_held():
        return [jax.device_put(np.ones((10, 10), np.float32)) for _ in range(6)]

    held = make_held()
    line = make_held.__code__.co_firstlineno + 1
    site = next(s for k, s in aggregate_profile(jax.profiler.device_memory_profile()).sites.items()
                if k[0] == __file__ and k[1] == line)
    assert (site.bytes, site.count) == (sum(a.nbytes for a in held), 6)
    del held


# -- growth -> leak suspects ------------------------------------------------------------------------

def run_tracker(series, rises=5, dt=5.0):
    """``series``: one {site: (bytes, count)} per profile; returns the tracker and, per profile, the suspects."""
    tracker = GrowthTracker(rises)
    flagged = []
    for i, sites in enumerate(series):
        tracker.update(T0 + i * dt, sites)
        flagged.append(sorted(k[2] for k in tracker.suspects()))
    return tracker, flagged


A, B, C = (USER, 10, "params"), (USER, 120, "log_metrics"), (DATA, 31, "next_batch")


def test_growth_of_a_steady_program_flags_nothing():
    _, flagged = run_tracker([{A: (MiB, 10), C: (4096, 1)} for _ in range(50)])
    assert not any(flagged)


def test_up_and_down_flags_nothing_even_when_rising_more_often():
    # In-flight batches: 1, 2, 3, 4, 1, 2, 3, 4… never five rises without a fall.
    series = [{C: (4096 * (1 + i % 4), 1 + i % 4)} for i in range(60)]
    _, flagged = run_tracker(series)
    assert not any(flagged)


def test_a_leak_is_flagged_after_five_rises_with_its_rate():
    # 64 arrays of 32 KiB per profile, every 5 s: +768 arrays/min, +24 MiB/min.
    series = [{A: (MiB, 10), B: (i * 64 * 32768, i * 64)} for i in range(12)]
    tracker, flagged = run_tracker(series)
    assert flagged[4] == [] and flagged[5] == ["log_metrics"]  # 5 rises after the first profile
    assert all(f == ["log_metrics"] for f in flagged[5:])
    growth = tracker.growth(B)
    assert growth["count_per_min"] == pytest.approx(768) and growth["bytes_per_min"] == pytest.approx(24 * MiB)
    assert growth["for_s"] == pytest.approx(55.0) and growth["rises"] == 11
    assert describe_growth(B, growth) == "train.py:120 log_metrics: +768 arrays/min, +24.0 MiB/min, for 55 s"


def test_a_slow_leak_stays_flagged_and_a_finished_warmup_is_cleared():
    # One array every 4th profile, for 60 profiles: flagged from its 5th rise on, never dropped.
    slow = [{B: ((i // 4) * 1024, i // 4)} for i in range(60)]
    _, flagged = run_tracker(slow)
    first = next(i for i, f in enumerate(flagged) if f)
    assert first == 20 and all(flagged[first:])
    # Six rises in a row, then a plateau: flagged while growing, cleared 5 flat profiles later.
    warm = [{A: (min(i, 6) * MiB, min(i, 6))} for i in range(20)]
    _, flagged = run_tracker(warm)
    assert flagged[5] == ["params"] and flagged[6] == ["params"]
    assert flagged[11] == ["params"] and not any(flagged[12:])


def test_a_fall_ends_the_run_and_gone_sites_are_forgotten():
    series = [{B: (i, i)} for i in range(4)] + [{B: (1, 1)}] + [{B: (i, i)} for i in range(2, 6)]
    tracker, flagged = run_tracker(series)
    assert not any(flagged) and tracker.growth(B)["rises"] == 4
    tracker, _ = run_tracker([{C: (5, 1)}] + [{} for _ in range(12)])
    assert C not in tracker.trends


# -- the probe: cadence, budget, mark, commands --------------------------------------------------------

class Clock:
    def __init__(self, t=100.0):
        self.t = t

    def __call__(self):
        return self.t


class FakeAgent:
    def __init__(self):
        self.fields, self.commands, self.events = {}, {}, []
        self.running = True

    def register_sample_field(self, name, fn):
        self.fields[name] = fn

    def register_command(self, name, handler):
        self.commands[name] = handler

    def add_probe(self, probe):
        """What the agent does with a probe: its field each tick, its commands."""
        from jaxtop.probes.base import Tick

        self.fields[probe.name] = lambda: probe.on_tick(Tick(0.0))
        self.commands.update(getattr(probe, "commands", None) or {})

    def post_event(self, kind, **fields):
        self.events.append({"kind": kind, **fields})


def leak_profiles(n_steps, leak_per_step=64):
    """Profiles of a program with a steady site, a batch going up and down, and a leak."""
    out = []
    for i in range(n_steps):
        out.append(make_pprof([
            buf(jax_stack(("init_params", USER, 10)), 130, 1200 * MiB),
            buf(jax_stack(("init_opt_state", USER, 14)), 260, 2400 * MiB),
            buf(jax_stack(("next_batch", DATA, 31)), 1 + i % 2, (1 + i % 2) * 32 * MiB),
            buf(jax_stack(("log_metrics", USER, 120)), i * leak_per_step, i * leak_per_step * 32768),
        ]))
    return out


def make_probe(profiles, cost=0.0001, **kw):
    """A probe on synthetic profiles and fake clocks; each profile costs ``cost`` seconds."""
    clock, mono, timer = Clock(T0), Clock(0.0), Clock(0.0)
    it = iter(profiles)

    def capture():
        timer.t += cost
        return next(it)

    kw.setdefault("timer", timer)
    probe = HoldersProbe(capture=capture, ready=lambda: True, clock=clock, monotonic=mono, **kw)
    return probe, clock, mono


def test_probe_cadence_backs_off_to_stay_within_its_budget():
    probe, clock, mono = make_probe(leak_profiles(3), cost=0.080, interval_s=5.0)  # a profile takes 80 ms
    rec = probe.sample()
    assert rec["seq"] == 1 and rec["seconds"] == pytest.approx(0.08)
    assert rec["interval_s"] == pytest.approx(200.0)  # 80 ms is 0.04 % of 200 s, more than the 5 s base
    mono.t += 5.0
    assert probe.sample() is None  # 5 s later: not yet
    mono.t += 194.0
    assert probe.sample() is None
    mono.t += 1.0
    assert probe.sample()["seq"] == 2


def test_probe_records_sites_suspects_an_event_and_a_mark():
    agent = FakeAgent()
    probe, clock, mono = make_probe(leak_profiles(20), interval_s=5.0)
    probe.install(agent)
    assert set(agent.fields) == {"holders"} and set(agent.commands) == {"holders_mark", "holders_profile"}
    records = []
    for i in range(8):
        clock.t, mono.t = T0 + 5 * i, 5.0 * i
        records.append(agent.fields["holders"]())
        assert agent.fields["holders"]() is None  # one record per profile
    last = records[-1]
    sites = {s["site"]: s for s in last["sites"]}
    assert [s["site"] for s in last["sites"]] == ["train.py:14", "train.py:10", "data.py:31", "train.py:120"]  # largest first
    assert sites["train.py:120"]["suspect"] and last["suspects"] == 1
    assert not sites["train.py:10"].get("suspect") and not sites["data.py:31"].get("suspect")
    assert sites["train.py:120"]["growth"]["count_per_min"] == pytest.approx(64 * 12)
    assert sites["train.py:120"]["devices"] == {"cpu:0": [7 * 64 * 32768, 7 * 64]}
    assert [e["kind"] for e in agent.events] == ["leak_suspect"]
    assert agent.events[0]["text"].startswith("leak suspect: train.py:120 log_metrics: +768 arrays/min")

    clock.t, mono.t = T0 + 41, 41.0
    reply = agent.commands["holders_mark"]({})
    assert reply["seq"] == 9 and reply["sites"] == 4
    assert agent.commands["holders_mark"]({})["pending"]  # a second command within 1 s waits
    marked = agent.fields["holders"]()
    assert marked["reason"] == "mark" and marked["mark"]["seq"] == 9
    clock.t, mono.t = T0 + 45, 45.0
    after = agent.fields["holders"]()  # the pending mark is taken by this profile
    assert after["mark"]["seq"] == 10 and after["mark"]["bytes"] == 0
    clock.t, mono.t = T0 + 50, 50.0
    after = agent.fields["holders"]()
    deltas = {s["site"]: s["mark"] for s in after["sites"]}
    assert deltas["train.py:120"] == {"bytes": 64 * 32768, "count": 64}
    assert deltas["train.py:10"] == {"bytes": 0, "count": 0}
    assert after["mark"]["count"] == 64 + (1 if after["seq"] % 2 == 0 else -1)
    assert agent.commands["holders_mark"]({"clear": True}) == {"cleared": True}


def test_the_backend_check_waits_for_jax_to_finish_importing(monkeypatch):
    import types

    from jaxtop.probes import holders

    half = types.ModuleType("jax")
    half.__spec__ = types.SimpleNamespace(_initializing=True)  # what importlib shows while jax's code runs
    monkeypatch.setitem(sys.modules, "jax", half)
    monkeypatch.setattr("jaxtop.probes.jax_memory.backend_ready", lambda: pytest.fail("imported from a half-imported jax"))
    assert not holders.jax_imported() and not holders._backend_ready() and holders._in_use_bytes() is None
    half.__spec__._initializing = False
    assert holders.jax_imported()


def test_profile_command_is_rate_limited_and_waits_for_a_backend():
    probe, clock, mono = make_probe(leak_profiles(5))
    first = probe.cmd_profile({})
    assert first["seq"] == 1 and first["sites"] == 4
    refused = probe.cmd_profile({})
    assert refused["taken"] is False and 0 < refused["retry_after_s"] <= 1.0
    mono.t += 1.0
    assert probe.cmd_profile({})["seq"] == 2
    idle = HoldersProbe(capture=lambda: pytest.fail("profiled without a backend"), ready=lambda: False)
    assert "backend" in idle.cmd_profile({})["error"] and idle.sample() is None


def test_a_failing_capture_is_reported_and_backed_off():
    mono = Clock(0.0)

    def capture():
        raise RuntimeError("no profiler")

    probe = HoldersProbe(capture=capture, ready=lambda: True, monotonic=mono, interval_s=5.0)
    rec = probe.sample()
    assert rec["error"] == "RuntimeError: no profiler"
    assert probe.sample() is None  # not retried on the next tick
    mono.t = 5.0
    assert probe.sample()["error"]


def test_many_sites_list_the_largest_the_suspects_and_sum_the_rest():
    profiles = []
    for i in range(8):
        samples = [buf(jax_stack((f"f{j}", USER, 1000 + j)), 1, (j + 1) * 1024) for j in range(80)]
        samples.append(buf(jax_stack(("tiny_leak", USER, 7)), i, i))
        profiles.append(make_pprof(samples))
    probe, clock, mono = make_probe(profiles, max_sites=10)
    for i in range(8):
        mono.t = 10.0 * i
        rec = probe.sample()
    listed = [s["site"] for s in rec["sites"]]
    assert listed[:10] == [f"train.py:{1079 - j}" for j in range(10)] and listed[10] == "train.py:7"
    assert rec["sites_total"] == 81 and rec["other"]["sites"] == 70
    assert rec["other"]["bytes"] + sum(s["bytes"] for s in rec["sites"]) == rec["bytes"]


# -- labels ------------------------------------------------------------------------------------------------

@pytest.fixture
def jax_cpu():
    jax = pytest.importorskip("jax")
    return jax


@pytest.fixture
def labels_installed():
    from jaxtop.agent import labels

    agent = FakeAgent()
    registry = labels.install(agent)
    registry.min_interval_s = 0.0
    yield labels, agent
    labels.uninstall()


def test_label_bytes_match_the_tree_and_dropping_frees_it(jax_cpu, labels_installed):
    import jax
    import jax.numpy as jnp
    import numpy as np

    labels, agent = labels_installed
    before = {id(a) for a in jax.live_arrays()}
    params = {"w": jnp.ones((64, 32)), "b": jnp.zeros((32,), jnp.bfloat16), "layers": [jnp.ones((8, 8)) for _ in range(3)],
              "step": 3, "host": np.ones(5)}
    assert labels.label("params", params) is params
    expected = sum(x.nbytes for x in jax.tree_util.tree_leaves(params) if isinstance(x, jax.Array))
    tree = agent.fields["labels"]()["trees"][0]
    assert tree["name"] == "params" and tree["bytes"] == expected == 64 * 32 * 4 + 32 * 2 + 3 * 256
    assert (tree["arrays"], tree["alive"], tree["leaves"]) == (5, 5, 7)
    ids = {id(x) for x in jax.tree_util.tree_leaves(params) if isinstance(x, jax.Array)}
    assert ids <= {id(a) for a in jax.live_arrays()}
    del params
    gc.collect()
    after = {id(a) for a in jax.live_arrays()}
    assert after <= before | (after - ids) and not (ids & after - before)  # the label kept none alive
    assert len([a for a in jax.live_arrays() if a.shape == (64, 32)]) == 0
    tree = agent.fields["labels"]()["trees"][0]
    assert (tree["bytes"], tree["alive"], tree["arrays"]) == (0, 0, 5)


def test_label_replaces_by_name_and_skips_deleted_and_traced_leaves(jax_cpu, labels_installed):
    import jax
    import jax.numpy as jnp

    labels, agent = labels_installed
    a, b = jnp.ones(100), jnp.ones(200)
    labels.label("state", [a])
    labels.label("state", [a, b])
    b.delete()  # e.g. donated to a jitted step
    assert [(t["name"], t["bytes"], t["alive"]) for t in labels.read()] == [("state", 400, 1)]
    seen = []

    @jax.jit
    def f(x):
        labels.label("inside", {"x": x})
        seen.append(1)
        return x + 1

    f(a)
    inside = next(t for t in labels.read() if t["name"] == "inside")
    assert seen and inside["arrays"] == 0 and inside["leaves"] == 1  # a tracer is no device array


def test_label_falls_back_to_ids_for_leaves_without_weak_references(jax_cpu, labels_installed, monkeypatch):
    import jax.numpy as jnp

    import jaxtop.agent.labels as mod

    def no_weakref(obj):
        raise TypeError(f"cannot create weak reference to {type(obj).__name__!r} object")

    labels, agent = labels_installed
    monkeypatch.setattr(mod, "_weak", no_weakref)
    tree = [jnp.ones(10), jnp.ones((2, 3), jnp.int8)]
    labels.label("t", tree)
    assert [(t["bytes"], t["alive"]) for t in labels.read()] == [(46, 2)]
    del tree
    gc.collect()
    assert [(t["bytes"], t["alive"]) for t in labels.read()] == [(0, 0)]  # ids only: nothing kept alive


def test_label_without_an_agent_does_nothing(jax_cpu, monkeypatch):
    import jax
    import jax.numpy as jnp

    from jaxtop.agent import labels

    labels.uninstall()
    monkeypatch.setattr(jax.tree_util, "tree_leaves", lambda *a, **k: pytest.fail("walked the tree"))
    tree = {"w": jnp.ones(3)}
    assert labels.label("params", tree) is tree
    assert labels.read() == []
    stopped = FakeAgent()
    labels.install(stopped)
    stopped.running = False  # the agent stopped: labels stop recording
    assert labels.label("params", tree) is tree and labels.read() == []
    labels.uninstall()


def test_labels_field_sends_changes_and_a_heartbeat(jax_cpu, labels_installed, monkeypatch):
    import jax.numpy as jnp

    import jaxtop.agent.labels as mod

    labels, agent = labels_installed
    now = Clock(1000.0)
    monkeypatch.setattr(mod.time, "monotonic", now)
    assert agent.fields["labels"]() is None  # nothing labelled: no field
    now.t += 1
    x = jnp.ones(10)
    labels.label("x", x)
    assert agent.fields["labels"]()["trees"][0]["bytes"] == 40
    now.t += 1
    assert agent.fields["labels"]() is None  # unchanged
    now.t += 10
    assert agent.fields["labels"]() is not None  # heartbeat for late clients


# -- host syncs (in this process) ---------------------------------------------------------------------------

@pytest.fixture
def host_sync(jax_cpu):
    from jaxtop.probes.host_sync import HostSyncProbe, array_class_state

    before = array_class_state()
    probe = HostSyncProbe()
    probe.start()
    yield probe
    probe.stop()
    after = array_class_state()
    for group in before:
        assert before[group].keys() == after[group].keys(), group
        for name, value in before[group].items():
            assert after[group][name] is value, (group, name)


def here_counts(probe):
    return {k[1]: v for k, v in probe.counts().items() if k[0] == __file__}


def test_host_sync_counts_each_read_once_per_line_and_kind(host_sync):
    import jax
    import jax.numpy as jnp
    import numpy as np

    def fresh(k=1):
        return jnp.arange(4.0) * k + 1

    base = sys._getframe().f_lineno
    a = float(jnp.sum(fresh()))  # +2
    b = jnp.sum(fresh()).item()  # +3
    c = np.asarray(fresh())  # +4
    d = str(fresh())  # +5
    e = [bool(jnp.all(fresh(k) > 0)) for k in range(3)]  # +6
    f = jax.device_get(fresh())  # +7
    g = np.array(fresh())  # +8
    h = f"{jnp.sum(fresh()):.1f}"  # +9
    assert (a, b, c.tolist(), d, e, f.tolist(), g.tolist(), h) == (
        10.0, 10.0, [1, 2, 3, 4], "[1. 2. 3. 4.]", [True] * 3, [1, 2, 3, 4], [1, 2, 3, 4], "10.0")
    counts = here_counts(host_sync)
    assert counts == {
        base + 1: {"float": 1}, base + 2: {"item": 1}, base + 3: {"asarray": 1}, base + 4: {"str": 1},
        base + 5: {"bool": 3}, base + 6: {"device_get": 1}, base + 7: {"array": 1}, base + 8: {"format": 1},
    }
    name = sys._getframe().f_code.co_name
    assert {k[2] for k in host_sync.counts() if k[1] == base + 5} == {f"{name}.<listcomp>"}
    rec = host_sync.snapshot()
    assert rec["available"] and rec["count"] == 10 and rec["by_kind"]["bool"] == 3


def test_host_sync_leaves_results_and_exceptions_alone(host_sync):
    import jax.numpy as jnp
    import numpy as np

    x = jnp.arange(6.0).reshape(2, 3)
    with pytest.raises(TypeError, match="Only scalar arrays"):
        float(x)
    x.delete()
    with pytest.raises(RuntimeError, match="deleted"):
        str(x)
    with pytest.raises(TypeError):
        np.asarray()
    assert np.asarray([1, 2], dtype=np.int8).dtype == np.int8 and np.array(object=[3]).tolist() == [3]
    assert here_counts(host_sync) == {}  # failed reads are not counted


def test_host_sync_hooks_are_cheap_off_the_read_path(host_sync):
    import numpy as np

    host = np.ones(3)
    assert np.asarray(host) is host  # not a jax Array: passed straight through
    assert np.asarray.__wrapped__ is host_sync._orig_np["asarray"] and np.asarray.__name__ == "asarray"


def test_host_sync_stop_restores_and_a_second_probe_stays_off(jax_cpu):
    import jax
    import numpy as np

    from jaxtop.probes.host_sync import HostSyncProbe, array_class_state

    before = array_class_state()
    first, second = HostSyncProbe(), HostSyncProbe()
    first.start()
    second.start()
    assert not second.started and "another" in second.reason
    assert second.snapshot()["available"] is False
    first.stop()
    first.stop()  # twice is fine
    after = array_class_state()
    assert all(after[g][k] is v for g in before for k, v in before[g].items())
    assert jax.Array.__dict__.keys() == before["Array"].keys() and np.asarray is before["numpy"]["asarray"]


# -- fold and report ----------------------------------------------------------------------------------------

def stream(n=24, pid=4242, mark_at=12):
    """A recorded-looking stream: hello, then samples every second with a
    profile every 5th, labels and host syncs, made by the real probe on
    synthetic profiles so that the records are the agent's own."""
    probe, clock, mono = make_probe(leak_profiles(n + 2, leak_per_step=16), interval_s=5.0)
    records = [{"type": "hello", "t": T0, "protocol": 1, "pid": pid, "argv": ["train.py"], "started_t": T0,
                "versions": {"jax": "0.10.2"}, "backend": "cpu", "devices": [{"id": 0, "platform": "cpu"}],
                "interval_s": 1.0, "slow_interval_s": 1.0, "transfer_capture": {"available": True},
                "nvml": {"available": False, "reason": "no driver"}}]
    for k in range(n * 5):
        t = T0 + 1 + k
        clock.t, mono.t = t, float(k)
        if k == mark_at * 5:
            probe.cmd_mark({})
        rec = {"type": "sample", "t": t, "seq": k + 1, "devices": [
            {"id": 0, "platform": "cpu", "source": "live_arrays", "bytes_in_use": 1300 * MiB,
             "live_arrays": {"bytes": 1300 * MiB, "count": 140}}], "process": {"rss_bytes": 2 << 30}}
        holders = probe.sample()
        if holders is not None:
            rec["holders"] = holders
        if k % 5 == 2:
            rec["labels"] = {"t": t, "trees": [
                {"name": "opt_state", "bytes": 2400 * MiB, "arrays": 260, "alive": 260, "leaves": 261, "labelled_t": T0},
                {"name": "params", "bytes": 1200 * MiB, "arrays": 130, "alive": 130, "leaves": 130, "labelled_t": T0},
                {"name": "batch", "bytes": 64 * MiB, "arrays": 2, "alive": 1, "leaves": 2, "labelled_t": t - 1}]}
            rec["host_syncs"] = {"t": t, "available": True, "count": 13 * (k + 1), "by_kind": {"float": 10 * (k + 1), "item": 2 * (k + 1), "asarray": k + 1},
                                 "sites_total": 2, "numpy_hooks": True, "sites": [
                                     {"site": "train.py:131", "function": "train_step", "file": USER, "line": 131, "count": 12 * (k + 1),
                                      "kinds": {"float": 10 * (k + 1), "item": 2 * (k + 1)}, "last_t": t},
                                     {"site": "eval.py:40", "function": "evaluate", "file": "/home/me/proj/eval.py", "line": 40, "count": k + 1,
                                      "kinds": {"asarray": k + 1}, "last_t": t}]}
        records.append(rec)
    return records


def test_fold_keeps_history_mark_suspects_labels_and_syncs():
    view = fold_records(stream())
    assert view.profiles == 24 and view.t == T0 + 116  # every 5 s; the mark's profile took #12's turn
    by_site = {s.site: s for s in view.sites}
    leak = by_site["train.py:120"]
    assert leak.suspect and leak.growth.count_per_min == pytest.approx(16 * 12)
    assert leak.history[-3:] == (21 * 16 * 32768.0, 22 * 16 * 32768.0, 23 * 16 * 32768.0)
    assert len(leak.history) == 24 and leak.history[0] == 0.0
    assert view.suspects == (leak,)
    assert leak.mark_count == 16 * (23 - 12) and by_site["train.py:10"].mark_bytes == 0
    assert view.mark_t == T0 + 61 and view.mark_bytes == 32 * MiB + 16 * 11 * 32768  # one more batch in flight
    assert by_site["train.py:10"].share == pytest.approx(1200 * MiB / view.bytes)
    assert [t.name for t in view.labels] == ["opt_state", "params", "batch"]
    sync = view.syncs[0]
    assert (sync.site, sync.count, sync.per_s) == ("train.py:131", 12 * 118, pytest.approx(12.0))
    assert view.syncs_total == 13 * 118 and view.syncs_by_kind["float"] == 1180


def test_fold_ignores_other_records_and_bad_fields():
    fold = HoldersFold()
    assert not fold.feed({"type": "hello", "t": 1.0})
    assert fold.feed({"type": "sample", "t": 2.0, "holders": {"error": "no profiler", "t": 2.0}})
    assert fold.view().error == "no profiler" and fold.view().t is None
    fold.feed({"type": "sample", "t": 3.0, "holders": {"t": 3.0, "sites": ["junk", {"site": "x.py:1"}], "bytes": "?"},
               "labels": {"trees": [None, {"name": "p"}]}, "host_syncs": {"sites": [1], "available": False, "reason": "r"}})
    view = fold.view()
    assert [s.site for s in view.sites] == ["x.py:1"] and view.labels[0].name == "p" and view.syncs_reason == "r"
    assert fold.view() is view  # cached until the next change


def render(renderable, width=120) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def test_report_shows_sites_suspects_mark_labels_and_syncs_at_any_width():
    view = fold_records(stream())
    text = render(HoldersReport(view), 140)
    assert "⚠ leak suspect train.py:120 log_metrics: +192 arrays/min, +6.00 MiB/min, for 1m55s" in text
    assert "since mark (59s ago): +37.5 MiB, +177 buffers" in text
    lines = text.splitlines()
    rows = [l for l in lines if l.strip().startswith(("train.py", "data.py", "⚠")) and "leak suspect" not in l]
    assert rows[0].lstrip().startswith("train.py:14") and "init_opt_state" in rows[0] and "2.34 GiB" in rows[0]
    assert "train.py:120" in rows[3] and "+6.00 MiB/min" in rows[3] and "+5.50 MiB" in rows[3]
    assert "opt_state" in text and "2.34 GiB" in text and "1/2" in text  # batch: one of two arrays alive
    assert "train.py:131" in text and "float 1,180, item 236" in text
    for width in (60, 80, 200):
        narrow = render_holders(view, width)
        assert "train.py:120" in narrow and "leak suspect" in narrow and "Named pytrees" in narrow
        assert max(len(l) for l in narrow.splitlines()) <= width
    assert "No holders data yet" in render(HoldersReport(None))
    one = render(HoldersReport(view, device="cpu:0"), 120)
    assert "on cpu:0" in one


def test_sparkline_tells_gone_from_unknown():
    assert sparkline([0, 1, 2, 4, 8], 5).plain == "▁▁▂▄█"
    assert sparkline([None, 4, 0], 4).plain == " ·█▁"


# -- the Holders screen in the app ------------------------------------------------------------------------

try:
    from jaxtop.dashboard.model import ProcessModel

    MODEL_FOLDS = hasattr(ProcessModel(1), "holders")  # the model folds holders itself once wired
except Exception:  # pragma: no cover
    MODEL_FOLDS = False


def app_with_holders():
    from jaxtop.dashboard.app import make_app
    from jaxtop.dashboard.sources import PushSource

    src = PushSource()
    app = make_app(src, refresh_s=0.05)
    return src, app


def feed_app(src, records, pid=4242):
    fold = HoldersFold()
    for rec in records:
        src.push(pid, rec, update=False)
        fold.feed(rec)
    src.on_update()
    return fold


async def open_holders(pilot, app, src, fold):
    await pilot.press("H")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the view arrives with the app's next snapshot
        await pilot.pause(0.05)
        if isinstance(app.screen, HoldersScreen):
            app.screen.refresh_view()
            if app.screen.view is not None and app.screen.view.profiles == 24:
                break
    assert isinstance(app.screen, HoldersScreen) and app.screen.view.profiles == 24
    return app.screen


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    time.tzset()


async def test_holders_screen_keys_send_commands_and_filter_devices():
    src, app = app_with_holders()
    async with app.run_test(size=(120, 40)) as pilot:
        fold = feed_app(src, stream())
        screen = await open_holders(pilot, app, src, fold)
        body = render(screen.query_one("#holders-body").content, 118)
        assert "train.py:120" in body and "leak suspect" in body and "opt_state" in body
        await pilot.press("m")
        assert src.commands[-1][1:] == ("holders_mark", {})
        await pilot.press("M")
        assert src.commands[-1][1:] == ("holders_mark", {"clear": True})
        await pilot.press("r")
        assert src.commands[-1][1] == "holders_profile"
        await pilot.press("v")
        assert screen.device == "cpu:0"
        assert "on cpu:0" in render(screen.query_one("#holders-body").content, 118)
        await pilot.press("v")
        assert screen.device is None
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, HoldersScreen)


def test_holders_screen_snapshot(snap_compare, utc):
    src, app = app_with_holders()

    async def run_before(pilot):
        fold = feed_app(src, stream())
        await open_holders(pilot, app, src, fold)
        app.screen.refresh_view()
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=(120, 40), run_before=run_before)


# -- real programs ---------------------------------------------------------------------------------------------

def marker_lines(path: Path, tag: str) -> dict[str, int]:
    """``# TAG:name`` markers of a target -> line numbers."""
    out = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = re.search(rf"# {tag}:?(\w*)", line)
        if m:
            out[m.group(1) or tag] = n
    return out


def read_log(path: Path) -> list[dict]:
    out = []
    if path.exists():
        for line in path.read_bytes().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # the last line may be half written
    return out


def holders_records(path: Path) -> list[dict]:
    return [r["holders"] for r in read_log(path) if r.get("type") == "sample" and isinstance(r.get("holders"), dict)]


def start(script: str, env, *args, stdin=None):
    return subprocess.Popen([PY, str(TARGETS / script), *map(str, args)], env=env, stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def read_line(proc, prefix: str, timeout=30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if not line:
            break
        if line.startswith(prefix):
            return line.strip()
    raise AssertionError(f"no {prefix!r} line; stderr: {proc.stderr.read().decode()[-2000:] if proc.poll() is not None else ''}")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_leaking_program_is_flagged_at_the_leaking_line_with_its_rate(child_env, tmp_path):
    from jaxtop.wire.client import AgentConnection

    log = tmp_path / "leak.jsonl"
    period = 0.05  # one float32[256] every 50 ms: 1200 arrays/min, 1200 KiB/min
    proc = start("holders_leak.py", child_env, "--log", log, "--leak", "--period", period, "--seconds", 25)
    try:
        read_line(proc, "ready")
        line = marker_lines(TARGETS / "holders_leak.py", "LEAK")["LEAK"]

        def flagged():
            for rec in holders_records(log):
                if any(s.get("suspect") for s in rec["sites"]):
                    return rec
            return None

        rec = wait_for(flagged, timeout=20, what="a leak suspect")
        suspects = [s for s in rec["sites"] if s.get("suspect")]
        assert [(s["site"], s["function"]) for s in suspects] == [(f"holders_leak.py:{line}", "log_metrics")]
        growth = suspects[0]["growth"]
        assert growth["count_per_min"] == pytest.approx(60 / period, rel=0.1)
        assert growth["bytes_per_min"] == pytest.approx(1024 * 60 / period, rel=0.1)
        events = [e for r in read_log(log) if r.get("type") == "sample" for e in r.get("events") or []]
        assert any(e["kind"] == "leak_suspect" and f"holders_leak.py:{line} log_metrics" in e["text"] for e in events)

        with AgentConnection.open(proc.pid) as conn:
            conn.send_command("holders_mark", {})
            seen = holders_records(log)[-1]["seq"]

            def marked_later():
                recs = [r for r in holders_records(log) if r["seq"] > seen + 1 and "mark" in r]
                return recs[-1] if recs else None

            after = wait_for(marked_later, timeout=10, what="a record after the mark")
        leak = next(s for s in after["sites"] if s["site"] == f"holders_leak.py:{line}")
        assert leak["mark"]["count"] > 0 and leak["mark"]["bytes"] == 1024 * leak["mark"]["count"]
        steady = [s for s in after["sites"] if s["site"] != f"holders_leak.py:{line}" and not s.get("library")]
        assert all(abs(s["mark"]["count"]) <= 2 for s in steady), steady
    finally:
        proc.kill()
        proc.communicate(timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_steady_program_is_never_flagged(child_env, tmp_path):
    log = tmp_path / "steady.jsonl"
    proc = start("holders_leak.py", child_env, "--log", log, "--seconds", 9)
    try:
        read_line(proc, "ready")
        proc.wait(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
    records = holders_records(log)
    assert len(records) >= 12  # a profile every 0.5 s over 9 s
    assert not [s for rec in records for s in rec["sites"] if s.get("suspect")]
    prefetch = marker_lines(TARGETS / "holders_leak.py", "PREFETCH")["PREFETCH"]
    counts = [s["count"] for rec in records for s in rec["sites"] if s["line"] == prefetch and s["function"] == "<module>"]
    assert len(set(counts)) > 1  # the queue did go up and down while nothing was flagged
    assert not [e for r in read_log(log) if r.get("type") == "sample" for e in r.get("events") or []
                if e["kind"] == "leak_suspect"]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_site_bytes_and_labels_match_the_programs_own_accounting(child_env, tmp_path):
    log = tmp_path / "sites.jsonl"
    path = TARGETS / "holders_sites.py"
    proc = start("holders_sites.py", child_env, "--log", log, stdin=subprocess.PIPE)
    try:
        ready_t = float(read_line(proc, "ready").split()[1])
        lines = marker_lines(path, "SITE")

        def profiled():
            recs = [r for r in holders_records(log) if r["t"] > ready_t]
            return recs[0] if recs else None

        rec = wait_for(profiled, timeout=20, what="a profile after ready")
        truth = next(r["truth"] for r in read_log(log) if r.get("type") == "sample" and "truth" in r)["truth"]
        per_line: dict[int, list] = {}
        for site in rec["sites"]:
            if site["file"] == str(path):
                got = per_line.setdefault(site["line"], [0, 0, {}])
                got[0] += site["bytes"]
                got[1] += site["count"]
                for dev, (b, _c) in site["devices"].items():
                    got[2][dev] = got[2].get(dev, 0) + b
        for name, want in truth.items():
            got = per_line.get(lines[name])
            assert got is not None, (name, per_line)
            assert (got[0], got[1]) == (want["bytes"], want["count"]), name
            if "devices" in want:
                assert sorted(got[2].values()) == sorted(want["devices"].values())
        labelled = wait_for(lambda: next((r["labels"] for r in read_log(log) if r.get("type") == "sample" and r.get("labels")), None),
                            timeout=10, what="a labels field")
        assert labelled["trees"][0]["name"] == "params" and labelled["trees"][0]["bytes"] == truth["params"]["bytes"]

        proc.stdin.write(b"\n")
        proc.stdin.flush()
        dropped_t = float(read_line(proc, "dropped").split()[1])

        def freed():
            recs = [r for r in read_log(log) if r.get("type") == "sample" and r["t"] > dropped_t]
            lab = [r["labels"] for r in recs if r.get("labels")]
            prof = [r["holders"] for r in recs if r.get("holders")]
            return (lab[-1], prof[-1]) if lab and prof else None

        lab, prof = wait_for(freed, timeout=15, what="labels and a profile after the drop")
        assert lab["trees"][0]["bytes"] == 0 and lab["trees"][0]["alive"] == 0
        assert not [s for s in prof["sites"] if s["file"] == str(path) and s["line"] == lines["params"]]
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
    # The exports carry the profiles and the labels: the same bytes per site and per tree.
    site_rows = _export(log, "holders-csv", tmp_path)
    at = [r for r in site_rows if float(r["t"]) == rec["t"] and r["file"] == str(path)]
    for name, want in truth.items():
        mine = [r for r in at if int(r["line"]) == lines[name]]
        assert (sum(int(r["bytes"]) for r in mine), sum(int(r["count"]) for r in mine)) == (want["bytes"], want["count"])
    tree_rows = _export(log, "labels-csv", tmp_path)
    assert any(r["name"] == "params" and int(r["bytes"]) == truth["params"]["bytes"] for r in tree_rows)
    assert [r for r in tree_rows if r["name"] == "params"][-1]["bytes"] == "0"  # dropped: freed
    trace = _export(log, "perfetto", tmp_path)
    labelled = [e["args"] for e in trace["traceEvents"] if e.get("name") == "labelled trees (bytes)"]
    assert any(a.get("params") == truth["params"]["bytes"] for a in labelled) and labelled[-1]["params"] == 0
    assert any(e.get("name") == "memory by allocation site (bytes)" for e in trace["traceEvents"])


def _export(log, fmt: str, tmp_path):
    """``jaxtop export`` of a recording: CSV rows as dicts, or the trace's JSON."""
    import csv

    out = tmp_path / f"export.{fmt}"
    res = subprocess.run([PY, "-m", "jaxtop", "export", str(log), "--format", fmt, "-o", str(out)],
                         capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr.decode()
    if fmt == "perfetto":
        return json.loads(out.read_text())
    with open(out, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_host_syncs_counted_per_line_with_the_output_unchanged(child_env, tmp_path):
    path = TARGETS / "holders_syncs.py"
    log = tmp_path / "syncs.jsonl"
    with_probe = subprocess.run([PY, str(path), "--log", str(log)], env=child_env, capture_output=True, timeout=60)
    without = subprocess.run([PY, str(path), "--no-probe"], env=child_env, capture_output=True, timeout=60)
    value_only = subprocess.run([PY, str(path), "--numpy-hooks", "off"], env=child_env, capture_output=True, timeout=60)
    for run in (with_probe, without, value_only):
        assert run.returncode == 0, run.stderr.decode()[-2000:]
    out_with = with_probe.stdout.decode().splitlines()
    out_without = without.stdout.decode().splitlines()
    assert "restored True" in out_with  # jax.Array and numpy exactly as before start()
    program_output = [l for l in out_with if not l.startswith(("counts ", "restored "))]
    assert program_output == [l for l in out_without if not l.startswith(("counts ", "restored "))]
    lines = {k: str(v) for k, v in marker_lines(path, "READ").items()}
    expected = {
        lines["float"]: {"float": 3}, lines["item"]: {"item": 1}, lines["asarray"]: {"asarray": 1},
        lines["print"]: {"str": 1}, lines["bool"]: {"bool": 2}, lines["int"]: {"int": 1},
        lines["tolist"]: {"tolist": 1},
        lines["sharded"]: {"asarray": 2},  # 2 arrays read twice each: the second read is jax's host copy
        lines["replicated"]: {"item": 1},
    }
    counts = json.loads(next(l for l in out_with if l.startswith("counts "))[len("counts "):])
    assert counts == expected
    streamed = [r["host_syncs"] for r in read_log(log) if r.get("type") == "sample" and r.get("host_syncs")]
    final = streamed[-1]
    got = {str(s["line"]): s["kinds"] for s in final["sites"] if s["file"] == str(path)}
    assert got == expected and final["available"] and final["numpy_hooks"]
    # The export carries them: a row per reading line of each record, and a counter in the trace.
    rows = _export(log, "host-syncs-csv", tmp_path)
    last_t = max(float(r["t"]) for r in rows)
    exported = {r["line"]: dict(kv.split("=") for kv in r["kinds"].split()) for r in rows
                if float(r["t"]) == last_t and r["file"] == str(path)}
    assert exported == {line: {k: str(v) for k, v in kinds.items()} for line, kinds in expected.items()}
    trace = _export(log, "perfetto", tmp_path)
    reads = [e["args"]["total"] for e in trace["traceEvents"] if e.get("name") == "host reads of device arrays"]
    assert reads and reads[-1] == final["count"]
    # With the _value hook alone (the GPU case), reads numpy takes through
    # __array__ count exactly once too; single-device CPU arrays go unseen.
    out_value = value_only.stdout.decode().splitlines()
    assert "restored True" in out_value
    counts = json.loads(next(l for l in out_value if l.startswith("counts "))[len("counts "):])
    assert counts == {k: v for k, v in expected.items() if k not in (lines["item"], lines["asarray"])}
