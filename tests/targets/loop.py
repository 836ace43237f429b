"""A jitted loop that runs until killed (or for --seconds), printing its step
counter with timestamps to stdout and a step line to stderr every 50 steps."""
import argparse
import sys
import time

import numpy as np

import jax
import jax.numpy as jnp

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=60.0)
p.add_argument("--sleep", type=float, default=0.005)
args = p.parse_args()

step = jax.jit(lambda w, x: w + 0.001 * jnp.tanh(x @ w))
w = jnp.ones((64, 64))
x = np.ones((64, 64), np.float32)
end = time.time() + args.seconds
i = 0
print("ready", flush=True)
while time.time() < end:
    w = step(w, x)
    w.block_until_ready()
    i += 1
    print(f"{time.time():.4f} {i}", flush=True)
    if i % 50 == 0:
        print(f"step {i}", file=sys.stderr, flush=True)
    time.sleep(args.sleep)
