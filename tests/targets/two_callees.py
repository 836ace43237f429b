"""One line that calls two things that each copy host values to the device:
a jitted function given two Python scalars by keyword, then jnp's add given
a NumPy array. The line's arguments must be said to be whose they are.

    python two_callees.py STEPS [PAUSE_S]
"""
import sys
import time

import numpy as np

import jax
import jax.numpy as jnp

steps = int(sys.argv[1])
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
scale = jax.jit(lambda x, minval, maxval: x * minval + maxval)
x = jnp.ones(4, jnp.float32)
ones = np.ones(4, np.float32)
for _ in range(steps):
    y = jnp.add(scale(x, minval=0.5, maxval=2.0), ones)  # TWO
    if pause:
        time.sleep(pause)
y.block_until_ready()
print("done", flush=True)
