"""What tying each implicit transfer to its line costs, beside JAX's own logging.

Three arms, each workload in a fresh child process, the arms interleaved
``--rounds`` times (these machines are noisy: only side-by-side runs compare):

* ``jax-log``: no jaxtop; JAX's transfer guard at ``log``, its lines to a
  pipe the parent drains (what the guard costs by itself: JAX's price);
* ``counts``: jaxtop's agent with the transfer-sites probe off
  (``JAXTOP_TRANSFER_SITES=0``): transfers counted, not tied to lines;
* ``sites``: jaxtop's agent as shipped.

Workloads, timed in the program's thread (median ns per call over blocks):

* ``numpy``: a jitted call fed a NumPy array: one implicit transfer a call;
* ``device``: the same call fed a device array: no transfer (what the hook
  costs every jitted call that transfers nothing);
* ``eager``: an eager op on device arrays (``x + x``): no transfer;
* ``scalar``: an eager op with a Python scalar (``x + 1.0``): the scalar is
  copied to the device, one transfer a call, at the highest rate jax allows.

Then ``paced``: 1,000 transfers a second for ``--paced-s`` seconds (after
``--paced-warmup-s`` more); the CPU of jaxtop's threads (their own thread
clocks), of every thread but the main one (XLA's too), and of the stderr
relay (a child process), as % of one core, and the interval the agent
samples at by then (it stretches it while over its CPU ceiling:
``jaxtop.agent.cadence``).

``--before DIR`` adds the arms ``counts-before`` and ``sites-before``: the
same with the jaxtop installed under DIR (an earlier commit, made with
``pip install --no-deps --target DIR <checkout>``), interleaved with the
others, so a change is measured before and after in one run.

    .venv/bin/python benchmarks/transfer_sites.py --rounds 3
    .venv/bin/python benchmarks/transfer_sites.py --workloads paced --before /tmp/pre_pkg
    tools/tpu/run.sh chip ... --steps sitescost      # the same on a TPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

CHILD = r'''
import json, os, sys, time, threading
mode, workload, calls, blocks, paced_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
warmup_s = float(sys.argv[6])
if mode != "jax-log":
    import jaxtop
    handle = jaxtop.instrument()
import numpy as np
import jax, jax.numpy as jnp
f = jax.jit(lambda x: x * 2.0)
host = np.ones((16,), np.float32)
dev = jax.device_put(host)
g = lambda: None
if workload == "numpy":
    def one(): f(host)
elif workload == "device":
    def one(): f(dev)
elif workload == "scalar":
    def one(): dev + 1.0  # the Python scalar is copied to the device: one transfer a call
else:
    def one(): dev + dev
for _ in range(2000):  # compiled, warmed, the agent's first ticks past
    one()
jax.block_until_ready(dev)
time.sleep(1.0)
out = {}
if workload != "paced":
    per = []
    for _ in range(blocks):
        t = time.perf_counter_ns()
        for _ in range(calls):
            one()
        per.append((time.perf_counter_ns() - t) / calls)
        time.sleep(0.05)
    out["ns_per_call"] = per
else:
    def one(): f(host)
    relay = None
    def paced(seconds):  # 1,000 calls a second; returns how many were made
        n, start = 0, time.perf_counter()
        next_t = start
        while time.perf_counter() - start < seconds:
            one(); n += 1
            next_t += 0.001
            pause = next_t - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        return n
    paced(warmup_s)  # the agent's first windows: it may settle its interval
    try:
        import psutil
        kids = psutil.Process().children()
        relay = kids[0] if kids else None
        r0 = relay.cpu_times() if relay else None
    except Exception:
        relay = None
    agents = [t for t in threading.enumerate() if t.name.startswith("jaxtop")]
    clocks = [time.pthread_getcpuclockid(t.ident) for t in agents]
    agent0 = sum(time.clock_gettime(c) for c in clocks)
    main0, proc0, wall0 = time.thread_time(), time.process_time(), time.perf_counter()
    n = paced(paced_s)
    wall = time.perf_counter() - wall0
    others = (time.process_time() - proc0) - (time.thread_time() - main0)
    out["transfers_per_s"] = n / wall
    out["other_threads_pct_core"] = 100 * others / wall
    out["agent_threads_pct_core"] = 100 * (sum(time.clock_gettime(c) for c in clocks) - agent0) / wall
    if mode != "jax-log":
        meter = getattr(handle.agent, "_meter", None)
        interval = getattr(handle.agent, "interval_s", None)
        if meter is not None and hasattr(meter, "tick_stretch") and interval:
            out["tick_s"] = interval * meter.tick_stretch  # the interval the agent runs at (0.1 s asked)
    if relay is not None:
        r1 = relay.cpu_times()
        out["relay_pct_core"] = 100 * ((r1.user - r0.user) + (r1.system - r0.system)) / wall
print("RESULT " + json.dumps(out), flush=True)
'''

ARMS = ("jax-log", "counts", "sites")
BEFORE = "-before"


def run_child(arm: str, workload: str, args: argparse.Namespace, script: Path) -> dict:
    env = dict(os.environ, JAX_PLATFORMS=args.platform)
    env.pop("JAXTOP_TRANSFER_SITES", None)
    if arm.endswith(BEFORE):  # the earlier jaxtop first on the path (the checkout's stays installed)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (args.before, env.get("PYTHONPATH"))))
        arm = arm[:-len(BEFORE)]
    if arm == "jax-log":
        env["JAX_TRANSFER_GUARD"] = "log"
    else:
        env.pop("JAX_TRANSFER_GUARD", None)
        env["JAXTOP_SOCKET_DIR"] = args.sockdir
        if arm == "counts":
            env["JAXTOP_TRANSFER_SITES"] = "0"
    proc = subprocess.Popen([sys.executable, str(script), arm, workload, str(args.calls), str(args.blocks),
                             str(args.paced_s), str(args.paced_warmup_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    # The guard's lines (jax-log arm) drained as jaxtop's relay drains them.
    errors: list[bytes] = []
    drain = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)
    drain.start()
    out, _ = proc.communicate(timeout=600)
    drain.join()
    for line in out.decode().splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{arm}/{workload} gave no result: {b''.join(errors)[-2000:].decode(errors='replace')}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=20000, help="calls per timed block")
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--paced-s", type=float, default=10.0)
    p.add_argument("--paced-warmup-s", type=float, default=0.0,
                   help="paced transfers before the measured ones (the agent measures its share over 10 s "
                        "windows and may stretch its interval after the first: 25 shows the settled state)")
    p.add_argument("--workloads", default="numpy,device,eager,scalar,paced",
                   help="which of numpy, device, eager, scalar, paced (default all)")
    p.add_argument("--platform", default="cpu", help="JAX_PLATFORMS of the children (tpu on the chip)")
    p.add_argument("--json-out")
    p.add_argument("--before", metavar="DIR", help="also run counts and sites with the jaxtop installed under DIR")
    args = p.parse_args()
    arms = ARMS + ((f"counts{BEFORE}", f"sites{BEFORE}") if args.before else ())
    if args.before and not (Path(args.before) / "jaxtop" / "__init__.py").is_file():
        p.error(f"--before {args.before}: no jaxtop package there (pip install --no-deps --target DIR <checkout>)")
    with tempfile.TemporaryDirectory() as tmp:
        args.sockdir = tmp
        script = Path(tmp) / "child.py"
        script.write_text(CHILD)
        results: dict[tuple[str, str], list[dict]] = {}
        for r in range(args.rounds):
            order = arms if r % 2 == 0 else tuple(reversed(arms))
            for workload in args.workloads.split(","):
                for arm in order:
                    result = run_child(arm, workload, args, script)
                    results.setdefault((arm, workload), []).append(result)
                    # As it goes: a run stopped early (a time limit) keeps what it measured.
                    print(f"round {r} {workload} {arm}: {json.dumps(result)}", flush=True)
    table = {}
    print(f"{'workload':<8} {'arm':<8} {'ns/call':>9}   (median of {args.rounds} rounds x {args.blocks} blocks)")
    timed = [w for w in ("numpy", "device", "eager", "scalar") if w in args.workloads.split(",")]
    for workload in timed:
        for arm in arms:
            per = [ns for res in results[(arm, workload)] for ns in res["ns_per_call"]]
            table[(arm, workload)] = statistics.median(per)
            print(f"{workload:<8} {arm:<8} {table[(arm, workload)]:9.0f}")
    print()
    for workload, what in (("numpy", "per transfer (one a call)"), ("device", "per jitted call, no transfer"),
                           ("eager", "per eager op, no transfer"), ("scalar", "per eager op with a scalar")):
        if workload not in timed:
            continue
        jax_price = table[("counts", workload)] - table[("jax-log", workload)]
        sites = table[("sites", workload)] - table[("counts", workload)]
        print(f"{what:<30}: jaxtop counting {jax_price:+6.0f} ns vs JAX's logging alone; "
              f"tying to lines {sites:+6.0f} ns more")
        if args.before:
            print(f"{'':<30}  before: counting {table[('counts' + BEFORE, workload)] - table[('jax-log', workload)]:+6.0f} ns, "
                  f"tying {table[('sites' + BEFORE, workload)] - table[('counts' + BEFORE, workload)]:+6.0f} ns more")
    print()
    for arm in arms if "paced" in args.workloads.split(",") else ():
        paced = results[(arm, "paced")]
        rate = statistics.median(r["transfers_per_s"] for r in paced)
        others = statistics.median(r["other_threads_pct_core"] for r in paced)
        relay = [r["relay_pct_core"] for r in paced if "relay_pct_core" in r]
        agent = statistics.median(r["agent_threads_pct_core"] for r in paced)
        ticks = [r["tick_s"] for r in paced if "tick_s" in r]
        print(f"paced {arm:<13}: {rate:6.0f} transfers/s; jaxtop's threads {agent:5.2f} % of a core"
              f" (all but the main thread {others:5.2f} %)"
              + (f"; relay process {statistics.median(relay):5.2f} %" if relay else "")
              + (f"; sampling every {statistics.median(ticks):.3f} s" if ticks else ""))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({f"{a}/{w}": v for (a, w), v in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
