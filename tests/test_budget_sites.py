"""Budgets per line of the program (``h2d@train.py:27=0``): the grammar, the
fold over readings, ``jaxtop run --budget`` and ``pytest --jaxtop-budget`` on
real programs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from jaxtop.budgets import BudgetError, WindowState, check, parse_spec
from jaxtop.budgets.reading import Reading
from jaxtop.wire.records import from_dict

PROGRAM = '''
import numpy as np
import jax, jax.numpy as jnp

@jax.jit
def step(w, batch):
    return w - 0.1 * batch.sum()

w = jnp.ones((4,))
placed = jax.device_put(np.ones((8, 4), np.float32))
for i in range(20):
    w = step(w, placed)  # LINE_PLACED
    w = step(w, np.ones((8, 4), np.float32))  # LINE_NUMPY
'''


def _line(tag: str) -> int:
    return next(i for i, text in enumerate(PROGRAM.splitlines(), 1) if tag in text)


# -- the grammar ------------------------------------------------------------------------

def test_a_site_limit_parses_with_its_direction_and_line():
    budget = parse_spec("h2d@train.py:27=0, transfers@src/model/step.py:9=10,d2h=5")
    assert [(limit.name, limit.value, limit.kind) for limit in budget.limits] == [
        ("h2d@train.py:27", 0, "count"), ("transfers@src/model/step.py:9", 10, "count"), ("d2h", 5, "count")]


@pytest.mark.parametrize("text, message", [
    ("h2x@train.py:27=0", "is not h2d, d2h, d2d or transfers"),
    ("h2d@train.py=0", "is not FILE:LINE"),
    ("h2d@:27=0", "is not FILE:LINE"),
    ("h2d@train.py:0=0", "is not FILE:LINE"),
    ("h2d@train.py:27=1.5", "takes a whole number"),
    ("h2d@train.py:27=2GiB", "without a unit"),
])
def test_a_malformed_site_limit_says_what_is_wrong(text, message):
    with pytest.raises(BudgetError, match=message):
        parse_spec(text)


def test_an_unknown_name_mentions_the_per_line_form():
    with pytest.raises(BudgetError, match="h2d@train.py:27"):
        parse_spec("bogus=1")


# -- the fold -----------------------------------------------------------------------------

def _reading(t, sites, unattributed=None):
    return Reading.from_sample(from_dict({"type": "sample", "t": t, "transfer_sites": {
        "sites": [{"direction": d, "file": f"/w/{f}", "line": n, "function": "main", "callee": "step",
                   "count_total": c, "args": []} for d, f, n, c in sites],
        "unattributed": unattributed or {}}}))


def _measure(spec, start, end):
    budget = parse_spec(spec)
    window = WindowState(budget, start, start.t if start else 0.0)
    return check(budget, window.finish(end, end.t), {"name": "test"})


def test_a_site_counts_its_own_direction_and_line_over_the_window():
    start = _reading(1.0, [("h2d", "train.py", 27, 10), ("h2d", "train.py", 30, 5)])
    end = _reading(2.0, [("h2d", "train.py", 27, 14), ("h2d", "train.py", 30, 5), ("d2h", "train.py", 27, 3)])
    report = _measure("h2d@train.py:27=3,h2d@train.py:30=0,transfers@train.py:27=100,h2d@other.py:27=0", start, end)
    values = {r.limit.name: (r.status, r.measured.value) for r in report.results}
    assert values == {"h2d@train.py:27": ("exceeded", 4.0), "h2d@train.py:30": ("ok", 0.0),
                      "transfers@train.py:27": ("ok", 7.0), "h2d@other.py:27": ("ok", 0.0)}


def test_a_pass_is_not_given_while_some_transfers_have_no_line():
    start = _reading(1.0, [])
    end = _reading(2.0, [("h2d", "train.py", 30, 5)], unattributed={"h2d": 2})
    (result,) = _measure("h2d@train.py:27=0", start, end).results
    assert result.status == "n/a" and "2 implicit transfer(s)" in result.measured.na
    # Over the limit is over it, whatever else happened.
    (result,) = _measure("h2d@train.py:30=1", start, end).results
    assert result.status == "exceeded"


def test_no_attribution_at_all_is_na_not_zero():
    start = Reading.from_sample(from_dict({"type": "sample", "t": 1.0}))
    end = Reading.from_sample(from_dict({"type": "sample", "t": 2.0}))
    (result,) = _measure("h2d@train.py:27=0", start, end).results
    assert result.status == "n/a" and "not attributed to lines" in result.measured.na


# -- jaxtop run --------------------------------------------------------------------------------

@pytest.mark.slow
def test_jaxtop_run_fails_on_the_line_that_transfers_and_passes_the_one_that_does_not(tmp_path, child_env):
    program = tmp_path / "train.py"
    program.write_text(PROGRAM)
    numpy_line, placed_line = _line("LINE_NUMPY"), _line("LINE_PLACED")
    run = subprocess.run([sys.executable, "-m", "jaxtop", "run", "--budget",
                          f"h2d@train.py:{placed_line}=0,h2d@train.py:{numpy_line}=0", str(program)],
                         capture_output=True, text=True, timeout=120, env=child_env)
    assert run.returncode == 3, run.stderr[-2000:]
    assert f"h2d@train.py:{numpy_line}  20 > 0" in run.stderr
    assert f"h2d@train.py:{placed_line}  0 <= 0: ok" in run.stderr
    assert "NumPy array float32[8,4]" in run.stderr  # what the line passed
    run = subprocess.run([sys.executable, "-m", "jaxtop", "run", "--budget", f"h2d@train.py:{placed_line}=0",
                          str(program)], capture_output=True, text=True, timeout=120, env=child_env)
    assert run.returncode == 0, run.stderr[-2000:]


# -- pytest --jaxtop-budget ---------------------------------------------------------------------

pytest_plugins = ["pytester"]


@pytest.mark.slow
def test_pytest_budget_on_a_line_and_the_summary_names_the_worst_line(pytester, sockdir, monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv("JAX_TRANSFER_GUARD", raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    pytester.makepyfile(test_lines=textwrap.dedent('''
        import numpy as np
        import pytest
        import jax, jax.numpy as jnp

        step = jax.jit(lambda w, x: w - 0.1 * x.sum())
        W = jnp.ones(4)
        PLACED = jax.device_put(np.ones((8, 4), np.float32))
        step(W, PLACED)
        step(W, np.ones((8, 4), np.float32))

        def feed(x, n):
            for _ in range(n):
                step(W, x).block_until_ready()  # FEED


        def test_placed():
            feed(PLACED, 5)


        def test_numpy():
            feed(np.ones((8, 4), np.float32), 7)
    '''))
    feed_line = next(i for i, t in enumerate((pytester.path / "test_lines.py").read_text().splitlines(), 1)
                     if "# FEED" in t)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA",
                                           f"--jaxtop-budget=h2d=100,h2d@test_lines.py:{feed_line}=0", timeout=240)
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 1 and outcomes.get("failed") == 1, result.stdout.str()[-3000:]
    out = result.stdout.str()
    assert f"h2d@test_lines.py:{feed_line}  7 > 0" in out
    # The line and the function; its arguments are read on later calls of the line.
    assert f"(most at test_lines.py:{feed_line} (<lambda>" in out and ") x7)" in out, out
