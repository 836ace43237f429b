"""Pure: the allowances that set how often the agent's costly details run."""

from __future__ import annotations

import pytest

from jaxtop.agent import cadence
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


def test_over_its_ceiling_the_agent_samples_less_often_and_comes_back_when_under():
    meter = SelfMeter(budget=0.004, window_s=10.0, ceiling=0.005)
    t, cpu = 0.0, 0.0
    meter.update(t, cpu, ())

    def window(share):
        nonlocal t, cpu
        t, cpu = t + 10.0, cpu + 10.0 * share
        meter.update(t, cpu, ())
        return meter.tick_stretch

    assert window(0.02) == 1.0  # the first window (the program's start-up) is left out
    assert window(0.004) == 1.0 and window(0.0085) == 1.0  # fewer than three windows: nothing moves
    # Three in, their median twice the target (85 % of the ceiling): twice the interval.
    assert window(0.0085) == pytest.approx(2.0)
    for _ in range(6):
        window(0.0085 / meter.tick_stretch)  # a steady program: the same cost at the interval asked for
    assert meter.tick_stretch == pytest.approx(2.0) and meter.share == pytest.approx(0.00425)
    assert window(0.0035 / 2.0) == pytest.approx(2.0)  # one window a fifth under: the median stays
    for _ in range(4):
        window(0.0017 / meter.tick_stretch)  # the program stopped transferring
    assert meter.tick_stretch == 1.0  # never faster than asked
    for _ in range(4):
        window(0.1)  # 10 % of a core (a runaway): at most twice the interval
    assert meter.tick_stretch == cadence.MAX_TICK_STRETCH == 2.0


def test_a_noisy_window_or_the_start_up_moves_nothing():
    """A TPU VM's thread clock counts in 10 ms: a window reads 0.94 % where
    its neighbours read 0.38 %; the TPU's start-up filled two windows."""
    meter = SelfMeter(window_s=10.0)
    t, cpu = 0.0, 0.0
    meter.update(t, cpu, ())
    for share in (0.012, 0.010, 0.0038, 0.0038, 0.0094, 0.0036):
        t, cpu = t + 10.0, cpu + 10.0 * share
        meter.update(t, cpu, ())
        assert meter.tick_stretch == 1.0


@pytest.mark.parametrize("per_tick_us,per_s_share", [(380, 0.0012), (600, 0.0015), (250, 0.0005)])
def test_the_stretch_brings_a_steady_program_under_the_ceiling(per_tick_us, per_s_share):
    """An agent whose cost is per tick plus per second of work (reading and
    tying a thousand transfers a second), as measured on a 2-core VM (380 us
    a tick at 10 Hz, 0.12 % of a core of the rest) and a slower sandbox."""
    meter = SelfMeter(window_s=10.0)
    t, cpu = 0.0, 0.0
    meter.update(t, cpu, ())
    shares = []
    for _ in range(20):
        rate = 10.0 / meter.tick_stretch
        t, cpu = t + 10.0, cpu + 10.0 * (rate * per_tick_us * 1e-6 + per_s_share)
        meter.update(t, cpu, ())
        shares.append(meter.share)
    assert shares[-1] <= cadence.CPU_CEILING
    if shares[0] > cadence.CPU_CEILING * cadence.TICK_TARGET:
        assert 0.8 * cadence.CPU_CEILING * cadence.TICK_TARGET <= shares[-1]
        # At the target, or as close as twice the interval gets.
        assert shares[-1] <= cadence.CPU_CEILING * cadence.TICK_TARGET * 1.01 or (
            meter.tick_stretch == cadence.MAX_TICK_STRETCH)
    else:
        assert meter.tick_stretch == 1.0
