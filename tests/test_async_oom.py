"""An allocation that fails asynchronously must never abort the program.

On CPU under ``RLIMIT_AS``, a jitted matmul whose 24 GiB output cannot be
allocated fails after dispatch: the array says ``is_ready()`` and holds the
error. jaxlib aborts the process (SIGABRT, ``Check failed:
buffer_.IsConcrete()``) when asked that array's buffer address, which the
agent's scan and the OOM census used to do: a program that never reads the
array exited 0 on its own and 134 under jaxtop. Now both runs, read and not
read, end the same (status, stdout, stderr and traceback), and a census is
written.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest

from conftest import PY
from test_oom import decoded

pytestmark = pytest.mark.slow

PROGRAM = """\
import sys, time
import jax, jax.numpy as jnp
a = jnp.ones((80000, 1), jnp.float32)
b = jnp.ones((1, 80000), jnp.float32)
y = jax.jit(lambda a, b: a @ b)(a, b)  # 23.8 GiB: cannot be allocated under the limit
print("dispatched", flush=True)
time.sleep(2.0)  # the agent scans the live arrays meanwhile
print("done", flush=True)
if "read" in sys.argv:
    print(float(y[0, 0]))
"""


def limited() -> None:
    limit = 2_000_000_000  # address space: jax and the agent fit, the output does not
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@pytest.mark.parametrize("read", [False, True], ids=["not_read", "read"])
def test_an_asynchronous_oom_ends_the_program_as_without_jaxtop(child_env, tmp_path, read):
    script = tmp_path / "async_oom.py"
    script.write_text(PROGRAM)
    args = [str(script)] + (["read"] if read else [])
    plain = subprocess.run([PY, *args], env=child_env, capture_output=True, text=True, timeout=120,
                           preexec_fn=limited, cwd=tmp_path)
    if read and plain.returncode == 0 or not read and "done" not in plain.stdout:
        pytest.skip(f"this jax does not fail the allocation asynchronously here: {plain.stderr[-300:]}")
    ours = subprocess.run([PY, "-m", "jaxtop", "run", *args], env=child_env, capture_output=True, text=True,
                          timeout=120, preexec_fn=limited, cwd=tmp_path)
    assert ours.returncode == plain.returncode == (1 if read else 0), ours.stderr[-2000:]
    assert ours.stdout == plain.stdout
    # The traceback and every other line as the plain run's; jaxtop adds one line naming the census.
    notes = [line for line in ours.stderr.splitlines() if line.startswith("jaxtop: out of memory: census written")]
    assert [line for line in ours.stderr.splitlines() if line not in notes] == plain.stderr.splitlines()
    censuses = sorted(tmp_path.glob("jaxtop-oom-*.json"))
    assert censuses, "no census written"
    triggers = [json.loads(p.read_text())["trigger"] for p in censuses]
    assert all(decoded(json.loads(p.read_text())).trigger.how == t["how"] for p, t in zip(censuses, triggers))
    assert any(t["how"] == "failed_array" for t in triggers) or any(t.get("uncaught") for t in triggers), triggers
    if read:
        assert len(notes) == 1 and any(t.get("uncaught") for t in triggers)
        assert "Traceback (most recent call last)" in ours.stderr and "probes/" not in ours.stderr
    else:
        census = json.loads(censuses[0].read_text())
        assert census["trigger"]["how"] == "failed_array" and census["trigger"]["thread"] == "jaxtop-agent"
        # The failed array holds no memory: it is not counted as live.
        assert census["arrays"]["failed"] >= 1 and census["arrays"]["bytes"] < 1 << 30


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS as on Linux")
def test_the_scan_counts_a_failed_array_as_nothing(child_env, tmp_path):
    """The agent's own figures under the failure: the 23.8 GiB never existed."""
    log = tmp_path / "run.jsonl"
    script = tmp_path / "async_oom.py"
    script.write_text(PROGRAM)
    res = subprocess.run([PY, "-m", "jaxtop", "run", "--log", str(log), str(script)], env=child_env,
                         capture_output=True, text=True, timeout=120, preexec_fn=limited, cwd=tmp_path)
    if "done" not in res.stdout:
        pytest.skip("this jax does not fail the allocation asynchronously here")
    samples = [r for r in map(json.loads, log.read_text().splitlines()) if r.get("type") == "sample"]
    in_use = [d["bytes_in_use"] for s in samples for d in s.get("devices") or [] if d.get("bytes_in_use") is not None]
    assert in_use and max(in_use) < 1 << 30
