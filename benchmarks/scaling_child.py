"""The child process of benchmarks/scaling.py: one arm, one workload, one fresh process.

It sets itself up (the jaxtop agent, a naive poller thread, jax-smi or
nothing), builds the workload it was given (``N`` live arrays or ``N`` live
compiled executables, untimed), compiles and warms up a jitted step loop, says
READY, then runs a block of steps at each ``RUN n`` on stdin (``n`` steps, or
``--block-seconds`` of steps when ``n`` is 0) and reports its measurements as
one JSON line at ``END``. Not meant to be run by hand.

Roles (the parent names the arm; ``agent-before`` is the ``agent`` role run
under another interpreter):

* ``baseline``: the workload and the step loop alone;
* ``agent``:    ``jaxtop.instrument(interval_s=..., log_path=...)`` before
  ``import jax``, default settings otherwise;
* ``floor``:    a plain daemon thread that every ``interval`` s calls
  ``memory_stats()`` on every local device and sums ``nbytes`` over
  ``jax.live_arrays()``: what the most naive poller costs;
* ``jaxsmi``:   jax-smi's tracking thread (``initialise_tracking``, 1 s).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

# benchmarks/ is on sys.path (the script's directory), whatever the interpreter.
from overhead_child import MARK, _machine_cpu, _read_log, _say, _thread_cpu

ROLES = ("baseline", "agent", "floor", "jaxsmi")
# The held arrays cycle through these shapes (float32, 32 B .. 1 KiB); the
# churn window is a multiple of their count, so every window has the same
# structure and the refresh compiles once.
SHAPES = [(8,), (16, 16), (4, 32), (64,), (3, 3, 8), (128,), (2, 64), (32,), (8, 8, 2), (256,)]
# The step: one SGD-like update of a (D, D) weight matrix on a (BATCH, D)
# batch, ~2 ms on the 2-core reference VM.
D, BATCH = 512, 128


def _tail_sample(path: str, chunk: int = 1 << 20) -> dict[str, Any] | None:
    """The last ``sample`` record that carries the agent's own report
    (``agent``: once a second) of a JSON-lines log (reads only its tail)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - chunk))
            lines = f.read().split(b"\n")
    except OSError:
        return None
    for raw in reversed(lines):
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("type") == "sample" and "agent" in rec:
            return rec
    return None


def _file_size(path: str | None) -> int | None:
    if path is None:
        return None
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _agent_ident(agent: Any) -> int | None:
    ident = getattr(agent, "thread_ident", None)
    if ident is not None:
        return ident
    for t in threading.enumerate():  # older agents without the accessor
        if t.name == "jaxtop-agent":
            return t.ident
    return None


