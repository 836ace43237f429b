"""The child process of benchmarks/overhead.py: one arm, one fresh process.

It sets itself up (the agent, jax-smi or nothing), compiles and warms up the
training step, says READY, then runs blocks of steps when the parent says
``RUN n`` on stdin and reports its measurements as one JSON line at ``END``.
Started by overhead.py as ``overhead_child.py ARM --warmup N --interval S
--workdir DIR``; not meant to be run by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

MARK = "JAXTOP_BENCH_RESULT "
ARMS = ("baseline", "agent", "jaxsmi", "twin")
# twin: a second baseline, the A/A control. Its ratio to the baseline is the
# benchmark's own error: what "overhead" a process that does nothing extra shows.
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


def run_child(arm: str, warmup: int, interval_s: float, workdir: str, feed: str = "numpy") -> dict[str, Any]:
    """Set up, warm up, say READY, then obey ``RUN n`` / ``END`` on stdin."""
    out: dict[str, Any] = {"arm": arm, "pid": os.getpid(), "feed": feed}
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
    if feed == "device":
        # Batches placed up front: no implicit transfer, no guard line.
        xs = [jax.device_put(x) for x in xs]
        ys = [jax.device_put(y) for y in ys]

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
    agent_ident = agent.thread_ident if agent is not None else None
    relay = _relay_proc() if arm == "agent" else None

    def snapshot() -> dict[str, Any]:
        return {
            "wall": time.perf_counter(),
            "t": time.time(),
            "proc": sum(os.times()[:2]),
            "main": time.thread_time(),
            "ctx": _ctx_switches(),
            "machine": _machine_cpu(),
            "agent_tick": agent.tick_cpu_s if agent is not None else None,
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
            last = next((r for r in reversed(samples) if "agent" in r), samples[-1])  # `agent`: once a second
            out["last_sample_cpu_s_total"] = last.get("agent", {}).get("cpu_s_total")
            out["last_sample_span_s"] = last["t"] - agent.started_t
            if arm == "agent":
                out["h2d_counted_total"] = last.get("transfers", {}).get("h2d", {}).get("count_total")
        if arm == "agent":
            out["h2d_expected_min"] = 2 * (warmup + done) if feed == "numpy" else 0
        out["transfer_capture"] = next(
            (r.get("transfer_capture") for r in records if r.get("type") == "hello"), None
        )
        handle.stop()
    return out



def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="one arm of benchmarks/overhead.py")
    p.add_argument("arm", choices=ARMS + EXTRA_ARMS)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--interval", type=float, required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--feed", choices=("numpy", "device"), default="numpy")
    args = p.parse_args(argv)
    result = run_child(args.arm, args.warmup, args.interval, args.workdir, args.feed)
    _say(MARK + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
