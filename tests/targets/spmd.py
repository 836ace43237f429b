"""A data-parallel training loop on every CPU device (pmap, as JAX's SPMD
MNIST example does it, and jit with a NamedSharding), then an oracle.

Run with XLA_FLAGS=--xla_force_host_platform_device_count=8. Writes
``{"live_count", "t_ready", "t_oracle", "per_device", "h2d_bytes_placed"}``
as JSON to the path in argv[1]:

* ``live_count``: ``len(jax.live_arrays())`` as the program sees it, taken
  before the oracle touches any shard;
* ``per_device``: the sum of *unique* buffer sizes on each device (buffers
  deduplicated by address), read from the shards at the end — the oracle
  materialises shards, so it runs last.
"""

import json
import sys
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

n = jax.device_count()
rng = np.random.RandomState(0)
sizes = [64, 128, 10]
params = [(0.1 * rng.randn(m, k).astype(np.float32), np.zeros(k, np.float32)) for m, k in zip(sizes[:-1], sizes[1:])]


def loss(params, x, y):
    h = x
    for w, b in params[:-1]:
        h = jnp.tanh(h @ w + b)
    w, b = params[-1]
    return jnp.mean((h @ w + b - y) ** 2)


@partial(jax.pmap, axis_name="batch")
def update(params, x, y):
    grads = jax.grad(loss)(params, x, y)
    grads = jax.tree_util.tree_map(lambda g: jax.lax.psum(g, "batch"), grads)
    return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)


replicated = jax.tree_util.tree_map(lambda a: np.broadcast_to(a, (n,) + a.shape), params)
h2d_bytes = 0
for step in range(20):
    # NumPy batches: implicit host-to-device transfers, one shard per device.
    x = rng.randn(n, 16, sizes[0]).astype(np.float32)
    y = rng.randn(n, 16, sizes[-1]).astype(np.float32)
    if step == 0:
        h2d_bytes += sum(a.nbytes for a in jax.tree_util.tree_leaves(replicated))
    h2d_bytes += x.nbytes + y.nbytes
    replicated = update(replicated, x, y)

mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))  # jax.make_mesh is newer than 0.4.30
sharded = jax.device_put(np.ones((n * 32, 256), np.float32), NamedSharding(mesh, P("x")))  # explicit: no guard line
doubled = jax.jit(lambda a: a * 2, out_shardings=NamedSharding(mesh, P("x")))(sharded)
jax.block_until_ready((replicated, doubled))
t_ready = time.time()
time.sleep(2.5)  # at least two of the agent's live-array scans
live_count = len(jax.live_arrays())
t_oracle = time.time()

per_device = {}
seen = set()
for arr in jax.live_arrays():
    for shard in arr.addressable_shards:
        data = shard.data
        key = (shard.device.id, data.unsafe_buffer_pointer())
        if key not in seen:
            seen.add(key)
            per_device[shard.device.id] = per_device.get(shard.device.id, 0) + int(data.nbytes)
with open(sys.argv[1], "w") as f:
    json.dump({"live_count": live_count, "t_ready": t_ready, "t_oracle": t_oracle,
               "per_device": per_device, "h2d_bytes_placed": h2d_bytes}, f)
