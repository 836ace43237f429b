"""Holders: memory by allocation site and leak suspects (probes/holders.py),
named pytrees (jaxtop/agent/labels.py), host syncs (probes/host_sync.py), their
fold (jaxtop/dashboard/holders.py) and the Holders screen.

Pure layers run on synthetic pprof profiles; the probes also run in this
process on the CPU backend; ``slow`` tests start real programs
(tests/targets/holders_*.py) and read what their agent recorded.
"""

from __future__ import annotations

import os
import sys

import pytest

from jaxtop.probes.holders import (
    GrowthTracker, HoldersProbe, LibraryFilter, aggregate_profile, describe_growth, pick_site, site_text,
)


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

def run_tracker(series, rises=5, dt=5.0, steep_bytes_per_min=None):
    """``series``: one {site: (bytes, count)} per profile; returns the tracker and, per profile, the suspects.

    The rule of ``rises`` alone by default: the steep rule, which flags
    fast growth sooner, has its own tests (test_leak_early.py)."""
    tracker = GrowthTracker(rises, steep_bytes_per_min=steep_bytes_per_min)
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
    # The level is the floor of the last FLOOR_PROFILES (3) profiles: it
    # rises from the 3rd profile on, and the 5th rise is the 7th profile.
    assert flagged[6] == [] and flagged[7] == ["log_metrics"]
    assert all(f == ["log_metrics"] for f in flagged[7:])
    growth = tracker.growth(B)
    assert growth["count_per_min"] == pytest.approx(768) and growth["bytes_per_min"] == pytest.approx(24 * MiB)
    assert growth["for_s"] == pytest.approx(45.0) and growth["rises"] == 9
    assert describe_growth(B, growth) == "train.py:120 log_metrics: +768 arrays/min, +24.0 MiB/min, for 45 s"


def test_a_slow_leak_on_the_steps_own_line_survives_mid_step_profiles():
    """The line that calls an NNX/optax step allocates the next model and
    optimizer state there: a profile taken mid-step sees both generations
    (measured: 10.5 MB -> 20.4 MB -> 10.5 MB). The 1 KiB/step leak kept on
    that line must stay flagged through it (before: un-flagged for 5 profiles
    after each such profile)."""
    state = 10 * MiB
    series = []
    for i in range(80):
        nbytes, count = state + i * 22 * 1024, 50 + i * 22  # 22 steps of 1 KiB between profiles
        if i % 11 == 10:
            nbytes, count = nbytes + state, count + 30  # mid-step: the new state beside the old
        series.append({B: (nbytes, count)})
    _, flagged = run_tracker(series)
    first = next(i for i, f in enumerate(flagged) if f)
    assert first <= 8 and all(flagged[first:]), flagged


