"""An un-instrumented jitted loop (no jaxtop anywhere): a step counter on
stdout every step and on stderr every 10 steps; deterministic output."""
import argparse
import sys
import time

import numpy as np

import jax
import jax.numpy as jnp

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=1000)
p.add_argument("--sleep", type=float, default=0.01)
args = p.parse_args()

step = jax.jit(lambda w, x: w + 0.001 * jnp.tanh(x @ w))
w = jnp.ones((32, 32))
x = np.ones((32, 32), np.float32)  # NumPy: an implicit host-to-device copy per step
for i in range(args.steps):
    w = step(w, x)
    w.block_until_ready()
    print(f"step {i}", flush=True)
    if i % 10 == 0:
        print(f"err {i}", file=sys.stderr, flush=True)
    time.sleep(args.sleep)
