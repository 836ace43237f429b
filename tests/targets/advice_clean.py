"""tests/targets/advice_miss.py with the six strategies it misses applied
(each at the line marked ``# APPLIED <strategy>``): the advisor must find
none of them missing here.

    python advice_clean.py SECONDS

Prints ``ready`` when the loop starts, ``warm t=T`` once its first step
(which compiles everything) is done and the SECONDS start (T:
``time.time()``, the clock of the agent's samples, so that the steady loop
can be told from the start-up in the recording), ``steps=N`` when it ends.
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
    y = jnp.tanh(params) * 0.5 + 0.1
    y = jnp.exp(-y * y)
    return jnp.mean(y, axis=0, keepdims=True)


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
    scores, last_loss = None, float("nan")
    print("ready", flush=True)
    steps = 0
    stop = None
    while stop is None or time.monotonic() < stop:
        # The next batch's copy starts before this step runs.
        batch = next_batch
        next_batch = jax.device_put(rng.standard_normal((BATCH, WIDTH), dtype=np.float32))  # APPLIED placement
        params, loss = step(params, batch)
        if steps % READ_EVERY == 0:
            last_loss = float(loss)  # APPLIED host_sync
        scores = score(jax.device_put(items))  # APPLIED batching
        row = summarize(params)
        history, index = record(history, row, index)  # APPLIED in_place
        steps += 1
        if stop is None:
            # Warmed up through the loop's own lines, so that each function
            # is compiled where the loop calls it.
            print(f"warm t={time.time():.3f}", flush=True)
            stop = time.monotonic() + seconds
    jax.block_until_ready((params, history, scores))
    return steps, last_loss


if __name__ == "__main__":
    steps, last_loss = train(float(sys.argv[1]) if len(sys.argv) > 1 else 8.0)
    print(f"steps={steps} loss={last_loss:.6f}", flush=True)