def test_a_slow_leak_stays_flagged_and_a_finished_warmup_is_cleared():
    # One array every 4th profile, for 60 profiles: flagged from its 5th rise on, never dropped.
    slow = [{B: ((i // 4) * 1024, i // 4)} for i in range(60)]
    _, flagged = run_tracker(slow)
    first = next(i for i, f in enumerate(flagged) if f)
    assert first == 22 and all(flagged[first:])  # the floor of 3 profiles rises at 22, not 20
    # Six rises in a row, then a plateau: flagged while growing, cleared 5 flat profiles later.
    warm = [{A: (min(i, 6) * MiB, min(i, 6))} for i in range(20)]
    _, flagged = run_tracker(warm)
    assert flagged[6] == [] and flagged[7] == ["params"] and flagged[8] == ["params"]
    assert flagged[13] == ["params"] and not any(flagged[14:])


def test_a_fall_ends_the_run_and_gone_sites_are_forgotten():
    # A fall below the floor of the last 3 profiles (a single dip is one).
    series = [{B: (i, i)} for i in range(6)] + [{B: (1, 1)}] + [{B: (i, i)} for i in range(2, 8)]
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
    probe, clock, mono = make_probe(leak_profiles(4), cost=0.080, interval_s=5.0)  # a profile takes 80 ms
    rec = probe.sample()
    assert rec["seq"] == 1 and rec["seconds"] == pytest.approx(0.08)
    # Every site is new: nothing can be told before its 3rd profile, so the
    # first ones come on the watch budget (80 ms is 0.4 % of 20 s), paid from its allowance.
    assert rec["interval_s"] == pytest.approx(20.0) and rec["cadence"] == "young"
    mono.t += 20.0
    assert probe.sample()["cadence"] == "young"
    mono.t += 20.0
    rec = probe.sample()
    assert rec["seq"] == 3 and rec["cadence"] == "base"
    assert rec["interval_s"] == pytest.approx(200.0)  # 80 ms is 0.04 % of 200 s, more than the 5 s base
    mono.t += 5.0
    assert probe.sample() is None  # 5 s later: not yet
    mono.t += 194.0
    assert probe.sample() is None
    mono.t += 1.0
    assert probe.sample()["seq"] == 4


def test_probe_records_sites_suspects_an_event_and_a_mark():
    agent = FakeAgent()
    probe, clock, mono = make_probe(leak_profiles(20), interval_s=5.0)
    probe.install(agent)
    assert set(agent.fields) == {"holders"} and set(agent.commands) == {"holders_mark", "holders_profile", "holders_who"}
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
    # Watched first (two rises), then flagged: 24 MiB/min is steep, so after 3 rises, not 5.
    assert [e["kind"] for e in agent.events] == ["leak_watch", "leak_suspect"]
    assert agent.events[0]["text"].startswith("watching: train.py:120 log_metrics: +24.0 MiB/min, +768 arrays/min over ")
    assert agent.events[1]["text"].startswith("leak suspect: train.py:120 log_metrics: +768 arrays/min")

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


def test_the_profile_after_a_mark_comes_soon_whatever_the_back_off():
    """A profile that costs 80 ms backs the cadence off to 200 s; a mark is
    itself a profile (every site ±0 against it), so without a sooner one
    the Holders screen showed zeros until the backed-off one."""
    probe, clock, mono = make_probe(leak_profiles(12), cost=0.080, interval_s=5.0)
    for _ in range(3):
        rec = probe.sample()
        mono.t += rec["interval_s"]
    assert rec["cadence"] == "base" and rec["interval_s"] == pytest.approx(200.0)
    mono.t += 1.0
    reply = probe.cmd_mark({})
    assert reply["seq"] == 4
    marked = probe.sample()
    assert marked["reason"] == "mark" and marked["cadence"] == "marked"
    assert marked["interval_s"] <= 20.0  # the watch budget's period for 80 ms, not 200 s
    mono.t += marked["interval_s"]
    after = probe.sample()
    assert after is not None and after["seq"] == 5 and after["mark"]["seq"] == 4


# -- the records as the dashboard decodes them (jaxtop.wire.records.holders) ----------------------------

def assert_decoded_whole(raw, typed, where="part"):
    """Every key and value ``raw`` (what a producer wrote) holds is in
    ``typed`` (its decoded part), field by field: none was dropped as
    unknown nor read n/a."""
    import msgspec

    if isinstance(typed, msgspec.Struct):
        assert isinstance(raw, dict), where
        for key, value in raw.items():
            assert hasattr(typed, key), f"{where}.{key}: no such field"
            assert_decoded_whole(value, getattr(typed, key), f"{where}.{key}")
    elif isinstance(raw, dict):
        assert isinstance(typed, dict) and typed.keys() == raw.keys(), where
        for key, value in raw.items():
            assert_decoded_whole(value, typed[key], f"{where}.{key}")
    elif isinstance(raw, list):
        assert isinstance(typed, (list, tuple)) and len(typed) == len(raw), where
        for i, (value, item) in enumerate(zip(raw, typed)):
            assert_decoded_whole(value, item, f"{where}[{i}]")
    else:
        assert typed == raw and type(typed) is type(raw), (where, raw, typed)


def test_the_probes_records_decode_whole_mark_growth_and_suspects_included():
    from jaxtop.wire.records import Holders, from_dict

    probe, clock, mono = make_probe(leak_profiles(14, leak_per_step=16), interval_s=5.0)
    keys = set()
    for i in range(14):
        clock.t, mono.t = T0 + 5.0 * i, 5.0 * i
        if i == 6:
            probe.cmd_mark({})
        raw = probe.sample()
        rec = from_dict({"type": "sample", "t": clock.t, "holders": raw})
        assert rec.odd == () and isinstance(rec.holders, Holders)
        assert_decoded_whole(raw, rec.holders, "holders")
        keys |= set(raw) | {k for site in raw["sites"] for k in site}
    assert {"mark", "growth", "suspect", "other", "by_device", "executables", "devices"} <= keys, keys
