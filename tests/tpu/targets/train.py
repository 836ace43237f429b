"""A small training loop, the chip tests' program.

An MLP trained with momentum; each step is fed two NumPy batches (two
implicit host-to-device transfers, which JAX's transfer guard logs and
jaxtop counts) and the loss is read every 10 steps (a device-to-host
transfer where the device's memory is not the host's: logged on TPU, not on
CPU). The transfers are the same in every run of the same arguments, so a
run under jaxtop and a plain one can be compared line for line.

Usage: train.py (--steps N | --seconds S) [--width W] [--layers L]

Prints ``ready`` once the step is compiled, then ``done STEPS``.
"""

import argparse
import time

import numpy as np

import jax
import jax.numpy as jnp

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=0)
p.add_argument("--seconds", type=float, default=0.0)
p.add_argument("--width", type=int, default=256)
p.add_argument("--layers", type=int, default=3)
p.add_argument("--batch", type=int, default=64)
args = p.parse_args()

keys = jax.random.split(jax.random.key(0), args.layers)
params = [jax.random.normal(k, (args.width, args.width), jnp.float32) / np.sqrt(args.width) for k in keys]
momentum = [jnp.zeros_like(w) for w in params]


@jax.jit
def step(params, momentum, x, y):
    def loss_fn(params):
        h = x
        for w in params[:-1]:
            h = jnp.tanh(h @ w)
        return jnp.mean((h @ params[-1] - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    momentum = [0.9 * m + g for m, g in zip(momentum, grads)]
    params = [w - 1e-3 * m for w, m in zip(params, momentum)]
    return params, momentum, loss


rng = np.random.default_rng(0)
batches = [(rng.standard_normal((args.batch, args.width), dtype=np.float32),
            rng.standard_normal((args.batch, args.width), dtype=np.float32)) for _ in range(8)]

params, momentum, loss = step(params, momentum, *batches[0])
jax.block_until_ready(loss)
print("ready", flush=True)

done = 1
deadline = time.monotonic() + args.seconds
while (done < args.steps) if args.steps else (time.monotonic() < deadline):
    x, y = batches[done % len(batches)]
    params, momentum, loss = step(params, momentum, x, y)  # two implicit h2d transfers
    done += 1
    if done % 10 == 0:
        float(loss)  # a host read of the loss: one d2h transfer on TPU
jax.block_until_ready(params)
print("done", done, flush=True)
