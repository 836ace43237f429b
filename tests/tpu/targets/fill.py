"""Fills the device CHUNK bytes at a time until it refuses (uncaught).

On a TPU the chip's HBM runs out (RESOURCE_EXHAUSTED after ~15 GiB on a
v5e). On CPU the device is the host's memory, which has no limit of its
own: an address-space limit a few chunks above what the process maps once
jax is up stands in for one, so the failure comes after a few chunks on any
machine.

Usage: fill.py CHUNK_BYTES
"""

import os
import resource
import sys

import jax
import jax.numpy as jnp

chunk = int(sys.argv[1])


def vm_size():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")


if jax.devices()[0].platform == "cpu":
    jnp.zeros(4).block_until_ready()  # jax's own threads and arenas mapped before the limit is read
    room = int(os.environ.get("FILL_CPU_ROOM", 3 * chunk + chunk // 2))
    resource.setrlimit(resource.RLIMIT_AS, (vm_size() + room, resource.getrlimit(resource.RLIMIT_AS)[1]))

held = []
print("filling", flush=True)
while True:
    held.append(jnp.ones((chunk // 4,), jnp.float32))  # FILL_LINE
    held[-1].block_until_ready()
