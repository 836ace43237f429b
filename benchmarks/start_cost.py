"""What starting jaxtop costs a program that already holds many arrays: the
loop's steps/s in half-second windows around ``jaxtop.instrument()``, and
the cyclic garbage collector's full collections (which thread, how long).

Each child builds ``--arrays`` live arrays, compiles a ~70 us step, runs it
for 2 s, then (arm ``on``) calls ``jaxtop.instrument()`` (arm ``off``: does
not) and goes on for ``--seconds``, printing its steps/s per window. The
arms alternate in fresh children, ``--runs`` each. A full collection is
timed by a ``gc.callbacks`` probe in the child: where the agent's first
scan sets one off, it holds the interpreter on the agent's thread for all
of it.

    .venv/bin/python benchmarks/start_cost.py                  # 50,000 arrays, 2 runs each
    .venv/bin/python benchmarks/start_cost.py --arrays 2000

Printed: per run the windows (thousands of steps/s) and the full
collections; then the program time lost over the windows against the off
runs' median rate (seconds of steps); and, per pair of runs side by side,
the steps made in the first ``--seconds`` under jaxtop over those made
without it (``instrument()``'s own time counted in, at no steps).

The children import with bytecode caches (in a temporary
``-X pycache_prefix``, written by a first import), as an installed package
has them: from source, Python's compiler alone adds ~0.15 s to
``instrument()`` here (and where ``PYTHONDONTWRITEBYTECODE`` is set, each
run compiles again).
"""

from __future__ import annotations

import argparse
import json
import statistics
import os
import subprocess
import sys
import tempfile

CHILD = r'''
import gc, json, sys, threading, time
import numpy as np
import jax, jax.numpy as jnp

arrays, on, seconds, size = int(sys.argv[1]), sys.argv[2] == "on", float(sys.argv[3]), int(sys.argv[4])
kept = [jax.device_put(np.full((4,), i, np.float32)) for i in range(arrays)]
step = jax.jit(lambda w: jnp.tanh(w @ w) * 0.5)
w = step(jnp.ones((size, size)) / size).block_until_ready()
full = []
def probe(phase, info):
    if phase == "start":
        probe.t = time.perf_counter()
    elif info["generation"] == 2:
        full.append([threading.current_thread().name, 1e3 * (time.perf_counter() - probe.t)])
gc.callbacks.append(probe)
t0 = time.perf_counter()
while time.perf_counter() - t0 < 2:
    w = step(w); w.block_until_ready()
full.clear()
started = 0.0
if on:
    t = time.perf_counter()
    import jaxtop
    handle = jaxtop.instrument()
    started = time.perf_counter() - t
windows, n, t0 = [], 0, time.perf_counter()
last = t0
while True:
    w = step(w); w.block_until_ready(); n += 1
    if n % 32 == 0:
        now = time.perf_counter()
        if now - last >= 0.5:
            windows.append(n / (now - last)); n, last = 0, now
            if now - t0 >= seconds:
                break
print(json.dumps({"windows": windows, "full": full, "instrument_s": started}))
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arrays", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--size", type=int, default=96, help="the step's matrix side (96: ~70 us on a 2-core VM)")
    args = ap.parse_args()
    got: dict[str, list[dict]] = {"off": [], "on": []}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory(prefix="jaxtop-pycache-") as cache:
        python = [sys.executable, "-X", f"pycache_prefix={cache}"]
        subprocess.run(python + ["-c", "import jax, jaxtop.agent.agent"], env=env, check=True)
        for _ in range(args.runs):
            for arm in ("off", "on"):
                out = subprocess.run(python + ["-c", CHILD, str(args.arrays), arm, str(args.seconds), str(args.size)],
                                     capture_output=True, text=True, check=True, env=env).stdout
                got[arm].append(json.loads(out.strip().splitlines()[-1]))
    base = statistics.median(r for run in got["off"] for r in run["windows"])
    print(f"{args.arrays:,} live arrays, a {args.size}x{args.size} step; steps/s in 0.5 s windows (thousands), "
          f"off's median {base:,.0f}/s")
    for arm in ("off", "on"):
        for run in got[arm]:
            lost = sum(max(0.0, base - r) * 0.5 / base for r in run["windows"])
            full = ", ".join(f"{ms:.0f} ms on {name}" for name, ms in run["full"]) or "none"
            extra = f"; instrument() {run['instrument_s']:.3f} s" if arm == "on" else ""
            print(f"  {arm:3} " + " ".join(f"{r / 1000:.1f}" for r in run["windows"])
                  + f"   lost {lost:.2f} s; full collections: {full}{extra}")
    ratios = []
    for off, on in zip(got["off"], got["on"]):
        off_rate = sum(off["windows"]) * 0.5 / (0.5 * len(off["windows"]))
        on_rate = sum(on["windows"]) * 0.5 / (0.5 * len(on["windows"]) + on["instrument_s"])
        ratios.append(on_rate / off_rate)
    print(f"first {args.seconds:g} s under jaxtop / without, per pair (instrument() counted): "
          + " ".join(f"{r:.3f}" for r in ratios) + f"; median {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
