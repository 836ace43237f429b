"""Holds arrays of several shapes and dtypes, counts them as jax itself
sees them, then waits while the agent scans them.

The count is the oracle of the live-array test: ``jax.live_arrays()``,
each buffer once (by device and address), its ``nbytes`` summed per device.
It is printed as one JSON line with the time it was taken and
``memory_stats()``'s keys (None where the backend has none, as on CPU).

Usage: hold.py [--scale K] [--hold-seconds S]
"""

import argparse
import json
import time

import numpy as np

import jax
import jax.numpy as jnp

p = argparse.ArgumentParser()
p.add_argument("--scale", type=int, default=1, help="multiplies the big arrays' sizes (the chip holds GiBs)")
p.add_argument("--hold-seconds", type=float, default=4.0)
args = p.parse_args()

MiB = 1 << 20
dev = jax.devices()[0]
held = [jnp.full((args.scale * 16 * MiB // 4,), i, jnp.float32) for i in range(4)]  # 4 x 16 MiB x scale
held += [jnp.ones((1024, 1024), jnp.bfloat16) + i for i in range(3)]  # 2 MiB each
held += [jnp.ones((n,), jnp.int8) for n in (1, 7, 4097, 65537)]  # odd sizes
held += [jax.device_put(np.ones((300, 301), np.float32))]  # from the host
held += [jax.jit(lambda: jnp.zeros((513,), jnp.int32))()]  # a jitted output
jax.block_until_ready(held)

seen: set[tuple[int, int]] = set()
per_device: dict[int, list[int]] = {}
for a in jax.live_arrays():
    (d,) = a.sharding.device_set  # one device here: every array single-device
    key = (d.id, a.unsafe_buffer_pointer())
    if key in seen:
        continue
    seen.add(key)
    total = per_device.setdefault(d.id, [0, 0])
    total[0] += a.nbytes
    total[1] += 1
stats = dev.memory_stats()
print(json.dumps({"t": time.time(), "platform": dev.platform, "per_device": per_device,
                  "memory_stats_keys": sorted(stats) if stats is not None else None}), flush=True)
time.sleep(args.hold_seconds)  # the agent scans about once a second
print("done", len(held), flush=True)
