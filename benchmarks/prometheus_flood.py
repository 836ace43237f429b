#!/usr/bin/env python
"""What another local user's requests to ``--prometheus PORT`` cost the program.

Two identical child processes (``attack.py``'s: a paced, jitted CPU training
loop under ``jaxtop.instrument(prometheus_port=...)``) run side by side. In
each attack window this process attacks the Prometheus port of one of them,
the *flooded* child; the other child is the same program next to a server
(the flooded child's, in another process) under the same attack, with the
same load on the machine. Its step rate is the one "the same flood aimed at
a separate server" gives. The ratio per window is

    flooded child's step rate / other child's step rate   (same window)

and the windows alternate which child is flooded (and which goes first), so
a difference between the two children cancels in the geometric mean over
windows. A quiet window per round gives the A/A ratio (no attack) and the
other child's slowdown from the attack's load alone (``separate / quiet``).

During every attack window a legitimate scraper (a fresh ``urllib`` GET
every second, 10 s timeout) scrapes the flooded child: its successes and
slowest answer are printed.

Attacks (all on 127.0.0.1, bounded in threads, connections and time):

* ``flood``: ``--threads`` (16) threads, each a loop of one-request
  connections (``GET /metrics``), reading every answer.
* ``slowloris``: ``--drips`` (200) connections that send a request line and
  then one header byte every 0.2 s, reopened as soon as they are closed.
* ``huge``: 4 threads each sending a 1 MiB request head (a huge header),
  again and again.

Target: every step-rate ratio >= 0.95 and every legitimate scrape answered.

Usage::

    .venv/bin/python benchmarks/prometheus_flood.py
    .venv/bin/python benchmarks/prometheus_flood.py --attacks flood --rounds 5
    .venv/bin/python benchmarks/prometheus_flood.py --pythonpath /tmp/jaxtop-before   # another version
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import socket
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attack  # noqa: E402  (the child loop and its step reports)

ATTACKS = ("flood", "slowloris", "huge")
GET = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: flood\r\n\r\n"


class Attack:
    """Threads that run ``_work(port)`` until :meth:`stop`; counts what they got."""

    def __init__(self, port: int, threads: int) -> None:
        self.port = port
        self.stop_flag = threading.Event()
        self.counts = {"answered": 0, "refused": 0}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._work, daemon=True) for _ in range(threads)]

    def start(self) -> None:
        self.t0 = time.monotonic()
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stop_flag.set()
        for t in self.threads:
            t.join(timeout=15)
        self.seconds = time.monotonic() - self.t0

    def count(self, key: str) -> None:
        with self.lock:
            self.counts[key] += 1

    def _work(self) -> None:
        raise NotImplementedError


class Flood(Attack):
    """One-request connections as fast as the server answers them."""

    def _work(self) -> None:
        while not self.stop_flag.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                    s.sendall(GET)
                    got = 0
                    while got < (1 << 22):
                        data = s.recv(1 << 16)
                        if not data:
                            break
                        got += len(data)
                self.count("answered" if got else "refused")
            except OSError:
                self.count("refused")


class Huge(Attack):
    """Request heads of 1 MiB: a request line, then one endless header."""

    def _work(self) -> None:
        chunk = b"X-Huge: " + b"a" * 65536
        while not self.stop_flag.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                    for _ in range(16):
                        s.sendall(chunk)
                    s.sendall(b"\r\n\r\n")
                    self.count("answered" if s.recv(1 << 16) else "refused")
            except OSError:
                self.count("refused")


class Slowloris(Attack):
    """``n`` connections that drip a header a byte at a time, reopened when closed."""

    def __init__(self, port: int, n: int) -> None:
        super().__init__(port, 1)
        self.n = n

    def _work(self) -> None:
        socks: list[socket.socket] = []
        try:
            while not self.stop_flag.is_set():
                opened = 0
                # Reopen what the server closed, a bounded number per tick.
                while len(socks) < self.n and opened < 50 and not self.stop_flag.is_set():
                    try:
                        s = socket.create_connection(("127.0.0.1", self.port), timeout=0.5)
                        s.sendall(b"GET /metrics HTTP/1.1\r\n")
                        s.setblocking(False)
                        socks.append(s)
                    except OSError:
                        self.count("refused")
                    opened += 1
                alive = []
                for s in socks:
                    try:
                        s.send(b"X")
                        alive.append(s)
                    except OSError:
                        s.close()
                        self.count("refused")  # closed by the server: as it should
                socks = alive
                self.stop_flag.wait(0.2)
        finally:
            for s in socks:
                s.close()


class Scraper:
    """A legitimate scrape every second until stopped: (ok, seconds) each."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.results: list[tuple[bool, float]] = []
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        while not self.stop_flag.is_set():
            t0 = time.monotonic()
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10).read()
                ok = b"jaxtop_sample_seq" in body
            except OSError:
                ok = False
            self.results.append((ok, time.monotonic() - t0))
            self.stop_flag.wait(max(0.0, 1.0 - (time.monotonic() - t0)))

    def stop(self) -> None:
        self.stop_flag.set()
        self.thread.join(timeout=15)


