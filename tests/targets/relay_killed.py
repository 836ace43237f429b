"""Makes implicit transfers and writes to stderr on both sides of a pause in
which the test kills jaxtop's stderr relay (it reads a line from stdin).

Prints ``ready`` once everything before the pause is on the terminal and
counted, and the number of transfers it made at the end.
"""
import os
import sys

import numpy as np

import jax

N = int(os.environ.get("KILLED_N", "10"))
f = jax.jit(lambda a: a + 1)
x = np.ones((4,), np.float32)
for _ in range(N):
    f(x).block_until_ready()  # one NumPy arg: one h2d per call
sys.stderr.write("before the kill\n")
sys.stderr.flush()
try:
    import jaxtop

    handle = jaxtop.instrument()  # the running agent's handle (idempotent)
    handle.agent.transfer_totals(sync_timeout_s=5.0)  # all of the above relayed
except ImportError:  # a plain run
    pass
print("ready", flush=True)
sys.stdin.readline()
# Right after the kill, before jaxtop can have noticed: must not raise.
sys.stderr.write("right after the kill\n")
sys.stderr.flush()
os.write(2, b"a partial line")
for i in range(N):
    f(x).block_until_ready()
    sys.stderr.write(f"\rafter the kill {i}")
    sys.stderr.flush()
sys.stderr.write("\nlast line\n")
print("transfers", 2 * N, flush=True)
