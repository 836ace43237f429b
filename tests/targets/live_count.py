"""Arrays made every way jax makes them, read and not read, then
``len(jax.live_arrays())`` once the agent (when there is one) has scanned them:
the program must see the same number with and without it.

Run with XLA_FLAGS=--xla_force_host_platform_device_count=8. Prints the count.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
single = jax.sharding.SingleDeviceSharding(jax.devices()[0])
keep = [
    jax.device_put(np.ones(1000)),  # assembled in Python: asking its address would make an Array
    jax.device_put(np.ones(1000), jax.devices()[-1]),  # another device where there is one
    jax.make_array_from_callback((1000,), single, lambda i: np.ones(1000)[i]),
    jax.make_array_from_single_device_arrays((8,), single, [jnp.ones(8)]),
    jax.device_put(np.ones(8 * 64), NamedSharding(mesh, P("x"))),
    jax.jit(lambda: jnp.zeros(100))(),
    jnp.arange(10.0) + 1,
]
read = jax.device_put(np.ones(500))
np.asarray(read)  # the program's own read makes one, with or without the agent
keep.append(read)
jax.block_until_ready(keep)
time.sleep(1.5)  # the agent scans every 0.5 s at most
print(len(jax.live_arrays()))
