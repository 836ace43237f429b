#!/usr/bin/env python
"""Overhead of the jaxtop agent on a jitted CPU training loop.

Every round starts one FRESH child process per arm (``sys.executable``, so
compile caches, the transfer-guard setting and threads never leak between
runs):

* ``baseline``: the training loop alone;
* ``agent``:    ``jaxtop.instrument(interval_s=0.1)`` with every probe (stderr
  relay, transfer guard at ``log``, live-array scan, psutil, compile and
  donation hooks), started before ``import jax`` as the docs recommend;
* ``jaxsmi``:   jax-smi's tracking thread (``initialise_tracking()``, default
  1 s), for comparison; skipped with a note when ``jax_smi`` is not importable;
* ``twin``:     a second baseline, the A/A control: its "overhead" is the
  benchmark's own error (``--no-twin`` skips it).

The loop is a jitted MLP SGD step; the parameters stay on the device and a
NumPy batch (x, y) is passed every step, so each step makes two implicit
host-to-device transfers: two transfer-guard log lines for the agent to count.
Each child compiles and warms up first, then times only the step loop and
reports its steps/s as JSON.

Scheduling (``--mode``):

* ``interleaved`` (default): the round's children start together, warm up,
  and are frozen (SIGSTOP on their process group, relay included); the parent
  then thaws one child at a time for a block of ``--block-steps`` steps, in a
  rotating arm order, until each has run ``--steps``. The arms of a round run
  within seconds of each other, so the slow drifts of a shared VM (±10 % over
  tens of seconds here) cancel in the ratio; a frozen child uses no CPU.
* ``sequential``: one child at a time, all its steps in one block (the plain
  A/B design; drifts between runs stay in the ratio).

Wall-clock ratios stay noisy at the 1 % level, so the script also reports
stable figures: CPU time of the agent thread (the
``agent.cpu_s_total`` it records, which covers the sampling tick, and the
whole thread read from its pthread CPU clock), of the stderr relay process and
of jax-smi's thread, each per second of run as a % of one core, plus the user's
main thread: its CPU time and context switches per step.

Two estimates of the overhead come out of one run:

* the paired throughput estimate: per round, the mean log ratio of the
  arm's blocks to the baseline's, with a 95 % Student-t interval over rounds;
  the twin arm's interval shows what the run can resolve;
* the CPU share: the agent thread and the relay (their own clocks) plus the
  main thread's extra CPU per step, over the loop's CPU per step in the
  control arms. The loop keeps every core busy, so that share is what it
  loses; CPU clocks move far less than throughput on a shared VM.

Usage::

    .venv/bin/python benchmarks/overhead.py --pairs 7
    .venv/bin/python benchmarks/overhead.py --pairs 7 --json > results.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from overhead_child import BATCH, D_IN, D_OUT, EXTRA_ARMS, HIDDEN, MARK, STALL_S  # benchmarks/ is on sys.path

TARGET_PCT = 1.0  # the agent's overhead target: 1 % of the loop's throughput
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "overhead_child.py")


# ---------------------------------------------------------------------------
# parent side
# ---------------------------------------------------------------------------

class Child:
    """One benchmark child in its own process group (so the relay freezes too)."""

    def __init__(self, arm: str, args: argparse.Namespace) -> None:
        self.arm = arm
        self.workdir = tempfile.mkdtemp(
            prefix="jaxtop-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
        )
        self.stderr_path = os.path.join(self.workdir, "stderr.txt")
        self._stderr = open(self.stderr_path, "wb")
        cmd = [
            sys.executable, CHILD, arm,
            "--warmup", str(args.warmup), "--interval", str(args.interval), "--workdir", self.workdir,
            "--feed", args.feed,
        ]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            bufsize=0, start_new_session=True,
        )
        self._buf = b""
        self.frozen = False
        self.timeout = args.child_timeout

    def expect(self, word: str) -> str:
        """Read stdout lines until one starts with ``word``; return it."""
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + self.timeout
        while True:
            while b"\n" in self._buf:
                raw, self._buf = self._buf.split(b"\n", 1)
                line = raw.decode("utf-8", "replace")
                if line.startswith(word):
                    return line
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise RuntimeError(f"{self.arm}: no {word} within {self.timeout:.0f} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"{self.arm}: exited ({self.proc.wait()}) before {word}")
            self._buf += chunk

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def freeze(self) -> None:
        self.signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        if self.frozen:
            self.signal(signal.SIGCONT)
            self.frozen = False

    def send(self, text: str) -> None:
        self.proc.stdin.write((text + "\n").encode())

    def run_block(self, steps: int) -> None:
        self.thaw()
        self.send(f"RUN {steps}")
        self.expect("DONE")

    def finish(self) -> dict[str, Any]:
        self.thaw()
        self.send("END")
        line = self.expect(MARK)
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        return json.loads(line[len(MARK):])

    def stderr_tail(self, n: int = 15) -> list[str]:
        try:
            with open(self.stderr_path, "rb") as f:
                return f.read().decode("utf-8", "replace").strip().splitlines()[-n:]
        except OSError:
            return []

    def close(self) -> None:
        if self.proc.poll() is None:
            self.thaw()
            self.signal(signal.SIGKILL)
            self.proc.wait()
        else:
            self.signal(signal.SIGKILL)  # a relay still draining, if any
        self._stderr.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _blocks(total: int, size: int) -> list[int]:
    sizes = [size] * (total // size)
    if total % size:
        sizes.append(total % size)
    return sizes


def run_round(index: int, arms: list[str], args: argparse.Namespace) -> dict[str, Any]:
    # Rotate (and on odd rounds reverse) the arm order so no arm is always first.
    order = arms[index % len(arms):] + arms[: index % len(arms)]
    if index % 2:
        order = order[::-1]
    result: dict[str, Any] = {"_order": order}
    children: list[Child] = []
    try:
        if args.mode == "sequential":
            for arm in order:
                child = Child(arm, args)
                children.append(child)
                child.expect("READY")
                child.run_block(args.steps)
                result[arm] = child.finish()
                child.close()
        else:
            children = [Child(arm, args) for arm in order]
            for child in children:  # they compile concurrently; nothing is timed yet
                child.expect("READY")
                child.freeze()
            for b, size in enumerate(_blocks(args.steps, args.block_steps)):
                shift = b % len(children)
                for child in children[shift:] + children[:shift]:
                    child.run_block(size)
                    child.freeze()
            for child in children:
                result[child.arm] = child.finish()
    except Exception as exc:
        tails = {c.arm: c.stderr_tail() for c in children}
        raise RuntimeError(f"round {index + 1}: {exc}\n" + "\n".join(
            f"  {arm} stderr | {line}" for arm, lines in tails.items() for line in lines
        )) from None
    finally:
        for child in children:
            child.close()
    return result


# Two-sided 95 % quantiles of Student's t, by degrees of freedom.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
         18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042}


def _t975(df: int) -> float:
    if df in _T975:
        return _T975[df]
    below = [k for k in _T975 if k <= df]
    return _T975[max(below)] if df <= 30 else 1.96


def _block_pairs(rnd: dict[str, Any], arm: str) -> list[tuple[float, float]]:
    """(arm, baseline) steps/s of block b of one round: run seconds apart."""
    return list(zip(rnd[arm].get("block_steps_per_s", []), rnd["baseline"].get("block_steps_per_s", [])))


def paired_estimate(rounds: list[dict[str, Any]], arm: str) -> dict[str, Any] | None:
    """The arm's throughput relative to the baseline, with a 95 % interval.

    Each round gives one value: the mean log ratio of its blocks, block b of
    the arm against block b of the baseline (run seconds apart, so the VM's
    drift cancels). Rounds are the independent units (fresh processes: a
    process's own luck, its memory layout say, is shared by all its blocks),
    so the interval is Student's t over rounds.
    """
    import math

    per_round = []
    for r in rounds:
        logs = [math.log(x / b) for x, b in _block_pairs(r, arm) if x > 0 and b > 0]
        if logs:
            per_round.append(statistics.fmean(logs))
    if len(per_round) < 2:
        return None
    mean = statistics.fmean(per_round)
    half = _t975(len(per_round) - 1) * statistics.stdev(per_round) / math.sqrt(len(per_round))
    return {
        "rounds": len(per_round),
        "ratio": math.exp(mean),
        "ci95": [math.exp(mean - half), math.exp(mean + half)],
        "overhead_pct": (1 - math.exp(mean)) * 100,
        "overhead_pct_ci95": [(1 - math.exp(mean + half)) * 100, (1 - math.exp(mean - half)) * 100],
    }


def verdict(estimate: dict[str, Any] | None, target_pct: float) -> str:
    """Whether the interval shows the overhead within the target."""
    if estimate is None:
        return "no estimate (needs 2 rounds or more)"
    lo, hi = estimate["overhead_pct_ci95"]
    if hi <= target_pct:
        return f"MET: the whole 95 % interval is within {target_pct:g} %"
    if lo > target_pct:
        return f"MISSED: the whole 95 % interval is above {target_pct:g} %"
    return f"NOT SHOWN: the 95 % interval reaches {hi:+.2f} %; more rounds would narrow it"


def _pct(value: float | None) -> str:
    return "   n/a" if value is None else f"{value * 100:6.2f}"


def _med(values: list[Any]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _per_s(runs: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] / r["wall_s"] for r in runs if r.get(key) is not None]


def cpu_share(rounds: list[dict[str, Any]], arms: list[str]) -> dict[str, Any] | None:
    """The overhead as a share of the loop's CPU, from CPU clocks.

    The loop keeps both vCPUs busy (XLA computes on every core), so what the
    agent costs it is the CPU it takes: its thread and the relay, measured on
    their own clocks, plus what the user's main thread spends more per step
    than in the control arms (JAX formatting a guard log line per transfer,
    GIL hand-offs). Per round, over the process CPU per step of the controls
    (baseline, and twin when it ran). CPU clocks drift far less than
    throughput on a shared VM, but this is a model: it holds for a loop
    bound by CPU, as this one is.
    """
    controls = [a for a in ("baseline", "twin") if a in arms]
    agent_s, main_s, total = [], [], []
    for r in rounds:
        a = r["agent"]
        steps = a.get("steps")
        if not steps or a.get("agent_thread_cpu_s") is None:
            continue
        proc = statistics.fmean(
            (r[c]["proc_cpu_s"] + r[c].get("relay_cpu_s", 0.0)) / r[c]["steps"] for c in controls
        )
        main = statistics.fmean(r[c]["main_cpu_s"] / r[c]["steps"] for c in controls)
        own = (a["agent_thread_cpu_s"] + a.get("relay_cpu_s", 0.0)) / steps
        extra_main = a["main_cpu_s"] / steps - main
        agent_s.append(own / proc)
        main_s.append(extra_main / proc)
        total.append((own + extra_main) / proc)
    if not total:
        return None
    return {
        "controls": controls,
        "agent_and_relay_pct": statistics.median(agent_s) * 100,
        "main_thread_extra_pct": statistics.median(main_s) * 100,
        "total_pct": statistics.median(total) * 100,
        "total_pct_range": [min(total) * 100, max(total) * 100],
    }


def summarize(rounds: list[dict[str, Any]], arms: list[str]) -> dict[str, Any]:
    by_arm = {a: [r[a] for r in rounds] for a in arms}
    summary: dict[str, Any] = {"throughput_steps_per_s": {}, "ratio_vs_baseline": {}, "main_thread": {}}
    for a in arms:
        runs = by_arm[a]
        sps = [r["steps_per_s"] for r in runs]
        summary["throughput_steps_per_s"][a] = {"median": statistics.median(sps), "min": min(sps), "max": max(sps)}
        summary["main_thread"][a] = {
            "cpu_us_per_step": _med([r.get("main_cpu_s", 0) / r["steps"] * 1e6 for r in runs]),
            "vol_ctx_per_step": _med([r.get("main_vol_ctx", 0) / r["steps"] for r in runs]),
            "invol_ctx_per_step": _med([r.get("main_invol_ctx", 0) / r["steps"] for r in runs]),
            "stalls_per_s": _med([r.get("stalls", 0) / r["wall_s"] for r in runs]),
            "stall_ms_per_s": _med([r.get("stall_s", 0) / r["wall_s"] * 1e3 for r in runs]),
            "stall_max_ms": max(r.get("stall_max_s", 0) for r in runs) * 1e3,
            "process_cpu_us_per_step": _med([
                (r["proc_cpu_s"] + r.get("relay_cpu_s", 0.0)) / r["steps"] * 1e6 for r in runs
            ]),
        }
        if a == "baseline":
            continue
        ratios = [r[a]["steps_per_s"] / r["baseline"]["steps_per_s"] for r in rounds]
        med = statistics.median(ratios)
        # Interleaved mode: block b of each arm ran within seconds of block b
        # of the baseline; the median over all such pairs resists bursts.
        block_ratios = [
            x / b
            for r in rounds
            for x, b in _block_pairs(r, a)
        ]
        summary["ratio_vs_baseline"][a] = {
            "per_round": ratios, "median": med, "min": min(ratios), "max": max(ratios),
            "overhead_pct_median": (1 - med) * 100,
            "block_pairs": len(block_ratios),
            "block_median": statistics.median(block_ratios) if block_ratios else None,
            "paired": paired_estimate(rounds, a),
        }
    base = [r["steps_per_s"] for r in by_arm["baseline"]]
    summary["baseline_spread_pct"] = (max(base) - min(base)) / statistics.median(base) * 100
    steal = _med([r.get("machine_steal_frac") for a in arms for r in by_arm[a]])
    summary["steal_pct_median"] = None if steal is None else steal * 100

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
        cpu["agent_tick_us_per_sample"] = _med([
            r["agent_tick_cpu_s"] / r["samples_in_window"] * 1e6
            for r in runs if r.get("agent_tick_cpu_s") is not None and r.get("samples_in_window")
        ])
        # Two implicit transfers a step with NumPy batches; none with --feed device.
        cpu["guard_lines_per_s"] = _med([2 * r["steps"] / r["wall_s"] for r in runs if r.get("feed", "numpy") == "numpy"])
        if not cpu["guard_lines_per_s"]:
            cpu["guard_lines_per_s"] = None
        elif cpu["relay_core_frac"] is not None:
            cpu["relay_us_per_line"] = cpu["relay_core_frac"] / cpu["guard_lines_per_s"] * 1e6
        if cpu["guard_lines_per_s"] and cpu["agent_thread_core_frac"] is not None and cpu["agent_tick_core_frac"] is not None:
            # Thread time outside _tick: selector wake-ups for relay reports,
            # guard-line parsing, JSON encoding and the log write.
            outside = cpu["agent_thread_core_frac"] - cpu["agent_tick_core_frac"]
            cpu["agent_outside_tick_us_per_line"] = outside / cpu["guard_lines_per_s"] * 1e6
        cpu["h2d_counted_vs_expected"] = [(r.get("h2d_counted_total"), r.get("h2d_expected_min")) for r in runs]
    if "nocapture" in by_arm:
        cpu["nocapture_thread_core_frac"] = _med(_per_s(by_arm["nocapture"], "agent_thread_cpu_s"))
        cpu["nocapture_tick_core_frac"] = _med(_per_s(by_arm["nocapture"], "agent_tick_cpu_s"))
    if "jaxsmi" in by_arm:
        cpu["jaxsmi_thread_core_frac"] = _med(_per_s(by_arm["jaxsmi"], "smi_thread_cpu_s"))
    summary["cpu"] = cpu
    summary["cpu_share"] = cpu_share(rounds, arms) if "agent" in arms else None
    return summary


def print_table(rounds: list[dict[str, Any]], arms: list[str], summary: dict[str, Any],
                args: argparse.Namespace, notes: list[str]) -> None:
    short = {"baseline": "base", "agent": "agent", "jaxsmi": "jax-smi", "twin": "twin", "guard": "guard",
             "nocapture": "nocap"}
    print()
    head = f"{'round':>5}  " + "".join(f"{short[a] + ' st/s':>13}" for a in arms)
    head += "".join(f"{short[a] + '/base':>14}" for a in arms if a != "baseline")
    print(head)
    for i, r in enumerate(rounds):
        line = f"{i + 1:>5}  " + "".join(f"{r[a]['steps_per_s']:>13.1f}" for a in arms)
        line += "".join(
            f"{r[a]['steps_per_s'] / r['baseline']['steps_per_s']:>14.4f}" for a in arms if a != "baseline"
        )
        print(line)
    tp = summary["throughput_steps_per_s"]
    line = f"{'med':>5}  " + "".join(f"{tp[a]['median']:>13.1f}" for a in arms)
    line += "".join(f"{summary['ratio_vs_baseline'][a]['median']:>14.4f}" for a in arms if a != "baseline")
    print(line)
    print()
    for a, r in summary["ratio_vs_baseline"].items():
        print(f"{short[a] + '/baseline':<16} median throughput ratio {r['median']:.4f}"
              f"  -> overhead {r['overhead_pct_median']:+.2f} %  (per-round range {r['min']:.3f} .. {r['max']:.3f})")
        if r.get("block_median") is not None:
            print(f"{'':<16} block-paired median   {r['block_median']:.4f}  over {r['block_pairs']} pairs of blocks"
                  " run seconds apart")
        est = r.get("paired")
        if est is not None:
            lo, hi = est["overhead_pct_ci95"]
            print(f"{'':<16} paired estimate       {est['ratio']:.4f}  -> overhead {est['overhead_pct']:+.2f} %"
                  f"  (95 % interval {lo:+.2f} .. {hi:+.2f} %, {est['rounds']} rounds)")
    if "twin" in summary["ratio_vs_baseline"]:
        print("(twin is a second baseline: its interval is what this run can resolve)")
    if "agent" in summary["ratio_vs_baseline"]:
        print(f"agent target (overhead <= {TARGET_PCT:g} %): "
              + verdict(summary["ratio_vs_baseline"]["agent"].get("paired"), TARGET_PCT))
    steal = summary.get("steal_pct_median")
    print(f"baseline throughput spread across rounds: {summary['baseline_spread_pct']:.1f} % of its median"
          + (f"; CPU steal during the loops: {steal:.1f} %" if steal is not None else ""))
    print()
    print("user's main thread (medians): CPU us/step, voluntary and involuntary context switches per step,")
    print(f"  dispatch gaps > {STALL_S * 1e3:.0f} ms (stalls) per s and ms stalled per s, longest stall in any run;")
    print("  CPU us/step of the whole process plus the relay")
    print(f"  {'':<10}{'CPU us':>8}{'vol/st':>8}{'invol/st':>9}{'stalls/s':>9}{'ms/s':>7}{'max ms':>8}{'proc us':>9}")
    for a in arms:
        m = summary["main_thread"][a]
        print(f"  {short[a]:<10}{m['cpu_us_per_step']:>8.1f}{m['vol_ctx_per_step']:>8.3f}{m['invol_ctx_per_step']:>9.3f}"
              f"{m['stalls_per_s']:>9.2f}{m['stall_ms_per_s']:>7.1f}{m['stall_max_ms']:>8.1f}{m['process_cpu_us_per_step']:>9.0f}")
    c = summary["cpu"]
    print()
    print("stable figures: CPU time per second of run, % of one core (medians over runs):")
    if "agent_tick_core_frac" in c:
        print(f"  agent sampling tick (agent.cpu_s_total) {_pct(c['agent_tick_core_frac'])} %"
              f"   = {c['agent_tick_us_per_sample'] or 0:.0f} us per sample at interval {args.interval} s")
        print(f"    same, whole run, from the last sample {_pct(c['agent_last_sample_core_frac'])} %")
        print(f"  agent thread, all of it (pthread clock) {_pct(c['agent_thread_core_frac'])} %")
        if c.get("agent_outside_tick_us_per_line") is not None:
            print(f"    outside the tick (relay reports)       {c['agent_outside_tick_us_per_line']:6.1f} us per guard line")
        per_line = (f"   = {c.get('relay_us_per_line', 0):.1f} us per guard line ({c['guard_lines_per_s']:.0f} lines/s)"
                    if c.get("guard_lines_per_s") else "   (no implicit transfers with --feed device)")
        print(f"  stderr relay process (psutil)           {_pct(c['relay_core_frac'])} %" + per_line)
        total = sum(v for v in (c["agent_thread_core_frac"], c["relay_core_frac"]) if v is not None)
        print(f"  agent thread + relay                    {_pct(total)} %")
    share = summary.get("cpu_share")
    if share is not None:
        print()
        print(f"overhead as a share of the loop's CPU (model for a CPU-bound loop; controls: "
              f"{', '.join(share['controls'])}; medians over rounds):")
        print(f"  agent thread + relay                    {share['agent_and_relay_pct']:6.2f} %")
        print(f"  user's main thread, extra CPU per step  {share['main_thread_extra_pct']:6.2f} %")
        lo, hi = share["total_pct_range"]
        print(f"  total                                   {share['total_pct']:6.2f} %   (rounds {lo:.2f} .. {hi:.2f} %)"
              f"  target <= {TARGET_PCT:g} %: " + ("met" if share["total_pct"] <= TARGET_PCT else "missed"))
    if "nocapture_thread_core_frac" in c:
        print(f"  agent thread, capture_stderr=False      {_pct(c['nocapture_thread_core_frac'])} %"
              f"   (tick {_pct(c['nocapture_tick_core_frac']).strip()} %)")
    if "jaxsmi_thread_core_frac" in c:
        print(f"  jax-smi tracking thread                 {_pct(c['jaxsmi_thread_core_frac'])} %")
    if "h2d_counted_vs_expected" in c:
        bad = [(n, e) for n, e in c["h2d_counted_vs_expected"] if n is None or n < e]
        print("check: h2d transfers counted by the agent "
              + ("match the steps run in every agent run" if not bad else f"fall SHORT in {len(bad)} run(s): {bad}"))
    for note in notes:
        print(f"note: {note}")


def _jax_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("jax")
    except Exception:
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--pairs", type=int, default=5, help="rounds; each runs every arm once in fresh processes (default 5)")
    p.add_argument("--steps", type=int, default=1500, help="timed steps per run (default 1500, ~3 s here)")
    p.add_argument("--warmup", type=int, default=100, help="untimed steps after compiling (default 100)")
    p.add_argument("--mode", choices=("interleaved", "sequential"), default="interleaved",
                   help="interleave blocks of the round's runs (default) or run them one after another")
    p.add_argument("--block-steps", type=int, default=300, help="steps per block in interleaved mode (default 300)")
    p.add_argument("--interval", type=float, default=0.1, help="agent interval_s (default 0.1)")
    p.add_argument("--no-jaxsmi", action="store_true", help="skip the jax-smi arm")
    p.add_argument("--no-twin", action="store_true", help="skip the twin arm (a second baseline, the A/A control)")
    p.add_argument("--feed", choices=("numpy", "device"), default="numpy",
                   help="numpy: a NumPy batch per step (2 implicit transfers a step, the worst case for the agent); "
                   "device: batches placed with device_put up front (no implicit transfers)")
    p.add_argument("--extra-arms", default="", help="comma-separated diagnostic arms: guard, nocapture")
    p.add_argument("--json", action="store_true", help="print machine-readable results (JSON) instead of the table")
    p.add_argument("--json-out", metavar="PATH", help="also write the JSON results to PATH")
    p.add_argument("--child-timeout", type=float, default=300.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.pairs < 1 or args.steps < 1 or args.block_steps < 1:
        p.error("--pairs, --steps and --block-steps must be positive")
    notes: list[str] = []
    arms = ["baseline", "agent"]
    if args.no_jaxsmi:
        notes.append("jax-smi arm skipped (--no-jaxsmi)")
    elif importlib.util.find_spec("jax_smi") is None:
        notes.append(f"jax-smi arm skipped: jax_smi is not importable by {sys.executable} (pip install jax-smi)")
    else:
        arms.append("jaxsmi")
    if not args.no_twin:
        arms.append("twin")
    for extra in filter(None, args.extra_arms.split(",")):
        if extra not in EXTRA_ARMS:
            p.error(f"unknown extra arm {extra!r}; known: {', '.join(EXTRA_ARMS)}")
        arms.append(extra)
    if not args.json:
        for note in notes:
            print(f"note: {note}")
        print(f"{args.pairs} rounds x {len(arms)} arms ({', '.join(arms)}), {args.steps} timed steps per run, "
              f"{args.mode}" + (f" in blocks of {args.block_steps}" if args.mode == "interleaved" else "")
              + f"; agent interval {args.interval} s; a fresh process per run", flush=True)

    rounds: list[dict[str, Any]] = []
    started = time.time()
    for i in range(args.pairs):
        try:
            rnd = run_round(i, arms, args)
        except RuntimeError as exc:
            sys.stderr.write(f"benchmark failed: {exc}\n")
            return 1
        rounds.append(rnd)
        if not args.json:
            print(f"  round {i + 1}/{args.pairs}: " + ", ".join(
                f"{a} {rnd[a]['steps_per_s']:.1f}" for a in arms) + " steps/s", flush=True)

    summary = summarize(rounds, arms)
    results = {
        "config": {
            "pairs": args.pairs, "steps": args.steps, "warmup": args.warmup, "mode": args.mode, "feed": args.feed,
            "block_steps": args.block_steps, "interval_s": args.interval,
            "model": {"batch": BATCH, "d_in": D_IN, "hidden": HIDDEN, "d_out": D_OUT, "layers": 3},
            "python": sys.version.split()[0], "cpus": os.cpu_count(), "jax": _jax_version(),
        },
        "arms": arms,
        "notes": notes,
        "rounds": rounds,
        "summary": summary,
        "elapsed_s": time.time() - started,
    }
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=2)
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_table(rounds, arms, summary, args, notes)
        print(f"(total {time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
