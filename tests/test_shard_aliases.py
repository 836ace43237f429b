"""Real layer, 8 CPU devices: the per-shard Arrays that host reads of a
sharded array cache on it (``np.asarray``, ``jax.device_get``,
``addressable_data``, a replicated array's read) are counted once, by the
agent's live-array accounting and by the OOM census, against the bytes the
program holds and the unique-buffer oracle."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import TARGETS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run():
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8")
    done = subprocess.run([sys.executable, str(TARGETS / "shard_reads.py")], env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


STEPS = ["made", "asarray", "device_get", "replicated", "addressable_data", "parent_gone", "kept_read"]


@pytest.mark.parametrize("step", STEPS)
def test_each_buffer_counted_once_after_host_reads(run, step):
    at = run["steps"][step]
    assert len(at["expected"]) == 8
    assert at["probe"] == at["expected"], step
    assert at["census"] == at["expected"], step


def test_the_reads_did_make_per_shard_arrays(run):
    """The case is real: each read added arrays to jax.live_arrays()."""
    live = [run["steps"][s]["live"] for s in STEPS]
    assert live[1] >= live[0] + 16  # np.asarray of an 8-way sharded array: 8 shards + 8 more
    assert live[2] >= live[1] + 16
    assert live[3] >= live[2] + 1
    assert live[4] >= live[3] + 8


def test_unique_buffer_oracle_agrees_at_the_end(run):
    assert run["oracle"] == run["steps"]["kept_read"]["expected"]
    after = run["steps"]["after_oracle"]
    assert after["probe"] == run["oracle"]
    assert after["census"] == run["oracle"]


def test_program_sees_the_same_live_arrays_under_the_agent(tmp_path):
    """Asking a buffer's address must not add an Array to the program's own
    jax.live_arrays(): on an array jax assembled in Python (device_put of host
    data, make_array_from_callback, ...) it would (5 arrays became 10)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAXTOP_SOCKET_DIR=str(tmp_path))
    target = str(TARGETS / "live_count.py")
    plain = subprocess.run([sys.executable, target], env=env, capture_output=True, text=True, timeout=180)
    assert plain.returncode == 0, plain.stderr[-2000:]
    log = tmp_path / "run.jsonl"
    under = subprocess.run([sys.executable, "-m", "jaxtop", "run", "--log", str(log), target], env=env,
                           capture_output=True, text=True, timeout=180)
    assert under.returncode == 0, under.stderr[-2000:]
    assert under.stdout == plain.stdout
    scanned = [json.loads(line) for line in log.read_text().splitlines() if '"live_arrays"' in line]
    assert scanned, "the agent never scanned: the comparison proves nothing"
