"""Training, then evaluation: a jitted step on device arrays only (no
implicit transfer) for SECONDS, faster than jaxtop's hook stays in for a
program that transfers nothing, then EVALS calls that each pass a new NumPy
batch (one implicit host-to-device copy per call) at the line marked EVAL,
PAUSE_S apart (default 5 ms).

    python quiet_then_eval.py SECONDS EVALS [PAUSE_S]

Prints ``quiet`` when the training part starts and ``done`` at the end.
"""
import sys
import time

import numpy as np

import jax
import jax.numpy as jnp

seconds, evals = float(sys.argv[1]), int(sys.argv[2])
PAUSE_S = float(sys.argv[3]) if len(sys.argv) > 3 else 0.005
step = jax.jit(lambda w: w * 0.999 + 0.001)
model = jax.jit(lambda w, x: (x @ w).sum())
w = jnp.ones((64, 64), jnp.float32)
step(w).block_until_ready()
print("quiet", flush=True)
stop = time.monotonic() + seconds
while time.monotonic() < stop:
    for _ in range(100):
        w = step(w)
    w.block_until_ready()
rng = np.random.default_rng(0)
for _ in range(evals):
    batch = rng.standard_normal((8, 64), dtype=np.float32)
    model(w, batch).block_until_ready()  # EVAL
    time.sleep(PAUSE_S)
print("done", flush=True)
