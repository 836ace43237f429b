"""Items made one ``jax.device_put`` each, every step (a batching miss the
guard cannot see: explicit transfers are not logged), or the same items as
one stacked array (its fix): ``python advice_puts.py SECONDS [stacked]``.
The advisor finds the first in the memory profiles: many small arrays alive
from one comprehension's line, profile after profile.

Prints ``ready``, ``warm t=T`` when the loop starts (T: ``time.time()``),
``steps=N`` at the end.
"""
import sys
import time

import numpy as np

import jax
import jax.numpy as jnp

ITEMS = 32
seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 12.0
stacked = len(sys.argv) > 2 and sys.argv[2] == "stacked"
step = jax.jit(lambda x: x * 0.5)
total = jnp.zeros(())
print("ready", flush=True)
print(f"warm t={time.time():.3f}", flush=True)
stop = time.monotonic() + seconds
steps = 0
while time.monotonic() < stop:
    if stacked:
        items = jax.device_put(np.arange(ITEMS, dtype=np.float32))  # APPLIED batching
    else:
        items = [jax.device_put(np.float32(i)) for i in range(ITEMS)]  # MISS batching
    total = total + step(items[0])
    steps += 1
    time.sleep(0.01)
jax.block_until_ready(total)
print(f"steps={steps}", flush=True)
