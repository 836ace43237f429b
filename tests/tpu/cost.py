#!/usr/bin/env python
"""The agent's cost on a device only one process may open: benchmarks/scaling.py's
children, one at a time.

benchmarks/scaling.py interleaves a round's children (baseline, agent, …),
all started together and thawed in turn, so that a shared VM's drifts cancel
in the ratio. On a TPU that cannot work: only one process at a time may open
the chip, and the second child's ``jax.devices()`` fails. This driver runs the
same children (benchmarks/scaling_child.py, through scaling.py's
``ScalingChild``), with the same arguments and the same summary
(``summarize_row``), but sequentially: each child opens the device, builds
its workload, settles, runs its timed blocks, reports and exits before the
next one starts. The arm order alternates between rounds (baseline first,
then agent first) so that a slow drift does not always favour one arm.

The figures per workload, medians over rounds:

* ``ratio``: the agent arm's steps/s over the baseline's, same round;
* ``thread_pct_core``: the agent thread's CPU (its pthread clock) during the
  timed blocks, as % of one core.

Usage (on the machine with the device; JAX_PLATFORMS picks it)::

    python tests/tpu/cost.py --sizes 10000,50000 --rounds 3 --json-out cost.json

tests/tpu/test_cost.py asserts the targets on these figures; the chip script
(tools/tpu/run.sh) runs this first and hands its JSON to that test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

#: The targets the chip must meet at 10,000 and 50,000 live arrays.
MIN_RATIO = 0.99
MAX_THREAD_PCT = 0.5


def _scaling() -> Any:
    """benchmarks/scaling.py, imported as its own children import it (its
    directory on sys.path: it imports overhead.py and overhead_child.py)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    import scaling

    return scaling


