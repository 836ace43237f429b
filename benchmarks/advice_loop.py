"""The loop benchmarks/advice.py records: a training step that misses
several strategies (a NumPy batch per call, no donation, a host read per
step, small calls per item, eager ops, a buffer grown by concatenate),
beside ``--arrays`` live arrays the agent scans and profiles.

    python benchmarks/advice_loop.py SECONDS [--arrays N]
"""

import argparse
import time

import numpy as np

import jax
import jax.numpy as jnp

ap = argparse.ArgumentParser()
ap.add_argument("seconds", type=float)
ap.add_argument("--arrays", type=int, default=0)
args = ap.parse_args()

W = 256
rng = np.random.default_rng(0)
params = jnp.ones((W, W), jnp.float32) * 0.01
# Held for the whole run, as a big model's many parameters are.
kept = [jax.device_put(np.full((4,), i, np.float32)) for i in range(args.arrays)]


@jax.jit
def step(params, batch):
    loss = jnp.mean(jnp.tanh(batch @ params) ** 2)
    return params - 0.001 * params * loss, loss


@jax.jit
def score(x):
    return jnp.sum(x)


def post(x):
    y = jnp.tanh(x)
    return jnp.exp(-(y * 2.0 + 1.0))


history = jnp.zeros((0, W), jnp.float32)
stop = time.time() + args.seconds
while time.time() < stop:
    batch = rng.standard_normal((64, W), dtype=np.float32)
    params, loss = step(params, batch)
    loss.item()
    for i in range(8):
        score(np.ones((8,), np.float32))
    out = post(params[:8])
    history = jnp.concatenate([history, out[:1]])
    if history.shape[0] >= 512:
        history = jnp.zeros((0, W), jnp.float32)
    time.sleep(0.005)
