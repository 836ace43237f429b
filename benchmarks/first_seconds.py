"""What jaxtop costs a short jitted step in a program's first seconds, on a
small machine: the post-call hook is in while the program transfers, and
leaves after a quiet spell; until then it runs on every jitted call.

Each child builds ``--arrays`` live arrays from NumPy (its set-up's
transfers), then runs a jitted step of ~70 us with no transfer, and reports
its steps/s over the loop's first ``--first`` seconds and over the window
from ``--settle`` to ``--settle`` + ``--seconds``. Three arms in fresh
children, alternating: ``plain``, ``jaxtop`` (`jaxtop run`), ``counts``
(`JAXTOP_TRANSFER_SITES=0`: no hook at all), and ``guard``: plain with
``JAX_TRANSFER_GUARD=log``, as `jaxtop run` sets it (JAX's own price for
the counts: its jitted calls check their arguments; jaxtop's share is
read against this arm).

    .venv/bin/python benchmarks/first_seconds.py                 # 50,000 arrays, 2 runs each
    .venv/bin/python benchmarks/first_seconds.py --baseline a2a2ab5   # also jaxtop at that revision

Targets (the fifth trust sweep, item 11): the first 15 s under jaxtop >= 0.97
of plain's steps/s, and the settled window's likewise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tui import tree_at  # noqa: E402  (a sibling benchmark's: jaxtop as it was at a revision)

CHILD = r'''
import json, sys, time
import numpy as np
import jax, jax.numpy as jnp

arrays, first, settle, seconds, size, out = (int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]),
                                             float(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
kept = [jnp.asarray(np.full((4,), i, np.float32)) for i in range(arrays)]  # the set-up's transfers
jax.block_until_ready(kept)
step = jax.jit(lambda w: jnp.tanh(w @ w) * 0.5)
w = jnp.ones((size, size)) / size
w = step(w).block_until_ready()
marks = []
t0 = time.perf_counter()
end = t0 + max(first, settle + seconds)
n = 0
while True:
    w = step(w)
    w.block_until_ready()
    n += 1
    if n % 64 == 0:
        now = time.perf_counter()
        marks.append((now - t0, n))
        if now >= end:
            break

def rate(a, b):
    inside = [(t, k) for t, k in marks if a <= t <= b]
    (ta, ka), (tb, kb) = inside[0], inside[-1]
    return (kb - ka) / (tb - ta)

with open(out, "w") as f:
    json.dump({"first": rate(0.0, first), "settled": rate(settle, settle + seconds),
               "step_us": 1e6 * marks[-1][0] / marks[-1][1]}, f)
'''

ARMS = ("plain", "guard", "jaxtop", "counts")


def run(arm: str, args: argparse.Namespace, work: str, tree: str | None) -> dict:
    script = os.path.join(work, "child.py")
    with open(script, "w") as f:
        f.write(CHILD)
    out = os.path.join(work, f"{arm}.json")
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAXTOP_SOCKET_DIR=work)
    env.pop("JAX_TRANSFER_GUARD", None)
    if arm == "counts":
        env["JAXTOP_TRANSFER_SITES"] = "0"
    if arm == "guard":
        env["JAX_TRANSFER_GUARD"] = "log"  # JAX's own price: jaxtop sets it so for its counts
    if arm == "before" and tree is not None:
        env["PYTHONPATH"] = tree
    child = [script, str(args.arrays), str(args.first), str(args.settle), str(args.seconds), str(args.size), out]
    cmd = [sys.executable, *child] if arm in ("plain", "guard") else [sys.executable, "-m", "jaxtop", "run", *child]
    subprocess.run(cmd, env=env, check=True, timeout=900, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arrays", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--first", type=float, default=15.0)
    ap.add_argument("--settle", type=float, default=12.0)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--size", type=int, default=96, help="the step's matrix side (96: ~70 us on a 2-core VM)")
    ap.add_argument("--baseline", default="", help="also time jaxtop as it was at this git revision ('before')")
    args = ap.parse_args()
    arms = ARMS + (("before",) if args.baseline else ())
    tree = tree_at(args.baseline) if args.baseline else None
    results: dict[str, list[dict]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory(prefix="jaxtop-first-") as work:
        for r in range(args.runs):
            for arm in (arms if r % 2 == 0 else tuple(reversed(arms))):
                results[arm].append(run(arm, args, work, tree))
    plain = {k: statistics.mean(x[k] for x in results["plain"]) for k in ("first", "settled")}
    print(f"step {statistics.mean(x['step_us'] for x in results['plain']):.0f} us plain; "
          f"{args.arrays:,} live arrays; steps/s (ratio to plain's mean):")
    for arm, runs in results.items():
        print(f"  {arm:>7}: first {args.first:g} s " + ", ".join(
            f"{x['first']:,.0f} ({x['first'] / plain['first']:.3f})" for x in runs)
              + f";  {args.settle:g}-{args.settle + args.seconds:g} s " + ", ".join(
            f"{x['settled']:,.0f} ({x['settled'] / plain['settled']:.3f})" for x in runs))
    print("targets:")
    for key, what in (("first", f"the first {args.first:g} s"), ("settled", "the settled window")):
        ratio = statistics.mean(x[key] for x in results["jaxtop"]) / plain[key]
        guard = statistics.mean(x[key] for x in results["jaxtop"]) / statistics.mean(x[key] for x in results["guard"])
        print(f"  {what} under jaxtop >= 0.97 of plain: {'met' if ratio >= 0.97 else 'MISSED'} ({ratio:.3f}; "
              f"of JAX's guard alone: {guard:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
