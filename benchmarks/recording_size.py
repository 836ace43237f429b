#!/usr/bin/env python
"""How big a recording grows: MB per hour at 10 Hz, by what the program holds.

Runs a JAX program on N CPU devices (``--xla_force_host_platform_device_count``)
holding ``--arrays`` small arrays spread over the devices, each device running
a jitted step, and a tenth of the arrays rebound every few steps (an optimizer
updating its state). The agent writes its own log (``jaxtop run --log``) and
``jaxtop log`` records the same process from outside, each to a ``.jsonl.gz``
(compressed as written) and the agent's also as plain text, side by side in
one run. Prints bytes per hour for each, the samples per second each holds,
and how many buffer maps they carry (the maps are the big records).

Usage::

    .venv/bin/python benchmarks/recording_size.py                 # 8 devices, 10,000 arrays, 120 s
    .venv/bin/python benchmarks/recording_size.py --devices 1 --arrays 100 --seconds 60
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import textwrap

PROGRAM = textwrap.dedent("""
    import sys, time
    import jax, jax.numpy as jnp
    n, seconds = int(sys.argv[1]), float(sys.argv[2])
    devices = jax.local_devices()
    held = [jax.device_put(jnp.full((i % 13 + 1, 8), i, dtype=jnp.float32), devices[i % len(devices)])
            for i in range(n)]
    step = jax.jit(lambda w: jnp.tanh(w @ w))
    w = [jax.device_put(jnp.ones((128, 128)), d) for d in devices]
    print("ready", flush=True)
    end, k = time.time() + seconds, 0
    while time.time() < end:
        w = [step(a) for a in w]
        k += 1
        if k % 10 == 0:
            for i in range(k // 10 % 10, n, 10):  # a tenth of the state rebound
                held[i] = held[i] + 1
        time.sleep(0.01)
    jax.block_until_ready(w)
""")


def _samples(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    out = []
    with opener(path, "rb") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("type") == "sample":
                out.append(rec)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--arrays", type=int, default=10_000)
    p.add_argument("--seconds", type=float, default=120.0)
    args = p.parse_args(argv)
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={args.devices}")
    with tempfile.TemporaryDirectory() as tmp:
        prog = os.path.join(tmp, "prog.py")
        with open(prog, "w") as f:
            f.write(PROGRAM)
        logs = {"agent --log (.gz)": os.path.join(tmp, "agent.jsonl.gz"),
                "jaxtop log -o (.gz)": os.path.join(tmp, "recorder.jsonl.gz")}
        run = subprocess.Popen([sys.executable, "-m", "jaxtop", "run", "--log", logs["agent --log (.gz)"], prog,
                                str(args.arrays), str(args.seconds)], env=env, stdout=subprocess.PIPE)
        assert run.stdout is not None
        if run.stdout.readline().strip() != b"ready":
            print("the program did not start", file=sys.stderr)
            return 1
        recorder = subprocess.Popen([sys.executable, "-m", "jaxtop", "log", str(run.pid), "-o",
                                     logs["jaxtop log -o (.gz)"]], env=env)
        run.wait()
        recorder.wait(timeout=60)
        print(f"{args.devices} devices, {args.arrays:,} arrays, {args.seconds:g} s at 10 Hz")
        print(f"{'recording':24s} {'MB/h':>8s} {'MB/h as text':>13s} {'samples/s':>10s} {'maps':>6s}")
        for name, path in logs.items():
            samples = _samples(path)
            span = samples[-1]["t"] - samples[0]["t"] if len(samples) > 1 else float("nan")
            text = sum(len(json.dumps(r, separators=(",", ":"))) + 1 for r in samples)
            maps = sum(1 for r in samples if any("map" in d.get("live_arrays", {}) for d in r.get("devices", [])))
            size = os.path.getsize(path)
            print(f"{name:24s} {size / span * 3600 / 1e6:8.2f} {text / span * 3600 / 1e6:13.1f} "
                  f"{len(samples) / span:10.1f} {maps:6d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
