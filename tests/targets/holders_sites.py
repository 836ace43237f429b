"""Arrays held at known lines (each marked SITE:<name>), with the program's
own accounting of them in the sample field ``truth``; a labelled pytree
that is dropped on request (a line on stdin).

Prints ``ready <t>`` once everything is allocated, then waits: the test
compares the first holders record taken after that moment with ``truth``.
"""
import argparse
import sys
import time

import jaxtop
from jaxtop.agent import labels
from jaxtop.probes.holders import HoldersProbe

p = argparse.ArgumentParser()
p.add_argument("--log", required=True)
args = p.parse_args()

h = jaxtop.instrument(interval_s=0.1, log_path=args.log)
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

HoldersProbe(interval_s=0.5, budget=0.05).install(h.agent)  # a test: profiles every 0.5 s
labels.install(h.agent)
held = {}


def make_tables():
    return [jax.device_put(np.ones((100, 10), np.float32)) for _ in range(7)]  # SITE:tables


def make_ids():
    return [jax.device_put(np.arange(33, dtype=np.int8)) for _ in range(3)]  # SITE:ids


def make_sharded():
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    return jax.device_put(np.zeros((8, 16), np.float32), NamedSharding(mesh, PartitionSpec("x")))  # SITE:sharded


def init_params():
    return {"w": jnp.zeros((128, 64)), "b": jnp.zeros((64,), jnp.bfloat16), "layers": [jnp.ones((32, 32)) for _ in range(3)]}  # SITE:params


held["tables"] = make_tables()
held["ids"] = make_ids()
sharded = make_sharded()
params = labels.label("params", init_params())  # jaxtop.label once re-exported
live_before = len(jax.live_arrays())
leaves = jax.tree_util.tree_leaves(params)


def per_device(arrays):
    out = {}
    for a in arrays:
        shard = a.sharding.shard_shape(a.shape)
        for d in a.sharding.addressable_devices:
            out[str(d.id)] = out.get(str(d.id), 0) + int(np.prod(shard)) * a.dtype.itemsize
    return out


truth = {
    "tables": {"bytes": sum(a.nbytes for a in held["tables"]), "count": len(held["tables"])},
    "ids": {"bytes": sum(a.nbytes for a in held["ids"]), "count": len(held["ids"])},
    "sharded": {"bytes": sum(per_device([sharded]).values()), "count": 2, "devices": per_device([sharded])},
    "params": {"bytes": sum(x.nbytes for x in leaves), "count": len(leaves)},
}
state = {"truth": truth, "label_bytes": sum(x.nbytes for x in leaves), "live": live_before}
del leaves
h.agent.register_sample_field("truth", lambda: state)
print(f"ready {time.time():.6f}", flush=True)
sys.stdin.readline()  # the test has compared the sites: drop the labelled tree
del params
state = {"truth": truth, "label_bytes": 0, "live": len(jax.live_arrays()), "dropped": True,
         "live_before": live_before}
print(f"dropped {time.time():.6f} {state['live']} {live_before}", flush=True)
sys.stdin.readline()
h.stop()
