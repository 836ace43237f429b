"""A training-like loop with a known mix of implicit transfers, on 8 CPU devices.

The target of tests/transfer_oracle.py (which counts, per line, what JAX's own
transfer guard reports) and of jaxtop's "which line makes each implicit
transfer". What JAX 0.10.2 logs per line (on CPU, per run of N steps):

- train_step(params, {two NumPy arrays}, step, lr): 4 h2d a call (2 arrays and
  the 2 Python scalars), the first (compiling) call included;
- jnp.sin(NumPy array): 1 h2d a call;
- jax.device_put(..., NamedSharding(mesh, ...)) / device_put(x, device): explicit,
  not logged;
- pinned(on_dev0), a jit pinned to device 1 fed an array committed to device 0:
  1 d2d on the first call only (later calls take jit's C++ fast path, which
  copies the argument to device 1 without applying the guard). Under the
  oracle's default (disallow) mode every call counts (N): the first call fails
  its disallow attempt, and a failed first call turns the C++ fast path off
  for that call signature, so every later call goes through the Python path,
  which applies the guard to the copy; `--mode log` counts 1;
- sharded + offset, offset uncommitted on device 0 and sharded over the 8
  devices: 8 d2d a call (one per destination shard);
- float(loss) every 5 steps: a d2h JAX does not log on CPU (the CPU buffer is
  read without a copy, and the guard is only applied to copies);
- np.asarray(int4 codes) every 5 steps: 1 d2h a call (sub-byte values are
  copied to unpack them, so the guard sees it).
"""

import argparse
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import numpy as np  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
args = parser.parse_args()

devices = jax.devices()
assert len(devices) == 8, devices
mesh = Mesh(np.array(devices), ("data",))
rng = np.random.default_rng(0)
xs = rng.standard_normal((4, 32, 16), dtype=np.float32)
ys = rng.standard_normal((4, 32, 4), dtype=np.float32)
noise = rng.standard_normal((4, 128), dtype=np.float32)

params = jax.device_put(np.zeros((16, 4), np.float32), devices[0])
sharded = jax.device_put(rng.standard_normal((64, 4), dtype=np.float32), NamedSharding(mesh, PartitionSpec("data")))
offset = jax.device_put(np.full((64, 4), 0.5, np.float32))
on_dev0 = jax.device_put(np.arange(256, dtype=np.float32), devices[0])


@jax.jit
def train_step(params, batch, step, lr):
    def loss_fn(p):
        return jnp.mean((batch["x"] @ p - batch["y"]) ** 2)

    loss, grad = jax.value_and_grad(loss_fn)(params)
    return params - lr / (1.0 + 0.01 * step) * grad, loss


pinned = jax.jit(lambda a: a * 2.0, in_shardings=SingleDeviceSharding(devices[1]))
quantize = jax.jit(lambda p: jnp.clip(jnp.round(p * 8.0), -8, 7).astype(jnp.int4))

lr = 0.05
for step in range(args.steps):
    i = step % 4
    params, loss = train_step(params, {"x": xs[i], "y": ys[i]}, step, lr)
    feats = jnp.sin(noise[i])
    moved = pinned(on_dev0)
    spread = sharded + offset
    if step % 5 == 4:
        print(f"step {step} loss {float(loss):.4f}")
        codes = np.asarray(quantize(params))
print("done", file=sys.stderr)
