#!/usr/bin/env python
"""What a hostile local peer can do to an instrumented program.

Each scenario starts two identical child processes: a jitted CPU training
loop with the jaxtop agent (``jaxtop.instrument``: stderr relay, transfer
guard, Prometheus endpoint; ``RLIMIT_NOFILE`` 1024, the common default). The
attacker (this process) hits only one of them, the *target*; the other is the
*control*. Both report their step counter, failed ``open()`` calls (the
loop opens a file every 100 steps), RSS, open fds and CPU time five times a
second. The loop sleeps ``--sleep`` per step, so two children and the
attacker fit on a small machine without starving one another; an agent
that holds the GIL still costs the loop steps.

Per scenario, rounds of a quiet window then an attack window (the attack set
up before its window starts and held through it). The step-rate ratio is

    (target / control during the attack) / (target / control when quiet)

averaged over rounds (geometric mean), so what both children suffer alike
(the attacker's own CPU, other load on the machine) cancels. RSS growth is
the target's growth over the attack minus the control's. Two CPU figures
resolve more than throughput does: the target's extra process CPU over the
control (attack minus quiet, % of one core), and the agent thread's own CPU
in each (its /proc task clock).

Scenarios:

* ``idle_socket``: 1,000 idle connections to the agent's Unix socket.
* ``idle_prometheus``: 1,000 idle connections to the Prometheus port.
* ``backfill``: 200 idle clients that never read, against an agent holding
  6,000 samples of backfill (10 minutes at the default 0.1 s interval; filled
  in 30 s here at a 0.005 s interval, in both children).
* ``flood_ping`` / ``flood_memory_profile`` / ``flood_unknown``: 8
  connections sending one kind of request as fast as the agent takes them,
  reading the replies.

Targets: the program's ``open()`` never fails and its step rate stays within
5 % of the control; 200 idle clients cost < 50 MB of RSS; floods within 5 %.

Usage::

    .venv/bin/python benchmarks/attack.py
    .venv/bin/python benchmarks/attack.py --scenarios flood_ping,backfill --rounds 3
    .venv/bin/python benchmarks/attack.py --pythonpath /path/to/other/checkout  # compare a version
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time

SCENARIOS = ("idle_socket", "idle_prometheus", "backfill", "flood_ping", "flood_memory_profile", "flood_unknown")

CHILD = r"""
import json, os, resource, sys, time
cfg = json.loads(sys.argv[1])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(cfg["nofile"], hard), hard))
import jaxtop
h = jaxtop.instrument(interval_s=cfg["interval_s"], backfill_s=cfg["backfill_s"],
                      prometheus_port=cfg["port"], nvml=False)
import jax
import jax.numpy as jnp

step = jax.jit(lambda w, x: w + 1e-3 * jnp.tanh(x @ w))
w = jnp.ones((64, 64))
x = jnp.ones((64, 64))
w = step(w, x).block_until_ready()
import threading
agent_tid = next(t.native_id for t in threading.enumerate() if t.ident == h.agent.thread_ident)
print("ready", h.socket_path, agent_tid, flush=True)
page = os.sysconf("SC_PAGE_SIZE")
i = failures = 0
next_report = time.monotonic()
while True:
    w = step(w, x)
    w.block_until_ready()
    i += 1
    # Paced, not CPU-bound: two children and the attacker share the cores
    # without starving each other, and an agent that holds the GIL still
    # shows as fewer steps.
    time.sleep(cfg["sleep_s"])
    if i % 100 == 0:
        try:
            open(os.devnull).close()
        except OSError:
            failures += 1
    now = time.monotonic()
    if now >= next_report:
        next_report = now + 0.2
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * page
        try:
            fds = len(os.listdir("/proc/self/fd")) - 1
        except OSError:
            fds = -1
        cpu = sum(os.times()[:2])
        print(f"tick {now:.4f} {i} {failures} {rss} {fds} {cpu:.3f}", flush=True)
"""


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port



def task_cpu_s(pid: int, tid: int) -> float:
    """CPU seconds of one thread of a process so far (its /proc task clock);
    NaN once it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

