"""The agent's cost on a jitted step loop, resolved to a fraction of a
percent: one process, the agent started and stopped in alternating blocks.

A device only one process may open (a TPU) rules out children run side by
side, and children run one after another differ by more than the cost
(tests/tpu/cost.py read 0.958, 1.010 and 0.981 in three runs of one machine
within 20 minutes). Here one process holds the device, the live arrays and
the compiled step throughout, and alternates ``on`` blocks (``jaxtop.
instrument()`` started, settled, timed, stopped) with ``off`` blocks (the
same loop without it) in the order on, off, off, on, ... so that a linear
drift cancels. Each ``on`` block is paired with its neighbouring ``off``
block; the figure is the median of the pairs' ratios, printed with their
spread (quartiles, and the 95 % interval of the median from the pairs'
order statistics).

Also printed: the agent thread's CPU over the ``on`` blocks (its
/proc/self/task clock), as % of one core.

    .venv/bin/python benchmarks/cost_blocks.py --arrays 50000 --pairs 24
    JAX_PLATFORMS=tpu python benchmarks/cost_blocks.py --arrays 50000   # on the chip

Targets (the fifth trust sweep, item 2): ratio >= 0.99 and the agent's
thread <= 0.5 % of a core at 10,000 and 50,000 live arrays on the chip.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time


def thread_cpu_s(name: str) -> float | None:
    """CPU seconds of this process's thread named ``name`` (its /proc clock)."""
    for th in threading.enumerate():
        if th.name == name and th.native_id is not None:
            try:
                with open(f"/proc/self/task/{th.native_id}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                return None
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return None


def median_interval(values: list[float]) -> tuple[float, float]:
    """The 95 % interval of the median from the order statistics (binomial,
    normal approximation): (low, high)."""
    xs = sorted(values)
    n = len(xs)
    half = 0.98 * n ** 0.5
    lo, hi = max(0, int(n / 2 - half)), min(n - 1, int(n / 2 + half))
    return xs[lo], xs[hi]


def mean_interval(values: list[float]) -> tuple[float, float]:
    """The mean and the half-width of its 95 % interval (Student's t, the
    pairs taken as independent): narrower than the median's where the
    pairs' spread is near normal, which the quartiles beside it show."""
    n = len(values)
    # t's 97.5th percentile for n-1 degrees of freedom, taken at the nearest
    # tabled degrees at or below (the wider interval, never a narrower one).
    t = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 10: 2.23, 15: 2.13, 20: 2.09, 30: 2.04, 40: 2.02, 60: 2.00}
    df = n - 1
    quantile = t[max(k for k in t if k <= df)] if df >= 1 else float("inf")
    return statistics.fmean(values), quantile * statistics.stdev(values) / n ** 0.5 if n > 1 else float("inf")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arrays", type=int, default=50_000)
    ap.add_argument("--pairs", type=int, default=24, help="on/off pairs (>= 20 for the interval to mean much)")
    ap.add_argument("--block-s", type=float, default=1.5, help="timed seconds per block")
    ap.add_argument("--settle-s", type=float, default=1.0, help="untimed seconds after the agent starts")
    ap.add_argument("--off-settle-s", type=float, default=0.3,
                    help="untimed seconds before an off block (the agent's thread has ended; nothing to settle "
                         "but the loop itself)")
    ap.add_argument("--size", type=int, default=256, help="the step's matrix side")
    ap.add_argument("--json-out")
    args = ap.parse_args()

    import numpy as np

    import jax
    import jax.numpy as jnp

    import jaxtop

    kept = [jax.device_put(np.full((4,), i, np.float32)) for i in range(args.arrays)]
    jax.block_until_ready(kept)
    step = jax.jit(lambda w: jnp.tanh(w @ w) * 0.5)
    w = jnp.ones((args.size, args.size)) / args.size
    w = step(w).block_until_ready()

    def run(seconds: float) -> float:
        nonlocal w
        n, t0 = 0, time.perf_counter()
        end = t0 + seconds
        while True:
            w = step(w)
            w.block_until_ready()
            n += 1
            if n % 16 == 0 and time.perf_counter() >= end:
                return n / (time.perf_counter() - t0)

    order = []
    for p in range(args.pairs):
        order += ["on", "off"] if p % 2 == 0 else ["off", "on"]
    rates: dict[str, list[float]] = {"on": [], "off": []}
    agent_cpu = 0.0
    timed_on = 0.0
    for arm in order:
        handle = jaxtop.instrument() if arm == "on" else None
        run(args.settle_s if handle is not None else args.off_settle_s)
        before = thread_cpu_s("jaxtop-agent") if handle is not None else None
        t0 = time.perf_counter()
        rates[arm].append(run(args.block_s))
        if handle is not None:
            after = thread_cpu_s("jaxtop-agent")
            if before is not None and after is not None:
                agent_cpu += after - before
                timed_on += time.perf_counter() - t0
            handle.stop()
    pairs = [on / off for on, off in zip(rates["on"], rates["off"])]
    q = statistics.quantiles(pairs, n=4)
    lo, hi = median_interval(pairs)
    mean, half = mean_interval(pairs)
    share = 100 * agent_cpu / timed_on if timed_on else None
    out = {"arrays": args.arrays, "pairs": len(pairs), "ratio_median": statistics.median(pairs),
           "ratio_q1": q[0], "ratio_q3": q[2], "ratio_ci95": [lo, hi], "ratio_min": min(pairs),
           "ratio_max": max(pairs), "ratio_mean": mean, "ratio_mean_ci95": [mean - half, mean + half],
           "steps_per_s_off": statistics.median(rates["off"]),
           "agent_thread_pct_core": share, "backend": jax.default_backend()}
    print(f"{args.arrays:,} live arrays, {len(pairs)} pairs of {args.block_s:g} s blocks on {out['backend']}: "
          f"steps/s off {out['steps_per_s_off']:,.0f}; on/off ratio median {out['ratio_median']:.4f} "
          f"(95 % interval {lo:.4f}-{hi:.4f}; mean {mean:.4f} +- {half:.4f}; quartiles {q[0]:.4f}-{q[2]:.4f}; range {min(pairs):.4f}-{max(pairs):.4f}); "
          f"agent thread {'n/a' if share is None else f'{share:.2f} %'} of a core")
    print(f"target: ratio >= 0.99: {'met' if out['ratio_median'] >= 0.99 else 'MISSED'}; "
          f"agent thread <= 0.5 %: {'n/a' if share is None else ('met' if share <= 0.5 else 'MISSED')}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
