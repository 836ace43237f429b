"""Attaching to a long run: the first complete frame, keys while the history
loads, and what the agent's history costs the program.

A child process plays the agent: it fills an agent's history (the
``Backfill`` of ``jaxtop/agent/clients.py``: the fine level, the coarse
level, the present) with ``--hours`` of a synthetic 8-device GPU job at
10 Hz, dated to end now, through the agent's own append path, then serves
it on ``PID.sock`` with the agent's own connection code (``Clients``: the
greeting, the lazy expansion of the history) while it keeps taking a sample
every 0.1 s. Building a day takes a minute: an hour of distinct samples is
played 24 times over into the coarse level, then the last ``backfill_s`` of
samples go in whole.

This process runs the real dashboard (``JaxtopApp`` with a ``LiveSource``,
headless via ``run_test``, the collector tuned as ``jaxtop attach`` tunes
it) and times, from the moment its reader connected:

* the **first complete frame**: the first frame drawn whose snapshot has the
  present (the newest sample, every device's buffer map) and a timeline
  filled back over the whole 10-minute window (from the coarse history);
* the **whole history in**: the first frame after ``history_end``;
* **keys**: ``tab`` pressed back to back from the first frame until the
  history is in, each timed to the screen drawn after it
  (``jaxtop.dashboard.keytiming``); every attach but the first (which
  times the history by itself: the reader steps aside for each key, so
  keys held down slow the history down).

``--before`` serves the history the way agents did before the coarse level:
hello, then every kept sample of ``--hours`` oldest first (an agent with
``backfill_s`` = the whole run), and the first complete frame is the one
that shows the newest sample (keys are pressed from the first frame that
shows a sample). Keep it to an hour or two: it holds every sample encoded.

    .venv/bin/python benchmarks/first_frame.py                   # 24 h, 8 devices, 3 attaches
    .venv/bin/python benchmarks/first_frame.py --hours 1 --before
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib

HZ = 10
INTERVAL_S = 1.0 / HZ


def mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# -- the agent (child process) --------------------------------------------------------------------


def build(args: argparse.Namespace, pid: int):
    """An agent's history after ``args.hours`` at 10 Hz, ending now: the
    Backfill, the synthetic stream to go on with, and what it holds."""
    from jaxtop.wire import protocol
    from jaxtop.testing import synthetic
    from jaxtop.agent.history import Backfill

    n_total = int(args.hours * 3600 * HZ)
    n_fine = min(n_total, int(args.backfill_s * HZ)) if not args.before else n_total
    n_coarse = n_total - n_fine
    rss0 = rss_bytes()
    backfill = Backfill()
    hello = synthetic.hello(pid, args.devices, 0.0, INTERVAL_S)
    backfill.note_hello(hello)

    # The history ends when the build starts; the samples the agent would
    # have taken meanwhile are added after it (at full resolution).
    t0 = time.time() - n_total * INTERVAL_S
    built = time.perf_counter()
    if n_coarse:
        block = min(n_coarse, 3600 * HZ)
        hour = list(synthetic.samples(pid, args.devices, t0, block, INTERVAL_S, seed=1, map_every=10**9))
        span = block * INTERVAL_S
        for k in range(n_coarse):
            rec = hour[k % block]
            backfill.coarse.add(dict(rec, t=rec["t"] + (k // block) * span))
        del hour
    stream = synthetic.samples(pid, args.devices, t0 + n_coarse * INTERVAL_S, 10**8, INTERVAL_S, seed=2)
    seq0 = n_coarse
    horizon = args.backfill_s if not args.before else 1e12
    rec = next(stream)
    while True:
        rec["seq"] += seq0
        backfill.add(rec, protocol.encode(rec))
        backfill.trim(rec["t"] - horizon)
        if rec["t"] + INTERVAL_S > time.time():
            break
        rec = next(stream)
    build_s = time.perf_counter() - built
    present_seq = backfill.present.record["seq"] if backfill.present.record else 0
    sizes = backfill.nbytes()
    coarse_json = sum(len(zlib.decompress(d) if c else d) for c, d in backfill.coarse.entries())
    stats = {
        "pid": pid, "present_seq": present_seq, "build_s": round(build_s, 1),
        "fine_records": len(backfill), "fine_bytes": sizes["fine"], "coarse_bytes": sizes["coarse"],
        "coarse_buckets": len(backfill.coarse), "coarse_json_bytes": coarse_json,
        "rss_growth_bytes": rss_bytes() - rss0,
    }
    return backfill, stream, seq0, rec, stats


def serve(args: argparse.Namespace) -> int:
    from jaxtop.wire import protocol
    from jaxtop.testing import synthetic
    from jaxtop.agent.clients import Clients

    pid = os.getpid()
    backfill, stream, seq0, rec, stats = build(args, pid)

    def greeting():
        hello_now = dict(synthetic.hello(pid, args.devices, time.time(), INTERVAL_S), t=time.time())
        if args.before:  # hello, then every kept sample, oldest first
            return protocol.encode(hello_now), backfill.start
        hello_now["history"] = backfill.describe(args.backfill_s)
        backfill.note_hello(hello_now)
        return backfill.greeting(protocol.encode(hello_now), time.time() - args.backfill_s)

    sel = selectors.DefaultSelector()
    clients = Clients(greeting, {"ping": lambda a: {"pong": True}}, backfill)
    clients.selector = sel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(args.sockdir, f"{pid}.sock"))
    listener.listen(64)
    listener.setblocking(False)
    clients.listen(listener)
    print("ready " + json.dumps(stats), flush=True)
    next_tick = time.monotonic()
    next_t = rec["t"]
    while True:  # until the parent kills us
        wake = clients.service(time.monotonic())
        deadline = next_tick if wake is None else min(wake, next_tick)
        for key, mask in sel.select(max(0.0, deadline - time.monotonic())):
            kind, client = key.data
            if kind == "accept":
                clients.accept()
            else:
                clients.on_event(client, mask)
        if time.monotonic() >= next_tick:
            next_tick += INTERVAL_S
            rec = next(stream)
            rec["seq"] += seq0
            next_t = rec["t"] = max(time.time(), next_t + 0.001)
            line = protocol.encode(rec)
            backfill.add(rec, line)
            if not args.before:
                backfill.trim(rec["t"] - args.backfill_s)
            clients.broadcast(line)


# -- the dashboard (this process) ----------------------------------------------------------------------


def attach(pid: int, present_seq: int, n_devices: int, before: bool, typing: bool) -> dict:
    """One attach of the real dashboard, in this (fresh) process; times
    from its reader's connect. ``typing``: press keys while the history
    loads (the reader steps aside for each, so the history takes longer)."""
    from jaxtop.wire import client
    from jaxtop.dashboard.app import JaxtopApp
    from jaxtop.dashboard.collector import tune_gc
    from jaxtop.dashboard.keytiming import KeyNotAnswered, type_keys
    from jaxtop.dashboard.sources import LiveSource

    connected: list[float] = []
    opened = client.AgentConnection.open

    def timed_open(p: int, timeout_s: float = 2.0):
        conn = opened(p, timeout_s)
        connected.append(time.monotonic())
        return conn

    client.AgentConnection.open = timed_open  # type: ignore[method-assign]
    out: dict = {}

    def complete(snap) -> bool:
        """The present on every panel, the timeline filled over its window."""
        proc = snap.processes[0] if snap.processes else None
        if proc is None or proc.seq is None or proc.seq < present_seq or len(snap.devices) < n_devices:
            return False
        if not all(d.buffer_map for d in snap.devices):
            return False
        span = proc.span
        return span is not None and span[1] - span[0] >= 0.98 * (snap.window_s or 0) and len(proc.history.t) > 30

    async def run() -> None:
        source = LiveSource([pid], retry_s=0.2)
        app = JaxtopApp(source)
        frames: list[tuple[float, bool, bool]] = []  # (drawn at, complete, history in)
        shown = app.show

        def show(snap):  # on the UI thread, as each frame is drawn
            shown(snap)
            proc = app.model.processes.get(pid)
            loaded = proc is not None and not proc.history_loading and (not before or app.model.loading() is None)
            frames.append((time.monotonic(), complete(snap), loaded))
            if before and snap.processes and snap.processes[0].seq:
                first.set()  # keys from the first frame with a sample: the backlog loads behind it

        app.show = show  # type: ignore[method-assign]
        first = threading.Event()
        done = threading.Event()
        keys: list[float] = []
        failed: list[BaseException] = []

        def typist() -> None:
            if not first.wait(60):
                return
            try:
                keys.extend(type_keys(app, done))
            except KeyNotAnswered as exc:
                failed.append(exc)

        async with app.run_test(size=(120, 40)):
            tune_gc()  # what `jaxtop attach` does (run_as_main), the widgets mounted
            typer = threading.Thread(target=typist, daemon=True)
            if typing:
                typer.start()
            deadline = time.monotonic() + 600
            t_first = t_done = None
            while time.monotonic() < deadline and t_done is None:
                await asyncio.sleep(0.005)
                for at, whole, loaded in list(frames):
                    if t_first is None and whole:
                        t_first = at
                        first.set()
                    if t_first is not None and loaded and whole:
                        t_done = at
                        break
            done.set()
            first.set()
            while typer.is_alive():  # the UI must go on answering its last key
                await asyncio.sleep(0.02)
            if failed:
                raise failed[0]
            proc = app.model.processes.get(pid)
            start = connected[0]
            out.update(first_frame_s=None if t_first is None else t_first - start,
                       history_s=None if t_done is None else t_done - start, keys=keys,
                       history_samples=(proc.past_samples if not before else proc.samples) if proc is not None else 0,
                       rss_bytes=rss_bytes())
            app.exit()

    try:
        asyncio.run(run())
    finally:
        client.AgentConnection.open = opened  # type: ignore[method-assign]
    return out


def key_stats(keys: list[float]) -> str:
    if not keys:
        return "no key pressed (the history was in before the first frame)"
    keys = sorted(keys)
    p = lambda q: keys[min(len(keys) - 1, int(q * len(keys)))] * 1000
    return f"{len(keys)} keys, median {p(0.5):.0f} ms, 95th percentile {p(0.95):.0f} ms, max {keys[-1] * 1000:.0f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=24.0, help="how long the program has run (default 24)")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--backfill-s", type=float, default=600.0, help="the agent's fine level (default 600)")
    ap.add_argument("--runs", type=int, default=3, help="attaches, each a fresh dashboard (default 3)")
    ap.add_argument("--before", action="store_true", help="serve every sample as the backfill, as before the coarse level")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sockdir", help=argparse.SUPPRESS)
    ap.add_argument("--attach", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--present-seq", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--typing", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args)
    if args.attach:
        print(json.dumps(attach(args.attach, args.present_seq, args.devices, args.before, args.typing)))
        return 0

    sockdir = tempfile.mkdtemp(prefix="jaxtop-first-frame-")
    os.chmod(sockdir, 0o700)
    os.environ["JAXTOP_SOCKET_DIR"] = sockdir
    cmd = [sys.executable, os.path.abspath(__file__), "--serve", "--sockdir", sockdir, "--hours", str(args.hours),
           "--devices", str(args.devices), "--backfill-s", str(args.backfill_s)] + (["--before"] if args.before else [])
    agent = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        line = agent.stdout.readline()
        if not line.startswith("ready "):
            raise SystemExit(f"the agent did not start: {line!r}")
        stats = json.loads(line[6:])
        mode = "before (every sample as the backfill)" if args.before else "present first, coarse then fine history"
        print(f"{args.hours:g} h at {HZ} Hz, {args.devices} devices, {mode}; the agent's history built in {stats['build_s']} s")
        if args.before:
            print(f"  agent history: {stats['fine_records']:,} samples, {mib(stats['fine_bytes'])} encoded")
        else:
            print(f"  agent history: fine {stats['fine_records']:,} records, {mib(stats['fine_bytes'])}; coarse "
                  f"{stats['coarse_buckets']:,} buckets, {mib(stats['coarse_bytes'])} kept compressed "
                  f"({mib(stats['coarse_json_bytes'])} as sent); the agent process grew {mib(stats['rss_growth_bytes'])}")
        results = []
        for i in range(args.runs):
            typing = i > 0  # the first attach untouched: how long the history takes by itself
            res = subprocess.run([sys.executable, os.path.abspath(__file__), "--attach", str(stats["pid"]),
                                  "--present-seq", str(stats["present_seq"]), "--devices", str(args.devices)]
                                 + (["--before"] if args.before else []) + (["--typing"] if typing else []),
                                 capture_output=True, text=True, timeout=900, env=dict(os.environ))
            if res.returncode != 0:
                raise SystemExit(f"attach {i + 1} failed: {res.stderr[-3000:]}")
            r = json.loads(res.stdout.strip().splitlines()[-1])
            results.append(r)
            ff = "never" if r["first_frame_s"] is None else f"{r['first_frame_s']:.2f} s"
            hs = "never" if r["history_s"] is None else f"{r['history_s']:.2f} s"
            what = "fine samples" if not args.before else "samples"
            print(f"  attach {i + 1}: first complete frame {ff} after connecting; whole history in {hs} "
                  f"({r['history_samples']:,} {what}" + (f"; keys pressed back to back meanwhile: {key_stats(r['keys'])}"
                                                         if typing else ", no key pressed") +
                  f"); dashboard RSS {mib(r['rss_bytes'])}", flush=True)
        firsts = [r["first_frame_s"] for r in results if r["first_frame_s"] is not None]
        keys = [k for r in results for k in r["keys"]]
        plain = [r["history_s"] for r in results[:1] if r["history_s"] is not None]
        if plain:
            print(f"whole history in, no key pressed: {plain[0]:.2f} s")
        if firsts:
            verdict = "met" if max(firsts) <= 1.0 else "MISSED"
            print(f"first complete frame within 1 s: {verdict} (median {statistics.median(firsts):.2f} s, "
                  f"max {max(firsts):.2f} s)")
        slow = sum(k > 0.1 for k in keys)
        print(f"keys while the history loads: {key_stats(keys)}; {slow} over 100 ms")
        if args.json:
            print(json.dumps({"agent": stats, "runs": results, "hours": args.hours, "devices": args.devices,
                              "before": args.before}))
        return 0
    finally:
        agent.kill()
        agent.wait()
        shutil.rmtree(sockdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
