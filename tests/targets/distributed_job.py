"""One process of a real multi-process jax.distributed job on CPU (gloo
collectives over localhost), for tests/test_cluster.py.

Each process holds its share of a sharded array, runs an all-reduce step
and reads a scalar back to the host (an implicit device-to-host read and a
host-to-device put each step), until the file ``--pause`` names appears: it
then stops changing anything (so that the figures Prometheus scrapes and
the process's own are the same numbers) and exits when ``--stop`` appears.
"""

import argparse
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--coordinator", required=True)
parser.add_argument("--process-id", type=int, required=True)
parser.add_argument("--processes", type=int, default=2)
parser.add_argument("--pause", required=True)
parser.add_argument("--stop", required=True)
parser.add_argument("--timeout", type=float, default=120.0)
args = parser.parse_args()

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.processes,
                           process_id=args.process_id)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

mesh = Mesh(np.array(jax.devices()), ("d",))
sharding = NamedSharding(mesh, P("d"))
n = len(jax.devices())
rows = 1024
local = [jax.device_put(np.full((rows, 256), float(i), np.float32), d)
         for i, d in enumerate(jax.local_devices())]
x = jax.make_array_from_single_device_arrays((rows * n, 256), sharding, local)
# Each process also holds an array of its own size on its first device: the
# processes' figures differ, so a mix-up of labels would show.
own = jax.device_put(np.ones((256 * (args.process_id + 1), 256), np.float32), jax.local_devices()[0])


@jax.jit
def step(a, k):
    return a * 0.5 + k, jnp.sum(a)


deadline = time.monotonic() + args.timeout
k = 0
while not os.path.exists(args.pause) and time.monotonic() < deadline:
    x, total = step(x, np.float32(k))  # np scalar argument: an implicit host-to-device transfer
    float(total)  # the all-reduced sum read on the host
    k += 1
    time.sleep(0.02)
print(f"process {args.process_id}: {k} steps", flush=True)
while not os.path.exists(args.stop) and time.monotonic() < deadline:
    time.sleep(0.05)
