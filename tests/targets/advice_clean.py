"""tests/targets/advice_miss.py with the six strategies it misses applied
(each at the line marked ``# APPLIED <strategy>``): the advisor must find
none of them missing here.

    python advice_clean.py SECONDS

Prints ``ready`` when the loop starts, ``steps=N`` when it ends.
"""
import functools
import sys
import time

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

WIDTH = 256
BATCH = 64
ITEMS = 32  # small items per step
ROWS = 512  # rows of the preallocated history (written round and round)
READ_EVERY = 100  # steps between two reads of the loss on the host


@functools.partial(jax.jit, donate_argnums=0)  # APPLIED donation
def step(params, batch):
    loss = jnp.mean(jnp.tanh(batch @ params) ** 2)
    return params - 0.01 * params * loss, loss


@jax.jit
def score(xs):
    return jnp.sum(xs * xs, axis=-1)  # one call for every item


@jax.jit  # APPLIED jit
def summarize(params):
    y = jnp.tanh(params[:1]) * 0.5 + 0.1
    y = jnp.maximum(y, 0.0)
    return jnp.exp(-y * y)


@functools.partial(jax.jit, donate_argnums=(0, 2))
def record(history, row, index):
    history = lax.dynamic_update_slice(history, row, (index % history.shape[0], 0))
    return history, index + 1


def train(seconds):
    rng = np.random.default_rng(0)
    params = jnp.ones((WIDTH, WIDTH), jnp.float32) * 0.01
    history = jnp.zeros((ROWS, WIDTH), jnp.float32)
    index = jnp.zeros((), jnp.int32)
    items = np.stack([np.full((8,), i, np.float32) for i in range(ITEMS)])
    next_batch = jax.device_put(rng.standard_normal((BATCH, WIDTH), dtype=np.float32))
    last_loss = None
    print("ready", flush=True)
    steps = 0
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        # The next batch's copy starts before this step runs.
        batch, next_batch = next_batch, jax.device_put(rng.standard_normal((BATCH, WIDTH), dtype=np.float32))  # APPLIED placement
        params, loss = step(params, batch)
        if steps % READ_EVERY == 0:
            last_loss = float(loss)  # APPLIED host_sync
        small = jax.device_put(np.arange(ITEMS, dtype=np.float32))  # APPLIED batching
        scores = score(jax.device_put(items))  # APPLIED batching
        row = summarize(params)
        history, index = record(history, row, index)  # APPLIED in_place
        steps += 1
    jax.block_until_ready((params, history, small, scores))
    return steps, last_loss


if __name__ == "__main__":
    steps, last_loss = train(float(sys.argv[1]) if len(sys.argv) > 1 else 8.0)
    print(f"steps={steps} loss={last_loss:.6f}", flush=True)