def _round(index: int, arms: list[str], row: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """One round: each arm in a fresh child, one child at a time."""
    scaling = _scaling()
    from overhead_child import MARK

    order = arms if index % 2 == 0 else arms[::-1]
    result: dict[str, Any] = {"_order": order}
    for arm in order:
        child = scaling.ScalingChild(arm, args.python, scaling._child_args(row, args), args.child_timeout)
        try:
            child.expect("READY")
            for _ in range(args.blocks):
                child.run_block(args.steps or 0)  # 0: --seconds of steps
            child.send("END")
            line = child.expect(MARK)
            result[arm] = json.loads(line[len(MARK):])
        except Exception as exc:
            tail = "\n".join(f"  {arm} stderr | {ln}" for ln in child.stderr_tail())
            raise RuntimeError(f"arrays {row['n']:,} round {index + 1}, {arm}: {exc}\n{tail}") from None
        finally:
            child.close()
    return result


def measure(sizes: list[int], rounds: int = 2, blocks: int = 2, seconds: float = 1.5, settle: float = 10.0,
            warmup: int = 30, interval: float = 0.1, arms: tuple[str, ...] = ("baseline", "agent"),
            python: str = sys.executable, child_timeout: float = 600.0, say: Any = None) -> dict[str, Any]:
    """Run the rounds and summarize them.

    The children run on whatever device ``JAX_PLATFORMS`` (inherited)
    selects: the caller sets it.

    Returns:
        ``{"config": …, "rows": [{"n", "rounds", "summary", "ratio_median",
        "thread_pct_median"}, …]}``, one row per size.
    """
    scaling = _scaling()
    args = argparse.Namespace(interval=interval, seconds=seconds, warmup=warmup, settle=settle, steps=0,
                              blocks=blocks, python=python, child_timeout=child_timeout, jit_cache_dir=None)
    started = time.time()
    rows = []
    for n in sizes:
        row: dict[str, Any] = {"workload": "arrays", "n": n, "churn": 0.0, "rounds": []}
        for i in range(rounds):
            rnd = _round(i, list(arms), row, args)
            row["rounds"].append(rnd)
            if say is not None:
                base = rnd["baseline"]["steps_per_s"]
                agent = rnd.get("agent", {})
                pct = (agent["thread_cpu_s"] / agent["wall_s"] * 100
                       if agent.get("thread_cpu_s") is not None and agent.get("wall_s") else float("nan"))
                say(f"arrays {n:,} round {i + 1}/{rounds}: baseline {base:.0f} steps/s, agent x"
                    f"{agent.get('steps_per_s', float('nan')) / base:.4f}, agent thread {pct:.2f} % of a core")
        summary = scaling.summarize_row(row["rounds"], list(arms))
        row["summary"] = summary
        agent = summary.get("agent") or {}
        row["ratio_median"] = (agent.get("ratio") or {}).get("median")
        row["thread_pct_median"] = (agent.get("thread_pct_core") or {}).get("median")
        rows.append(row)
    return {
        "config": {"sizes": sizes, "rounds": rounds, "blocks": blocks, "seconds": seconds, "settle": settle,
                   "warmup": warmup, "interval_s": interval, "arms": list(arms), "python": python,
                   "jax_platforms": os.environ.get("JAX_PLATFORMS"), "schedule": "sequential"},
        "targets": {"min_ratio": MIN_RATIO, "max_thread_pct": MAX_THREAD_PCT},
        "rows": rows,
        "elapsed_s": time.time() - started,
    }


def verdicts(results: dict[str, Any]) -> list[str]:
    """One line per size: the figures against the targets."""
    lines = []
    for row in results["rows"]:
        ratio, pct = row["ratio_median"], row["thread_pct_median"]
        ok = ratio is not None and pct is not None and ratio >= MIN_RATIO and pct <= MAX_THREAD_PCT
        lines.append(f"arrays {row['n']:>6,}: step-rate ratio agent/plain {ratio if ratio is None else f'{ratio:.4f}'} "
                     f"(target >= {MIN_RATIO}), agent thread {pct if pct is None else f'{pct:.2f}'} % of a core "
                     f"(target <= {MAX_THREAD_PCT}) -> {'met' if ok else 'MISSED'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10000,50000", help="live-array counts (default 10000,50000)")
    p.add_argument("--rounds", type=int, default=2, help="rounds per size, each arm in a fresh process (default 2)")
    p.add_argument("--blocks", type=int, default=2, help="timed blocks per child (default 2)")
    p.add_argument("--seconds", type=float, default=1.5, help="seconds of steps per block (default 1.5)")
    p.add_argument("--settle", type=float, default=10.0, help="untimed seconds of steps before the blocks (default 10)")
    p.add_argument("--warmup", type=int, default=30, help="untimed steps after compiling (default 30)")
    p.add_argument("--arms", default="baseline,agent",
                   help="baseline,agent and optionally floor (a naive 10 Hz poller) or jaxsmi (default baseline,agent)")
    p.add_argument("--child-timeout", type=float, default=600.0, help="seconds a child may take (default 600)")
    p.add_argument("--json-out", metavar="PATH", help="write the results as JSON to PATH")
    args = p.parse_args(argv)
    arms = tuple(a for a in args.arms.split(",") if a)
    if arms[:2] != ("baseline", "agent"):
        p.error("--arms starts with baseline,agent")
    results = measure([int(s.replace("_", "")) for s in args.sizes.split(",") if s], rounds=args.rounds,
                      blocks=args.blocks, seconds=args.seconds, settle=args.settle, warmup=args.warmup, arms=arms,
                      child_timeout=args.child_timeout, say=lambda line: print(line, flush=True))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2) + "\n")
    for line in verdicts(results):
        print(line)
    for row in results["rows"]:
        for arm in arms[2:]:
            s = row["summary"].get(arm) or {}
            pct = (s.get("thread_pct_core") or {}).get("median")
            ratio = (s.get("ratio") or {}).get("median")
            print(f"arrays {row['n']:>6,}: {arm} thread {pct} % of a core, step-rate ratio {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
