"""A small jitted training loop with a deliberate implicit transfer per step.

Run it under the agent and watch it:

    jaxtop run -m jaxtop.demo.train_loop --steps 2000
    jaxtop ls; jaxtop log PID | head

Each step feeds a NumPy batch to a jitted step (one implicit host-to-device
transfer per step, counted by jaxtop) and keeps the parameters on the device.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds between steps")
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(0)
    k1, k2 = jax.random.split(key)
    params = {
        "w1": jax.random.normal(k1, (args.width, args.width)) * 0.05,
        "w2": jax.random.normal(k2, (args.width, 1)) * 0.05,
    }

    def loss_fn(p, x, y):
        h = jnp.tanh(x @ p["w1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)

    @jax.jit
    def step(p, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        return jax.tree_util.tree_map(lambda w, g: w - 0.01 * g, p, grads), loss

    rng = np.random.default_rng(0)
    loss = None
    for i in range(args.steps):
        x = rng.standard_normal((args.batch, args.width), dtype=np.float32)
        y = rng.standard_normal((args.batch, 1), dtype=np.float32)
        params, loss = step(params, x, y)  # x, y: implicit h2d transfers
        if args.sleep:
            time.sleep(args.sleep)
        if i % 100 == 0:
            print(f"step {i} loss {float(loss):.4f}", flush=True)
    print(f"done: {args.steps} steps, final loss {float(loss):.4f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
