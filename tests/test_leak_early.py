"""Steep leaks are watched, then flagged, within ~30 s, whatever a profile costs.

A 38 MiB/min leak used to be flagged after 5 rises of its floor, with the
holders probe's period backing off as each profile got costlier (5, 21,
49 s): minutes, and nothing said meanwhile. Now a site that has started
rising is **watched** (``watching``, a ``leak_watch`` event), steep growth
is flagged after 3 rises, and the cadence does not back off while sites are
new or memory climbs, paid from a bounded allowance. These tests drive the
tracker and the probe on synthetic profiles with fake clocks (the costs of
the profiles given), and one runs a real leaking program under the default
agent.
"""

from __future__ import annotations

import json
import random
import subprocess
import time

import pytest

from conftest import PY
from jaxtop.probes import holders as holders_mod
from jaxtop.probes.holders import GrowthTracker, HoldersProbe
from test_holders import DATA, USER, MiB, T0, buf, jax_stack, make_pprof

LEAK = (USER, 120, "log_metrics")
BATCH = (DATA, 31, "next_batch")


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


# -- the tracker: steep growth, watching ---------------------------------------------------------------------

def feed(series, dt=5.0, **kw):
    """One profile per entry of ``series`` every ``dt`` s; per profile, (suspects, watched, new watched)."""
    tracker = GrowthTracker(**kw)
    out = []
    for i, sites in enumerate(series):
        tracker.update(T0 + i * dt, sites)
        out.append((tracker.suspects(), tracker.watching(), list(tracker.new_watching)))
    return tracker, out


def test_steep_growth_is_watched_at_two_rises_and_flagged_at_three_with_its_true_rate():
    # 38 MiB/min, a profile every 5 s: 3.17 MiB per profile. The floor of 3
    # profiles rises from the 3rd on: rise 2 at #4, rise 3 at #5 (was #7).
    step = 38 * MiB * 5 // 60
    series = [{LEAK: (i * step, i * 50)} for i in range(10)]
    tracker, out = feed(series)
    first_watch = next(i for i, (_, w, _) in enumerate(out) if w)
    first_flag = next(i for i, (s, _, _) in enumerate(out) if s)
    assert (first_watch, first_flag) == (4, 5)
    assert out[4][2] == [LEAK]  # said once, when it started
    assert not out[5][1]  # a suspect is no longer "watching"
    growth = tracker.growth(LEAK)
    assert growth["bytes_per_min"] == pytest.approx(38 * MiB, rel=0.01)


def test_the_rate_stays_true_when_the_cadence_changes():
    # A level is timed by the profile that holds it: timed at the latest
    # profile, the rate doubled when the period went from 5 s to 2.5 s.
    tracker = GrowthTracker()
    times = [0, 5, 10, 15, 17.5, 20, 22.5, 25, 27.5]
    for t in times:
        tracker.update(T0 + t, {LEAK: (int(t * 38 * MiB / 60), int(t * 10))})
    assert tracker.growth(LEAK)["bytes_per_min"] == pytest.approx(38 * MiB, rel=0.02)
    assert tracker.growth(LEAK)["count_per_min"] == pytest.approx(600, rel=0.02)


def test_slow_growth_still_waits_for_five_rises_and_a_burst_of_profiles_is_no_evidence():
    # 6 MiB/min is below steep: flagged at the 5th rise, as before.
    step = 6 * MiB * 5 // 60
    _, out = feed([{LEAK: (i * step, i)} for i in range(10)])
    assert next(i for i, (s, _, _) in enumerate(out) if s) == 7
    # Steep, but over profiles 1 s apart (commands): 3 rises span 3 s, not 10.
    _, out = feed([{LEAK: (i * 4 * MiB, i)} for i in range(8)], dt=1.0, steep_rises=3)
    assert next(i for i, (s, _, _) in enumerate(out) if s) == 7  # the rule of 5 rises


def test_a_steep_warmup_that_stops_is_cleared_and_two_rises_are_only_watched():
    warm = [{LEAK: (min(i, 6) * 8 * MiB, min(i, 6))} for i in range(20)]
    _, out = feed(warm)
    flagged = [bool(s) for s, _, _ in out]
    # Flagged at the 3rd rise, kept while the run grows (6 rises: the rule of
    # 5 too), cleared 5 flat profiles after the last rise.
    assert flagged.index(True) == 5 and flagged[13] and not any(flagged[14:])
    # Two rises, then flat: watched, never flagged, then no longer watched.
    short = [{LEAK: (min(i, 4) * 8 * MiB, 1)} for i in range(15)]
    _, out = feed(short)
    assert not any(s for s, _, _ in out)
    watched = [bool(w) for _, w, _ in out]
    assert watched[4] and not any(watched[9:])


