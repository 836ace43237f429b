"""The last sample carries every counter, and budgets see every event up to
exit: host reads made 0.05 s before the program ends are counted (the
``host_syncs`` record otherwise goes out at most once a second)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from conftest import PY

pytestmark = pytest.mark.slow

READS = """\
import time, jax.numpy as jnp
x = jnp.arange(4.0)
x.block_until_ready()
for i in range(6):  # six host reads in 0.06 s, then exit
    float(x[i % 4])
    time.sleep(0.01)
time.sleep(0.05)
"""


def test_reads_just_before_exit_are_counted_by_the_budget_and_the_last_sample(child_env, tmp_path):
    script = tmp_path / "reads.py"
    script.write_text(READS)
    over = subprocess.run([PY, "-m", "jaxtop", "run", "--budget", "host_syncs=5", str(script)], env=child_env,
                          capture_output=True, text=True, timeout=120)
    assert over.returncode == 3, over.stderr
    assert "host_syncs  6 > 5" in over.stderr
    log = tmp_path / "run.jsonl"
    within = subprocess.run([PY, "-m", "jaxtop", "run", "--budget", "host_syncs=6", "--log", str(log), str(script)],
                            env=child_env, capture_output=True, text=True, timeout=120)
    assert within.returncode == 0, within.stderr
    samples = [r for r in map(json.loads, log.read_text().splitlines()) if r.get("type") == "sample"]
    last = samples[-1]
    assert last.get("final") is True
    # Every counter in the last sample, read in full.
    assert last["host_syncs"]["count"] == 6
    assert last["transfers"]["h2d"]["count_total"] >= 6  # the index of each read is put on the device
    assert last["compile"]["count_total"] >= 1 and "process" in last and last["devices"]


NUMPY_READS = """\
import jax.numpy as jnp, numpy as np
x = jnp.arange(4.0)
for i in range(3):
    np.asarray(x + i)  # numpy takes a CPU array's buffer in C: only numpy's wrappers see it
"""


def test_a_host_syncs_budget_counts_numpy_reads_of_cpu_arrays(child_env, tmp_path):
    script = tmp_path / "numpy_reads.py"
    script.write_text(NUMPY_READS)
    env = dict(child_env)
    env.pop("JAXTOP_NUMPY_HOOKS", None)
    over = subprocess.run([PY, "-m", "jaxtop", "run", "--budget", "host_syncs=2", str(script)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert over.returncode == 3 and "host_syncs  3 > 2" in over.stderr, over.stderr
    # Refused by the environment: not counted, so under the limit is not a pass: the limit is n/a.
    refused = subprocess.run([PY, "-m", "jaxtop", "run", "--budget", "host_syncs=2", str(script)],
                             env=dict(env, JAXTOP_NUMPY_HOOKS="0"), capture_output=True, text=True, timeout=120)
    assert refused.returncode == 0, refused.stderr
    assert re.search(r"host_syncs +n/a: at least 0, np.asarray/np.array of CPU arrays not counted: numpy reads "
                     r"them in C \(JAXTOP_NUMPY_HOOKS=0\)", refused.stderr), refused.stderr
    # Without a budget numpy is left alone, and the stream says what goes uncounted.
    log = tmp_path / "plain.jsonl"
    plain = subprocess.run([PY, "-m", "jaxtop", "run", "--log", str(log), str(script)], env=env,
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    last = [r for r in map(json.loads, log.read_text().splitlines()) if r.get("type") == "sample"][-1]
    assert last["host_syncs"]["count"] == 0 and not last["host_syncs"]["numpy_hooks"]
    assert "np.asarray/np.array of CPU arrays not counted" in last["host_syncs"]["uncounted"]
