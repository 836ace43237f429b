"""The recompile budget names what changed: the jit ledger's recompile
reason (jax's tracing-cache-miss explanation, ``x f32[10] → f32[100]``) on
the report line of `jaxtop run --budget recompiles=N` and of the pytest
plugin, and in the JSON report."""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from conftest import NAMES_COMPILES, TARGETS, jaxtop_cmd
from jaxtop import budgets as b
from test_budget import fold, result, sample

STORM = TARGETS / "compile_storm.py"
needs_compile_names = pytest.mark.skipif(not NAMES_COMPILES,
                                         reason="recompile limits need jax >= 0.6.2's named compile events")
pytest_plugins = ["pytester"]


def types(old, new, arg="x"):
    return {"kind": "types", "arg": arg, "old": old, "new": new, "t": 100.5}


def test_the_report_line_says_what_changed():
    step = b.CompileSite("jit(step)", "train.py:12 (main)", count=3, recompiled_t=100.25,
                         reasons=[types("f32[10]", "f32[100]"), types("f32[10]", "f32[1000]")])
    flip = b.CompileSite("jit(evaluate)", "train.py:30 (main)", count=2, recompiled_t=100.5,
                         reasons=[{"kind": "static", "arg": "train", "old": "True", "new": "False"}])
    quiet = b.CompileSite("jit(init)", "train.py:5 (main)", count=2, recompiled_t=100.75)  # reasons were off
    report = fold("recompiles=0", sample(100.0), [], sample(101.0), compile_sites=[step, flip, quiet],
                  compile_na=None)
    r = result(report, "recompiles")
    assert r.measured.value == 4
    assert r.measured.detail[:3] == [
        "jit(step) at train.py:12 (main): compiled 3 times (2 recompile(s)): x f32[10] → f32[100] → f32[1000]",
        "jit(evaluate) at train.py:30 (main): compiled 2 times (1 recompile(s)): static argument train: True → False",
        "jit(init) at train.py:5 (main): compiled 2 times (1 recompile(s))",
    ]
    assert "x f32[10] → f32[100] → f32[1000]" in report.text()
    functions = report.to_json()["limits"][0]["detail"]["functions"]
    assert [f["changed"] for f in functions] == ["x f32[10] → f32[100] → f32[1000]",
                                                 "static argument train: True → False", None]


@pytest.mark.slow
@needs_compile_names
def test_jaxtop_run_names_what_changed(child_env, tmp_path):
    report = tmp_path / "budget.json"
    run = jaxtop_cmd("run", "--budget", "recompiles=0", "--budget-report", report, STORM, "ops", "--user-jit",
                     env=child_env, timeout=240)
    assert run.returncode == 3, run.stderr[-3000:]
    err = run.stderr.decode()
    line = next(n for n, text in enumerate(STORM.read_text().splitlines(), 1) if text.endswith("# call:step"))
    assert re.search(rf"jit\(step\) at \S*compile_storm\.py:{line} \(<module>\): compiled 3 times "
                     r"\(2 recompile\(s\)\): x f32\[3\] → f32\[5\] → f32\[7\]$", err, re.M), err
    (recompiles,) = [m for m in json.loads(report.read_text())["limits"] if m["name"] == "recompiles"]
    assert recompiles["detail"]["functions"][0]["changed"] == "x f32[3] → f32[5] → f32[7]"


@pytest.fixture
def inner(pytester, sockdir, monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv("JAX_TRANSFER_GUARD", raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    return pytester


@pytest.mark.slow
@needs_compile_names
def test_the_pytest_plugin_names_what_changed(inner):
    inner.makepyfile(test_steps=textwrap.dedent("""
        import jax
        import numpy as np
        import pytest


        @pytest.mark.jaxtop_budget("recompiles=0")
        def test_recompiles():
            double = jax.jit(lambda x: x * 2)
            for n in (3, 4, 5):
                double(jax.device_put(np.ones(n, np.float32))).block_until_ready()
    """))
    result = inner.runpytest_subprocess("-p", "no:cacheprovider", "-rA", timeout=240)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert re.search(r"jit\(<lambda>\) at test_steps\.py:\d+ \(test_recompiles\): compiled 3 times "
                     r"\(2 recompile\(s\)\): x f32\[3\] → f32\[4\] → f32\[5\]", out), out[-3000:]
