"""A small training loop for `jaxtop run --budget` (tests/test_budget.py).

Usage: budget_loop.py MODE STEPS, MODE one of
  device   batches placed with jax.device_put up front: no implicit transfer
  numpy    a NumPy batch fed to the jitted step each step: one implicit h2d per step,
           then sys.exit(0) (a success: the budget still counts)
  raise    as numpy, then an exception: exit status 1 and its traceback
"""
import sys

import numpy as np

import jax
import jax.numpy as jnp

mode, steps = sys.argv[1], int(sys.argv[2])
w = jax.device_put(np.full((128, 128), 0.01, np.float32))
step = jax.jit(lambda w, x: jnp.tanh(x @ w).sum())
batches = [np.full((32, 128), i, np.float32) for i in range(4)]
placed = [jax.device_put(b) for b in batches]
for i in range(steps):
    batch = placed[i % 4] if mode == "device" else batches[i % 4]
    loss = step(w, batch)
print(f"{mode}: {steps} steps, loss {float(loss):.4f}", flush=True)
print("a line of the program's own on stderr", file=sys.stderr, flush=True)
if mode == "numpy":
    sys.exit(0)
if mode == "raise":
    raise RuntimeError("the program's own failure")
