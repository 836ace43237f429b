"""One probe interface: the agent's list starts, ticks and stops every probe
the same way, and nothing of any probe is left in the program after stop.

Pure tests of :class:`jaxtop.agent.probe_list.ProbeList` first, then the
real agent in a fresh interpreter (tests/targets/probe_lifecycle.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from interpreter_waits import adds_for, long_waits, waits_beside
from jaxtop.agent.probe_list import FieldProbe, ProbeList
from jaxtop.probes.base import Probe, Tick

TARGETS = Path(__file__).parent / "targets"


class Fake:
    """A probe that writes down what is asked of it."""

    def __init__(self, name, log, needs_jax=False, fail_start=False, fail_tick=False, value=1):
        self.name, self.log, self.needs_jax = name, log, needs_jax
        self.fail_start, self.fail_tick, self.value = fail_start, fail_tick, value
        self.reason = None
        self.installed = False

    def start(self):
        self.log.append(("start", self.name))
        if self.fail_start:
            raise RuntimeError("no such hook")
        self.installed = True

    def on_tick(self, tick):
        if self.fail_tick:
            raise ValueError("bad reading")
        return self.value

    def stop(self):
        self.log.append(("stop", self.name))
        self.installed = False


def test_probes_start_early_or_with_jax_in_list_order():
    log = []
    probes = ProbeList()
    for probe in (Fake("a", log), Fake("b", log, needs_jax=True), Fake("c", log)):
        probes.add(probe)
    probes.start_early()
    assert log == [("start", "a"), ("start", "c")]
    probes.jax_imported()
    assert log[2:] == [("start", "b")]
    probes.jax_imported()  # twice: nothing starts twice
    assert len(log) == 3
    late = Fake("d", log, needs_jax=True)
    probes.add(late)  # jax already imported: started at once
    assert log[-1] == ("start", "d") and late.installed


def test_a_probe_that_cannot_start_says_why_and_the_others_go_on():
    log = []
    probes = ProbeList()
    broken, fine = Fake("broken", log, fail_start=True), Fake("fine", log)
    probes.add(broken)
    probes.add(fine)
    probes.start_early()
    assert broken.reason == "could not start: RuntimeError: no such hook"
    assert fine.installed and fine.reason is None


def test_a_tick_fills_each_field_in_order_and_a_failure_stays_in_its_field():
    probes = ProbeList()
    log = []
    probes.add(Fake("a", log, value={"x": 1}))
    probes.add(Fake("none", log, value=None))  # no news: left out
    probes.add(Fake("bad", log, fail_tick=True))
    probes.add(FieldProbe("z", lambda: 3))
    record = {"type": "sample"}
    probes.tick(Tick(1.0), record)
    assert list(record) == ["type", "a", "bad", "z"]
    assert record["bad"] == {"error": "ValueError: bad reading"} and record["z"] == 3


def test_a_tick_hands_the_interpreter_back_between_probes_that_hold_it():
    """Six probes, each holding the interpreter in C for ~2 ms (a call
    into a runtime): run back to back, a thread of the program that wants
    it waits for all of them, up to Python's switch interval (set to 50 ms
    here, so that the figure stands out of a loaded machine's noise: 12 ms
    or more); with the tick handing it back, for one or two probes."""
    n = adds_for(0.002)

    class Holding(Fake):
        def on_tick(self, tick):
            sum(range(n))
            return super().on_tick(tick)

    log: list = []
    probes = ProbeList()
    for i in range(6):
        probes.add(Holding(f"p{i}", log))
    probes.start_early()
    late = waits_beside(lambda: probes.tick(Tick(time.time()), {}), 10)
    # Each tick run back to back makes one wait of 12 ms or more; one wait
    # over 8 ms is let pass (a loaded machine may not wake the sleeper
    # within a hand-back or two).
    assert len(long_waits(late, 0.008)) <= 1, f"waits over 8 ms: {long_waits(late, 0.008)} (a probe: ~{n} adds)"


def test_a_probe_added_under_a_taken_name_replaces_and_stops_the_old_one():
    log = []
    probes = ProbeList()
    old = Fake("holders", log)
    probes.add(old)
    probes.add(Fake("other", log))
    probes.start_early()
    new = Fake("holders", log, value=2)
    probes.add(new)
    assert [p.name for p in probes] == ["holders", "other"] and probes.get("holders") is new
    assert ("stop", "holders") in log and not old.installed and new.installed
    record = {}
    probes.tick(Tick(1.0), record)
    assert record["holders"] == 2


def test_stop_goes_last_first_and_twice_is_harmless():
    log = []
    probes = ProbeList()
    for name in "abc":
        probes.add(Fake(name, log))
    probes.start_early()
    log.clear()
    probes.stop()
    probes.stop()
    assert log[:3] == [("stop", "c"), ("stop", "b"), ("stop", "a")]


def test_shift_deadlines_reaches_the_probes_that_have_deadlines():
    shifted = []

    class WithDeadlines(Fake):
        def shift_deadlines(self, gap):
            shifted.append(gap)

    probes = ProbeList()
    probes.add(Fake("plain", []))
    probes.add(WithDeadlines("timed", []))
    probes.shift_deadlines(4.5)
    assert shifted == [4.5]


def test_every_probe_of_the_agent_starts_and_stops_through_the_list_and_leaves_nothing(tmp_path):
    """The real agent in a fresh interpreter: each probe is a Probe, starts
    (NVML aside, where there is no driver, with its reason), fills its field,
    changes the program's world while it runs, and after stop the world is
    what it was before, to the identity of every hook."""
    env = dict(os.environ, JAXTOP_SOCKET_DIR=str(tmp_path), JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, str(TARGETS / "probe_lifecycle.py")], capture_output=True, text=True,
                         env=env, timeout=180, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["probes"][:3] == ["transfer_capture", "oom_census", "devices"]
    assert {"transfers", "process", "compile", "donation", "jit", "holders", "host_syncs", "labels"} <= set(report["probes"])
    assert all(report["conform"].values()), report["conform"]
    reasons = {k: v for k, v in report["reasons"].items() if v and k != "nvml"}
    assert not reasons, reasons
    assert {"devices", "transfers", "transfer_capture", "process", "compile", "donation", "jit", "host_syncs",
            "labels"} <= set(report["fields"])
    # The probes did install something while they ran (else "nothing left"
    # would prove nothing): hooks, the relay on fd 2, a thread; numpy's
    # functions are left alone unless asked for (they cost every numpy call).
    assert {"excepthook", "ArrayImpl", "errors", "fd2", "threads", "labels_attached",
            "compile_subscribers"} <= set(report["changed_during"])
    assert "numpy" not in report["changed_during"]
    before, after = report["before"], report["after"]
    assert after == before, {k: (before[k], after[k]) for k in before if before[k] != after[k]}


def test_the_protocol_is_checkable():
    assert isinstance(Fake("a", []), Probe)
    assert not isinstance(object(), Probe)
