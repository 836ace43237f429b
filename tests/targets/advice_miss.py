"""A training loop that misses six of the demo's strategies, each at a line
marked ``# MISS <strategy>`` (the advisor's names): the tests read the
marks to know where the advice must point. tests/targets/advice_clean.py is
the same loop with every one of them applied.

    python advice_miss.py SECONDS

Prints ``ready`` when the loop starts, ``steps=N`` when it ends.
"""
import sys
import time

import numpy as np

import jax
import jax.numpy as jnp

WIDTH = 256
BATCH = 64
ITEMS = 32  # small items per step


@jax.jit
def step(params, batch):
    loss = jnp.mean(jnp.tanh(batch @ params) ** 2)
    return params - 0.01 * params * loss, loss


@jax.jit
def score(x):
    return jnp.sum(x * x)


def summarize(params):
    """Several jnp ops run one by one: not under jit."""
    y = jnp.tanh(params[:1]) * 0.5 + 0.1  # MISS jit
    y = jnp.maximum(y, 0.0)
    return jnp.exp(-y * y)


def train(seconds):
    rng = np.random.default_rng(0)
    params = jnp.ones((WIDTH, WIDTH), jnp.float32) * 0.01
    history = jnp.zeros((0, WIDTH), jnp.float32)
    small = None
    print("ready", flush=True)
    steps = 0
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        batch = rng.standard_normal((BATCH, WIDTH), dtype=np.float32)
        params, loss = step(params, batch)  # MISS placement donation
        last_loss = float(loss)  # MISS host_sync
        small = [jax.device_put(np.float32(i)) for i in range(ITEMS)]  # MISS batching
        scores = [score(np.full((8,), i, np.float32)) for i in range(ITEMS)]  # MISS batching
        row = summarize(params)
        history = jnp.concatenate([history, row])  # MISS in_place
        steps += 1
    jax.block_until_ready((params, history, small, scores))
    return steps, last_loss


if __name__ == "__main__":
    steps, last_loss = train(float(sys.argv[1]) if len(sys.argv) > 1 else 8.0)
    print(f"steps={steps} loss={last_loss:.6f}", flush=True)
