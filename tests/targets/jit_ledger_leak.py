"""A leak: a new jitted closure per iteration, each kept alive, for ``--seconds``.

With ``--inprocess LOG`` the script instruments itself and adds the jit
ledger with public APIs (passes every 0.2 s); under ``jaxtop run`` the agent
keeps it. The closures are created and called on the line marked ``# leak``.
"""
import sys
import time

import numpy as np

INPROCESS = "--inprocess" in sys.argv
if INPROCESS:
    import jaxtop

    handle = jaxtop.instrument(interval_s=0.05, log_path=sys.argv[sys.argv.index("--inprocess") + 1])

import jax

if INPROCESS:
    from jaxtop.probes.executables import JitLedgerProbe

    probe = JitLedgerProbe(interval_s=0.2, full_every_s=1.0)
    probe.start()
    final: list[int] = []
    # As the agent's last sample at exit does: a pass and a whole table.
    handle.agent.register_sample_field("jit", lambda: probe.sample(force=bool(final), full=bool(final)))

seconds = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 4.0
x = np.ones(8, np.float32)
kept = []
end = time.time() + seconds
print("ready", flush=True)
while time.time() < end:
    k = len(kept)
    kept.append(jax.jit(lambda v, k=k: v * 2.0 + k)); kept[-1](x).block_until_ready()  # leak
    time.sleep(0.005)
print("closures", len(kept), flush=True)
if INPROCESS:
    final.append(1)
    time.sleep(0.3)
