"""The longest pause jaxtop puts on a program: a thread of the program that
sleeps 200 us in a loop reads how late each wake-up is (how long something
else held the interpreter), beside a jitted step loop holding ``--arrays``
live arrays. Plain and under `jaxtop run`, alternating, ``--runs`` each:
``--settle`` seconds first (the agent's first scans, the compiles), then
``--seconds`` timed (by default 12 s, long enough to hold a memory profile
of the holders' cadence).

    .venv/bin/python benchmarks/pause.py                    # 50,000 arrays, 3 runs each
    .venv/bin/python benchmarks/pause.py --arrays 10000 --runs 2
    .venv/bin/python benchmarks/pause.py --baseline fc94bbf   # also jaxtop before the chunked scans
    .venv/bin/python benchmarks/pause.py --unlimited          # also jaxtop with JAXTOP_MAX_PAUSE_MS=off
    .venv/bin/python benchmarks/pause.py --unlimited --pace-ms 10 --size 8 --seconds 30   # a 2-core VM
    python benchmarks/pause.py --platform tpu --runs 2      # on the chip (children one at a time)

``jax.live_arrays()``, which the live-array scan calls, is one call into
jaxlib that holds the interpreter throughout (~0.14 us an array here): the
one pause of jaxtop's that no piece size cuts. By default the agent takes no
scan predicted to pause the program more than 1 ms
(``jaxtop.agent.scan_pause``); the child makes its arrays before the agent
finds jax's backend, so the one scan that meets them (nothing could predict
it) falls in the settle. ``--unlimited`` adds the arm ``unlimited``: every
scan on its cadence, whatever it pauses (the agent before the limit).

Each wake-up later than 1 ms notes where the program's other threads stand
at that moment (the agent's among them): the thread that held the
interpreter has just let it go, as a rule a line past the call that held
it. The most frequent places are printed under the figures.

Target (the fifth trust sweep): the longest pause under jaxtop at most
1 ms at 50,000 arrays, beside plain's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tui import tree_at  # noqa: E402  (a sibling benchmark's: jaxtop as it was at a revision)

CHILD = r'''
import json, sys, threading, time
import numpy as np
import jax, jax.numpy as jnp

arrays, settle, seconds, out = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
pace = float(sys.argv[5])  # seconds the loop sleeps after each step (cores left free)
size = int(sys.argv[6])  # the step's matrix (384: ~1 ms of work on a 2-core VM)
kept = [jax.device_put(np.full((4,), i, np.float32)) for i in range(arrays)]
jax.block_until_ready(kept)
# A step of real work (~1 ms on a 2-core VM): the loop waits for it with the
# interpreter free, as a training loop does, so that a pause is what some
# other thread held, not the loop's own Python (a tiny step keeps the
# interpreter busy and every thread waits out the 5 ms switch interval).
step = jax.jit(lambda w: jnp.tanh(w @ w) * 0.5)
w = jnp.ones((size, size)) / size
late = []
stop = threading.Event()
timing = threading.Event()

blame = {}

def where_others_are():
    """Where each other thread stands right after a late wake-up: the one
    that held the interpreter has just let it go, as a rule a line or two
    past the call that held it (a hint, not a proof)."""
    import traceback
    me, main = threading.get_ident(), threading.main_thread().ident
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        if ident in (me, main):
            continue
        stack = traceback.extract_stack(frame)[-3:]
        key = names.get(ident, "?") + ": " + " < ".join(
            f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in reversed(stack))
        blame[key] = blame.get(key, 0) + 1

def watcher():
    while not stop.is_set():
        t = time.perf_counter()
        time.sleep(0.0002)
        lateness = time.perf_counter() - t - 0.0002
        if timing.is_set():
            late.append(lateness)
            if lateness > 1e-3:
                where_others_are()

thread = threading.Thread(target=watcher, daemon=True)
thread.start()
t0 = time.monotonic()
steps = 0
while time.monotonic() - t0 < settle + seconds:
    if not timing.is_set() and time.monotonic() - t0 >= settle:
        timing.set()
        steps = 0
    w = step(w)
    w.block_until_ready()
    steps += 1
    if pace:
        time.sleep(pace)
stop.set()
thread.join()
late.sort()
with open(out, "w") as f:
    json.dump({"max_ms": late[-1] * 1e3, "p999_us": late[int(0.999 * (len(late) - 1))] * 1e6,
               "p99_us": late[int(0.99 * (len(late) - 1))] * 1e6, "wakeups": len(late),
               "over_1ms": sum(x > 1e-3 for x in late), "steps_per_s": steps / seconds,
               "blame": sorted(blame.items(), key=lambda kv: -kv[1])[:5]}, f)
'''


def run(mode: str, args: argparse.Namespace, work: str, tree: str | None = None) -> dict:
    script = os.path.join(work, "child.py")
    with open(script, "w") as f:
        f.write(CHILD)
    out = os.path.join(work, f"{mode}.json")
    env = dict(os.environ, JAX_PLATFORMS=args.platform, JAXTOP_SOCKET_DIR=work)
    if mode == "unlimited":
        env["JAXTOP_MAX_PAUSE_MS"] = "off"
    else:
        env.pop("JAXTOP_MAX_PAUSE_MS", None)
    if mode == "before" and tree is not None:
        env["PYTHONPATH"] = tree  # the baseline's jaxtop first on the path
    child = [script, str(args.arrays), str(args.settle), str(args.seconds), out, str(args.pace_ms / 1e3), str(args.size)]
    cmd = [sys.executable, *child] if mode == "plain" else [sys.executable, "-m", "jaxtop", "run", *child]
    subprocess.run(cmd, env=env, check=True, timeout=600, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arrays", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--settle", type=float, default=12.0)
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--baseline", default="", help="also time jaxtop as it was at this git revision ('before')")
    ap.add_argument("--pace-ms", type=float, default=0.0,
                    help="the loop sleeps this long after each step: on a machine of few cores the step's own "
                         "threads make the watcher wake 3-6 ms late without jaxtop; paced, the cores are free and "
                         "a pause is jaxtop's (e.g. 10 with --size 8 on a 2-core VM: a server waiting for requests)")
    ap.add_argument("--size", type=int, default=384, help="the step's matrix: SIZE x SIZE (default 384)")
    ap.add_argument("--platform", default="cpu",
                    help="JAX_PLATFORMS of the children (tpu on the chip: they run one at a time, as one process "
                         "at a time may open it)")
    ap.add_argument("--unlimited", action="store_true",
                    help="also time jaxtop with JAXTOP_MAX_PAUSE_MS=off ('unlimited')")
    args = ap.parse_args()
    modes = ("plain", "before", "jaxtop") if args.baseline else ("plain", "jaxtop")
    if args.unlimited:
        modes += ("unlimited",)
    results: dict[str, list[dict]] = {m: [] for m in modes}
    tree = tree_at(args.baseline) if args.baseline else None
    with tempfile.TemporaryDirectory(prefix="jaxtop-pause-") as work:
        for r in range(args.runs):
            for mode in (modes if r % 2 == 0 else tuple(reversed(modes))):
                t0 = time.monotonic()
                results[mode].append(run(mode, args, work, tree))
                x = results[mode][-1]
                print(f"  {mode}: longest pause {x['max_ms']:.2f} ms ({time.monotonic() - t0:.0f} s)", file=sys.stderr,
                      flush=True)
    for mode, runs in results.items():
        print(f"{mode:>9}: longest pause " + ", ".join(f"{x['max_ms']:.2f}" for x in runs) + " ms;  p99.9 "
              + ", ".join(f"{x['p999_us']:.0f}" for x in runs) + " us;  p99 "
              + ", ".join(f"{x['p99_us']:.0f}" for x in runs) + " us;  wake-ups over 1 ms "
              + ", ".join(str(x["over_1ms"]) for x in runs) + ";  steps/s "
              + ", ".join(f"{x['steps_per_s']:,.0f}" for x in runs))
    for mode, runs in results.items():
        for x in runs:
            for where, n in x.get("blame", []):
                print(f"  {mode}: {n} wake-up(s) over 1 ms beside {where}")
    worst = max(x["max_ms"] for x in results["jaxtop"])
    plain = max(x["max_ms"] for x in results["plain"])
    print("targets:")
    print(f"  longest pause under jaxtop <= 1 ms at {args.arrays:,} arrays: {'met' if worst <= 1.0 else 'MISSED'} "
          f"({worst:.2f} ms; plain {plain:.2f} ms)")
    if "unlimited" in results:
        unlimited = max(x["max_ms"] for x in results["unlimited"])
        print(f"  (with JAXTOP_MAX_PAUSE_MS=off, every scan on its cadence: {unlimited:.2f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
