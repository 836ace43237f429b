"""What one pass of the jit ledger costs the agent thread.

Measures, in this process (CPU backend):

1. a pass over a few live executables with nothing new compiling (the
   steady state of a training loop);
2. a program with N (default 1,000) live executables, kept alive as jit
   closures: the first passes after they appeared (each analyses new
   executables for at most the probe's budget, 4 ms by default, and leaves
   the rest for the next pass), then passes with nothing new;
3. the same N analysed in one pass without a budget (what the budget
   spreads out), and the size of a whole table as JSON.

    .venv/bin/python benchmarks/jit_ledger.py                 # about a minute on 2 cores (the compiles)
    .venv/bin/python benchmarks/jit_ledger.py --executables 200 --passes 100
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from jaxtop.probes.executables import JitLedgerProbe


def timed_passes(probe: JitLedgerProbe, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        probe.scan()
        out.append(time.perf_counter() - t0)
    return out


def ms(values: list[float]) -> str:
    s = sorted(values)
    p90 = s[min(len(s) - 1, int(0.9 * len(s)))]
    return f"median {statistics.median(s) * 1e3:.3f} ms, p90 {p90 * 1e3:.3f} ms, max {s[-1] * 1e3:.3f} ms ({len(s)} passes)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executables", type=int, default=1000, help="live executables for part 2 (default 1000)")
    parser.add_argument("--passes", type=int, default=200, help="passes timed per steady-state measurement")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args()
    results: dict[str, object] = {"jax": jax.__version__}

    probe = JitLedgerProbe(interval_s=0.0)
    probe.start()
    x = np.ones((64, 64), np.float32)
    step = jax.jit(lambda w, v: w + 0.001 * jnp.tanh(v @ w))
    w = step(jnp.ones((64, 64)), x)
    probe.scan()  # analyses what exists
    idle = timed_passes(probe, args.passes)
    results["idle_live"] = probe.live_count()
    results["idle_pass_ms_median"] = statistics.median(idle) * 1e3
    results["idle_pass_ms_max"] = max(idle) * 1e3
    t0 = time.perf_counter()
    for _ in range(args.passes):
        probe.sample(force=True)
    results["idle_sample_ms_median"] = (time.perf_counter() - t0) / args.passes * 1e3

    t0 = time.perf_counter()
    kept = [jax.jit(lambda v, k=k: v * 2.0 + k) for k in range(args.executables)]
    small = np.ones(8, np.float32)
    for f in kept:
        f(small).block_until_ready()
    results["compile_s"] = time.perf_counter() - t0
    cold: list[float] = []
    while True:
        t0 = time.perf_counter()
        probe.scan()
        cold.append(time.perf_counter() - t0)
        if probe._pending == 0:
            break
    results["live"] = probe.live_count()
    results["first_passes"] = len(cold)
    results["first_pass_ms_max"] = max(cold) * 1e3
    results["first_passes_ms_total"] = sum(cold) * 1e3
    busy = timed_passes(probe, args.passes)
    results["n_pass_ms_median"] = statistics.median(busy) * 1e3
    results["n_pass_ms_p90"] = sorted(busy)[int(0.9 * len(busy))] * 1e3
    results["n_pass_ms_max"] = max(busy) * 1e3
    table = json.dumps(probe.table())
    full = json.dumps(probe.sample(force=True, full=True))
    results["table_json_bytes"] = len(table)
    results["sample_full_json_bytes"] = len(full)
    results["sample_quiet_is_none"] = probe.sample(force=True) is None
    probe.stop()

    unbudgeted = JitLedgerProbe(interval_s=0.0, budget_s=float("inf"))
    t0 = time.perf_counter()
    unbudgeted.scan()
    one = time.perf_counter() - t0
    results["unbudgeted_pass_ms"] = one * 1e3
    results["analysis_us_per_executable"] = one / max(1, unbudgeted.live_count()) * 1e6
    del kept, w

    if args.json:
        print(json.dumps(results))
        return
    print(f"jax {results['jax']}, CPU")
    print(f"nothing new compiling, {results['idle_live']} live executables: {ms(idle)}; "
          f"sample() {results['idle_sample_ms_median']:.3f} ms")
    print(f"{args.executables} jit closures compiled in {results['compile_s']:.1f} s; "
          f"{results['live']} live executables")
    print(f"  first passes (4 ms analysis budget each): {results['first_passes']} passes, "
          f"longest {results['first_pass_ms_max']:.2f} ms, {results['first_passes_ms_total']:.1f} ms in all")
    print(f"  then, nothing new: {ms(busy)}")
    print(f"  without a budget, one pass analyses all: {results['unbudgeted_pass_ms']:.1f} ms "
          f"({results['analysis_us_per_executable']:.1f} us per executable)")
    print(f"  whole table: {results['table_json_bytes']} bytes JSON (jit_ledger command), "
          f"{results['sample_full_json_bytes']} bytes in a sample (the 64 largest executables); "
          f"a quiet sample adds nothing: {results['sample_quiet_is_none']}")


if __name__ == "__main__":
    main()
