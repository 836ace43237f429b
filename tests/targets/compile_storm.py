"""Compile storms, and a set-up that is not one, for ``--seconds`` (default 8).

Modes (the first argument):

* ``eager``: ``jnp.sin`` run outside jit on a new shape every step.
* ``shapes``: a jitted ``step`` called on a new shape every step.
* ``closures``: a new ``jax.jit`` closure every step, each kept alive.
* ``setup``: what a model's start looks like: dozens of ops run eagerly
  on a few shapes each in a burst, then a jitted step on one shape for the
  rest of the time (no storm).
* ``ops``: jax's ops run eagerly (``jnp.sin``, ``jnp.cos``, ``jnp.exp``,
  ``jnp.mean``, ``jnp.concatenate``, ``x * 2``, ``jnp.where``,
  ``jax.nn.relu``, ``jnp.linalg.norm``) on three shapes each, then a jitted
  ``step`` of the program's on three shapes with ``--user-jit``: the ops
  are no recompiles, the step's are two.

``--pace S`` sleeps between steps; ``--min-steps N`` goes on past
``--seconds`` until N steps are done (a loaded machine compiles slower: the
storm still reaches its size). The storming call stands on the line marked
``# storm``. Prints ``steps N`` at the end.
"""
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

mode = sys.argv[1]
seconds = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 8.0
pace = float(sys.argv[sys.argv.index("--pace") + 1]) if "--pace" in sys.argv else 0.02
min_steps = int(sys.argv[sys.argv.index("--min-steps") + 1]) if "--min-steps" in sys.argv else 0


def step(x):
    return jnp.tanh(x).sum()


jitted = jax.jit(step)
kept = []
steps = 0
end = time.time() + seconds
print("ready", flush=True)
if mode == "ops":
    ops = {
        "sin": jnp.sin, "cos": jnp.cos, "exp": jnp.exp, "mean": jnp.mean,
        "concatenate": lambda x: jnp.concatenate([x, x]), "mul": lambda x: x * 2,
        "where": lambda x: jnp.where(x > 0, x, 0.0), "relu": jax.nn.relu, "norm": jnp.linalg.norm,
    }
    for n in (3, 5, 7):
        x = jax.device_put(np.arange(n, dtype=np.float32))
        for op in ops.values():
            op(x).block_until_ready()
            steps += 1
    if "--user-jit" in sys.argv:
        for n in (3, 5, 7):
            jitted(jax.device_put(np.ones(n, np.float32))).block_until_ready()  # call:step
            steps += 1
elif mode == "setup":
    # Initialisers and ops of a model: many different ops, each on a few shapes.
    shapes = [(64, 64), (64,), (128, 64), (10,)]
    key = jax.random.PRNGKey(0)
    for shape in shapes:
        w = jax.random.normal(key, shape)
        for fn in (jnp.sin, jnp.cos, jnp.exp, jnp.tanh, jnp.abs, jnp.sqrt, jnp.square, jnp.log1p, jax.nn.relu,
                   jax.nn.gelu, jax.nn.sigmoid, jnp.mean, jnp.sum, jnp.max, jnp.min, jnp.std, jnp.var):
            fn(w).block_until_ready()
            steps += 1
    x = jax.device_put(np.ones((32, 64), np.float32))
    while time.time() < end:
        jitted(x).block_until_ready()
        steps += 1
        time.sleep(pace)
else:
    n = 10
    while time.time() < end or steps < min_steps:
        n += 1
        # Closures meet one shape: a new function object is their one change.
        x = jax.device_put(np.ones(8 if mode == "closures" else n, np.float32))
        if mode == "eager":
            jnp.sin(x).block_until_ready()  # storm
        elif mode == "shapes":
            jitted(x).block_until_ready()  # storm
        elif mode == "closures":
            kept.append(jax.jit(lambda v, k=n: v * 2.0 + k)); kept[-1](x).block_until_ready()  # storm
        else:
            raise SystemExit(f"unknown mode {mode!r}")
        steps += 1
        time.sleep(pace)
print("steps", steps, flush=True)