def make_attack(name: str, port: int, args: argparse.Namespace) -> Attack:
    if name == "flood":
        return Flood(port, args.threads)
    if name == "slowloris":
        return Slowloris(port, args.drips)
    if name == "huge":
        return Huge(port, 4)
    raise SystemExit(f"unknown attack {name}")


def geomean(values: list[float]) -> float:
    logs = [math.log(v) for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(logs) / len(logs)) if logs else float("nan")


def run_attack(name: str, children: list[attack.Child], args: argparse.Namespace) -> dict:
    ratios, separate, quiet_ratios, scrapes = [], [], [], []
    counts = {"answered": 0, "refused": 0}
    seconds = 0.0
    for rnd in range(args.rounds):
        t0 = time.monotonic()
        time.sleep(args.window)
        t1 = time.monotonic()
        quiet = [c.window(t0, t1)["rate"] for c in children]
        quiet_ratios.append(quiet[0] / quiet[1])
        order = (0, 1) if rnd % 2 == 0 else (1, 0)  # who is flooded first alternates too
        for flooded in order:
            other = 1 - flooded
            hit = make_attack(name, children[flooded].port, args)
            scraper = Scraper(children[flooded].port)
            hit.start()
            time.sleep(0.5)  # the attack is under way before the window opens
            scraper.start()
            t2 = time.monotonic()
            time.sleep(args.window)
            t3 = time.monotonic()
            scraper.stop()
            hit.stop()
            rates = [c.window(t2, t3)["rate"] for c in children]
            ratios.append(rates[flooded] / rates[other])
            separate.append(rates[other] / quiet[other])
            scrapes.extend(scraper.results)
            for k, v in hit.counts.items():
                counts[k] += v
            seconds += hit.seconds
            time.sleep(1.0)  # the server drops what is left
    return {
        "attack": name,
        "step_rate_ratio": round(geomean(ratios), 4),
        "ratios": [round(r, 4) for r in ratios],
        "quiet_ratio_a_a": round(geomean(quiet_ratios), 4),
        "separate_over_quiet": round(geomean(separate), 4),
        "attack_requests_per_s": {k: round(v / seconds, 1) for k, v in counts.items()},
        "legit_scrapes_ok": f"{sum(ok for ok, _ in scrapes)}/{len(scrapes)}",
        "legit_slowest_s": round(max((s for _, s in scrapes), default=float("nan")), 3),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--attacks", default=",".join(ATTACKS), help="comma-separated, of: " + ", ".join(ATTACKS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--window", type=float, default=4.0, help="seconds per quiet or attack window")
    p.add_argument("--threads", type=int, default=16, help="flooding threads")
    p.add_argument("--drips", type=int, default=200, help="slowloris connections")
    p.add_argument("--sleep", type=float, default=0.001, help="seconds each child sleeps per step")
    p.add_argument("--pythonpath", help="run the children against this jaxtop (e.g. an older tree)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sockdir = tempfile.mkdtemp(prefix="jt-promflood-")
    os.rmdir(sockdir)  # the agent creates it, mode 0700
    env = dict(os.environ, JAXTOP_SOCKET_DIR=sockdir, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    children: list[attack.Child] = []
    results = []
    try:
        for name in ("a", "b"):
            children.append(attack.Child(name, env, 0.1, 600.0, args.sleep))
        time.sleep(3.0)  # warm up: both serve their first sample
        for name in args.attacks.split(","):
            res = run_attack(name, children, args)
            results.append(res)
            if not args.json:
                print(json.dumps(res), flush=True)
    finally:
        for child in children:
            child.stop()
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print()
    print(f"{'attack':<10} {'step rate (flooded / separate)':>31} {'A/A quiet':>10} {'separate / quiet':>17} "
          f"{'legit scrapes ok':>17} {'slowest s':>10}")
    for r in results:
        print(f"{r['attack']:<10} {r['step_rate_ratio']:>31.3f} {r['quiet_ratio_a_a']:>10.3f} "
              f"{r['separate_over_quiet']:>17.3f} {r['legit_scrapes_ok']:>17} {r['legit_slowest_s']:>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
