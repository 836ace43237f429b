"""Where the agent's thread spends its time, probe by probe, beside a program.

A child process starts jaxtop's agent, then calls a jitted function fed a
NumPy array (one implicit transfer a call) at ``--rate`` calls a second for
``--seconds``. Each probe's ``on_tick`` and the agent's ``_emit`` are timed
with the agent thread's own CPU clock; the report gives microseconds per
tick and the share of one core, beside the whole agent thread's share (the
rest is the loop: waking, serving clients). The timers themselves cost
about 1 us each a call, so the thread's total here reads ~0.05 % above
``benchmarks/transfer_sites.py``'s (which times nothing inside).

Beside a busy program each tick finds the agent's code and data evicted
from the CPU's caches: a probe that returns a cached dict reads ~3 us here,
where a loop timing it hot reads well under 1 us.

    .venv/bin/python benchmarks/agent_tick.py --seconds 15
    .venv/bin/python benchmarks/agent_tick.py --sites off   # transfers counted, not tied to lines
    .venv/bin/python benchmarks/agent_tick.py --arrays 50000 --rate 100   # what a tick holds at many arrays

Each probe's longest call in wall time is printed too: with the program's
loop mostly asleep (a low ``--rate``), the agent's thread holds the
interpreter for about that long, and each of the program's threads that
wants it meanwhile waits (the 1 ms pause target of the fifth trust sweep).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r'''
import collections, json, sys, threading, time
seconds, rate, arrays = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
import numpy as np
import jax
kept = [jax.device_put(np.full((4,), i, np.float32)) for i in range(arrays)]
import jaxtop
from jaxtop.agent import loop, probe_list

costs, counts, longest, over = collections.Counter(), collections.Counter(), collections.Counter(), collections.Counter()

def tick(self, tick, record):
    for probe in self._probes:
        t, w = time.thread_time_ns(), time.perf_counter_ns()
        try:
            value = probe.on_tick(tick)
        except Exception as exc:
            value = {"error": f"{type(exc).__name__}: {exc}"}
        costs[probe.name] += time.thread_time_ns() - t
        w = time.perf_counter_ns() - w
        longest[probe.name] = max(longest[probe.name], w)
        over[probe.name] += w > 1_000_000
        counts[probe.name] += 1
        if value is not None:
            record[probe.name] = value

emit = loop.AgentLoop._emit

def timed_emit(self, record, keep=True):
    t, w = time.thread_time_ns(), time.perf_counter_ns()
    emit(self, record, keep)
    costs["(emit)"] += time.thread_time_ns() - t
    w = time.perf_counter_ns() - w
    longest["(emit)"] = max(longest["(emit)"], w)
    over["(emit)"] += w > 1_000_000
    counts["(emit)"] += 1

probe_list.ProbeList.tick = tick
loop.AgentLoop._emit = timed_emit
handle = jaxtop.instrument()
f = jax.jit(lambda x: x * 2.0)
host = np.ones((16,), np.float32)
for _ in range(2000):
    f(host)
time.sleep(1.0)
costs.clear(); counts.clear(); longest.clear(); over.clear()
agent = next(t for t in threading.enumerate() if t.name == "jaxtop-agent")
clock = time.pthread_getcpuclockid(agent.ident)
a0, wall0 = time.clock_gettime(clock), time.perf_counter()
n, next_t = 0, wall0
while time.perf_counter() - wall0 < seconds:
    f(host); n += 1
    next_t += 1.0 / rate
    pause = next_t - time.perf_counter()
    if pause > 0:
        time.sleep(pause)
wall = time.perf_counter() - wall0
print("RESULT " + json.dumps({"rate": n / wall, "wall": wall,
                              "agent_pct": 100 * (time.clock_gettime(clock) - a0) / wall,
                              "costs": dict(costs), "counts": dict(counts),
                              "longest": dict(longest), "over": dict(over)}), flush=True)
'''


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--rate", type=float, default=1000.0, help="jitted calls (implicit transfers) a second")
    p.add_argument("--sites", choices=("on", "off"), default="on", help="tie transfers to lines (JAXTOP_TRANSFER_SITES)")
    p.add_argument("--platform", default="cpu", help="JAX_PLATFORMS for the child (cpu, tpu)")
    p.add_argument("--arrays", type=int, default=0, help="live arrays the child holds (made before the agent starts)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="jaxtop-tick-") as tmp:
        env = dict(os.environ, JAX_PLATFORMS=args.platform, JAXTOP_SOCKET_DIR=os.path.join(tmp, "sockets"))
        env.pop("JAX_TRANSFER_GUARD", None)
        env["JAXTOP_TRANSFER_SITES"] = "1" if args.sites == "on" else "0"
        # Run from elsewhere: in a checkout, `-c` would put its jaxtop/ (not the installed package) first.
        done = subprocess.run([sys.executable, "-c", CHILD, str(args.seconds), str(args.rate), str(args.arrays)],
                              env=env, cwd=tmp,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=args.seconds + 300)
    line = next((x for x in done.stdout.decode().splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        print(done.stderr.decode(errors="replace")[-2000:], file=sys.stderr)
        return 1
    r = json.loads(line[7:])
    wall = r["wall"]
    print(f"{r['rate']:.0f} calls/s for {wall:.0f} s; the agent thread {r['agent_pct']:.3f} % of a core")
    ticked = sum(v for k, v in r["costs"].items())
    print(f"  in ticks and emits: {100 * ticked / 1e9 / wall:.3f} %; the rest (waking, serving) "
          f"{r['agent_pct'] - 100 * ticked / 1e9 / wall:.3f} %")
    for name, ns in sorted(r["costs"].items(), key=lambda kv: -kv[1]):
        n = r["counts"][name]
        print(f"  {name:<20} {ns / n / 1e3:7.1f} us a call  {100 * ns / 1e9 / wall:6.3f} % of a core  ({n} calls; "
              f"the longest {r['longest'].get(name, 0) / 1e6:.2f} ms of wall time, {r['over'].get(name, 0)} over 1 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
