"""A function whose name is 1 MiB long (generated code can make such names),
jitted and called with a NumPy value every step at the line marked LONG.

    python long_names.py SECONDS
"""
import sys
import time

import numpy as np

import jax

NAME = "f" * (1 << 20)
namespace = {}
exec(f"def {NAME}(x, y):\n    return x + y\n", namespace)
fn = jax.jit(namespace[NAME])
x = jax.numpy.ones(4)
stop = time.monotonic() + float(sys.argv[1])
steps = 0
while time.monotonic() < stop:
    fn(x, np.ones(4, np.float32)).block_until_ready()  # LONG
    steps += 1
    time.sleep(0.005)
print(f"steps={steps}", flush=True)
