"""Three lines, each feeding its own jitted function a NumPy array every
call: the same array (# SAME), a new one each call (# NEW), and one array
refilled in place each call (# REFILLED: the same object, other contents).

    python same_or_new.py SECONDS
"""
import sys
import time

import numpy as np

import jax
import jax.numpy as jnp

seconds = float(sys.argv[1])
add_a = jax.jit(lambda w, x: w + x.sum())
add_b = jax.jit(lambda w, x: w - x.sum())
add_c = jax.jit(lambda w, x: w * 0.5 + x.mean())
fixed = np.ones((64, 64), np.float32)
buf = np.zeros((64, 64), np.float32)
rng = np.random.default_rng(0)
w = jnp.zeros(())
i = 0
t0 = time.monotonic()
while time.monotonic() - t0 < seconds:
    w = add_a(w, fixed)  # SAME
    w = add_b(w, rng.standard_normal((64, 64), dtype=np.float32))  # NEW
    buf[:] = i
    w = add_c(w, buf)  # REFILLED
    i += 1
    time.sleep(0.005)
w.block_until_ready()
print("done", flush=True)
