"""A known mix of implicit transfers, plus the program's own stderr output.

Needs XLA_FLAGS=--xla_force_host_platform_device_count=2 for the d2d part.
"""
import os
import sys

import numpy as np

import jax
import jax.numpy as jnp
from jax.sharding import SingleDeviceSharding

N = int(os.environ.get("MIX_N", "20"))
sys.stderr.write("user line before any transfer\n")
sys.stderr.write("partial line without newline... ")
sys.stderr.flush()
os.write(2, b"done\n")
os.write(2, b"binary \xff\xfe bytes\r progress 50%\r progress 100%\n")

f = jax.jit(lambda a, b: a * 2 + b)
x = np.ones((64, 32), np.float32)
y = np.zeros((64, 32), np.float32)
for i in range(N):
    f(x, y)  # two NumPy args: two h2d per call (the first logs avals, later calls log empty payloads)
g = jax.jit(lambda a, s: a + s)
dev_arr = jnp.ones((16,))
for i in range(N):
    g(dev_arr, float(i))  # Python scalar operand: one h2d
devices = jax.devices()
if len(devices) > 1:
    pinned = jax.jit(lambda a: a + 1, in_shardings=SingleDeviceSharding(devices[1]))
    on0 = jax.device_put(jnp.arange(8.0), devices[0])  # explicit: not counted
    try:
        for i in range(N):
            pinned(on0)  # committed to device 0, pinned to device 1: one d2d
    except ValueError:
        # jax < 0.5 refuses a committed argument on another device; an
        # uncommitted one (default device 0) still moves to device 1.
        uncommitted = jnp.arange(8.0)
        for i in range(N):
            pinned(uncommitted)
print("W1202 00:00:00.000000    1 fake.cc:1] not a guard line, user text", file=sys.stderr)
sys.stderr.write("user line at the end\n")
if os.environ.get("MIX_EXIT"):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(os.environ["MIX_EXIT"]))
