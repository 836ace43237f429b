#!/usr/bin/env python
"""Overhead of the jaxtop agent on a jitted CPU training loop (DESIGN.md §5).

Runs rounds of fresh child processes (``sys.executable``, so compile caches,
the transfer-guard setting and threads never leak between runs):

* ``baseline``: the training loop alone;
* ``agent``:    ``jaxtop.instrument(interval_s=0.1)`` with every probe (stderr
  relay, transfer guard at ``log``, live-array scan, psutil, compile and
  donation hooks), started before ``import jax`` as the docs recommend;
* ``jaxsmi``:   jax-smi's tracking thread (``initialise_tracking()``, 1 s),
  for comparison; skipped with a note when ``jax_smi`` is not importable.

The loop is a jitted MLP SGD step; the parameters stay on the device and a
NumPy batch (x, y) is passed every step, so each step makes two implicit
host-to-device transfers -- two transfer-guard log lines the agent counts.
Each child compiles and warms up first and times only the step loop.

Wall-clock throughput on a shared VM is noisy (DESIGN.md §5: about ±10 %), so
besides the per-round throughput ratios and their median the script reports
the stable figures: CPU time of the agent thread (the ``agent.cpu_s_total`` it
records, which covers the sampling tick, and the whole thread read from its
pthread CPU clock), of the stderr relay process, and of jax-smi's thread, each
per second of run as a percentage of one core.

Usage::

    .venv/bin/python benchmarks/overhead.py --pairs 7
    .venv/bin/python benchmarks/overhead.py --pairs 7 --json > results.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

MARK = "JAXTOP_BENCH_RESULT "
ARMS = ("baseline", "agent", "jaxsmi")
# Diagnostic arms (--extra-arms), to split the agent's cost into parts:
#   guard:   only jax's transfer guard at ``log`` (lines go to the child's
#            stderr, a pipe the parent drains): jax's own cost of logging;
#   nocapture: the agent with capture_stderr=False (no relay, no guard): the
#            sampling thread alone.
EXTRA_ARMS = ("guard", "nocapture")

# Model size: one step is ~1.9 ms on the 2-core reference VM, so the default
# 1,500 steps take ~3 s.
BATCH, D_IN, HIDDEN, D_OUT = 64, 256, 512, 10
N_BATCHES = 8  # distinct host batches, cycled (no RNG inside the timed loop)


# ---------------------------------------------------------------------------
# child side
# ---------------------------------------------------------------------------

def _machine_cpu() -> dict[str, int]:
    """Machine-wide jiffies from /proc/stat (idle, steal, total)."""
    try:
        with open("/proc/stat") as f:
            parts = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return {}
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    steal = parts[7] if len(parts) > 7 else 0
    return {"idle": idle, "steal": steal, "total": sum(parts[:8])}


def _thread_cpu(ident: int | None) -> float | None:
    """CPU seconds of another thread of this process, via its pthread clock."""
    if ident is None or not hasattr(time, "pthread_getcpuclockid"):
        return None
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(ident))
    except (OSError, ValueError, OverflowError):
        return None


def _relay_proc() -> Any:
    import psutil

    for child in psutil.Process().children(recursive=False):
        try:
            if any("_relay.py" in part for part in child.cmdline()):
                return child
        except psutil.Error:
            continue
    return None


def _proc_cpu(proc: Any) -> float | None:
    if proc is None:
        return None
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except Exception:
        return None


def _read_log(path: str) -> list[dict[str, Any]]:
    records = []
    try:
        with open(path, "rb") as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return records


def run_child(arm: str, steps: int, warmup: int, interval_s: float, workdir: str) -> dict[str, Any]:
    out: dict[str, Any] = {"arm": arm, "pid": os.getpid()}
    handle = None
    log_path = os.path.join(workdir, "agent.jsonl")
    if arm == "agent":
        import jaxtop  # before jax, as documented

        handle = jaxtop.instrument(interval_s=interval_s, log_path=log_path)
    elif arm == "nocapture":
        import jaxtop

        handle = jaxtop.instrument(interval_s=interval_s, log_path=log_path, capture_stderr=False)

    import jax
    import jax.numpy as jnp
    import numpy as np

    def init(key: Any) -> list[tuple[Any, Any]]:
        dims = [(D_IN, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, D_OUT)]
        keys = jax.random.split(key, len(dims))
        return [
            (jax.random.normal(k, (a, b), jnp.float32) / np.sqrt(a), jnp.zeros((b,), jnp.float32))
            for k, (a, b) in zip(keys, dims)
        ]

    def loss_fn(params: Any, x: Any, y: Any) -> Any:
        h = x
        for w, b in params[:-1]:
            h = jax.nn.relu(h @ w + b)
        w, b = params[-1]
        logits = h @ w + b
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, D_OUT), axis=-1))

    @jax.jit
    def train_step(params: Any, x: Any, y: Any) -> tuple[Any, Any]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), loss

    if arm == "guard":
        jax.config.update("jax_transfer_guard_host_to_device", "log")

    params = init(jax.random.key(0))  # on the device from here on
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((BATCH, D_IN), dtype=np.float32) for _ in range(N_BATCHES)]
    ys = [rng.integers(0, D_OUT, BATCH).astype(np.int32) for _ in range(N_BATCHES)]

    smi_ident = None
    if arm == "jaxsmi":
        import threading

        from jax_smi import initialise_tracking

        before = {t.ident for t in threading.enumerate()}
        # Default 1 s interval; a private directory instead of /dev/shm itself
        # so runs never touch a profile the user's own jax-smi is writing.
        initialise_tracking(dir_prefix=workdir)
        new = [t.ident for t in threading.enumerate() if t.ident not in before]
        smi_ident = new[0] if new else None

    # Compile and warm up (not timed), then let the agent settle.
    for i in range(warmup):
        params, loss = train_step(params, xs[i % N_BATCHES], ys[i % N_BATCHES])
    jax.block_until_ready((params, loss))
    time.sleep(0.3)

    agent = handle.agent if handle is not None else None
    agent_ident = agent._thread.ident if agent is not None and agent._thread is not None else None
    relay = _relay_proc() if agent is not None else None

    def snapshot() -> dict[str, Any]:
        cpu = os.times()
        return {
            "wall": time.perf_counter(),
            "t": time.time(),
            "proc": cpu.user + cpu.system,
            "machine": _machine_cpu(),
            "agent_tick": agent._agent_cpu_s if agent is not None else None,
            "agent_thread": _thread_cpu(agent_ident),
            "relay": _proc_cpu(relay),
            "smi_thread": _thread_cpu(smi_ident),
        }

    s0 = snapshot()
    for i in range(steps):
        params, loss = train_step(params, xs[i % N_BATCHES], ys[i % N_BATCHES])
    jax.block_until_ready((params, loss))
    s1 = snapshot()

    wall = s1["wall"] - s0["wall"]
    out.update({
        "steps": steps,
        "wall_s": wall,
        "steps_per_s": steps / wall,
        "loss": float(loss),
        "proc_cpu_s": s1["proc"] - s0["proc"],
    })
    m0, m1 = s0["machine"], s1["machine"]
    if m0 and m1 and m1["total"] > m0["total"]:
        span = m1["total"] - m0["total"]
        out["machine_idle_frac"] = (m1["idle"] - m0["idle"]) / span
        out["machine_steal_frac"] = (m1["steal"] - m0["steal"]) / span
    for key in ("agent_tick", "agent_thread", "relay", "smi_thread"):
        if s0[key] is not None and s1[key] is not None:
            out[key + "_cpu_s"] = s1[key] - s0[key]

    if agent is not None and arm == "agent":
        # Let a sample or two pass so the counts include the timed loop.
        time.sleep(max(0.5, 3 * interval_s))
        records = _read_log(log_path)
        samples = [r for r in records if r.get("type") == "sample"]
        in_window = [r for r in samples if s0["t"] <= r["t"] <= s1["t"]]
        out["samples_in_window"] = len(in_window)
        if samples:
            last = samples[-1]
            cpu_total = last.get("agent", {}).get("cpu_s_total")
            span = last["t"] - agent.started_t
            out["last_sample_cpu_s_total"] = cpu_total
            out["last_sample_span_s"] = span
            h2d = last.get("transfers", {}).get("h2d", {})
            out["h2d_counted_total"] = h2d.get("count_total")
        out["h2d_expected_min"] = 2 * (warmup + steps)
        out["transfer_capture"] = next(
            (r.get("transfer_capture") for r in records if r.get("type") == "hello"), None
        )
    if handle is not None:
        handle.stop()
    return out


# ---------------------------------------------------------------------------
# parent side
# ---------------------------------------------------------------------------

def _spawn(arm: str, args: argparse.Namespace) -> dict[str, Any]:
    workdir = tempfile.mkdtemp(prefix="jaxtop-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    cmd = [
        sys.executable, os.path.abspath(__file__), "--child", arm,
        "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--interval", str(args.interval), "--workdir", workdir,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.child_timeout)
    except subprocess.TimeoutExpired:
        return {"arm": arm, "error": f"timed out after {args.child_timeout} s"}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            result = json.loads(line[len(MARK):])
            result["returncode"] = proc.returncode
            return result
    tail = (proc.stderr or "").strip().splitlines()[-15:]
    return {"arm": arm, "error": f"exit {proc.returncode}, no result", "stderr_tail": tail}


def _pct(value: float | None) -> str:
    return "   n/a" if value is None else f"{value * 100:6.2f}"


def _med(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _per_s(runs: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] / r["wall_s"] for r in runs if r.get(key) is not None]


def summarize(rounds: list[dict[str, dict[str, Any]]], arms: list[str]) -> dict[str, Any]:
    by_arm = {a: [r[a] for r in rounds] for a in arms}
    base = by_arm["baseline"]
    summary: dict[str, Any] = {"throughput_steps_per_s": {}, "ratio_vs_baseline": {}}
    for a in arms:
        sps = [r["steps_per_s"] for r in by_arm[a]]
        summary["throughput_steps_per_s"][a] = {
            "median": statistics.median(sps), "min": min(sps), "max": max(sps),
        }
        if a == "baseline":
            continue
        ratios = [r[a]["steps_per_s"] / r["baseline"]["steps_per_s"] for r in rounds]
        summary["ratio_vs_baseline"][a] = {
            "per_round": ratios,
            "median": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
            "overhead_pct_median": (1 - statistics.median(ratios)) * 100,
        }
        # CPU cost per step (process + relay), less sensitive to steal than wall.
        cpu_ratio = []
        for r in rounds:
            b = r["baseline"]["proc_cpu_s"] / r["baseline"]["steps"]
            x = (r[a]["proc_cpu_s"] + r[a].get("relay_cpu_s", 0.0)) / r[a]["steps"]
            cpu_ratio.append(x / b)
        summary["ratio_vs_baseline"][a]["cpu_per_step_median"] = statistics.median(cpu_ratio)
    # Noise of the baseline itself: spread of its throughput across rounds.
    bs = [r["steps_per_s"] for r in base]
    summary["baseline_spread_pct"] = (max(bs) - min(bs)) / statistics.median(bs) * 100
    summary["steal_pct_median"] = _med(
        [r.get("machine_steal_frac") for a in arms for r in by_arm[a]]
    )
    if summary["steal_pct_median"] is not None:
        summary["steal_pct_median"] *= 100

    cpu: dict[str, Any] = {}
    if "agent" in by_arm:
        runs = by_arm["agent"]
        cpu["agent_tick_core_frac"] = _med(_per_s(runs, "agent_tick_cpu_s"))
        cpu["agent_thread_core_frac"] = _med(_per_s(runs, "agent_thread_cpu_s"))
        cpu["relay_core_frac"] = _med(_per_s(runs, "relay_cpu_s"))
        cpu["agent_last_sample_core_frac"] = _med([
            r["last_sample_cpu_s_total"] / r["last_sample_span_s"]
            for r in runs if r.get("last_sample_cpu_s_total") is not None and r.get("last_sample_span_s")
        ])
        per_sample = [
            r["agent_tick_cpu_s"] / r["samples_in_window"] * 1e6
            for r in runs if r.get("agent_tick_cpu_s") is not None and r.get("samples_in_window")
        ]
        cpu["agent_tick_us_per_sample"] = _med(per_sample)
        per_sample_thread = [
            r["agent_thread_cpu_s"] / r["samples_in_window"] * 1e6
            for r in runs if r.get("agent_thread_cpu_s") is not None and r.get("samples_in_window")
        ]
        cpu["agent_thread_us_per_sample"] = _med(per_sample_thread)
        transfers_per_s = [2 * r["steps"] / r["wall_s"] for r in runs]
        cpu["guard_lines_per_s"] = _med(transfers_per_s)
        if cpu["relay_core_frac"] is not None and cpu["guard_lines_per_s"]:
            cpu["relay_us_per_line"] = cpu["relay_core_frac"] / cpu["guard_lines_per_s"] * 1e6
        if cpu["agent_thread_core_frac"] is not None and cpu["agent_tick_core_frac"] is not None:
            # Thread time outside _tick: selector wake-ups for relay reports,
            # guard-line parsing, JSON encoding and the log write.
            outside = cpu["agent_thread_core_frac"] - cpu["agent_tick_core_frac"]
            cpu["agent_outside_tick_us_per_line"] = outside / cpu["guard_lines_per_s"] * 1e6
        counted = [
            (r.get("h2d_counted_total"), r.get("h2d_expected_min")) for r in runs
        ]
        cpu["h2d_counted_vs_expected"] = counted
    if "nocapture" in by_arm:
        cpu["nocapture_thread_core_frac"] = _med(_per_s(by_arm["nocapture"], "agent_thread_cpu_s"))
        cpu["nocapture_tick_core_frac"] = _med(_per_s(by_arm["nocapture"], "agent_tick_cpu_s"))
    if "jaxsmi" in by_arm:
        cpu["jaxsmi_thread_core_frac"] = _med(_per_s(by_arm["jaxsmi"], "smi_thread_cpu_s"))
    summary["cpu"] = cpu
    return summary


def print_table(rounds: list[dict[str, dict[str, Any]]], arms: list[str], summary: dict[str, Any],
                args: argparse.Namespace, notes: list[str]) -> None:
    print()
    head = f"{'round':>5} {'order':<22}" + "".join(f"{a + ' st/s':>14}" for a in arms)
    head += "".join(f"{a + '/base':>13}" for a in arms if a != "baseline")
    print(head)
    for i, r in enumerate(rounds):
        line = f"{i + 1:>5} {'>'.join(r['_order']):<22}"
        line += "".join(f"{r[a]['steps_per_s']:>14.1f}" for a in arms)
        line += "".join(
            f"{r[a]['steps_per_s'] / r['baseline']['steps_per_s']:>13.4f}" for a in arms if a != "baseline"
        )
        print(line)
    print()
    tp = summary["throughput_steps_per_s"]
    print(f"median throughput (steps/s): " + ", ".join(f"{a} {tp[a]['median']:.1f}" for a in arms))
    for a, r in summary["ratio_vs_baseline"].items():
        print(
            f"{a + '/baseline':<18} median ratio {r['median']:.4f}  (overhead {r['overhead_pct_median']:+.2f} %;"
            f" range {r['min']:.3f}..{r['max']:.3f}; CPU per step incl. relay x{r['cpu_per_step_median']:.4f})"
        )
    steal = summary.get("steal_pct_median")
    print(
        f"baseline spread across rounds: {summary['baseline_spread_pct']:.1f} % of its median"
        + (f"; CPU steal during loops: {steal:.1f} % (median)" if steal is not None else "")
    )
    c = summary["cpu"]
    if "agent_tick_core_frac" in c:
        print()
        print("stable figures (CPU time per second of run, % of one core; medians over agent runs):")
        print(f"  agent sampling tick (agent.cpu_s_total) {_pct(c['agent_tick_core_frac'])} %"
              f"   = {c['agent_tick_us_per_sample'] or 0:.0f} us per sample at {args.interval} s")
        print(f"    same, whole run from last sample      {_pct(c['agent_last_sample_core_frac'])} %")
        print(f"  agent thread, all of it (pthread clock) {_pct(c['agent_thread_core_frac'])} %"
              f"   = {c['agent_thread_us_per_sample'] or 0:.0f} us per sample period")
        print(f"  stderr relay process (psutil)           {_pct(c['relay_core_frac'])} %"
              f"   = {c.get('relay_us_per_line', 0):.1f} us per guard line"
              f" ({c['guard_lines_per_s']:.0f} lines/s)")
        if c.get("agent_outside_tick_us_per_line") is not None:
            print(f"  agent thread outside the tick: {c['agent_outside_tick_us_per_line']:.1f} us per guard line")
        total = sum(v for v in (c["agent_thread_core_frac"], c["relay_core_frac"]) if v is not None)
        print(f"  agent thread + relay                    {_pct(total)} %")
        bad = [(n, e) for n, e in c["h2d_counted_vs_expected"] if n is None or n < e]
        print(f"  h2d transfers counted by the agent: "
              + ("all runs >= expected" if not bad else f"SHORT in {len(bad)} run(s): {bad}"))
    if "nocapture_thread_core_frac" in c:
        print(f"  agent thread, capture_stderr=False      {_pct(c['nocapture_thread_core_frac'])} %"
              f"   (tick {_pct(c['nocapture_tick_core_frac']).strip()} %)")
    if "jaxsmi_thread_core_frac" in c:
        print(f"  jax-smi tracking thread                 {_pct(c['jaxsmi_thread_core_frac'])} %")
    for note in notes:
        print(f"note: {note}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=5, help="rounds of baseline/agent/jax-smi runs (default 5)")
    p.add_argument("--steps", type=int, default=1500, help="timed steps per run (default 1500, ~3 s here)")
    p.add_argument("--warmup", type=int, default=100, help="untimed steps after compiling (default 100)")
    p.add_argument("--interval", type=float, default=0.1, help="agent interval_s (default 0.1)")
    p.add_argument("--no-jaxsmi", action="store_true", help="skip the jax-smi arm")
    p.add_argument("--json", action="store_true", help="print machine-readable results (JSON) instead of the table")
    p.add_argument("--child-timeout", type=float, default=300.0, help=argparse.SUPPRESS)
    p.add_argument("--extra-arms", default="", help="comma-separated diagnostic arms: guard, nocapture")
    p.add_argument("--child", choices=ARMS + EXTRA_ARMS, help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child:
        result = run_child(args.child, args.steps, args.warmup, args.interval, args.workdir or tempfile.gettempdir())
        sys.stdout.write(MARK + json.dumps(result) + "\n")
        sys.stdout.flush()
        return 0

    if args.pairs < 1 or args.steps < 1:
        p.error("--pairs and --steps must be positive")
    notes: list[str] = []
    arms = ["baseline", "agent"]
    if args.no_jaxsmi:
        notes.append("jax-smi arm skipped (--no-jaxsmi)")
    elif importlib.util.find_spec("jax_smi") is None:
        notes.append(f"jax-smi arm skipped: jax_smi is not importable by {sys.executable} (pip install jax-smi)")
    else:
        arms.append("jaxsmi")
    for extra in filter(None, args.extra_arms.split(",")):
        if extra not in EXTRA_ARMS:
            p.error(f"unknown extra arm {extra!r}; known: {', '.join(EXTRA_ARMS)}")
        arms.append(extra)
    if not args.json:
        for note in notes:
            print(f"note: {note}")
        print(f"{args.pairs} rounds x {len(arms)} arms ({', '.join(arms)}), {args.steps} steps each, "
              f"agent interval {args.interval} s; each run is a fresh {os.path.basename(sys.executable)} process")

    rounds: list[dict[str, Any]] = []
    started = time.time()
    for i in range(args.pairs):
        # Rotate the order so no arm always runs first (or right after another).
        order = arms[i % len(arms):] + arms[: i % len(arms)]
        if i % 2:
            order = order[::-1]
        rnd: dict[str, Any] = {"_order": order}
        for arm in order:
            res = _spawn(arm, args)
            if "error" in res:
                sys.stderr.write(f"run {arm} (round {i + 1}) failed: {res['error']}\n")
                for line in res.get("stderr_tail", []):
                    sys.stderr.write(f"  | {line}\n")
                return 1
            rnd[arm] = res
        rounds.append(rnd)
        if not args.json:
            print(f"  round {i + 1}/{args.pairs}: " + ", ".join(
                f"{a} {rnd[a]['steps_per_s']:.1f}" for a in arms) + " steps/s", flush=True)

    summary = summarize(rounds, arms)
    if args.json:
        json.dump({
            "config": {
                "pairs": args.pairs, "steps": args.steps, "warmup": args.warmup, "interval_s": args.interval,
                "model": {"batch": BATCH, "d_in": D_IN, "hidden": HIDDEN, "d_out": D_OUT, "layers": 3},
                "python": sys.version.split()[0], "cpus": os.cpu_count(),
            },
            "arms": arms,
            "notes": notes,
            "rounds": rounds,
            "summary": summary,
            "elapsed_s": time.time() - started,
        }, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_table(rounds, arms, summary, args, notes)
        print(f"(total {time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
