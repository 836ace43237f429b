#!/usr/bin/env python
"""What a flood of commands from two clients costs an instrumented program.

Two identical child processes run a jitted CPU training loop with the jaxtop
agent (``jaxtop.instrument``) and hold ``--executables`` live compiled
functions besides (300 by default), so that ``jit_ledger`` does what it
does in a real program: a pass over every executable and a reply of
hundreds of KB. The flooder (this process) hits only one of them, the
*target*, from two connections that send one command as fast as the agent
reads them and read every reply; the other child is the *control*. Both
report their step counter and CPU time five times a second.

Per command, rounds of a quiet window then a flood window. The step-rate
ratio is

    (target / control during the flood) / (target / control when quiet)

averaged over rounds (geometric mean), so that what both children suffer
alike (the flooder's own CPU, other load on the machine) cancels. Also
printed: the replies the flood got (answered, refused as rate limited,
other errors) and the agent thread's own CPU in each child (its /proc task
clock, % of one core).

Commands: ``jit_ledger``, ``holders_mark``, ``holders_profile``,
``memory_profile``, ``ping`` (answered inline, not a command) and an
unknown command. ``detach`` is left out: the first one stops the agent.

Target: every ratio >= 0.95.

Usage::

    .venv/bin/python benchmarks/command_flood.py
    .venv/bin/python benchmarks/command_flood.py --commands jit_ledger --rounds 3
    .venv/bin/python benchmarks/command_flood.py --pythonpath /path/to/other/tree  # compare a version
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attack  # noqa: E402  (one child, one flood and one /proc reader for both benchmarks)
import time

COMMANDS = ("jit_ledger", "holders_mark", "holders_profile", "memory_profile", "ping", "unknown")

CHILD = r"""
import json, os, sys, threading, time
cfg = json.loads(sys.argv[1])
import jaxtop
h = jaxtop.instrument(interval_s=0.1, nvml=False)
import jax
import jax.numpy as jnp

# Live executables besides the loop's: what jit_ledger walks and reports.
kept = []
for k in range(cfg["executables"]):
    f = jax.jit(lambda v, k=k: jnp.sin(v * (k + 1)) + k)
    f(jnp.ones(8)).block_until_ready()
    kept.append(f)
step = jax.jit(lambda w, x: w + 1e-3 * jnp.tanh(x @ w))
w = jnp.ones((64, 64))
x = jnp.ones((64, 64))
w = step(w, x).block_until_ready()
agent_tid = next(t.native_id for t in threading.enumerate() if t.ident == h.agent.thread_ident)
print("ready", h.socket_path, agent_tid, flush=True)
i = 0
next_report = time.monotonic()
while True:
    w = step(w, x)
    w.block_until_ready()
    i += 1
    # Paced, not CPU-bound: two children and the flooder share the cores
    # without starving each other, and an agent that holds the GIL still
    # shows as fewer steps.
    time.sleep(cfg["sleep_s"])
    now = time.monotonic()
    if now >= next_report:
        next_report = now + 0.2
        print(f"tick {now:.4f} {i} {sum(os.times()[:2]):.3f}", flush=True)
