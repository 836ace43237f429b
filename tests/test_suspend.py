"""Real JAX child: a process stopped with SIGSTOP and continued is told
apart from a busy one, and the agent's costly passes move on by the stop
(nothing changed while it was frozen) instead of all falling due at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

TARGET = r"""
import sys, time
import jaxtop
handle = jaxtop.instrument(interval_s=0.1, log_path=sys.argv[1])
import jax, jax.numpy as jnp
held = [jnp.full((16,), float(i)) for i in range(100)]
step = jax.jit(lambda w: w * 0.999 + 0.001)
w = jnp.ones((256, 256))
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    w = step(w)
    w.block_until_ready()
    time.sleep(0.001)
handle.stop()
"""


def last_agent_field(path) -> dict:
    last = None
    with open(path, "rb") as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("type") == "sample" and isinstance(rec.get("agent"), dict):
                last = rec["agent"]
    assert last is not None
    return last


@pytest.mark.parametrize("stop_s", [0.0, 4.0], ids=["busy", "stopped"])
def test_a_stopped_process_is_told_from_a_busy_one(tmp_path, child_env, stop_s):
    script = tmp_path / "target.py"
    script.write_text(TARGET)
    log = tmp_path / "run.jsonl"
    proc = subprocess.Popen([sys.executable, str(script), str(log), str(8.0 + stop_s)], env=child_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline().startswith(b"ready"), proc.stderr.read()
        time.sleep(2.5)
        if stop_s:
            os.kill(proc.pid, signal.SIGSTOP)
            time.sleep(stop_s)
            os.kill(proc.pid, signal.SIGCONT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
    agent = last_agent_field(log)
    if stop_s:
        # The stop is seen from the first late tick: at most the stop, at
        # least all but the tick and the slow interval it can fall in.
        assert stop_s - 1.2 <= agent["suspended_s"] <= stop_s + 0.2, agent
    else:
        assert agent["suspended_s"] == 0, agent
