"""What the holders probes cost the program.

* **Profile cadence**: one device memory profile folded into sites (what
  ``HoldersProbe`` does each period), with 1,000 and 10,000 live arrays made
  by one line and by 100 different lines; the probe's period is then
  ``max(5 s, cost / 1 %)``, so its share of a core is ``cost / period``.
* **label()**: one call on a tree of 10 / 100 / 1,000 leaves with an agent
  reading labels, and without one; and what the agent's read of the labels
  costs.
* **Host-sync hook**: time per host read (``float(x)``, ``np.asarray(x)``)
  with and without the hook, and what the numpy wrapper adds to a call that is
  not a read (``np.asarray`` of a NumPy array).

Run on the CPU backend, in this process (the probes run in the user's
process: the numbers are what they take from it)::

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/holders.py            # table
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/holders.py --json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def per_call(fn: Callable[[], Any], number: int, repeat: int = 5) -> float:
    """Best-of-``repeat`` seconds per call of ``fn`` over ``number`` calls
    (the minimum: the cost itself, not the machine's other load)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def make_arrays(n: int, sites: int) -> list[Any]:
    """``n`` small arrays made by ``sites`` different lines (distinct stacks
    in the profile: the decoding and folding work grows with them)."""
    import jax
    import numpy as np

    src = "\n".join(f"def make_{i}(jax, np):\n    return jax.device_put(np.ones(16, np.float32))" for i in range(sites))
    namespace: dict[str, Any] = {}
    exec(compile(src, "<benchmark sites>", "exec"), namespace)
    makers = [namespace[f"make_{i}"] for i in range(sites)]
    return [makers[i % sites](jax, np) for i in range(n)]


def bench_profiles(repeat: int) -> list[dict[str, Any]]:
    from jaxtop.probes.holders import DEFAULT_BUDGET, DEFAULT_INTERVAL_S, HoldersProbe

    rows = []
    for n in (1_000, 10_000):
        for sites in (1, 100):
            held = make_arrays(n, sites)
            probe = HoldersProbe()
            walls, cpus = [], []
            for _ in range(repeat):
                c0, t0 = time.thread_time(), time.perf_counter()
                rec = probe.profile_now()
                walls.append(time.perf_counter() - t0)
                cpus.append(time.thread_time() - c0)
            assert rec is not None and rec["count"] >= n, rec
            wall = statistics.median(walls)
            period = max(DEFAULT_INTERVAL_S, wall / DEFAULT_BUDGET)
            rows.append({
                "arrays": n, "sites": sites, "profile_ms": round(wall * 1e3, 3),
                "profile_cpu_ms": round(statistics.median(cpus) * 1e3, 3), "period_s": round(period, 2),
                "core_percent": round(100 * wall / period, 3),
            })
            del held
            gc.collect()
    return rows


def bench_labels() -> list[dict[str, Any]]:
    import jax
    import jax.numpy as jnp

    from jaxtop.agent import labels

    class Agent:
        running = True

        def register_sample_field(self, name: str, fn: Callable[[], Any]) -> None:
            pass

    rows = []
    labels.uninstall()
    tree = {"w": [jnp.ones(4) for _ in range(100)]}
    rows.append({"case": "no agent, 100 leaves", "us": round(per_call(lambda: labels.label("p", tree), 100_000) * 1e6, 3)})
    agent = Agent()
    registry = labels.install(agent)
    for leaves in (10, 100, 1_000):
        tree = {"w": [jnp.ones(4) for _ in range(leaves)]}
        number = max(20, 20_000 // leaves)
        cost = per_call(lambda: labels.label("params", tree), number)
        # The agent's read of a label made since its last read measures each
        # leaf's nbytes once; later reads of the same label only check liveness.
        fresh = per_call(lambda: (labels.label("params", tree), registry.read()), number) - cost
        read = per_call(registry.read, number)
        rows.append({"case": f"agent, {leaves} leaves", "us": round(cost * 1e6, 2),
                     "fresh_read_us": round(fresh * 1e6, 2), "read_us": round(read * 1e6, 2)})
    labels.uninstall()
    del jax
    return rows


def bench_syncs() -> list[dict[str, Any]]:
    import jax.numpy as jnp
    import numpy as np

    from jaxtop.probes.host_sync import HostSyncProbe

    x = jnp.float32(3.0) + 1  # a device scalar
    v = jnp.arange(16.0) + 1
    host = np.ones(16, np.float32)
    x.block_until_ready()
    v.block_until_ready()
    cases = {
        "float(x)": lambda: float(x),
        "np.asarray(x)": lambda: np.asarray(v),
        "x.item()": lambda: x.item(),
        "np.asarray(numpy array) (not a read)": lambda: np.asarray(host),
    }
    base = {name: per_call(fn, 20_000) for name, fn in cases.items()}
    probe = HostSyncProbe()
    probe.start()
    try:
        hooked = {name: per_call(fn, 20_000) for name, fn in cases.items()}
    finally:
        probe.stop()
    return [{"case": name, "without_us": round(base[name] * 1e6, 3), "with_us": round(hooked[name] * 1e6, 3),
             "added_us": round((hooked[name] - base[name]) * 1e6, 3)} for name in cases]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7, help="profiles per case (the median is reported)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import jax

    jax.numpy.ones(1).block_until_ready()  # the backend, before anything is measured
    result = {
        "jax": jax.__version__, "python": sys.version.split()[0],
        "profiles": bench_profiles(args.repeat), "labels": bench_labels(), "host_syncs": bench_syncs(),
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"jax {result['jax']}, Python {result['python']}, CPU backend")
    print("\nprofile cadence (one profile + folding; period = max(5 s, cost / 1 %))")
    print(f"{'arrays':>8} {'sites':>6} {'wall ms':>9} {'cpu ms':>8} {'period s':>9} {'core %':>8}")
    for r in result["profiles"]:
        print(f"{r['arrays']:>8,} {r['sites']:>6} {r['profile_ms']:>9.2f} {r['profile_cpu_ms']:>8.2f} "
              f"{r['period_s']:>9.2f} {r['core_percent']:>8.3f}")
    print("\nlabel() per call")
    for r in result["labels"]:
        extra = (f"   (agent's read: {r['fresh_read_us']:.1f} us after a new label, {r['read_us']:.1f} us again)"
                 if "read_us" in r else "")
        print(f"  {r['case']:<24} {r['us']:>9.2f} us{extra}")
    print("\nhost-sync hook per call")
    for r in result["host_syncs"]:
        print(f"  {r['case']:<40} {r['without_us']:>8.2f} us -> {r['with_us']:>8.2f} us  (+{r['added_us']:.2f} us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
