"""A training-like loop with a steady state (a batch replaced every step, a
prefetch queue of 1 to 3 batches) and, with --leak, one line that keeps every
step's metrics array alive (the line marked LEAK).

The leak grows on a fixed schedule (one float32[256] array every --period
seconds, wall clock), so its true rate is known whatever the machine's load.
The holders probe is wired through the agent's public hooks and profiles
every --profile-interval seconds.
"""
import argparse
import collections
import random
import time

import jaxtop
from jaxtop.probes.holders import HoldersProbe

p = argparse.ArgumentParser()
p.add_argument("--log", required=True)
p.add_argument("--leak", action="store_true")
p.add_argument("--seconds", type=float, default=25.0)
p.add_argument("--period", type=float, default=0.05)
p.add_argument("--profile-interval", type=float, default=0.5)
args = p.parse_args()

h = jaxtop.instrument(interval_s=0.1, log_path=args.log)
import jax
import jax.numpy as jnp
import numpy as np

step = jax.jit(lambda w, x: w + 0.001 * jnp.tanh(x @ w))
w = jnp.ones((64, 64))
w.block_until_ready()
HoldersProbe(interval_s=args.profile_interval, budget=0.05).install(h.agent)  # a test: profiles every 0.5 s, not the agent default 0.1 % of a core

metrics = []
prefetch = collections.deque()  # 1 to 3 batches in flight: goes up and down, never leaks
rng = random.Random(0)


def log_metrics(i):
    metrics.append(jax.device_put(np.full((256,), i, np.float32)))  # LEAK


t0 = time.time()
next_leak = t0
i = 0
print(f"ready {t0:.6f}", flush=True)
while time.time() - t0 < args.seconds:
    batch = jax.device_put(np.ones((64, 64), np.float32))  # steady: replaced every step
    prefetch.append(jax.device_put(np.zeros((32, 32), np.float32)))  # PREFETCH
    while len(prefetch) > rng.randint(1, 3):
        prefetch.popleft()
    w = step(w, batch)
    w.block_until_ready()
    i += 1
    if args.leak:
        while time.time() >= next_leak:
            log_metrics(i)
            next_leak += args.period
    time.sleep(0.01)
print(f"done {len(metrics)}", flush=True)
h.stop()
