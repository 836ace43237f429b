"""Host reads of sharded arrays on 8 CPU devices, counted at each step by
the agent's live-array accounting, its own probe and the OOM census, next
to what the program holds.

Run with XLA_FLAGS=--xla_force_host_platform_device_count=8. Prints one JSON
object: per step, ``{"probe": {device: bytes}, "census": {device: bytes},
"expected": {device: bytes}, "live": len(jax.live_arrays())}``, and at the
end ``"oracle"``: the unique buffers' bytes per device, read from every
array's shards by address (it materialises shards, so it runs last, and a
scan after it must agree too).
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxtop.probes.jax_memory import JaxMemoryProbe
from jaxtop.probes.oom.parts import group_live_arrays

mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
rows = NamedSharding(mesh, P("x"))
everywhere = NamedSharding(mesh, P())
probe = JaxMemoryProbe()
named = {}  # what the program holds: name -> array


def expected():
    """Each named array's buffers, per device (the program's own view)."""
    out = {}
    for arr in named.values():
        for d in arr.sharding.addressable_devices:
            per = int(np.prod(arr.sharding.shard_shape(arr.shape))) * arr.dtype.itemsize
            out[str(d.id)] = out.get(str(d.id), 0) + per
    return out


def measure():
    probe.scan_live_arrays(0.0)
    live = jax.live_arrays()
    census = group_live_arrays(live)["per_device"]
    got = {str(k): v.bytes for k, v in probe.arrays.devices.items() if v.bytes}
    return {"probe": got, "census": {k: v for k, v in census.items() if v}, "expected": expected(),
            "live": len(live)}


steps = {}
named["a"] = jax.device_put(jnp.arange(8 * 32768, dtype=jnp.float32), rows)
named["r"] = jax.device_put(jnp.ones(1024, jnp.float32), everywhere)
named["s"] = jnp.ones(3000, jnp.float32) + 1
# Two same-shaped outputs of one call share one traceback.
named["w1"], named["w2"] = jax.jit(lambda: (jnp.ones((64, 128)), jnp.zeros((64, 128))), out_shardings=(rows, rows))()
named["gone"] = jax.device_put(jnp.ones((8, 512), jnp.float32), rows)
jax.block_until_ready(list(named.values()))
steps["made"] = measure()
np.asarray(named["a"])
steps["asarray"] = measure()
jax.device_get(named["w1"])
steps["device_get"] = measure()
np.asarray(named["r"])
steps["replicated"] = measure()
named["w2"].addressable_data(3)
steps["addressable_data"] = measure()
# A shard taken out and kept after its parent goes: its buffer lives on.
named["kept"] = named["gone"].addressable_data(2)
del named["gone"]
steps["parent_gone"] = measure()
np.asarray(named["kept"])
steps["kept_read"] = measure()

oracle = {}
seen = set()
for arr in jax.live_arrays():
    for shard in arr.addressable_shards:
        key = (shard.device.id, shard.data.unsafe_buffer_pointer())
        if key not in seen:
            seen.add(key)
            oracle[str(shard.device.id)] = oracle.get(str(shard.device.id), 0) + int(shard.data.nbytes)
steps["after_oracle"] = measure()
print(json.dumps({"steps": steps, "oracle": oracle, "devices": jax.device_count(), "pid": os.getpid()}))
