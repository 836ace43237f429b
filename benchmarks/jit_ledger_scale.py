"""What the jit ledger costs the agent thread as the number of live executables grows.

For each count K (default 100, 1,000 and 5,000) the program holds K distinct
live executables (``jax.jit(lambda x, k=k: x + k)``, each called once and
kept alive; they are compiled once, the counts grow one into the next). A
fresh ``JitLedgerProbe(interval_s=1.0)`` is started, analyses what exists
(one pass without the analysis budget, timed apart: that cost is paid once,
spread over passes of 4 ms in the agent), then ``sample()`` is called at
``--hz`` (10, the agent's tick) for ``--seconds`` (20) with nothing
compiling, and the CPU time of those calls (``time.thread_time()``) is summed:
the probe's share of one core.

With ``--baseline FILE`` another version of ``probes/executables.py`` runs
side by side in the same window (its probe and this tree's are ticked
alternately, so both see the same machine), e.g. the last commit's::

    git show HEAD:probes/executables.py > /tmp/executables_old.py
    .venv/bin/python benchmarks/jit_ledger_scale.py --baseline /tmp/executables_old.py

``--compile-every S`` adds a window at the largest count in which a new
function is compiled every S seconds (the cost while compiling);
``--profile`` prints a cProfile of passes and whole tables per probe. The
``floor`` row is a probe that does nothing: what timing a call right after a
sleep costs by itself (cold caches, the clock).

The compiles take most of the time: about 30 ms each on 2 idle cores, so
5,000 take 3 minutes or more. ``--quick`` makes the executables by loading
one serialized executable again and again (about 1 ms each): the same
objects to list, for trying a change; the numbers to quote come without it.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import json
import os
import pstats
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from jaxtop.probes import executables as current


def load_module(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Floor:
    """A probe that does nothing."""

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def sample(self, force: bool = False, full: bool = False) -> None:
        return None

    def live_count(self) -> int:
        return 0


def warm(probe) -> float:
    """Analyse everything that exists in one pass; its wall time."""
    if isinstance(probe, Floor):
        return 0.0
    budget = probe.budget_s
    probe.budget_s = float("inf")
    t0 = time.perf_counter()
    probe.sample(force=True)
    probe.budget_s = budget
    return time.perf_counter() - t0


def window(probes: dict[str, object], seconds: float, hz: float, compile_every: float | None = None,
           kept: list | None = None) -> dict[str, dict[str, float]]:
    """Tick every probe at ``hz`` for ``seconds``; per probe its CPU share and more."""
    period = 1.0 / hz
    names = list(probes)
    cpu = {n: 0.0 for n in names}
    worst = {n: 0.0 for n in names}
    said = {n: 0 for n in names}
    ticks = 0
    x = np.ones(8, np.float32)
    start = time.perf_counter()
    next_tick = start
    next_compile = start + compile_every if compile_every else None
    compiled = 0
    while True:
        now = time.perf_counter()
        if now - start >= seconds:
            break
        if next_compile is not None and now >= next_compile:
            k = len(kept)
            kept.append(jax.jit(lambda v, k=k: v * 3.0 + k))
            kept[-1](x).block_until_ready()
            compiled += 1
            next_compile += compile_every
        if now < next_tick:
            time.sleep(next_tick - now)
        next_tick += period
        ticks += 1
        order = names if ticks % 2 else names[::-1]
        for n in order:
            c0 = time.thread_time()
            out = probes[n].sample()
            dt = time.thread_time() - c0
            cpu[n] += dt
            worst[n] = max(worst[n], dt)
            said[n] += out is not None
    wall = time.perf_counter() - start
    return {n: {"cpu_pct_of_core": cpu[n] / wall * 100, "cpu_ms": cpu[n] * 1e3, "worst_tick_ms": worst[n] * 1e3,
                "samples_with_jit": said[n], "ticks": ticks, "wall_s": wall, "compiled": compiled,
                "live": probes[n].live_count()} for n in names}


def profile(probe) -> str:
    """Ten passes over an unchanged set, each followed by a whole table."""
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(10):
        probe.scan()
        probe.sample(full=True)
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(8)
    return s.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="100,1000,5000", help="live executable counts (ascending)")
    parser.add_argument("--seconds", type=float, default=20.0, help="window per count (default 20)")
    parser.add_argument("--hz", type=float, default=10.0, help="sample() calls per second (default 10)")
    parser.add_argument("--baseline", help="another probes/executables.py to run side by side")
    parser.add_argument("--compile-every", type=float, default=None,
                        help="add a window at the largest count compiling a function every S seconds")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of forced passes")
    parser.add_argument("--quick", action="store_true",
                        help="executables loaded from one serialized executable, not compiled (trying a change)")
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    args = parser.parse_args()
    modules = {"current": current}
    if args.baseline:
        modules = {"baseline": load_module(args.baseline, "_jit_ledger_baseline"), "current": current}
    counts = [int(c) for c in args.counts.split(",")]
    x = np.ones(8, np.float32)
    kept: list = []
    if args.quick:
        from jax.experimental import serialize_executable

        blob = serialize_executable.serialize(jax.jit(lambda v: v + 1).lower(x).compile())

        def make(k: int):
            return serialize_executable.deserialize_and_load(*blob)
    else:
        def make(k: int):
            f = jax.jit(lambda v, k=k: v + k)
            f(x).block_until_ready()
            return f
    results: dict[str, object] = {"jax": jax.__version__, "counts": {}}
    for count in counts:
        t0 = time.perf_counter()
        while len(kept) < count:
            kept.append(make(len(kept)))
        compile_s = time.perf_counter() - t0
        probes = {"floor": Floor()}
        probes.update({n: m.JitLedgerProbe(interval_s=1.0) for n, m in modules.items()})
        for p in probes.values():
            p.start()
        first = {n: warm(p) * 1e3 for n, p in probes.items()}
        res = window(probes, args.seconds, args.hz)
        for n in probes:
            res[n]["first_pass_ms"] = first[n]
        results["counts"][count] = res
        if not args.json:
            made = "loaded executables" if args.quick else "jit closures"
            print(f"{count} {made} ({compile_s:.0f} s to make), {args.seconds:.0f} s at {args.hz:.0f} Hz, "
                  "nothing compiling:", flush=True)
            for n, r in res.items():
                print(f"  {n:>8}: {r['cpu_pct_of_core']:.4f} % of a core ({r['cpu_ms']:.1f} ms CPU), "
                      f"worst tick {r['worst_tick_ms']:.2f} ms, {r['samples_with_jit']} jit fields "
                      f"in {r['ticks']} ticks, live {r['live']}; first pass (all analysed) {r['first_pass_ms']:.0f} ms",
                      flush=True)
        if args.profile:
            for n, p in probes.items():
                if isinstance(p, Floor):
                    continue
                print(f"--- {n}, {count} live: 5 x (scan + whole table)\n{profile(p)}", flush=True)
        if count == counts[-1] and args.compile_every:
            res = window(probes, args.seconds, args.hz, compile_every=args.compile_every, kept=kept)
            results["compiling"] = res
            if not args.json:
                print(f"{count}+ live, a new function compiled every {args.compile_every:g} s:")
                for n, r in res.items():
                    print(f"  {n:>8}: {r['cpu_pct_of_core']:.4f} % of a core ({r['cpu_ms']:.1f} ms CPU), "
                          f"worst tick {r['worst_tick_ms']:.2f} ms, {r['samples_with_jit']} jit fields, "
                          f"{r['compiled']} compiled, live {r['live']}", flush=True)
        for p in probes.values():
            p.stop()
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