class LoopChild:
    """A training loop in a child process, running ``program`` (it prints
    ``ready SOCKET AGENT_TID``, then ``tick T ...`` lines, read on a thread
    into :attr:`reports` by :meth:`_tick`)."""

    program = ""

    def __init__(self, cfg: dict, env: dict, name: str = "a child") -> None:
        self.name = name
        # cwd elsewhere: "-c" puts the cwd first on sys.path, and a checkout
        # there would shadow --pythonpath.
        self.proc = subprocess.Popen([sys.executable, "-c", self.program, json.dumps(cfg)], env=env,
                                     cwd=tempfile.gettempdir(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        first = self.proc.stdout.readline().decode().split()
        if not first or first[0] != "ready":
            raise RuntimeError(f"{name} did not start: {first}")
        self.socket_path = first[1]
        self.agent_tid = int(first[2])
        self.reports: list[tuple] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _tick(self, parts: list[bytes]) -> tuple:
        """One report from a tick line's fields (after ``tick``): numbers."""
        return tuple(float(p) for p in parts)

    def _read(self) -> None:
        for raw in self.proc.stdout:
            parts = raw.split()
            if parts and parts[0] == b"tick":
                self.reports.append(self._tick(parts[1:]))

    def agent_cpu_s(self) -> float:
        """CPU seconds of the agent thread so far (its /proc task clock)."""
        return task_cpu_s(self.proc.pid, self.agent_tid)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


class Child(LoopChild):
    """The attacks' training loop: reports t, steps, open failures, rss, fds, process CPU s."""

    program = CHILD

    def __init__(self, name: str, env: dict, interval_s: float, backfill_s: float, sleep_s: float) -> None:
        self.port = free_port()
        super().__init__({"interval_s": interval_s, "backfill_s": backfill_s, "port": self.port, "nofile": 1024,
                          "sleep_s": sleep_s}, env, name)

    def _tick(self, parts: list[bytes]) -> tuple:
        return (float(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), int(parts[4]), float(parts[5]))

    def window(self, t0: float, t1: float) -> dict:
        pts = [r for r in self.reports if t0 <= r[0] <= t1]
        if len(pts) < 2:
            return {"rate": float("nan"), "failures": 0, "rss": 0, "fds_max": 0}
        a, b = pts[0], pts[-1]
        return {
            "rate": (b[1] - a[1]) / (b[0] - a[0]),
            "failures": b[2] - a[2],
            "rss": b[3],
            "rss_start": a[3],
            "fds_max": max(p[4] for p in pts),
            "cpu": (b[5] - a[5]) / (b[0] - a[0]),
        }

    def total_failures(self) -> int:
        return self.reports[-1][2] if self.reports else 0


# -- attacks: each returns (set up, tear down, notes) -----------------------------

def connect_unix(path: str, deadline: float) -> socket.socket | None:
    while time.monotonic() < deadline:
        s = socket.socket(socket.AF_UNIX)
        s.setblocking(False)
        try:
            s.connect(path)
            return s
        except BlockingIOError:  # backlog full: the agent takes them at its pace
            s.close()
            time.sleep(0.002)
        except OSError:
            s.close()
            return None
    return None


class IdleSocket:
    def __init__(self, n: int, rcvbuf: int | None = None) -> None:
        self.n = n
        self.rcvbuf = rcvbuf
        self.socks: list[socket.socket] = []

    def start(self, target: Child) -> dict:
        deadline = time.monotonic() + 60
        for _ in range(self.n):
            s = connect_unix(target.socket_path, deadline)
            if s is None:
                break
            if self.rcvbuf:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
            self.socks.append(s)
        time.sleep(1.0)  # let the agent accept or refuse the last ones
        served = 0
        for s in self.socks:
            try:
                s.setblocking(False)
                data = s.recv(16, socket.MSG_PEEK)
                served += data.startswith(b'{"type":"hello"')
            except OSError:
                pass
        return {"connected": len(self.socks), "served": served}

    def stop(self) -> None:
        for s in self.socks:
            s.close()
        self.socks.clear()


class IdlePrometheus:
    def __init__(self, n: int) -> None:
        self.n = n
        self.socks: list[socket.socket] = []

    def start(self, target: Child) -> dict:
        failed = 0
        deadline = time.monotonic() + 60  # a server that stopped accepting makes each try time out
        for _ in range(self.n):
            if time.monotonic() >= deadline:
                break
            try:
                self.socks.append(socket.create_connection(("127.0.0.1", target.port), timeout=1))
            except OSError:
                failed += 1
        time.sleep(1.0)
        return {"connected": len(self.socks), "connect_failed": failed}

    def stop(self) -> None:
        for s in self.socks:
            s.close()
        self.socks.clear()


class Flood:
    def __init__(self, line: bytes, conns: int = 8) -> None:
        self.chunk = line * max(1, 32768 // len(line))
        self.conns = conns
        self.socks: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        self.stop_flag = False
        self.sent = 0
        self.replies = 0
        self.lock = threading.Lock()

    def start(self, target: Child) -> dict:
        self.stop_flag = False
        for _ in range(self.conns):
            s = socket.socket(socket.AF_UNIX)
            s.connect(target.socket_path)
            self.socks.append(s)
            self.threads.append(threading.Thread(target=self._send, args=(s,), daemon=True))
            self.threads.append(threading.Thread(target=self._recv, args=(s,), daemon=True))
        for t in self.threads:
            t.start()
        time.sleep(0.5)
        return {}

    def _send(self, s: socket.socket) -> None:
        n = self.chunk.count(b"\n")
        while not self.stop_flag:
            try:
                s.sendall(self.chunk)  # whole lines: a torn line is just bad input
            except OSError:
                return
            with self.lock:
                self.sent += n

    def _recv(self, s: socket.socket) -> None:
        while True:
            try:
                data = s.recv(1 << 16)
            except OSError:
                return
            if not data:
                return
            with self.lock:
                self.replies += data.count(b'"type":"reply"') + data.count(b'"type":"pong"')

    def stop(self) -> None:
        self.stop_flag = True
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self.threads:
            t.join(timeout=5)
        for s in self.socks:
            s.close()
        self.socks.clear()
        self.threads.clear()


def scenario(name: str, args: argparse.Namespace, env: dict, profile_dir: str) -> dict:
    interval_s, backfill_s = 0.1, 600.0
    if name == "backfill":
        interval_s, backfill_s = 0.005, 30.0  # 6,000 samples, as 10 min at 0.1 s
    target = Child("target", env, interval_s, backfill_s, args.sleep)
    control = Child("control", env, interval_s, backfill_s, args.sleep)
    notes: dict = {}
    try:
        if name == "backfill":
            time.sleep(backfill_s + 2)  # fill the ring in both
        else:
            time.sleep(2.0)  # warm up
        ratios, rss_growth, failures, fds_max, extra_cpu, agent_cpu = [], [], 0, 0, [], []
        for _ in range(args.rounds):
            t0 = time.monotonic()
            time.sleep(args.window)
            t1 = time.monotonic()
            quiet_t, quiet_c = target.window(t0, t1), control.window(t0, t1)
            if name == "idle_socket":
                attack = IdleSocket(1000)
            elif name == "idle_prometheus":
                attack = IdlePrometheus(1000)
            elif name == "backfill":
                attack = IdleSocket(200, rcvbuf=4096)
            elif name == "flood_ping":
                attack = Flood(b'{"type":"ping","id":1}\n')
            elif name == "flood_memory_profile":
                line = json.dumps({"type": "command", "name": "memory_profile", "id": 1,
                                   "args": {"directory": profile_dir}}).encode() + b"\n"
                attack = Flood(line)
            elif name == "flood_unknown":
                attack = Flood(b'{"type":"command","name":"no-such-command","id":1}\n')
            else:
                raise SystemExit(f"unknown scenario {name}")
            a0 = time.monotonic()
            notes.update(attack.start(target))
            notes["setup_s"] = round(time.monotonic() - a0, 2)
            t2 = time.monotonic()
            agent0 = target.agent_cpu_s(), control.agent_cpu_s()
            time.sleep(args.window)
            t3 = time.monotonic()
            agent1 = target.agent_cpu_s(), control.agent_cpu_s()
            agent_cpu.append(((agent1[0] - agent0[0]) / (t3 - t2), (agent1[1] - agent0[1]) / (t3 - t2)))
            hit_t, hit_c = target.window(t2, t3), control.window(t2, t3)
            setup_t = target.window(a0, t3)
            if isinstance(attack, Flood):
                notes["requests_sent"] = attack.sent
                notes["replies"] = attack.replies
            attack.stop()
            ratios.append((hit_t["rate"] / hit_c["rate"]) / (quiet_t["rate"] / quiet_c["rate"]))
            # The target's extra CPU over the control, per second, relative
            # to the quiet window's difference (the same loop in both).
            extra_cpu.append((hit_t["cpu"] - hit_c["cpu"]) - (quiet_t["cpu"] - quiet_c["cpu"]))
            rss_growth.append(((hit_t["rss"] - quiet_t["rss"]) - (hit_c["rss"] - quiet_c["rss"])) / 1e6)
            failures += setup_t["failures"]
            fds_max = max(fds_max, setup_t["fds_max"], hit_t["fds_max"])
            notes["fds_quiet"] = quiet_t["fds_max"]
            time.sleep(1.0)
        logs = [math.log(r) for r in ratios if r > 0 and math.isfinite(r)]
        result = {
            "scenario": name,
            "step_rate_ratio": math.exp(sum(logs) / len(logs)) if logs else float("nan"),
            "ratios": [round(r, 4) for r in ratios],
            "open_failures": failures,
            "target_open_failures_total": target.total_failures(),
            "target_fds_max": fds_max,
            "rss_growth_mb": round(max(rss_growth), 1),
            "extra_cpu_pct": round(100 * sum(extra_cpu) / len(extra_cpu), 2),
            "agent_thread_cpu_pct": [round(100 * sum(a[0] for a in agent_cpu) / len(agent_cpu), 2),
                                     round(100 * sum(a[1] for a in agent_cpu) / len(agent_cpu), 2)],
            **notes,
        }
        if name == "flood_memory_profile":
            result["profile_files"] = len(os.listdir(profile_dir))
        return result
    finally:
        target.stop()
        control.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, of: " + ", ".join(SCENARIOS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--window", type=float, default=4.0, help="seconds per quiet or attack window")
    p.add_argument("--sleep", type=float, default=0.001, help="seconds each child sleeps per step")
    p.add_argument("--pythonpath", help="run the children against this jaxtop (e.g. an older checkout)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the attacker needs thousands
    sockdir = tempfile.mkdtemp(prefix="jt-attack-")
    os.rmdir(sockdir)  # the agent creates it, mode 0700
    env = dict(os.environ, JAXTOP_SOCKET_DIR=sockdir, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    results = []
    for name in args.scenarios.split(","):
        with tempfile.TemporaryDirectory(prefix="jt-prof-") as profile_dir:
            try:
                res = scenario(name, args, env, profile_dir)
            except Exception as exc:  # an old version may fall over: report it
                res = {"scenario": name, "error": f"{type(exc).__name__}: {exc}"}
        results.append(res)
        if not args.json:
            print(json.dumps(res), flush=True)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print()
        print(f"{'scenario':<22} {'step rate':>10} {'open() failed':>14} {'target fds':>11} {'RSS +MB':>8} "
              f"{'extra CPU %':>12} {'agent thread CPU % (target, control)':>38}")
        for r in results:
            if "error" in r:
                print(f"{r['scenario']:<22} error: {r['error']}")
                continue
            print(f"{r['scenario']:<22} {r['step_rate_ratio']:>10.3f} {r['open_failures']:>14} "
                  f"{r['target_fds_max']:>11} {r['rss_growth_mb']:>8.1f} {r['extra_cpu_pct']:>12.2f} "
                  f"{str(r['agent_thread_cpu_pct']):>38}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