"""


class Child(attack.LoopChild):
    """A training loop with many live executables: reports t, steps, process CPU s."""

    program = CHILD

    def __init__(self, env: dict, executables: int, sleep_s: float) -> None:
        super().__init__({"executables": executables, "sleep_s": sleep_s}, env)

    def rate(self, t0: float, t1: float) -> float:
        pts = [r for r in self.reports if t0 <= r[0] <= t1]
        if len(pts) < 2:
            return float("nan")
        return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])


def request_line(command: str, profile_dir: str) -> bytes:
    if command == "ping":
        return b'{"type":"ping","id":1}\n'
    if command == "unknown":
        return b'{"type":"command","name":"no-such-command","id":1}\n'
    args = {"directory": profile_dir} if command == "memory_profile" else {}
    return json.dumps({"type": "command", "name": command, "id": 1, "args": args}).encode() + b"\n"


class Flood(attack.Flood):
    """Connections that send one request line as fast as the agent reads
    them (``attack.Flood``'s), and read and sort every reply."""

    def __init__(self, line: bytes, conns: int) -> None:
        super().__init__(line, conns)
        self.chunk = line * max(1, 8192 // len(line))
        self.counts = {"ok": 0, "rate_limited": 0, "other_error": 0}

    def _recv(self, s: socket.socket) -> None:
        buf = b""
        while True:
            try:
                data = s.recv(1 << 20)
            except OSError:
                return
            if not data:
                return
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if b'"type":"reply"' not in line[:40] and b'"type":"pong"' not in line[:40]:
                    continue  # the stream's own records
                rec = json.loads(line)
                key = ("ok" if rec.get("ok", True) else
                       "rate_limited" if str(rec.get("error", "")).startswith("rate limited") else "other_error")
                with self.lock:
                    self.counts[key] += 1


def flood_command(command: str, target: Child, control: Child, args: argparse.Namespace, profile_dir: str) -> dict:
    ratios, agent_cpu = [], []
    counts = {"ok": 0, "rate_limited": 0, "other_error": 0}
    for _ in range(args.rounds):
        t0 = time.monotonic()
        time.sleep(args.window)
        t1 = time.monotonic()
        quiet = target.rate(t0, t1) / control.rate(t0, t1)
        flood = Flood(request_line(command, profile_dir), args.clients)
        flood.start(target)
        t2 = time.monotonic()
        cpu0 = target.agent_cpu_s(), control.agent_cpu_s()
        time.sleep(args.window)
        t3 = time.monotonic()
        cpu1 = target.agent_cpu_s(), control.agent_cpu_s()
        flood.stop()
        ratios.append((target.rate(t2, t3) / control.rate(t2, t3)) / quiet)
        agent_cpu.append(((cpu1[0] - cpu0[0]) / (t3 - t2), (cpu1[1] - cpu0[1]) / (t3 - t2)))
        for k, v in flood.counts.items():
            counts[k] += v
        time.sleep(1.0)  # the agent answers what is left in the socket buffers
    logs = [math.log(r) for r in ratios if r > 0 and math.isfinite(r)]
    seconds = args.rounds * args.window
    return {
        "command": command,
        "step_rate_ratio": math.exp(sum(logs) / len(logs)) if logs else float("nan"),
        "ratios": [round(r, 4) for r in ratios],
        "replies_per_s": {k: round(v / seconds, 1) for k, v in counts.items()},
        "agent_thread_cpu_pct": [round(100 * sum(a[0] for a in agent_cpu) / len(agent_cpu), 2),
                                 round(100 * sum(a[1] for a in agent_cpu) / len(agent_cpu), 2)],
    }


def ledger_reply_bytes(path: str) -> int:
    """Bytes of one jit_ledger reply from the target (asked before any flood)."""
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(b'{"type":"command","name":"jit_ledger","id":99}\n')
    buf = b""
    s.settimeout(30)
    while True:
        data = s.recv(1 << 20)
        if not data:
            return -1
        buf += data
        for line in buf.split(b"\n")[:-1]:
            if b'"id":99' in line[:80]:
                s.close()
                return len(line) + 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--commands", default=",".join(COMMANDS), help="comma-separated, of: " + ", ".join(COMMANDS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--window", type=float, default=4.0, help="seconds per quiet or flood window")
    p.add_argument("--clients", type=int, default=2, help="flooding connections")
    p.add_argument("--executables", type=int, default=300, help="live executables in each child")
    p.add_argument("--sleep", type=float, default=0.001, help="seconds each child sleeps per step")
    p.add_argument("--pythonpath", help="run the children against this jaxtop (e.g. an older tree)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    sockdir = tempfile.mkdtemp(prefix="jt-flood-")
    os.rmdir(sockdir)  # the agent creates it, mode 0700
    env = dict(os.environ, JAXTOP_SOCKET_DIR=sockdir, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    results = []
    target = control = None
    with tempfile.TemporaryDirectory(prefix="jt-prof-") as profile_dir:
        env["JAXTOP_PROFILE_DIR"] = profile_dir
        try:
            target = Child(env, args.executables, args.sleep)
            control = Child(env, args.executables, args.sleep)
            time.sleep(2.0)  # warm up
            size = ledger_reply_bytes(target.socket_path)
            if not args.json:
                print(f"jit_ledger reply: {size / 1e3:.0f} KB ({args.executables} executables besides the loop's)",
                      flush=True)
            for command in args.commands.split(","):
                res = flood_command(command, target, control, args, profile_dir)
                results.append(res)
                if not args.json:
                    print(json.dumps(res), flush=True)
        finally:
            for child in (target, control):
                if child is not None:
                    child.stop()
    if args.json:
        print(json.dumps({"jit_ledger_reply_bytes": size, "results": results}, indent=2))
        return 0
    print()
    print(f"{'command':<16} {'step rate':>10} {'ok/s':>7} {'limited/s':>10} {'errors/s':>9} "
          f"{'agent thread CPU % (target, control)':>38}")
    for r in results:
        rps = r["replies_per_s"]
        print(f"{r['command']:<16} {r['step_rate_ratio']:>10.3f} {rps['ok']:>7} {rps['rate_limited']:>10} "
              f"{rps['other_error']:>9} {str(r['agent_thread_cpu_pct']):>38}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
