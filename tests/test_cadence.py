"""Pure: the allowances that set how often the agent's costly details run."""

from __future__ import annotations

import pytest

from jaxtop.agent.cadence import Allowance, SelfMeter


def test_a_detail_runs_as_often_as_its_share_pays_for_it():
    a = Allowance(0.001)  # 0.1 % of a core
    assert a.ready(0.0)
    a.spend(5.0, 0.0)  # the first run is free (every array is read once)
    assert a.ready(0.1)
    a.spend(0.010, 0.1)  # 10 ms: paid by 10 s of share
    assert not a.ready(5.0) and a.wait_s() == pytest.approx(5.1, abs=0.01)
    assert a.ready(10.2)
    # Over a long run the average cost is the share, whatever one run costs.
    t, spent = 10.2, 0.0
    while t < 1000:
        if a.ready(t):
            a.spend(0.004, t)
            spent += 0.004
        t += 0.1
    assert spent / (1000 - 10.2) == pytest.approx(0.001, rel=0.05)


def test_a_pause_earns_no_burst():
    """SIGSTOP or a debugger stops the process: after it the detail runs
    once, not back to back for every second of the pause."""
    a = Allowance(0.001)
    a.spend(0.0, 0.0)
    runs = 0
    for t in (3600.0, 3600.1, 3600.2, 3600.3):
        if a.ready(t):
            a.spend(0.002, t)
            runs += 1
    assert runs == 1


def test_the_agent_over_its_budget_slows_every_allowance():
    a = Allowance(0.001)
    meter = SelfMeter(budget=0.004, window_s=10.0)
    meter.update(0.0, 0.0, (a,))
    meter.update(10.0, 0.08, (a,))  # 0.8 % of a core over 10 s: twice the budget
    assert meter.share == pytest.approx(0.008) and meter.pressure == pytest.approx(2.0) and a.slowdown == 2.0
    a.spend(0.0, 10.0)
    a.spend(0.010, 10.0)
    assert a.wait_s() == pytest.approx(20.0)
    meter.update(20.0, 0.09, (a,))  # back under: the slowdown eases off
    assert meter.pressure == 1.0


def test_seconds_the_process_was_stopped_earn_nothing_and_are_not_idle():
    a = Allowance(0.001)
    a.spend(0.0, 0.0)
    a.spend(0.010, 0.0)  # owes 10 s of share
    a.shift(100.0)  # then stopped for 100 s
    assert not a.ready(100.0) and a.ready(110.0)
    meter = SelfMeter(budget=0.004, window_s=10.0)
    meter.update(0.0, 0.0, (a,))
    meter.shift(100.0)
    meter.update(110.0, 0.08, (a,))  # 0.08 s of CPU over the 10 s it ran, not over 110 s
    assert meter.share == pytest.approx(0.008)
