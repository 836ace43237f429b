"""Every jax the package claims: the tested range is stated once and
matches pyproject's floor; a jax outside it, or guard lines in a form the
capture does not know, give n/a with the reason, never a silent 0.

CI runs this file (with the agent, probe and live-exactness tests) a second
time on the oldest jax pyproject.toml accepts.
"""

from __future__ import annotations

import json

import re
import subprocess
import sys
from pathlib import Path

import pytest

from jaxtop.probes.transfer_guard import TESTED_JAX, untested_jax_reason

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_floor_is_the_oldest_tested_jax():
    floor = re.search(r'"jax>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert floor == TESTED_JAX[0]
    recorded = sorted(p.stem.removeprefix("jax-") for p in (ROOT / "tests/fixtures/guard_lines").glob("jax-*.stderr"))
    assert TESTED_JAX[0] in recorded and TESTED_JAX[1] in recorded


@pytest.mark.parametrize("version, untested", [
    ("0.4.30", False), ("0.6.2", False), ("0.10.2", False), ("0.10.7", False),
    ("0.4.29", True), ("0.11.2", True), ("1.0.0", True), ("0.11.0.dev20261201", True),
])
def test_versions_outside_the_tested_range_are_named(version, untested):
    reason = untested_jax_reason(version)
    assert (reason is not None) == untested
    if reason:
        assert version in reason and TESTED_JAX[0] in reason


def test_running_jax_is_inside_the_tested_range():
    import jax

    assert untested_jax_reason(jax.__version__) is None, "CI must run a jax this package says it tested"


UNKNOWN_LINE = "[2026-12-03T19:09:21Z WARN guard.cc:7] host-to-device transfer: aval=ShapedArray(float32[4])\n"


@pytest.mark.slow
def test_an_unrecognised_guard_line_gives_n_a_and_a_notice(child_env, tmp_path):
    """A guard message behind a log header the capture does not know (a new
    jaxlib's format, here synthetic): the line reaches the user unchanged,
    and the recording says n/a with the reason instead of counting 0."""
    script = tmp_path / "unknown.py"
    script.write_text(
        "import sys, jax, jax.numpy as jnp\n"
        "jnp.ones(3).block_until_ready()\n"
        f"sys.stderr.write({UNKNOWN_LINE!r})\n"
        "sys.stderr.flush()\n"
        "import time; time.sleep(0.5)\n"
    )
    plain = subprocess.run([sys.executable, str(script)], env=child_env, capture_output=True, timeout=120)
    log = tmp_path / "run.jsonl"
    run = subprocess.run([sys.executable, "-m", "jaxtop", "run", "--log", str(log), str(script)],
                         env=child_env, capture_output=True, timeout=120)
    assert run.returncode == plain.returncode == 0, run.stderr
    assert run.stderr == plain.stderr
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    final = [r for r in records if r["type"] == "sample"][-1]
    status = final["transfer_capture"]
    assert status["available"] is False and "does not recognise" in status["reason"]
    events = [e for r in records if r["type"] == "sample" for e in r.get("events") or []]
    assert any("does not recognise" in (e.get("text") or "") for e in events), events


@pytest.mark.slow
def test_warnings_silenced_by_the_user_are_counted_or_said_to_be_n_a(child_env, tmp_path):
    """TF_CPP_MIN_LOG_LEVEL=2 silences JAX's warnings, guard lines included.
    From jaxlib 0.7 jaxtop lowers the threshold at run time and hides the
    warnings the user silenced; before (TSL logging) nothing can take it
    back, and the transfer figures must say n/a with why, never 0. Either
    way the user's stderr is what it was."""
    from jax._src.lib import utils

    script = tmp_path / "silenced.py"
    script.write_text("import jax.numpy as jnp, numpy as np\n"
                      "x = jnp.ones(3)\n"
                      "for i in range(5):\n"
                      "    x = x + np.ones(3, np.float32)  # an implicit host-to-device transfer each\n"
                      "print(x)\n")
    env = dict(child_env, TF_CPP_MIN_LOG_LEVEL="2")
    plain = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, timeout=120)
    log = tmp_path / "run.jsonl"
    run = subprocess.run([sys.executable, "-m", "jaxtop", "run", "--log", str(log), str(script)],
                         env=env, capture_output=True, timeout=120)
    assert run.returncode == plain.returncode == 0, run.stderr
    assert (run.stdout, run.stderr) == (plain.stdout, plain.stderr)
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    final = [r for r in records if r["type"] == "sample"][-1]
    status = final["transfer_capture"]
    if hasattr(utils, "absl_set_min_log_level"):
        # JAX's own log, warnings not silenced, is the oracle.
        logged = subprocess.run([sys.executable, str(script)], env=dict(child_env, JAX_TRANSFER_GUARD="log"),
                                capture_output=True, timeout=120)
        expected = logged.stderr.count(b"] host-to-device transfer:")
        assert status["available"] is True, status
        assert final["transfers"]["h2d"]["count_total"] == expected >= 5
    else:
        assert status["available"] is False and "TF_CPP_MIN_LOG_LEVEL" in status["reason"], status
