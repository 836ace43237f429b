"""Is the allocator's largest free block a real bound on one request?

jaxtop shows ``1 - largest_free_block_bytes / free`` as fragmentation where
the allocator is BFC (GPU), whose free list it describes. On a TPU v5e the
runtime reported a largest free block of ~7.2 GiB after the first jitted
step while ~13 GiB were free, and kept reporting 7.19 GiB while the program
allocated 2 GiB more (new buffers came from another free region). Whether a
request between the two sizes fails has to be tried on the device itself,
so jaxtop says n/a on TPU until it has been. This program tries it:

1. a jitted step of an 8-layer, 4096-wide MLP with momentum (the program
   the chip was recorded with), run a few times, so the runtime places
   whatever it places after the first step;
2. the allocator's figures then (in use, limit, largest free block);
3. the largest single buffer that can be allocated, by bisection over
   ``jnp.zeros(n, int8)`` made on the device (no host copy), each try
   freed before the next;
4. one JSON line: ``bound`` is true when no request above the reported
   largest free block succeeded (the block is real: the fragmentation
   figure would be true), false when one did (it is not a bound).

Run it where the accelerator is (it takes the whole device for a few
seconds; one process at a time on a TPU):

    python benchmarks/largest_free_block.py [--layers 8] [--width 4096]

Standard library and jax only: the TPU machine has nothing else.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

MiB = 1 << 20


def _stats(device) -> dict:
    stats = device.memory_stats() or {}
    return {k: stats.get(k) for k in ("bytes_in_use", "bytes_limit", "largest_free_block_bytes", "bytes_reserved",
                                      "bytes_reservable_limit", "peak_bytes_in_use")}


def _fits(jax, jnp, nbytes: int) -> bool:
    """True when one buffer of ``nbytes`` can be allocated on the device now."""
    try:
        buf = jax.jit(lambda: jnp.zeros((nbytes,), jnp.int8))()
        buf.block_until_ready()
    except Exception as exc:  # RESOURCE_EXHAUSTED arrives as ValueError or JaxRuntimeError
        if "RESOURCE_EXHAUSTED" in str(exc) or "Out of memory" in str(exc) or "allocat" in str(exc).lower():
            return False
        raise
    buf.delete()
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--grain-mib", type=int, default=64, help="bisection stops at this precision")
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp

    device = jax.local_devices()[0]
    if device.memory_stats() is None:
        print(json.dumps({"platform": device.platform, "error": "memory_stats() is None: no allocator figures"}))
        return 2
    key = jax.random.PRNGKey(0)
    params = [jax.random.normal(jax.random.fold_in(key, i), (args.width, args.width)) * 0.01
              for i in range(args.layers)]
    moms = [jnp.zeros_like(p) for p in params]

    @jax.jit
    def step(params, moms, x):
        def loss(ps):
            h = x
            for p in ps:
                h = jnp.tanh(h @ p)
            return jnp.mean(h ** 2)

        grads = jax.grad(loss)(params)
        moms = [0.9 * m + g for m, g in zip(moms, grads)]
        return [p - 0.01 * m for p, m in zip(params, moms)], moms

    x = jnp.ones((1024, args.width))
    before = _stats(device)
    for _ in range(args.steps):
        params, moms = step(params, moms, x)
    jax.block_until_ready((params, moms))
    after = _stats(device)

    free = after["bytes_limit"] - after["bytes_in_use"]
    reported = after["largest_free_block_bytes"]
    grain = args.grain_mib * MiB
    lo, hi = 0, free + grain  # lo fits (nothing), hi is above anything that can
    started = time.perf_counter()
    tries = 0
    while hi - lo > grain:
        mid = (lo + hi) // 2 // MiB * MiB
        tries += 1
        if _fits(jax, jnp, mid):
            lo = mid
        else:
            hi = mid
    result = {
        "platform": device.platform,
        "device_kind": getattr(device, "device_kind", None),
        "jax": jax.__version__,
        "before_steps": before,
        "after_steps": after,
        "free_bytes": free,
        "reported_largest_free_block_bytes": reported,
        "largest_allocated_bytes": lo,
        "first_failed_bytes": hi,
        "bisection_tries": tries,
        "bisection_s": round(time.perf_counter() - started, 3),
        # Within the bisection's grain of the reported block: it is the bound.
        "bound": lo <= reported + grain,
        "reported_fragmentation": round(1 - reported / free, 4) if free > 0 else None,
        "true_fragmentation": round(1 - lo / free, 4) if free > 0 else None,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