@pytest.mark.parametrize("seed", range(5))
def test_batches_coming_and_going_are_never_flagged_and_watched_once_at_most(seed):
    # An hour of 1 to 3 batches of 32 MiB in flight. Their floor can rise
    # twice in a row by chance (1, 2, 3 in flight) but above every level
    # before only until it has reached the top of its band once.
    rng = random.Random(seed)
    tracker = GrowthTracker()
    watch_starts = climbing = 0
    for i in range(720):
        n = rng.randint(1, 3)
        tracker.update(T0 + 5 * i, {BATCH: (n * 32 * MiB, n), (USER, 10, "params"): (1200 * MiB, 130)})
        assert not tracker.suspects(), i
        watch_starts += len(tracker.new_watching)
        climbing += tracker.climbing()
    assert watch_starts <= 1
    # The cadence is hurried (half the period, from the allowance) seldom.
    assert climbing <= 20, climbing


# -- the probe: cadence and its cost ---------------------------------------------------------------------

def simulate(seconds, leak_mib_per_min=38.0, leak_from=0.0, cost0=0.0015, cost_sqrt_mib=0.004, batches=True,
             tick=0.1):
    """The default probe (the agent's) on synthetic profiles of a program
    whose leak makes each profile costlier (8.6 ms at 3 MiB held, 18 ms at
    17 MiB: the back-off went 5, 21, 45 s), sampled every ``tick``.

    Returns:
        (events as (t, kind, text), profiles as (t, seconds, cadence), probe)
    """
    clock, mono, timer = Clock(T0), Clock(0.0), Clock(0.0)
    rng = random.Random(0)

    def capture():
        leaked = max(0.0, mono.t - leak_from) * leak_mib_per_min / 60 * MiB
        n = int(leaked // (64 * 1024))
        timer.t += cost0 + cost_sqrt_mib * (leaked / MiB) ** 0.5
        samples = [buf(jax_stack(("init_params", USER, 10)), 130, 1200 * MiB)]
        if batches:
            k = rng.randint(1, 3)
            samples.append(buf(jax_stack(("next_batch", DATA, 31)), k, k * 32 * MiB))
        if n:
            samples.append(buf(jax_stack(("log_metrics", USER, 120)), n, n * 64 * 1024))
        return make_pprof(samples)

    events, profiles = [], []
    probe = HoldersProbe(capture=capture, ready=lambda: True, clock=clock, monotonic=mono, timer=timer,
                         on_suspect=lambda text: events.append((mono.t, "leak_suspect", text)),
                         on_watch=lambda text: events.append((mono.t, "leak_watch", text)))
    for i in range(int(seconds / tick)):
        mono.t = i * tick
        clock.t = T0 + mono.t
        rec = probe.sample()
        if rec is not None:
            profiles.append((mono.t, rec["seconds"], rec["cadence"]))
    return events, profiles, probe


def test_costly_profiles_no_longer_delay_the_flag_of_a_steep_leak():
    # Before: profiles at 0, 5, 26.6, 71.4, 142.4, 241.2 s and no flag in 300 s.
    events, profiles, _ = simulate(300.0)
    kinds = [(k, t) for t, k, _ in events]
    assert [k for k, _ in kinds] == ["leak_watch", "leak_suspect"], events
    (_, watched_t), (_, flagged_t) = kinds
    assert watched_t < flagged_t <= 30.0, kinds
    text = events[1][2]
    assert text.startswith("leak suspect: train.py:120 log_metrics: ")
    rate = float(text.split("arrays/min, +")[1].split(" MiB/min")[0])
    assert rate == pytest.approx(38.0, rel=0.1), text
    # Flagged: the suspect explains the climb, and the cadence backs off again.
    assert profiles[-1][2] == "base"


def test_a_leak_that_starts_later_at_a_new_line_is_flagged_as_soon():
    events, _, _ = simulate(400.0, leak_from=150.0)
    flagged = [t for t, k, _ in events if k == "leak_suspect"]
    assert flagged and flagged[0] - 150.0 <= 35.0, events


def test_profiling_stays_within_twice_its_budget_whatever_memory_does():
    # Three hours of a program whose batches swing by 64 MiB and of one that
    # leaks: what the probe spent profiling, against budget + watch share
    # (0.04 % + 0.04 % of the time) plus the allowance's first fill.
    hours = 3 * 3600.0
    for leak in (0.0, 38.0):
        _, profiles, probe = simulate(hours, leak_mib_per_min=leak, cost0=0.02, cost_sqrt_mib=0.0005, tick=1.0)
        bound = (holders_mod.DEFAULT_BUDGET + holders_mod.WATCH_SHARE) * hours + holders_mod.WATCH_CREDIT_S
        assert probe.wall_s_total <= bound, (leak, probe.wall_s_total, bound)
        assert probe.watch_s_total <= holders_mod.WATCH_SHARE * hours + holders_mod.WATCH_CREDIT_S
    # A steady program pays for its first profiles only.
    _, profiles, probe = simulate(3600.0, leak_mib_per_min=0.0, batches=False, cost0=0.02, tick=1.0)
    assert [c for _, _, c in profiles[:3]] == ["young", "young", "base"]
    assert probe.watch_profiles == 2 and {c for _, _, c in profiles[2:]} == {"base"}


def test_the_record_says_watching_and_the_cadence():
    agent_events = []

    class Agent:
        def post_event(self, kind, **fields):
            agent_events.append((kind, fields["text"]))

        def add_probe(self, probe):
            pass

    clock, mono, timer = Clock(T0), Clock(0.0), Clock(0.0)
    step = 38 * MiB * 5 // 60
    profiles = iter([make_pprof([buf(jax_stack(("log_metrics", USER, 120)), i + 1, (i + 1) * step)]) for i in range(8)])
    probe = HoldersProbe(capture=lambda: next(profiles), ready=lambda: True, clock=clock, monotonic=mono, timer=timer)
    probe.install(Agent())
    records = []
    for i in range(8):
        mono.t, clock.t = 5.0 * i, T0 + 5.0 * i
        records.append(probe.sample())
    watched = [r for r in records if r["watching"]]
    assert watched and watched[0]["sites"][0]["watching"] is True and "suspect" not in watched[0]["sites"][0]
    assert any(r["cadence"] == "climbing" for r in records)
    assert [k for k, _ in agent_events] == ["leak_watch", "leak_suspect"]
    assert agent_events[0][1].startswith("watching: train.py:120 log_metrics: +38.0 MiB/min")


# -- a real program under the default agent ---------------------------------------------------------------

LEAKING = """
import sys, time
import jax, jax.numpy as jnp, numpy as np
step = jax.jit(lambda w, x: w + 0.001 * jnp.tanh(x @ w))
w = jnp.ones((256, 256))
kept = []
t0 = nxt = time.time()
print("ready", flush=True)
while time.time() - t0 < float(sys.argv[1]):
    x = jax.device_put(np.ones((256, 256), np.float32))
    w = step(w, x); w.block_until_ready()
    while time.time() >= nxt:
        kept.append(jax.device_put(np.full((16384,), len(kept), np.float32)))  # LEAK: 64 KiB / 0.1 s = 37.5 MiB/min
        nxt += 0.1
    time.sleep(0.01)
"""


def _events_and_first_profile(log):
    first, events = None, []
    for line in log.read_bytes().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # the last line may be half written
        if rec.get("type") != "sample":
            continue
        holders = rec.get("holders")
        if first is None and isinstance(holders, dict) and "seq" in holders:
            first = holders["t"]
        events += [e for e in rec.get("events") or [] if e.get("kind") in ("leak_watch", "leak_suspect")]
    return first, events


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_real_38_mib_per_min_leak_is_watched_then_flagged_within_30_s(child_env, tmp_path):
    # Before: flagged 40.8 s after the first profile, with nothing said before.
    script, log = tmp_path / "leak38.py", tmp_path / "leak.jsonl"
    script.write_text(LEAKING)
    proc = subprocess.Popen([PY, "-m", "jaxtop", "run", "--log", str(log), str(script), "90"], env=child_env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        events: list = []
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            first, events = _events_and_first_profile(log) if log.exists() else (None, [])
            if any(e["kind"] == "leak_suspect" for e in events):
                break
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=30)
    assert first is not None, err.decode()[-2000:]
    kinds = [e["kind"] for e in events]
    assert kinds[:2] == ["leak_watch", "leak_suspect"], (events, err.decode()[-2000:])
    watch, flag = events[0], events[1]
    assert "leak38.py:" in watch["text"] and watch["text"].startswith("watching: ")
    assert flag["t"] - first <= 32.0, (flag["t"] - first, events)
    rate = float(flag["text"].split("arrays/min, +")[1].split(" MiB/min")[0])
    assert rate == pytest.approx(37.5, rel=0.2), flag["text"]
