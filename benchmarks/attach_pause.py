"""How long `jaxtop log PID --inject` pauses an un-instrumented JAX loop.

Starts tests/targets/plain_loop.py (10 ms a step, a step line on stdout each
step), injects the agent with `jaxtop log --inject`, detaches, and prints the
median step gap next to the longest gap during the injection, per run.

    .venv/bin/python benchmarks/attach_pause.py --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

LOOP = Path(__file__).resolve().parent.parent / "tests" / "targets" / "plain_loop.py"


def one_run() -> tuple[float, float]:
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, str(LOOP), "--steps", "800"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env)
    stamps: list[float] = []

    def pump() -> None:
        for _ in iter(proc.stdout.readline, b""):
            stamps.append(time.monotonic())

    threading.Thread(target=pump, daemon=True).start()
    while len(stamps) < 30:
        time.sleep(0.05)
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "jaxtop", "log", str(proc.pid), "--inject", "--duration", "1"],
                         capture_output=True, env=env)
    t1 = time.monotonic()
    if res.returncode != 0:
        proc.kill()
        raise SystemExit(f"injection failed: {res.stderr.decode().strip()}")
    subprocess.run([sys.executable, "-m", "jaxtop", "detach", str(proc.pid)], capture_output=True, env=env)
    proc.wait()
    time.sleep(0.2)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    during = [b - a for a, b in zip(stamps, stamps[1:]) if t0 <= b <= t1 + 0.5]
    return statistics.median(gaps), max(during)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    for i in range(args.runs):
        median, longest = one_run()
        print(f"run {i + 1}: median step gap {median * 1e3:.1f} ms, longest gap during injection {longest * 1e3:.0f} ms "
              f"({longest / median:.0f}x a step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
