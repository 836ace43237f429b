"""A program holding many live arrays (``argv[1]``, made in steps of
``argv[2]`` a step apart, the first step before anything else) beside a
small jitted loop, for ``argv[3]`` seconds after the last step: what the
live-array scans' pause limit is read on."""

import sys
import time

import numpy as np

import jax
import jax.numpy as jnp

total, per_step, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
kept = []
step = jax.jit(lambda w: jnp.tanh(w) * 0.5)
w = jnp.ones((8, 8))
while len(kept) < total:
    kept.extend(jax.device_put(np.full((4,), i, np.float32)) for i in range(len(kept), min(total, len(kept) + per_step)))
    jax.block_until_ready(kept)
    end = time.monotonic() + 1.2  # the agent scans every 0.5 s at most
    while time.monotonic() < end:
        w = step(w)
        time.sleep(0.01)
end = time.monotonic() + seconds
while time.monotonic() < end:
    w = step(w)
    time.sleep(0.01)
print(len(kept), flush=True)
