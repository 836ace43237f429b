#!/usr/bin/env python
"""Overhead of the jaxtop agent on a jitted CPU training loop (DESIGN.md §5).

Every round starts one FRESH child process per arm (``sys.executable``, so
compile caches, the transfer-guard setting and threads never leak between
runs):

* ``baseline``: the training loop alone;
* ``agent``:    ``jaxtop.instrument(interval_s=0.1)`` with every probe (stderr
  relay, transfer guard at ``log``, live-array scan, psutil, compile and
  donation hooks), started before ``import jax`` as the docs recommend;
* ``jaxsmi``:   jax-smi's tracking thread (``initialise_tracking()``, default
  1 s), for comparison; skipped with a note when ``jax_smi`` is not importable.

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
the stable figures of DESIGN.md §5: CPU time of the agent thread (the
``agent.cpu_s_total`` it records, which covers the sampling tick, and the
whole thread read from its pthread CPU clock), of the stderr relay process and
of jax-smi's thread, each per second of run as a % of one core, plus the user's
main thread: its CPU time and context switches per step.

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

MARK = "JAXTOP_BENCH_RESULT "
ARMS = ("baseline", "agent", "jaxsmi")
# Diagnostic arms (--extra-arms), to split the agent's cost into parts:
#   guard:     only jax's transfer guard at ``log`` (no jaxtop): jax's own cost
#              of writing one log line per transfer (to a file here);
#   nocapture: the agent with capture_stderr=False (no relay, no guard): the
#              sampling thread alone.
EXTRA_ARMS = ("guard", "nocapture")
AGENT_ARMS = ("agent", "nocapture")

# Model size: one step is ~2-3 ms on the 2-core reference VM, so the default
# 1,500 steps take ~3-4 s.
BATCH, D_IN, HIDDEN, D_OUT = 64, 256, 512, 10
N_BATCHES = 8  # distinct host batches, cycled (no RNG inside the timed loop)
STALL_S = 0.02  # a gap between two dispatches longer than this counts as a stall


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


def _ctx_switches() -> tuple[int, int] | None:
    """(voluntary, involuntary) context switches of the calling thread."""
    try:
        with open("/proc/thread-self/status") as f:
            text = f.read()
    except OSError:
        return None
    vals = {}
    for line in text.splitlines():
        if "ctxt_switches:" in line:
            key, _, value = line.partition(":")
            vals[key.strip()] = int(value)
    try:
        return vals["voluntary_ctxt_switches"], vals["nonvoluntary_ctxt_switches"]
    except KeyError:
        return None


def _thread_cpu(ident: int | None) -> float | None:
    """CPU seconds of another thread of this process, via its pthread clock."""
    if ident is None or not hasattr(time, "pthread_getcpuclockid"):
        return None
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(ident))
    except (OSError, ValueError, OverflowError):
        return None


def _relay_proc() -> Any:
    """The stderr relay: our child process whose command line has _relay.py."""
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


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def run_child(arm: str, warmup: int, interval_s: float, workdir: str) -> dict[str, Any]:
    """Set up, warm up, say READY, then obey ``RUN n`` / ``END`` on stdin."""
    out: dict[str, Any] = {"arm": arm, "pid": os.getpid()}
    handle = None
    log_path = os.path.join(workdir, "agent.jsonl")
    if arm in AGENT_ARMS:
        import jaxtop  # before jax, as documented

        handle = jaxtop.instrument(
            interval_s=interval_s, log_path=log_path, capture_stderr=(arm == "agent")
        )

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
        # Default 1 s interval; a private directory (on /dev/shm, like its
        # default) so runs never touch a profile a real jax-smi is writing.
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
    relay = _relay_proc() if arm == "agent" else None

    def snapshot() -> dict[str, Any]:
        return {
            "wall": time.perf_counter(),
            "t": time.time(),
            "proc": sum(os.times()[:2]),
            "main": time.thread_time(),
            "ctx": _ctx_switches(),
            "machine": _machine_cpu(),
            "agent_tick": agent._agent_cpu_s if agent is not None else None,
            "agent_thread": _thread_cpu(agent_ident),
            "relay": _proc_cpu(relay),
            "smi_thread": _thread_cpu(smi_ident),
        }

    acc: dict[str, float] = {}
    windows: list[tuple[float, float]] = []
    block_sps: list[float] = []
    stalls: list[float] = []

    def add(key: str, value: float | None) -> None:
        if value is not None:
            acc[key] = acc.get(key, 0.0) + value

    _say("READY")
    done = 0
    for command in sys.stdin:
        words = command.split()
        if not words or words[0] != "RUN":
            break
        n = int(words[1])
        s0 = snapshot()
        last = s0["wall"]
        for i in range(done, done + n):
            params, loss = train_step(params, xs[i % N_BATCHES], ys[i % N_BATCHES])
            # Time between dispatches: a stall of the user's thread (e.g. a
            # probe holding the GIL while it waits) shows up as a long gap.
            now = time.perf_counter()
            if now - last > STALL_S:
                stalls.append(now - last)
            last = now
        jax.block_until_ready((params, loss))
        s1 = snapshot()
        done += n
        windows.append((s0["t"], s1["t"]))
        add("wall_s", s1["wall"] - s0["wall"])
        block_sps.append(round(n / (s1["wall"] - s0["wall"]), 1))
        add("proc_cpu_s", s1["proc"] - s0["proc"])
        add("main_cpu_s", s1["main"] - s0["main"])
        if s0["ctx"] and s1["ctx"]:
            add("main_vol_ctx", s1["ctx"][0] - s0["ctx"][0])
            add("main_invol_ctx", s1["ctx"][1] - s0["ctx"][1])
        m0, m1 = s0["machine"], s1["machine"]
        if m0 and m1:
            add("machine_jiffies", m1["total"] - m0["total"])
            add("machine_idle_jiffies", m1["idle"] - m0["idle"])
            add("machine_steal_jiffies", m1["steal"] - m0["steal"])
        for key in ("agent_tick", "agent_thread", "relay", "smi_thread"):
            if s0[key] is not None and s1[key] is not None:
                add(key + "_cpu_s", s1[key] - s0[key])
        _say("DONE")

    out.update(acc)
    out["steps"] = done
    out["block_steps_per_s"] = block_sps
    out["stalls"] = len(stalls)
    out["stall_s"] = sum(stalls)
    out["stall_max_s"] = max(stalls, default=0.0)
    out["steps_per_s"] = done / acc["wall_s"] if acc.get("wall_s") else None
    out["loss"] = float(loss)
    if acc.get("machine_jiffies"):
        out["machine_idle_frac"] = acc.get("machine_idle_jiffies", 0) / acc["machine_jiffies"]
        out["machine_steal_frac"] = acc.get("machine_steal_jiffies", 0) / acc["machine_jiffies"]

    if agent is not None:
        # Let a sample or two pass so the counts include the last block.
        time.sleep(max(0.5, 3 * interval_s))
        records = _read_log(log_path)
        samples = [r for r in records if r.get("type") == "sample"]
        out["samples_in_window"] = sum(
            1 for r in samples if any(a <= r["t"] <= b for a, b in windows)
        )
        if samples:
            last = samples[-1]
            out["last_sample_cpu_s_total"] = last.get("agent", {}).get("cpu_s_total")
            out["last_sample_span_s"] = last["t"] - agent.started_t
            if arm == "agent":
                out["h2d_counted_total"] = last.get("transfers", {}).get("h2d", {}).get("count_total")
        if arm == "agent":
            out["h2d_expected_min"] = 2 * (warmup + done)
        out["transfer_capture"] = next(
            (r.get("transfer_capture") for r in records if r.get("type") == "hello"), None
        )
        handle.stop()
    return out


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
            sys.executable, os.path.abspath(__file__), "--child", arm,
            "--warmup", str(args.warmup), "--interval", str(args.interval), "--workdir", self.workdir,
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


def _pct(value: float | None) -> str:
    return "   n/a" if value is None else f"{value * 100:6.2f}"


def _med(values: list[Any]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _per_s(runs: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] / r["wall_s"] for r in runs if r.get(key) is not None]


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
            for x, b in zip(r[a].get("block_steps_per_s", []), r["baseline"].get("block_steps_per_s", []))
        ]
        summary["ratio_vs_baseline"][a] = {
            "per_round": ratios, "median": med, "min": min(ratios), "max": max(ratios),
            "overhead_pct_median": (1 - med) * 100,
            "block_pairs": len(block_ratios),
            "block_median": statistics.median(block_ratios) if block_ratios else None,
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
        cpu["guard_lines_per_s"] = _med([2 * r["steps"] / r["wall_s"] for r in runs])
        if cpu["relay_core_frac"] is not None:
            cpu["relay_us_per_line"] = cpu["relay_core_frac"] / cpu["guard_lines_per_s"] * 1e6
        if cpu["agent_thread_core_frac"] is not None and cpu["agent_tick_core_frac"] is not None:
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
    return summary


def print_table(rounds: list[dict[str, Any]], arms: list[str], summary: dict[str, Any],
                args: argparse.Namespace, notes: list[str]) -> None:
    short = {"baseline": "base", "agent": "agent", "jaxsmi": "jax-smi", "guard": "guard", "nocapture": "nocap"}
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
    steal = summary.get("steal_pct_median")
    print(f"baseline throughput spread across rounds: {summary['baseline_spread_pct']:.1f} % of its median"
          + (f"; CPU steal during the loops: {steal:.1f} %" if steal is not None else ""))
    print()
    print(f"user's main thread (medians): CPU us/step, voluntary and involuntary context switches per step,")
    print(f"  dispatch gaps > {STALL_S * 1e3:.0f} ms (stalls) per s and ms stalled per s, longest stall in any run;")
    print(f"  CPU us/step of the whole process plus the relay")
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
        print(f"  stderr relay process (psutil)           {_pct(c['relay_core_frac'])} %"
              f"   = {c.get('relay_us_per_line', 0):.1f} us per guard line ({c['guard_lines_per_s']:.0f} lines/s)")
        total = sum(v for v in (c["agent_thread_core_frac"], c["relay_core_frac"]) if v is not None)
        print(f"  agent thread + relay                    {_pct(total)} %")
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
    p.add_argument("--extra-arms", default="", help="comma-separated diagnostic arms: guard, nocapture")
    p.add_argument("--json", action="store_true", help="print machine-readable results (JSON) instead of the table")
    p.add_argument("--json-out", metavar="PATH", help="also write the JSON results to PATH")
    p.add_argument("--child-timeout", type=float, default=300.0, help=argparse.SUPPRESS)
    p.add_argument("--child", choices=ARMS + EXTRA_ARMS, help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child:
        result = run_child(args.child, args.warmup, args.interval, args.workdir or tempfile.gettempdir())
        _say(MARK + json.dumps(result))
        return 0

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
            "pairs": args.pairs, "steps": args.steps, "warmup": args.warmup, "mode": args.mode,
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
