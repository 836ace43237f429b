"""Real layer: Flax NNX programs (the MNIST tutorial's loop and a miniGPT,
tests/targets/nnx_*.py) under `jaxtop run`: no false recompile, no
executable-leak flag, no recompile over budget, while the model's eager
set-up compiles (ops run outside jit) are told apart in the ledger and in
the budget report."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import TARGETS
from test_jit_ledger import folded, jit_fields

pytest.importorskip("flax.nnx", reason="flax is a test dependency (pyproject.toml [test])")
pytestmark = pytest.mark.slow


def _run(tmp_path, target, *args):
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAXTOP_SOCKET_DIR=str(tmp_path / "s"))
    env.pop("XLA_FLAGS", None)
    log, report = tmp_path / "run.jsonl", tmp_path / "budget.json"
    done = subprocess.run([sys.executable, "-m", "jaxtop", "run", "--log", str(log), "--budget", "recompiles=0",
                           "--budget-report", str(report), str(TARGETS / target), *args],
                          env=env, capture_output=True, text=True, timeout=300)
    return done, log, json.loads(report.read_text()) if report.exists() else None


@pytest.fixture(scope="module", params=[("nnx_mnist.py", "300"), ("nnx_minigpt.py", "60")], ids=["mnist", "minigpt"])
def run(request, tmp_path_factory):
    target, steps = request.param
    return _run(tmp_path_factory.mktemp("nnx"), target, steps)


def test_runs_within_a_zero_recompile_budget(run):
    done, _, report = run
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("steps=" + done.args[-1])
    (recompiles,) = [m for m in report["limits"] if m["name"] == "recompiles"]
    assert recompiles["value"] == 0 and recompiles["status"] == "ok", recompiles
    # The set-up's compiles are counted apart, not hidden: ops run outside jit.
    assert recompiles["detail"]["eager_compiles"] >= 10, recompiles


def test_no_false_recompile_reason_nor_leak_flag(run):
    _, log, _ = run
    fields = jit_fields(log)
    assert fields, "no jit field in the recording"
    last = fields[-1]
    functions = {f["name"]: f for f in last["functions"]}
    reasons = {name: f["reasons"] for name, f in functions.items() if f["reasons"]}
    assert reasons == {}, reasons
    assert all(f.get("leak") is None for f in fields), [f["leak"] for f in fields if f.get("leak")]
    # Functions traced only inside the step (inlined, never compiled on their own) have no row.
    assert all(f["compiles"] >= 1 for f in functions.values()), functions.keys()
    assert functions["jit_train_step"]["compiles"] == 1
    assert not functions["jit_train_step"].get("eager_compiles")
    view = folded(log)
    ops = [f for f in view.functions if f.eager]
    assert ops and all(f.recompiles == 0 for f in ops)
    assert {"jit_broadcast_in_dim", "jit__truncated_normal"} <= {f.name for f in ops}


def test_a_slow_leak_on_the_steps_line_stays_flagged(tmp_path):
    """1 KiB a step kept from the NNX step's own call (the line that also
    allocates each step's new model and optimizer state): once flagged, it
    stays flagged in every later profile, mid-step ones included."""
    from test_holders_programs import holders_records, marker_lines

    env = dict(os.environ, JAX_PLATFORMS="cpu", JAXTOP_SOCKET_DIR=str(tmp_path / "s"))
    env.pop("XLA_FLAGS", None)
    log = tmp_path / "leak.jsonl"
    done = subprocess.run([sys.executable, str(TARGETS / "with_holders.py"), str(log), str(TARGETS / "nnx_mnist.py"),
                           "900", "1024", "0.02"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    site = f"nnx_mnist.py:{marker_lines(TARGETS / 'nnx_mnist.py', 'LEAK')['LEAK']}"
    series = []
    for rec in holders_records(log):
        at = [s for s in rec.get("sites", ()) if s.get("site") == site]
        if at:
            series.append((at[0]["bytes"], bool(at[0].get("suspect"))))
    flags = [flag for _, flag in series]
    assert any(flags), series
    first = flags.index(True)
    assert all(flags[first:]), series
    assert len(flags) - first >= 10, series  # flagged for a good while, not just at the end


def test_a_labelled_nnx_model_and_optimizer_are_followed_across_steps(monkeypatch):
    """Labelled once, an NNX model keeps its bytes although each step swaps
    the arrays inside its Variables (before: 0 B from the first step on)."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from jaxtop.agent import labels

    monkeypatch.setattr(labels, "REFLATTEN_MIN_S", 0.0)
    registry = labels.LabelRegistry()
    model = nnx.Linear(64, 32, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    registry.add("model", model)
    state = nnx.state(model)  # kept: a live view of the model's Variables
    registry.add("state", state)
    registry.add("optimizer", optimizer)
    registry.add("temporary", nnx.state(model))  # dropped at once: the arrays of now
    params = {"w": jnp.ones((64, 32)), "b": jnp.zeros(32)}
    registry.add("params", params)  # a functional loop's dict: the arrays of now

    @nnx.jit
    def step(model, optimizer, x):
        optimizer.update(model, nnx.grad(lambda m: (m(x) ** 2).sum())(model))

    param_bytes = (64 * 32 + 32) * 4
    for _ in range(3):
        step(model, optimizer, jnp.ones((4, 64)))
        params = jax.tree_util.tree_map(lambda a: a + 1, params)  # the next step's new arrays
        jax.block_until_ready(nnx.state(model))
        got = {r["name"]: r for r in registry.read()}
        assert got["model"]["bytes"] == got["state"]["bytes"] == param_bytes
        assert got["model"]["followed"] and got["model"]["alive"] == 2
        assert got["optimizer"]["bytes"] >= 2 * param_bytes  # adam's two moments
    # The dict held the arrays of labelling time: gone, and the screen says why.
    assert got["params"]["bytes"] == 0 and got["params"]["alive"] == 0 and "followed" not in got["params"]
    assert got["temporary"]["bytes"] == 0 and "followed" not in got["temporary"]
    from jaxtop.dashboard.holders import HoldersFold
    from jaxtop.widgets.holders import render_holders
    from jaxtop.wire.records import from_dict

    fold = HoldersFold()
    fold.feed(from_dict({"type": "sample", "t": 1.0, "labels": {"t": 1.0, "trees": list(got.values())}}))
    text = " ".join(render_holders(fold.view(), width=160).split())
    assert "params, temporary: every array labelled is gone (replaced by newer ones)" in text
    assert "model:" not in text.split("Named pytrees")[1].split("every array")[0]


RECOMPILE = '''
import jax.numpy as jnp
from flax import nnx

model = nnx.Linear(8, 4, rngs=nnx.Rngs(0))


@nnx.jit
def forward(model, x):
    return model(x).sum()


for n in (2, 3):
    forward(model, jnp.ones((n, 8)))  # CALL
'''


def test_recompile_reasons_name_the_programs_line_not_flaxs(tmp_path):
    """A real recompile through nnx.jit: jax names flax's wrapper line; the
    ledger names the program's line (as holders and host syncs do) and keeps
    jax's as traced_at."""
    script = tmp_path / "recompile.py"
    script.write_text(RECOMPILE)
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAXTOP_SOCKET_DIR=str(tmp_path / "s"))
    log = tmp_path / "run.jsonl"
    done = subprocess.run([sys.executable, "-m", "jaxtop", "run", "--log", str(log), str(script)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    functions = {f["name"]: f for f in jit_fields(log)[-1]["functions"]}
    (reason,) = functions["jit_forward"]["reasons"]
    line = next(n for n, text in enumerate(RECOMPILE.splitlines(), 1) if "# CALL" in text)
    assert reason["kind"] == "types" and reason["call_site"] == f"{script}:{line}", reason
    assert "site-packages" in reason["traced_at"] and "flax" in reason["traced_at"]
