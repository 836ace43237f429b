"""How long an OOM census takes with many live arrays, and that it stays bounded.

Makes N live arrays in this process (three allocation sites, mixed shapes;
with several CPU devices a share of them sharded), then takes the census
the way the hooks do (``build_census`` + ``write_census``) R times and
prints the median and the worst wall time, per step, next to the budget.
A second pass with a budget too small for the memory profile shows what a
census that cannot finish in time skips.

    .venv/bin/python benchmarks/oom_census.py                 # 10,000 arrays, 2 s budget
    .venv/bin/python benchmarks/oom_census.py --arrays 100000 --json

Run it alone on the machine: it measures wall-clock time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")


def make_arrays(n: int) -> list:
    """N live arrays from three sites; a tenth sharded over two devices."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    def small(i):
        return jnp.full((16,), i, jnp.float32)

    def medium(i):
        return jnp.zeros((64, 64), jnp.bfloat16) + i

    held = []
    devices = jax.devices()
    sharded = None
    if len(devices) >= 2:
        mesh = Mesh(np.array(devices[:2]), ("x",))
        sharded = NamedSharding(mesh, PartitionSpec("x"))
    for i in range(n):
        if sharded is not None and i % 10 == 0:
            held.append(jax.device_put(np.full((8, 4), i, np.float32), sharded))
        elif i % 3 == 0:
            held.append(medium(i))
        else:
            held.append(small(i))
    jax.block_until_ready(held)
    return held


def run(n: int, repeats: int, budget_s: float) -> dict:
    from jaxtop.probes.oom import build_census, write_census

    t0 = time.perf_counter()
    held = make_arrays(n)
    made_s = time.perf_counter() - t0
    message = "RESOURCE_EXHAUSTED: Out of memory allocating 2147483648 bytes."
    walls, writes, steps, last = [], [], [], None
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            start = time.perf_counter()
            census = build_census(message=message, trigger={"how": "benchmark"}, budget_s=budget_s)
            built = time.perf_counter()
            write_census(census, tmp)
            walls.append(time.perf_counter() - start)
            writes.append(time.perf_counter() - built)
            steps.append(census["timing"]["steps"])
            last = census
        # What a budget too small for everything leaves out.
        tight = build_census(message=message, trigger={"how": "benchmark"}, budget_s=0.01)
    assert last is not None
    result = {
        "arrays": n,
        "live_arrays_seen": last["timing"]["live_arrays"],
        "grouped": last["arrays"]["count"] if last["arrays"] else None,
        "groups": last["arrays"]["groups_total"] if last["arrays"] else None,
        "sites": len((last["sites"] or {}).get("top") or []),
        "complete": last["complete"],
        "budget_s": budget_s,
        "repeats": repeats,
        "median_s": statistics.median(walls),
        "max_s": max(walls),
        "write_median_s": statistics.median(writes),
        "steps_median_s": {k: statistics.median(s[k] for s in steps) for k in steps[0]},
        "tight_budget": {"budget_s": 0.01, "seconds": tight["timing"]["seconds"], "skipped": tight["skipped"]},
        "make_arrays_s": made_s,
    }
    del held
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrays", type=int, default=10_000, help="live arrays to hold (default 10000)")
    parser.add_argument("--repeats", type=int, default=5, help="censuses to time (default 5)")
    parser.add_argument("--budget", type=float, default=None, help="census budget in seconds (default: the monitor's)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    from jaxtop.probes.oom import DEFAULT_BUDGET_S

    result = run(args.arrays, max(1, args.repeats), args.budget if args.budget is not None else DEFAULT_BUDGET_S)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{result['arrays']} live arrays ({result['grouped']} buffers grouped in {result['groups']} groups, "
          f"{result['sites']} sites), budget {result['budget_s']:g} s, {result['repeats']} censuses")
    print(f"  census wall time: median {result['median_s'] * 1000:.1f} ms, worst {result['max_s'] * 1000:.1f} ms "
          f"(file write {result['write_median_s'] * 1000:.1f} ms); complete: {result['complete']}")
    print("  steps (median ms): " + ", ".join(f"{k} {v * 1000:.1f}" for k, v in result["steps_median_s"].items()))
    tight = result["tight_budget"]
    print(f"  with a {tight['budget_s']:g} s budget: {tight['seconds'] * 1000:.1f} ms, skipped: "
          + ("; ".join(f"{s['part']} ({s['reason']})" for s in tight["skipped"]) or "nothing"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
