"""jaxtop's own suite under its own budget: the demo's "placement" strategy.

Runs in this test process with the pytest plugin (jaxtop's entry point), so
it also checks that the plugin counts in a session where jax was imported
long before its agent started: the agent must arm the transfer guard at once.
"""

from __future__ import annotations

import pytest

import jax  # before the plugin's agent starts, as in most suites: it must arm the guard at once

from jaxtop.budgets import BudgetExceeded

STEPS = 5


@pytest.fixture(scope="module")
def placement():
    """The strategy as the demo builds it (demo/runner.py), compiled, with its
    first explicit copy made: what the steps below do is steady state."""
    from jaxtop.demo.strategies import Placement, Scale

    device = jax.local_devices()[0]
    strategy = Placement(Scale.for_backend(jax.default_backend(), small=True), device)
    for variant in strategy.variants:
        strategy.prepare(variant)
    strategy.step("on")
    return strategy


@pytest.mark.jaxtop_budget("h2d=0,recompiles=0")
def test_explicit_device_put_makes_no_implicit_transfer(placement):
    for _ in range(STEPS):
        placement.step("on")


def test_numpy_batches_break_the_same_budget(placement, jaxtop_budget):
    """The variant without device_put goes over it, one h2d per step: the
    budget above passes because nothing was transferred, not because nothing
    was counted."""
    with pytest.raises(BudgetExceeded) as exc:
        with jaxtop_budget("h2d=0,recompiles=0"):
            for _ in range(STEPS):
                placement.step("off")
    report = exc.value.report
    assert [r.limit.name for r in report.exceeded] == ["h2d"]
    (h2d,) = report.exceeded
    assert h2d.measured.value == STEPS
    batch = f"float32[{placement.scale.batch},{placement.scale.width}]"
    shapes = {s["shape"] for s in h2d.measured.data["shapes"]}
    assert shapes <= {batch, "(cached call, shape not logged)"}, shapes
