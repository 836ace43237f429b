"""Host reads of device arrays from known lines (each marked READ:<kind>),
with or without the host-sync probe (--no-probe): the test compares the
counts per line and the program's output between the two runs.

The reads are done on fresh arrays, some several times in a loop; the
output of each read is printed so that any change a hook made would show.
"""
import argparse
import json

import jaxtop
from jaxtop.probes.host_sync import HostSyncProbe, array_class_state

p = argparse.ArgumentParser()
p.add_argument("--log", default=None)
p.add_argument("--no-probe", action="store_true")
p.add_argument("--numpy-hooks", choices=("on", "auto"), default="on",
               help="auto: the default, numpy untouched (the _value and item hooks only)")
args = p.parse_args()

h = jaxtop.instrument(interval_s=0.05, log_path=args.log) if args.log else None
import jax
import jax.numpy as jnp
import numpy as np

agent_probe = getattr(h.agent, "host_sync", None) if h is not None else None
if agent_probe is not None:
    agent_probe.stop()  # an agent that counts host syncs itself: this run's own probe takes over
if h is not None:
    # The agent's memory probe routes jax.Array.delete through its lock once
    # the backend exists: that is the agent's, not this probe's, to undo.
    import time as _time

    jnp.zeros(1).block_until_ready()
    _deadline = _time.monotonic() + 10
    while getattr(h.agent, "memory", None) is None and _time.monotonic() < _deadline:
        _time.sleep(0.02)
before = array_class_state()
probe = None
if not args.no_probe:
    probe = HostSyncProbe(numpy_hooks="auto" if args.numpy_hooks == "auto" else True)
    if h is not None:
        probe.install(h.agent)
    probe.start()


def fresh(k):
    return jnp.arange(4.0) * k + 1


out = []
for k in range(3):
    out.append(float(jnp.sum(fresh(k))))  # READ:float
out.append(jnp.max(fresh(5)).item())  # READ:item
out.append(np.asarray(fresh(6)).tolist())  # READ:asarray
print(fresh(7))  # READ:print
for k in range(2):
    out.append(bool(jnp.all(fresh(k) > 0)))  # READ:bool
out.append(int(jnp.argmax(fresh(8))))  # READ:int
out.append(fresh(9).tolist())  # READ:tolist
try:
    float(fresh(10))  # READ:raises
except TypeError as exc:
    out.append(f"TypeError: {exc}")
# Arrays over two devices take the path every GPU array takes: numpy's buffer
# export is refused, so numpy calls __array__ -> _value, and jax keeps the
# host copy it made: the second read of the same array is no device read.
from jax.sharding import Mesh, NamedSharding, PartitionSpec

mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
for k in range(2):
    xs = jax.device_put(np.arange(8.0) * k, NamedSharding(mesh, PartitionSpec("x")))
    for _ in range(2):
        out.append(np.asarray(xs).tolist())  # READ:sharded
rep = jax.device_put(np.float32(2.5), NamedSharding(mesh, PartitionSpec()))
out.append(rep.item())  # READ:replicated
y = fresh(11)
y.block_until_ready()
print(json.dumps(out), flush=True)
counts = {}
if probe is not None:
    import time

    if h is not None:
        time.sleep(1.0)  # at least one host_syncs record after the last read
    counts = {f"{k[1]}": v for k, v in probe.counts().items() if k[0] == __file__}
    probe.stop()
after = array_class_state()
same = all(before[g].keys() == after[g].keys() and all(before[g][n] is after[g][n] for n in before[g])
           for g in before)
print("counts " + json.dumps(counts, sort_keys=True), flush=True)
print(f"restored {same}", flush=True)
if h is not None:
    h.stop()
