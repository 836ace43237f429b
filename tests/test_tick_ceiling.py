"""Real agent, real clock: over its CPU ceiling the agent samples less often,
says so in its record, and the dashboard neither calls it stale nor misreads
its rates.

The ceiling is lowered in the child (a window of 1 s, a ceiling of 0.01 % of
a core, which any agent exceeds) so that the stretch shows within seconds
(the first window left out, three more measured).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from jaxtop.agent import cadence
from jaxtop.dashboard.model import Model
from jaxtop.dashboard.snapshot_text import snapshot_text
from jaxtop.dashboard.views import LIVE

CHILD = textwrap.dedent("""
    import sys, time
    from jaxtop.agent import cadence
    # A 1 s window and a ceiling no agent stays under.
    cadence.SelfMeter.__init__.__defaults__ = (cadence.CPU_BUDGET, 1.0, 0.0001)
    import jaxtop
    handle = jaxtop.instrument(interval_s=0.05, slow_interval_s=0.1, log_path=sys.argv[1])
    import numpy as np, jax
    f = jax.jit(lambda x: x * 2.0)
    host = np.ones(4, np.float32)
    t0 = time.monotonic()
    while time.monotonic() - t0 < float(sys.argv[2]):
        f(host)  # one implicit transfer a call
        time.sleep(0.005)
""")


@pytest.mark.slow
def test_an_agent_over_its_ceiling_samples_less_often_and_says_so(tmp_path, child_env):
    log = tmp_path / "run.jsonl"
    out = subprocess.run([sys.executable, "-c", CHILD, str(log), "9"], capture_output=True, text=True,
                         env=child_env, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    samples = [r for r in records if r.get("type") == "sample"]
    agents = [s["agent"] for s in samples if isinstance(s.get("agent"), dict)]
    assert {a["ceiling_share"] for a in agents} == {0.0001}
    assert agents[0]["tick_s"] == 0.05  # as asked, until a window was measured
    assert agents[-1]["tick_s"] == pytest.approx(0.05 * cadence.MAX_TICK_STRETCH)
    stretched_at = next(s["t"] for s in samples if (s.get("agent") or {}).get("tick_s", 0.05) > 0.06)
    late = [s["t"] for s in samples if s["t"] > stretched_at + 1.0 and not s.get("final")]
    gaps = [b - a for a, b in zip(late, late[1:])]
    assert gaps and 0.08 < sorted(gaps)[len(gaps) // 2] < 0.15  # 0.1 s apart, not 0.05 s
    # Nothing lost: the transfers counted are the calls made, in the totals.
    totals = [s["transfers"]["h2d"]["count_total"] for s in samples if s.get("transfers")]
    assert totals == sorted(totals) and totals[-1] >= 300

    # The dashboard: live between the slower samples, and it says why they are slower.
    clock = [0.0]
    model = Model(clock=lambda: clock[0])
    pid = next(r["pid"] for r in records if r.get("type") == "hello")
    for rec in records:
        if rec.get("type") != "exit":
            model.feed(pid, rec)
    clock[0] = 0.25  # 2.5 stretched intervals after the last sample: not 3 (5 asked ones)
    model.refresh_states()
    snap = model.snapshot()
    proc = snap.processes[0]
    assert proc.state == LIVE
    assert proc.agent is not None and proc.agent.stretched(proc.interval_s)
    assert "sampling every 0.1 s (asked 0.05 s): at its CPU ceiling" in snapshot_text(snap)