def run_child(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    role = args.role
    out: dict[str, Any] = {"role": role, "pid": os.getpid(), "python": sys.executable,
                           "workload": args.workload, "n": args.n, "churn": args.churn}
    handle = None
    log_path = os.path.join(args.workdir, "agent.jsonl") if role == "agent" else None
    if role == "agent":
        import jaxtop  # before jax, as documented

        out["jaxtop_file"] = jaxtop.__file__
        out["jaxtop_version"] = getattr(jaxtop, "__version__", None)
        handle = jaxtop.instrument(interval_s=args.interval, log_path=log_path)

    import jax
    import jax.numpy as jnp
    import numpy as np

    out["jax_version"] = jax.__version__
    if args.jit_cache:
        # Executables load from a cache the parent filled once (untimed
        # creation only: nothing compiles inside the timed blocks).
        jax.config.update("jax_compilation_cache_dir", args.jit_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

    # --- the workload: created once, kept alive, not timed -----------------
    t0 = time.perf_counter()
    held: list[Any] = []
    if args.workload == "arrays":
        templates = [np.full(s, 0.5, np.float32) for s in SHAPES]
        held = list(jax.device_put([templates[i % len(SHAPES)] for i in range(args.n)]))
        jax.block_until_ready(held)
    else:
        # Distinct small functions, each compiled and called once. Kept as
        # the AOT ``Compiled`` objects: a live ``jax.jit`` wrapper also keeps
        # its traced and lowered module (~1.3 MB each on CPU here), which at
        # 5,000 x 4-5 children would not fit in the VM's memory; the client's
        # live executables are the same either way.
        x = jnp.ones((4,), jnp.float32)
        for k in range(args.n):
            compiled = jax.jit(lambda v, k=k: v + k).lower(x).compile()
            compiled(x).block_until_ready()
            held.append(compiled)
    out["create_s"] = time.perf_counter() - t0
    if args.prewarm:  # the parent only wanted the compilation cache filled
        return out

    # --- the step loop ------------------------------------------------------
    @jax.jit
    def step(w: Any, xb: Any) -> Any:
        h = jnp.tanh(xb @ w)
        return w - 1e-3 * (xb.T @ h) / BATCH

    w = jax.random.normal(jax.random.key(0), (D, D), jnp.float32) / np.sqrt(D)
    xb = jax.random.normal(jax.random.key(1), (BATCH, D), jnp.float32)

    churn_k = 0
    windows = 0  # churn windows: held[j * churn_k:(j + 1) * churn_k]
    refresh = None
    if args.workload == "arrays" and args.churn > 0 and held:
        p = len(SHAPES)
        churn_k = min(max(p, round(args.churn * len(held) / p) * p), len(held) // p * p)
        windows = len(held) // churn_k if churn_k else 0
        if windows:
            # A training step rebinding its state: the window's arrays are
            # replaced by new ones (the old ones die with their last reference).
            refresh = jax.jit(lambda xs: [a + 1.0 for a in xs])
        else:
            churn_k = 0
    out["churn_arrays_per_step"] = churn_k

    done = 0

    def one_step(i: int) -> None:
        nonlocal w
        w = step(w, xb)
        if refresh is not None:
            j = (i % windows) * churn_k
            held[j:j + churn_k] = refresh(held[j:j + churn_k])

    for i in range(args.warmup):
        one_step(i)
    jax.block_until_ready((w, held[:churn_k] if churn_k else w))

    # --- the observer -------------------------------------------------------
    ident = None
    if role == "floor":
        devices = jax.local_devices()
        interval = args.interval

        def poll() -> None:
            while True:
                [d.memory_stats() for d in devices]
                sum(a.nbytes for a in jax.live_arrays())
                time.sleep(interval)

        thread = threading.Thread(target=poll, name="naive-poller", daemon=True)
        thread.start()
        ident = thread.ident
    elif role == "jaxsmi":
        from jax_smi import initialise_tracking

        before = {t.ident for t in threading.enumerate()}
        initialise_tracking(dir_prefix=args.workdir)  # default 1 s, a private directory
        new = [t.ident for t in threading.enumerate() if t.ident not in before]
        ident = new[0] if new else None
    elif handle is not None:
        ident = _agent_ident(handle.agent)
    out["observer_thread_found"] = ident is not None if role != "baseline" else None

    # Settle: the program runs its steps, untimed, while the observer does
    # its one-off work (the agent reads every array and executable once,
    # takes its first profiles): a training job runs for hours, and what it
    # pays then is the steady cost the blocks measure. What the observer
    # spent from its start to the end of this is reported apart.
    settle_end = time.perf_counter() + args.settle
    k = 0
    while True:
        one_step(args.warmup + k)
        k += 1
        if k % 20 == 0:
            jax.block_until_ready(w)
            if time.perf_counter() >= settle_end:
                break
        time.sleep(0.002)
    done += k
    out["settle_steps"] = k
    out["observer_cpu_before_blocks_s"] = _thread_cpu(ident)
    out["startup_s"] = time.perf_counter() - started - out["create_s"]

    acc: dict[str, float] = {}
    block_sps: list[float] = []
    block_windows: list[tuple[float, float]] = []

    def snapshot() -> dict[str, Any]:
        return {
            "wall": time.perf_counter(),
            "t": time.time(),
            "proc": sum(os.times()[:2]),
            "main": time.thread_time(),
            "thread": _thread_cpu(ident),
            "log": _file_size(log_path),
            "machine": _machine_cpu(),
        }

    def add(key: str, value: float | None) -> None:
        if value is not None:
            acc[key] = acc.get(key, 0.0) + value

    _say("READY")
    for command in sys.stdin:
        words = command.split()
        if not words or words[0] != "RUN":
            break
        n = int(words[1])
        s0 = snapshot()
        steps = 0
        if n > 0:
            for i in range(done, done + n):
                one_step(i)
            steps = n
        else:
            end = s0["wall"] + args.block_seconds
            while time.perf_counter() < end:
                one_step(done + steps)
                steps += 1
                if steps % 50 == 0:  # bound the dispatch queue: the block ends on time
                    jax.block_until_ready(w)
        jax.block_until_ready(w)
        s1 = snapshot()
        done += steps
        block_windows.append((s0["t"], s1["t"]))
        wall = s1["wall"] - s0["wall"]
        add("wall_s", wall)
        block_sps.append(round(steps / wall, 2))
        add("proc_cpu_s", s1["proc"] - s0["proc"])
        add("main_cpu_s", s1["main"] - s0["main"])
        if s0["thread"] is not None and s1["thread"] is not None:
            add("thread_cpu_s", s1["thread"] - s0["thread"])
        if s0["log"] is not None and s1["log"] is not None:
            add("log_bytes", s1["log"] - s0["log"])
        m0, m1 = s0["machine"], s1["machine"]
        if m0 and m1:
            add("machine_jiffies", m1["total"] - m0["total"])
            add("machine_steal_jiffies", m1["steal"] - m0["steal"])
        _say("DONE")

    out.update(acc)
    out["steps"] = done
    out["blocks"] = len(block_sps)
    out["block_steps_per_s"] = block_sps
    out["steps_per_s"] = done / acc["wall_s"] if acc.get("wall_s") else None
    if acc.get("machine_jiffies"):
        out["machine_steal_frac"] = acc.get("machine_steal_jiffies", 0) / acc["machine_jiffies"]
    # What the observer saw: the live objects at the end (outside the blocks).
    out["live_arrays_end"] = len(jax.live_arrays())
    try:
        out["live_executables_end"] = len(jax.local_devices()[0].client.live_executables())
    except Exception:
        out["live_executables_end"] = None
    if handle is not None:
        last = _tail_sample(log_path)
        # Samples the agent emitted inside the blocks: does it keep its cadence?
        out["samples_in_blocks"] = sum(
            1 for r in _read_log(log_path)
            if r.get("type") == "sample" and any(a <= r.get("t", 0) <= b for a, b in block_windows)
        )
        if last is not None:
            out["agent_field"] = last.get("agent")
            out["last_sample_seq"] = last.get("seq")
        out["log_total_bytes"] = _file_size(log_path)
        out["agent_lifetime_s"] = time.time() - handle.agent.started_t
        handle.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="one arm of benchmarks/scaling.py")
    p.add_argument("role", choices=ROLES)
    p.add_argument("--workload", choices=("arrays", "executables"), required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--churn", type=float, default=0.0)
    p.add_argument("--interval", type=float, default=0.1)
    p.add_argument("--workdir", required=True)
    p.add_argument("--block-seconds", type=float, default=1.5)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--settle", type=float, default=10.0)
    p.add_argument("--jit-cache", default=None)
    p.add_argument("--prewarm", action="store_true")
    args = p.parse_args(argv)
    result = run_child(args)
    _say(MARK + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
