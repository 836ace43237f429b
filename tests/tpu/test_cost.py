"""What the agent costs a program on the chip, at 10,000 and 50,000 live arrays.

The targets: the program's step rate under jaxtop at least 0.99 of its rate
without it, and the agent's own thread at most 0.5 % of a core, medians over
rounds. The measurement is benchmarks/scaling.py's (its children and its
summary), run one child at a time by tests/tpu/cost.py because only one
process at a time may open a TPU.

On the chip, tools/tpu/run.sh runs tests/tpu/cost.py before pytest and names
its JSON in ``JAXTOP_TPU_COST_JSON``: the test then checks those figures
instead of spending the chip's time measuring them again.

On CPU (``JAXTOP_TPU_TESTS_ON_CPU=1``) the same driver runs once, small, and
only its working is checked: two shared cores cannot resolve 1 % of a step
rate, and the targets are the chip's.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from tpu import cost

pytestmark = [pytest.mark.tpu, pytest.mark.slow]

COST_JSON_ENV = "JAXTOP_TPU_COST_JSON"
SIZES = [10_000, 50_000]


def _chip_results() -> dict:
    """The figures of the chip script's benchmark run, when it named them
    and they cover the sizes; else measured here."""
    path = os.environ.get(COST_JSON_ENV)
    if path and Path(path).is_file():
        results = json.loads(Path(path).read_text())
        if (results["config"].get("jax_platforms") == "tpu"
                and {row["n"] for row in results["rows"]} >= set(SIZES)):
            return results
    return cost.measure(SIZES, rounds=2)


@pytest.mark.timeout(1800)
def test_agent_cost_at_ten_and_fifty_thousand_arrays(platform, monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", platform)  # the children inherit it
    if platform == "cpu":
        results = cost.measure([1000], rounds=1, blocks=1, seconds=0.5, settle=1.0, warmup=5, child_timeout=300)
        (row,) = results["rows"]
        assert results["config"]["jax_platforms"] == "cpu"
        for arm in ("baseline", "agent"):
            (run,) = [r[arm] for r in row["rounds"]]
            assert run["steps_per_s"] > 0 and run["live_arrays_end"] >= 1000
        assert 0.3 < row["ratio_median"] < 3.0  # a ratio of two step rates, whatever the noise
        assert math.isfinite(row["thread_pct_median"]) and 0 <= row["thread_pct_median"] < 100
        agent = row["rounds"][0]["agent"]
        assert agent["observer_thread_found"] and agent["thread_cpu_s"] > 0  # the agent's thread, on its own clock
        return
    results = _chip_results()
    by_size = {row["n"]: row for row in results["rows"]}
    lines = cost.verdicts(results)
    for n in SIZES:
        row = by_size[n]
        assert row["ratio_median"] >= cost.MIN_RATIO, "\n".join(lines)
        assert row["thread_pct_median"] <= cost.MAX_THREAD_PCT, "\n".join(lines)
