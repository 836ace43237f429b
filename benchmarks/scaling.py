#!/usr/bin/env python
"""How the jaxtop agent's cost scales with what the program holds.

The workloads, one table row each:

* ``arrays N``: the program holds N small float32 arrays of varied shapes
  (parameters plus optimizer state, say), created once and kept in a list,
  and runs a jitted step on a 512 x 512 weight matrix. With ``--churn F``
  each step also replaces a fraction F of the held arrays by new ones (a
  jitted ``a + 1`` over a rotating window), as a training step that rebinds
  its state does;
* ``executables N``: the program compiles N distinct small functions
  (``jax.jit(lambda x, k=k: x + k)``), calls each once and keeps them alive,
  then runs the same step loop.

The arms, each a FRESH child process per round (benchmarks/scaling_child.py):

* ``baseline``: the workload alone;
* ``agent``:    ``jaxtop.instrument(interval_s=0.1, log_path=...)`` before
  ``import jax``, default settings otherwise;
* ``floor``:    a plain daemon thread that every 0.1 s calls ``memory_stats()``
  on each local device and sums ``nbytes`` over ``jax.live_arrays()``: the
  most naive poller, a floor for what watching the live arrays costs;
* ``jaxsmi``:   jax-smi's tracking thread (``initialise_tracking()``, 1 s),
  skipped with a note when ``jax_smi`` is not importable;
* ``agent-before`` (``--compare-python PATH``): the agent arm under another
  interpreter (a venv with an older jaxtop), interleaved in the same rounds,
  so before and after come from one run.

Scheduling is overhead.py's ``interleaved`` mode: a round's children start
together, build their workload and warm up (untimed; creation time is
reported on its own), and are frozen (SIGSTOP on their process group); the
parent then thaws one child at a time for a block of ``--seconds`` (or
``--steps``) in a rotating arm order. Every figure is measured inside the
thawed blocks only, by the child itself:

* the step rate, as a ratio to the baseline of the same round;
* the observer thread's CPU (the agent's, the poller's, jax-smi's), read from
  its pthread CPU clock at each block's start and end, as % of one core;
* the agent's recording: bytes the log grew during the blocks, as MB per hour.

Usage::

    .venv/bin/python benchmarks/scaling.py --quick           # smoke test, ~2-3 min
    .venv/bin/python benchmarks/scaling.py                   # 5 rounds (executables 3), ~15-18 min on 2 cores
    .venv/bin/python benchmarks/scaling.py --compare-python /tmp/venv-before/bin/python
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from overhead import Child  # benchmarks/ is on sys.path
from overhead_child import MARK

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scaling_child.py")
ROLE = {"baseline": "baseline", "agent": "agent", "floor": "floor", "jaxsmi": "jaxsmi", "agent-before": "agent"}
AGENT_ARMS = ("agent", "agent-before")

DEFAULTS = {"rounds": 5, "blocks": 2, "seconds": 1.5, "sizes": "100,1000,10000,50000", "executables": "100,1000,5000"}
QUICK = {"rounds": 2, "blocks": 1, "seconds": 1.5, "sizes": "1000,10000", "executables": "100,1000"}


class ScalingChild(Child):
    """overhead.py's Child (freeze, thaw, blocks, END), started as a scaling child."""

    def __init__(self, arm: str, python: str, child_args: list[str], timeout: float) -> None:
        self.arm = arm
        self.workdir = tempfile.mkdtemp(
            prefix="jaxtop-scaling-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
        )
        self.stderr_path = os.path.join(self.workdir, "stderr.txt")
        self._stderr = open(self.stderr_path, "wb")
        # jax-smi (and anything else) writes under the child's private
        # directory: its cwd and TMPDIR; removed with the child.
        env = dict(os.environ, TMPDIR=self.workdir)
        self.proc = subprocess.Popen(
            [python, CHILD, ROLE[arm], "--workdir", self.workdir, *child_args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            bufsize=0, start_new_session=True, cwd=self.workdir, env=env,
        )
        self._buf = b""
        self.frozen = False
        self.timeout = timeout


def _row_label(row: dict[str, Any]) -> str:
    label = f"{row['workload']} {row['n']:,}"
    if row.get("churn"):
        label += f" ch{row['churn']:g}"
    return label


def _child_args(row: dict[str, Any], args: argparse.Namespace) -> list[str]:
    out = ["--workload", row["workload"], "--n", str(row["n"]), "--interval", str(args.interval),
           "--block-seconds", str(args.seconds), "--warmup", str(args.warmup), "--settle", str(args.settle)]
    if row.get("churn"):
        out += ["--churn", str(row["churn"])]
    if row["workload"] == "executables" and args.jit_cache_dir:
        out += ["--jit-cache", args.jit_cache_dir]
    return out


def _python_for(arm: str, args: argparse.Namespace) -> str:
    return args.compare_python if arm == "agent-before" else args.python


def run_round(index: int, arms: list[str], row: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    # Rotate (and on odd rounds reverse) the arm order so no arm is always first.
    order = arms[index % len(arms):] + arms[: index % len(arms)]
    if index % 2:
        order = order[::-1]
    result: dict[str, Any] = {"_order": order}
    children: list[ScalingChild] = []
    try:
        for arm in order:
            children.append(ScalingChild(arm, _python_for(arm, args), _child_args(row, args), args.child_timeout))
        for child in children:  # they build and warm up concurrently; nothing is timed yet
            child.expect("READY")
            child.freeze()
        for b in range(args.blocks):
            shift = b % len(children)
            for child in children[shift:] + children[:shift]:
                child.run_block(args.steps or 0)  # 0: --seconds of steps
                child.freeze()
        # END to all at once: their teardowns (the agent's stop) overlap.
        for child in children:
            child.thaw()
            child.send("END")
        for child in children:
            line = child.expect(MARK)
            result[child.arm] = json.loads(line[len(MARK):])
    except Exception as exc:
        tails = {c.arm: c.stderr_tail() for c in children}
        raise RuntimeError(f"{_row_label(row)} round {index + 1}: {exc}\n" + "\n".join(
            f"  {arm} stderr | {line}" for arm, lines in tails.items() for line in lines
        )) from None
    finally:
        for child in children:
            child.close()
    return result


def prewarm(python: str, n: int, args: argparse.Namespace) -> str:
    """Fill the compilation cache with the N executables once (untimed).

    Without it the first round's children would all compile every function
    at once (~20 ms each here, x every arm, on 2 cores); from the cache a
    child loads one in ~5 ms. A marker per interpreter and N skips this on
    later runs.
    """
    # A venv's python is a link to its base interpreter: key on the venv's path.
    key = hashlib.sha1(os.path.abspath(python).encode()).hexdigest()[:10]
    marker = os.path.join(args.jit_cache_dir, f"prewarmed-{key}-{n}.ok")
    prefix = f"prewarmed-{key}-"
    try:
        done = [int(f[len(prefix):-3]) for f in os.listdir(args.jit_cache_dir) if f.startswith(prefix) and f.endswith(".ok")]
    except (OSError, ValueError):
        done = []
    if any(m >= n for m in done):
        return f"compilation cache already holds {max(done):,} executables for {python}"
    os.makedirs(args.jit_cache_dir, exist_ok=True)
    started = time.monotonic()
    child = ScalingChild("baseline", python, _child_args({"workload": "executables", "n": n}, args) + ["--prewarm"],
                         args.child_timeout)
    try:
        child.expect(MARK)
    except RuntimeError as exc:
        raise RuntimeError(f"prewarm: {exc}\n" + "\n".join(f"  stderr | {l}" for l in child.stderr_tail())) from None
    finally:
        child.close()
    with open(marker, "w") as f:
        f.write(f"{time.time()}\n")
    return f"compilation cache filled with {n:,} executables for {python} in {time.monotonic() - started:.0f} s"


def _has_module(python: str, module: str) -> bool:
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        return subprocess.run([python, "-c", code], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _spread(values: list[float]) -> dict[str, float] | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def summarize_row(rounds: list[dict[str, Any]], arms: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in arms:
        runs = [r[a] for r in rounds if a in r]
        s: dict[str, Any] = {
            "steps_per_s": _spread([r.get("steps_per_s") for r in runs]),
            "create_s": _spread([r.get("create_s") for r in runs]),
            "startup_s": _spread([r.get("startup_s") for r in runs]),
        }
        if a != "baseline":
            s["ratio"] = _spread([
                r[a]["steps_per_s"] / r["baseline"]["steps_per_s"]
                for r in rounds if r.get(a, {}).get("steps_per_s") and r["baseline"].get("steps_per_s")
            ])
            # Block b of the arm against block b of the baseline: seconds apart.
            blocks = [
                x / y for r in rounds if a in r
                for x, y in zip(r[a].get("block_steps_per_s", []), r["baseline"].get("block_steps_per_s", []))
                if x and y
            ]
            s["block_ratio_median"] = statistics.median(blocks) if blocks else None
            s["thread_pct_core"] = _spread([
                r["thread_cpu_s"] / r["wall_s"] * 100 for r in runs if r.get("thread_cpu_s") is not None and r.get("wall_s")
            ])
        if a in AGENT_ARMS:
            s["mb_per_h"] = _spread([
                r["log_bytes"] / r["wall_s"] * 3600 / 1e6 for r in runs if r.get("log_bytes") is not None and r.get("wall_s")
            ])
            s["samples_per_s"] = _spread([
                r["samples_in_blocks"] / r["wall_s"] for r in runs if r.get("samples_in_blocks") is not None and r.get("wall_s")
            ])
            s["agent_field_last"] = runs[-1].get("agent_field") if runs else None
            s["jaxtop_file"] = sorted({r.get("jaxtop_file") for r in runs if r.get("jaxtop_file")})
            s["jaxtop_version"] = sorted({str(r.get("jaxtop_version")) for r in runs})
        s["live_arrays_end"] = _spread([r.get("live_arrays_end") for r in runs])
        s["live_executables_end"] = _spread([r.get("live_executables_end") for r in runs])
        out[a] = s
    steal = [r[a].get("machine_steal_frac") for r in rounds for a in arms if a in r]
    steal = [v for v in steal if v is not None]
    out["_steal_pct_median"] = statistics.median(steal) * 100 if steal else None
    return out


def _triple(s: dict[str, float] | None, fmt: str) -> str:
    if s is None:
        return "-"
    return "/".join(format(s[k], fmt) for k in ("min", "median", "max"))


def print_tables(rows: list[dict[str, Any]], arms: list[str]) -> None:
    print()
    print("Measured inside the thawed blocks only; min/median/max over rounds. step ratio: steps/s over the")
    print("baseline's, same round. thread: the agent's / poller's / jax-smi's thread CPU, % of one core.")
    print("MB/h: the agent's recording (log_path) per hour; smp/s: samples it emitted per second (medians).")
    head = f"{'workload':<20} {'arm':<13} {'steps/s':>8}  {'step ratio min/med/max':>22}  {'thread %core min/med/max':>25}  {'MB/h':>7}  {'smp/s':>5}"
    print(head)
    print("-" * len(head))
    for row in rows:
        summ = row.get("summary")
        if not summ:
            print(f"{_row_label(row):<20} (no round finished)")
            continue
        for a in arms:
            s = summ.get(a)
            if s is None or s["steps_per_s"] is None:
                continue
            sps = f"{s['steps_per_s']['median']:8.1f}"
            ratio = "1 (reference)" if a == "baseline" else _triple(s.get("ratio"), ".3f")
            thread = "" if a == "baseline" else _triple(s.get("thread_pct_core"), ".2f")
            mbh = f"{s['mb_per_h']['median']:7.1f}" if s.get("mb_per_h") else ""
            sps_agent = f"{s['samples_per_s']['median']:5.1f}" if s.get("samples_per_s") else ""
            print(f"{_row_label(row):<20} {a:<13} {sps}  {ratio:>22}  {thread:>25}  {mbh:>7}  {sps_agent:>5}")
        print()
    print("Untimed setup, medians over rounds (s): creating the workload | process start to READY otherwise")
    for row in rows:
        summ = row.get("summary")
        if not summ:
            continue
        parts = [
            f"{a} {summ[a]['create_s']['median']:.1f}|{summ[a]['startup_s']['median']:.1f}"
            for a in arms if a in summ and summ[a].get("create_s")
        ]
        live = summ["baseline"].get("live_arrays_end") if "baseline" in summ else None
        exe = summ["baseline"].get("live_executables_end") if "baseline" in summ else None
        seen = ""
        if live:
            seen += f"; live arrays at end {live['median']:,.0f}"
            # An observer that keeps arrays of its own alive shows here.
            more = [
                f"{a} {summ[a]['live_arrays_end']['median']:,.0f}" for a in arms
                if a in summ and summ[a].get("live_arrays_end") and summ[a]["live_arrays_end"]["median"] != live["median"]
            ]
            if more:
                seen += f" ({', '.join(more)})"
        if exe:
            seen += f", live executables {exe['median']:,.0f}"
        steal = summ.get("_steal_pct_median")
        if steal is not None:
            seen += f"; CPU steal {steal:.1f} %"
        print(f"  {_row_label(row):<20} " + ", ".join(parts) + seen)
    print()
    print("The agent's own report, the `agent` field of its last sample (last round):")
    for row in rows:
        summ = row.get("summary") or {}
        for a in AGENT_ARMS:
            if a in summ and summ[a].get("agent_field_last") is not None:
                field = summ[a]["agent_field_last"]
                extra = sorted(set(field) - {"cpu_s_total", "thread_cpu_s_total"})
                print(f"  {_row_label(row):<20} {a:<13} {json.dumps(field, sort_keys=True)}"
                      + (f"   (extra keys: {', '.join(extra)})" if extra else ""))
    files: dict[str, set[str]] = {}
    for row in rows:
        for a in AGENT_ARMS:
            s = (row.get("summary") or {}).get(a)
            if s:
                files.setdefault(a, set()).update(f"{f} (jaxtop {v})" for f in s["jaxtop_file"] for v in s["jaxtop_version"])
    for a, fs in files.items():
        print(f"{a} arm imported {', '.join(sorted(fs))}")


def _ints(text: str) -> list[int]:
    return [int(v.replace("_", "")) for v in text.split(",") if v.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, help=f"rounds per workload, fresh processes each (default {DEFAULTS['rounds']})")
    p.add_argument("--exe-rounds", type=int,
                   help="rounds of the executables workloads (default: --rounds, at most 3: building 5,000 "
                   "executables in every child of a round takes a minute or more, untimed)")
    p.add_argument("--blocks", type=int, help=f"thawed blocks per arm per round (default {DEFAULTS['blocks']})")
    p.add_argument("--seconds", type=float, help=f"seconds of steps per block (default {DEFAULTS['seconds']})")
    p.add_argument("--steps", type=int, default=0, help="a fixed number of steps per block instead of --seconds")
    p.add_argument("--warmup", type=int, default=30, help="untimed steps after compiling (default 30)")
    p.add_argument("--settle", type=float, default=10.0,
                   help="untimed seconds of steps before the blocks, while observers do their one-off work "
                        "(reading every array once); their CPU until then is reported apart (default 10)")
    p.add_argument("--sizes", help=f"live-array counts (default {DEFAULTS['sizes']})")
    p.add_argument("--executables", help=f"live-executable counts (default {DEFAULTS['executables']})")
    p.add_argument("--only", choices=("arrays", "executables"), help="run one kind of workload only")
    p.add_argument("--churn", type=float, default=0.0, metavar="FRACTION",
                   help="arrays workloads: each step replaces this fraction of the held arrays (e.g. 0.01)")
    p.add_argument("--interval", type=float, default=0.1, help="agent interval_s and the poller's period (default 0.1)")
    p.add_argument("--no-jaxsmi", action="store_true", help="skip the jax-smi arm")
    p.add_argument("--no-floor", action="store_true", help="skip the naive-poller arm")
    p.add_argument("--python", default=sys.executable, help="interpreter of the children (default: this one)")
    p.add_argument("--compare-python", metavar="PATH",
                   help="add an arm 'agent-before': the agent under this interpreter, interleaved with the others")
    p.add_argument("--jit-cache-dir", default=os.path.join(tempfile.gettempdir(), "jaxtop-scaling-jit-cache"),
                   help="persistent compilation cache for the executables workloads (untimed creation)")
    p.add_argument("--no-jit-cache", action="store_true", help="compile every executable in every child")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke test: {QUICK['rounds']} rounds, {QUICK['blocks']} block, sizes {QUICK['sizes']}, "
                   f"executables {QUICK['executables']}")
    p.add_argument("--json", action="store_true", help="print machine-readable results (JSON) instead of the table")
    p.add_argument("--json-out", metavar="PATH", help="also write the JSON results to PATH")
    p.add_argument("--child-timeout", type=float, default=900.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    base = QUICK if args.quick else DEFAULTS
    for key in ("rounds", "blocks", "seconds", "sizes", "executables"):
        if getattr(args, key) is None:
            setattr(args, key, base[key])
    if args.exe_rounds is None:
        args.exe_rounds = args.rounds if args.only == "executables" else min(args.rounds, 3)
    if args.no_jit_cache:
        args.jit_cache_dir = None
    if args.rounds < 1 or args.exe_rounds < 1 or args.blocks < 1 or (not args.steps and args.seconds <= 0):
        p.error("--rounds, --blocks and --seconds must be positive")
    if not 0 <= args.churn <= 1:
        p.error("--churn is a fraction between 0 and 1")

    rows: list[dict[str, Any]] = []
    if args.only != "executables":
        rows += [{"workload": "arrays", "n": n, "churn": args.churn, "n_rounds": args.rounds} for n in _ints(args.sizes)]
    if args.only != "arrays":
        rows += [{"workload": "executables", "n": n, "n_rounds": args.exe_rounds} for n in _ints(args.executables)]
    if not rows:
        p.error("no workload to run")

    notes: list[str] = []
    arms = ["baseline", "agent"]
    if args.compare_python:
        arms.append("agent-before")
    if not args.no_floor:
        arms.append("floor")
    if args.no_jaxsmi:
        notes.append("jax-smi arm skipped (--no-jaxsmi)")
    elif not _has_module(args.python, "jax_smi"):
        notes.append(f"jax-smi arm skipped: jax_smi is not importable by {args.python} (pip install jax-smi)")
    else:
        arms.append("jaxsmi")
    say = (lambda *a, **k: None) if args.json else (lambda *a, **k: print(*a, **k, flush=True))
    for note in notes:
        say(f"note: {note}")
    block = f"{args.steps} steps" if args.steps else f"{args.seconds:g} s"
    say(f"{len(rows)} workloads x {max(r['n_rounds'] for r in rows)} rounds"
        + (f" (executables {args.exe_rounds})" if args.exe_rounds != args.rounds and args.only is None else "")
        + f" x {len(arms)} arms ({', '.join(arms)}), "
        f"{args.blocks} block(s) of {block} per arm per round, interleaved; agent interval {args.interval:g} s; "
        f"children: {args.python}" + (f"; agent-before: {args.compare_python}" if args.compare_python else ""))

    started = time.time()
    exe_rows = [r["n"] for r in rows if r["workload"] == "executables"]
    if exe_rows and args.jit_cache_dir:
        pythons = {args.python} | ({args.compare_python} if args.compare_python else set())
        for py in sorted(pythons):
            try:
                msg = prewarm(py, max(exe_rows), args)
            except RuntimeError as exc:
                sys.stderr.write(f"benchmark failed: {exc}\n")
                return 1
            notes.append(msg)
            say(f"note: {msg}")

    for row in rows:
        row["rounds"] = []
        row["failed"] = []
    # Round-major: every workload's rounds spread over the whole run.
    for i in range(max(row["n_rounds"] for row in rows)):
        for row in rows:
            if i >= row["n_rounds"]:
                continue
            t0 = time.monotonic()
            try:
                rnd = run_round(i, arms, row, args)
            except RuntimeError as exc:
                sys.stderr.write(f"round failed: {exc}\n")
                row["failed"].append(str(exc).splitlines()[0])
                continue
            row["rounds"].append(rnd)
            b = rnd["baseline"]["steps_per_s"]
            bits = []
            for a in arms:
                if a == "baseline":
                    continue
                bit = f"{a} x{rnd[a]['steps_per_s'] / b:.3f}"
                if rnd[a].get("thread_cpu_s") is not None and rnd[a].get("wall_s"):
                    bit += f" {rnd[a]['thread_cpu_s'] / rnd[a]['wall_s'] * 100:.1f}%"
                bits.append(bit)
            say(f"  round {i + 1}/{row['n_rounds']} {_row_label(row):<20} base {b:.0f} st/s; " + ", ".join(bits)
                + f"  ({time.monotonic() - t0:.0f} s)")

    for row in rows:
        row["summary"] = summarize_row(row["rounds"], arms) if row["rounds"] else None
    results = {
        "config": {
            "rounds": args.rounds, "exe_rounds": args.exe_rounds, "blocks": args.blocks, "seconds": args.seconds, "steps": args.steps,
            "warmup": args.warmup, "interval_s": args.interval, "churn": args.churn,
            "python": args.python, "compare_python": args.compare_python, "jit_cache_dir": args.jit_cache_dir,
            "cpus": os.cpu_count(), "quick": args.quick,
        },
        "arms": arms,
        "notes": notes,
        "rows": rows,
        "elapsed_s": time.time() - started,
    }
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=2)
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_tables(rows, arms)
        for row in rows:
            for failure in row["failed"]:
                print(f"FAILED: {failure}")
        print(f"(total {time.time() - started:.0f} s)")
    return 0 if all(row["rounds"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
