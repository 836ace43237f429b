"""jax's ops run outside jit read as ops, whatever their implementation:
``jnp.sin``, ``jnp.linalg.norm`` and ``jax.nn.relu`` are ``jax.jit``-wrapped
functions of jax that the program calls itself (``jnp.multiply`` for
``x * 2``, ``jnp.mean``'s ``_mean`` are called by jax), and jax 0.10's
primitives are jitted too. None of their compiles is a recompile; a jitted
function of the program's called on three shapes is two."""

from __future__ import annotations

import io
import json
import re
import sys

import pytest
from rich.console import Console

from conftest import NAMES_COMPILES, TARGETS, jaxtop_cmd
from jaxtop.widgets.jit import JitLedgerTable
from test_jit_ledger import folded, jit_fields

STORM = TARGETS / "compile_storm.py"
#: The ops the target runs on three shapes each, as the ledger names their functions.
OP_FUNCTIONS = {"jit_sin", "jit_cos", "jit_exp", "jit__mean", "jit_concatenate", "jit_multiply", "jit__where",
                "jit_greater", "jit_relu", "jit_norm"}


def test_every_op_reads_as_an_op_on_a_live_stack(jax_cpu):
    """The compile listener's stack, op by op, on this process's jax; the
    program's own jit (and a jit of a jax transform of its function) is not
    an op."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxtop.probes import compile_events
    from jaxtop.probes.frames import eager_dispatch

    seen: list[bool] = []

    def listener(event, duration, *args, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            seen.append(eager_dispatch(sys._getframe(1)))

    def loss(w):
        return (w ** 2).sum()

    ops = {
        "sin": jnp.sin, "cos": jnp.cos, "exp": jnp.exp, "mean": jnp.mean,
        "concatenate": lambda x: jnp.concatenate([x, x]), "x * 2": lambda x: x * 2,
        "where": lambda x: jnp.where(x > 0, x, 0.0), "relu": jax.nn.relu, "norm": jnp.linalg.norm,
    }
    programs = {"jax.jit(f)": jax.jit(lambda v: v + 1), "jax.jit(jax.grad(loss))": jax.jit(jax.grad(loss))}
    compile_events.subscribe(compile_events.DURATION, listener)
    try:
        jax.clear_caches()
        for n in (13, 17, 19):  # shapes no other test compiles
            x = jax.device_put(np.arange(n, dtype=np.float32))
            for name, op in ops.items():
                del seen[:]
                op(x).block_until_ready()
                assert seen and all(seen), (name, n, seen)
            for name, f in programs.items():
                del seen[:]
                f(x).block_until_ready()
                assert seen == [False], (name, n, seen)
    finally:
        compile_events.unsubscribe(compile_events.DURATION, listener)


def render_text(renderable, width=120) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


@pytest.mark.slow
def test_eager_ops_on_three_shapes_are_no_recompiles(child_env, tmp_path):
    """`jaxtop run --budget recompiles=0` of sin, cos, exp, mean,
    concatenate, x * 2, where, relu and norm, each on three shapes: within
    the budget, every compile counted apart as an op's; in the ledger every
    function is an op (the Jit screen tags it), and its executables are left
    out of the leak trend. Before jax 0.6.2 the budget is n/a (no compile
    event names its function) and the ledger tells ops by their compile
    event's stack."""
    log, report = tmp_path / "ops.jsonl", tmp_path / "budget.json"
    run = jaxtop_cmd("run", "--log", log, "--budget", "recompiles=0", "--budget-report", report, STORM, "ops",
                     env=child_env, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    (recompiles,) = [m for m in json.loads(report.read_text())["limits"] if m["name"] == "recompiles"]
    if NAMES_COMPILES:
        assert recompiles["value"] == 0 and recompiles["status"] == "ok", recompiles
        assert recompiles["detail"]["functions"] == [] and recompiles["detail"]["eager_compiles"] >= 30
    else:
        assert recompiles["status"] == "n/a", recompiles
    last = jit_fields(log)[-1]
    functions = {f["name"]: f for f in last["functions"]}
    assert OP_FUNCTIONS <= set(functions), sorted(functions)
    for name in OP_FUNCTIONS:
        assert functions[name]["compiles"] == 3 and functions[name].get("eager_compiles") == 3, functions[name]
    assert all(f.get("eager_compiles") == f["compiles"] for f in functions.values()), functions
    not_ops = [e["name"] for e in last["executables"] if not e.get("eager")]
    assert not_ops == [], not_ops
    view = folded(log)
    assert all(f.eager and f.recompiles == 0 for f in view.functions)
    text = render_text(JitLedgerTable(view, sort="compiles"))
    row = next(line for line in text.splitlines() if line.startswith("jit_sin "))
    assert re.search(r" 3\+? op ", row), row  # "+": counted from the executables (jax < 0.6.2)


@pytest.mark.slow
@pytest.mark.skipif(not NAMES_COMPILES, reason="recompile limits need jax >= 0.6.2's named compile events")
def test_a_programs_jit_on_three_shapes_is_two_recompiles(child_env, tmp_path):
    log, report = tmp_path / "ops.jsonl", tmp_path / "budget.json"
    run = jaxtop_cmd("run", "--log", log, "--budget", "recompiles=0", "--budget-report", report, STORM, "ops",
                     "--user-jit", env=child_env, timeout=240)
    assert run.returncode == 3, run.stderr[-3000:]
    (recompiles,) = [m for m in json.loads(report.read_text())["limits"] if m["name"] == "recompiles"]
    assert recompiles["value"] == 2 and [f["name"] for f in recompiles["detail"]["functions"]] == ["jit(step)"]
    step = next(f for f in jit_fields(log)[-1]["functions"] if f["name"] == "jit_step")
    assert step["compiles"] == 3 and not step.get("eager_compiles") and step["reasons_total"] == 2
