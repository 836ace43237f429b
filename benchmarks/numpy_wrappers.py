#!/usr/bin/env python
"""What the host-sync probe costs numpy calls on plain data, by default
and with its numpy wrappers.

A single-device CPU jax Array hands numpy its buffer without running any
Python code of jax, so a read like ``np.asarray(x)`` is seen only by wrapping
numpy's ``asarray``, ``array`` and ``asanyarray``; every numpy call of the
program then goes through a Python function first, jax Array or not. So the
probe leaves numpy alone by default (those reads go uncounted, and the
stream says so) and wraps it only when asked (``JAXTOP_NUMPY_HOOKS=1``, or a
budget on host syncs). This measures, in one process, side by side: blocks
of calls with the probe stopped (*plain*), started as the agent starts it
(*default*: ``_value`` and ``item`` hooks, numpy untouched) and started
with numpy's wrappers (*numpy wrappers*), in rotating order, each arm's
throughput divided by the plain throughput of the same round (median over
rounds).

Calls: ``np.array`` of a list of 100 floats, ``np.array`` of a list of 3,
``np.asarray`` of a numpy array of 100, ``np.asarray`` of a jax Array (a
read: counted only with the wrappers), ``x.item()`` of a jax scalar (a
read, counted by both), and a pure-Python control (``sum`` of the list of
100) that no hook touches: its ratio is the machine's noise.

Usage::

    .venv/bin/python benchmarks/numpy_wrappers.py
    .venv/bin/python benchmarks/numpy_wrappers.py --rounds 30 --json
    .venv/bin/python benchmarks/numpy_wrappers.py --pythonpath /path/to/other/tree  # another version's probe
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import timeit


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--block-s", type=float, default=0.05, help="seconds per block of one call in one arm")
    p.add_argument("--pythonpath", help="import jaxtop from here (e.g. an older tree)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.pythonpath:
        sys.path.insert(0, args.pythonpath)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax.numpy as jnp
    import numpy as np

    from jaxtop.probes.host_sync import HostSyncProbe

    data = {
        "floats": [float(i) for i in range(100)],
        "three": [1.0, 2.0, 3.0],
        "ndarray": np.arange(100.0),
        "device": jnp.arange(100.0),
        "scalar": jnp.float32(2.5),
        "np": np,
    }
    calls = {
        "np.array(list of 100 floats)": "np.array(floats)",
        "np.array(list of 3 floats)": "np.array(three)",
        "np.asarray(ndarray)": "np.asarray(ndarray)",
        "np.asarray(jax Array)": "np.asarray(device)",
        "jax scalar .item()": "scalar.item()",
        "control: sum(list of 100)": "sum(floats)",
    }
    # Calls per block, so that each block takes about --block-s.
    numbers = {}
    for name, stmt in calls.items():
        timer = timeit.Timer(stmt, globals=data)
        n, took = timer.autorange()
        numbers[name] = max(1, int(n * args.block_s / took))

    arms = ("plain", "default", "numpy wrappers")
    os.environ.pop("JAXTOP_NUMPY_HOOKS", None)  # "default" is the agent's default, whatever this shell says
    probes = {"default": HostSyncProbe(), "numpy wrappers": HostSyncProbe(numpy_hooks=True)}
    untouched = {name: getattr(np, name) for name in ("array", "asarray", "asanyarray")}
    ratios: dict[str, dict[str, list[float]]] = {arm: {name: [] for name in calls} for arm in arms[1:]}
    rates: dict[str, dict[str, list[float]]] = {arm: {name: [] for name in calls} for arm in arms}
    for r in range(args.rounds):
        order = arms[r % 3:] + arms[:r % 3]  # each arm first, second and third in turn
        got: dict[str, dict[str, float]] = {}
        for arm in order:
            probe = probes.get(arm)
            if probe is not None:
                probe.start()
                assert probe.started and probe.numpy_wrapped == (arm == "numpy wrappers"), probe.reason
                if arm == "default":  # the very functions numpy had: nothing in their way
                    assert all(getattr(np, k) is v for k, v in untouched.items())
            try:
                got[arm] = {}
                for name, stmt in calls.items():
                    timer = timeit.Timer(stmt, globals=data)
                    t0 = time.perf_counter()
                    timer.timeit(numbers[name])
                    got[arm][name] = numbers[name] / (time.perf_counter() - t0)
            finally:
                if probe is not None:
                    probe.stop()
        for arm in arms:
            for name in calls:
                rates[arm][name].append(got[arm][name])
                if arm != "plain":
                    ratios[arm][name].append(got[arm][name] / got["plain"][name])
    out = {
        arm: {name: {"ratio_to_plain": round(statistics.median(ratios[arm][name]), 3),
                     "ns_per_call": round(1e9 / statistics.median(rates[arm][name]), 1)}
              for name in calls}
        for arm in arms[1:]
    }
    out["plain"] = {name: {"ns_per_call": round(1e9 / statistics.median(rates["plain"][name]), 1)} for name in calls}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"throughput / plain throughput (median of {args.rounds} rounds); ns per call in brackets")
    print(f"{'call':<32} {'plain':>10} {'default':>16} {'numpy wrappers':>18}")
    for name in calls:
        cells = [f"{out[arm][name]['ratio_to_plain']:.3f} ({out[arm][name]['ns_per_call']:.0f})" for arm in arms[1:]]
        print(f"{name:<32} {'(' + format(out['plain'][name]['ns_per_call'], '.0f') + ')':>10} "
              f"{cells[0]:>16} {cells[1]:>18}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
