"""A training loop that misses six of the demo's strategies, each at a line
marked ``# MISS <strategy>`` (the advisor's names): the tests read the
marks to know where the advice must point. tests/targets/advice_clean.py is
the same loop with every one of them applied.

The six: a NumPy batch fed to the jitted step (placement), which returns
the new parameters without the old ones donated (donation); the loss read on
the host every step (host_sync); one jitted call per item, from a
comprehension (batching); a function of jnp ops with Python constants run
op by op (jit); a history grown by jnp.concatenate (in_place). (Items made
one ``device_put`` each are a batching miss too, but the advisor sees those
only in two memory profiles, 5 s apart: more than the tests let this run.)

    python advice_miss.py SECONDS

Prints ``ready`` when the loop starts, ``warm t=T`` once its first step
(which compiles everything) is done and the SECONDS start (T:
``time.time()``, the clock of the agent's samples, so that the steady loop
can be told from the start-up in the recording), ``steps=N`` when it ends.
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
    y = jnp.tanh(params) * 0.5 + 0.1  # MISS jit
    y = jnp.exp(-y * y)
    return jnp.mean(y, axis=0, keepdims=True)


def train(seconds):
    rng = np.random.default_rng(0)
    params = jnp.ones((WIDTH, WIDTH), jnp.float32) * 0.01
    history = jnp.zeros((0, WIDTH), jnp.float32)
    scores, last_loss = [], float("nan")
    print("ready", flush=True)
    steps = 0
    stop = None
    while stop is None or time.monotonic() < stop:
        batch = rng.standard_normal((BATCH, WIDTH), dtype=np.float32)
        params, loss = step(params, batch)  # MISS placement donation
        last_loss = float(loss)  # MISS host_sync
        scores = [score(np.full((8,), i, np.float32)) for i in range(ITEMS)]  # MISS batching
        row = summarize(params)
        history = jnp.concatenate([history, row])  # MISS in_place
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
