"""How much CPU and memory the dashboard costs while it watches a big job.

This process plays the agent: it listens on ``PID.sock`` in a private socket
directory and streams a synthetic 8-device GPU job (``jaxtop.testing.synthetic``).
The dashboard runs as a user runs it, ``python -m jaxtop attach PID``, in a
real pseudo-terminal of 120x40 whose output this process drains.

1. **Backlog.** ``--hours`` of samples at 10 Hz (24 h = 864,000 samples, each
   with 8 devices) are sent as fast as the dashboard reads them, with
   timestamps ending now, as if it had watched the whole run. The dashboard's
   RSS is read at every tenth of the way, so growth is visible, not only the
   end point.
2. **Steady state.** Then samples go at the real 10 Hz for ``--measure-s``
   seconds, and the dashboard's CPU time over that window is reported as % of
   one core (psutil ``cpu_times``: user + system, all its threads), with its
   RSS at the end.

Before any of that, the ingest rate of the model is measured in this process,
the model at ``--baseline`` (a git revision) side by side with the working
tree's, alternating. Each target is printed as met or MISSED at the end.
``--dashboard-ref REV`` runs that revision's dashboard for the rest, so two
runs give the first frame and the CPU before and after.

Targets: first complete frame of a 10-minute backfill within 1 s, of a 1 h
backlog of 8 devices within 2 s; ingest >= 50,000 samples/s of 8 devices,
decoding included; <= 3 % of one core; RSS flat and under 150 MB.

    .venv/bin/python benchmarks/tui.py                 # 24 h backlog, 60 s measured
    .venv/bin/python benchmarks/tui.py --hours 1 --measure-s 20 --baseline 1d95fde   # quick look
    .venv/bin/python benchmarks/tui.py --hours 1 --measure-s 20 --ingest-samples 0 --dashboard-ref 1d95fde
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time

import psutil

from jaxtop.wire import protocol
from jaxtop.testing import synthetic
from jaxtop.agent.history import Backfill

HZ = 10
INTERVAL_S = 1.0 / HZ


def mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def start_dashboard(pid: int, env: dict[str, str], cols: int, rows: int, extra: list[str]) -> tuple[subprocess.Popen, int]:
    """``jaxtop attach pid`` in a pseudo-terminal; returns it and the master fd."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxtop", "attach", str(pid), *extra],
        stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True, close_fds=True,
    )
    os.close(slave)
    return proc, master


def tree_at(ref: str) -> str:
    """jaxtop as it was at git revision ``ref``, laid out as installed
    (``jaxtop.probes`` from ``probes/``…) in a temporary folder: put first
    on PYTHONPATH, a dashboard started with it runs that revision's code."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tmp = tempfile.mkdtemp(prefix="jaxtop-tree-")
    archive = subprocess.run(["git", "-C", root, "archive", ref, "jaxtop", "probes", "widgets", "demo"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
    for folder in ("probes", "widgets", "demo"):
        os.rename(os.path.join(tmp, folder), os.path.join(tmp, "jaxtop", folder))
    return tmp


def drain(master: int, counter: list[int]) -> None:
    """Read the terminal's output, as a terminal emulator would."""
    while True:
        try:
            data = os.read(master, 1 << 16)
        except OSError:
            return
        if not data:
            return
        counter[0] += len(data)



def measure_ingest(n_devices: int, count: int) -> dict[str, float]:
    """Samples/s into the model, in this process, the way the live source
    feeds it: a read of 90 lines given to ``jaxtop.dashboard.sources.live.
    ingest`` (decoding included), and the same records decoded beforehand
    and fed with ``Model.feed_many``. Whichever jaxtop this process imports
    is measured: the working tree's, or a revision's (``tree_at``), each
    with its own decoder."""
    from jaxtop.dashboard.model import Model
    from jaxtop.dashboard.sources.live import ingest
    try:
        from jaxtop.wire.records import decode
    except ImportError:  # a revision before the typed records
        from jaxtop.dashboard.sources.live import fast_decode as decode

    lines = [protocol.encode(synthetic.hello(1, n_devices, 0.0, INTERVAL_S))]
    lines += [protocol.encode(r) for r in synthetic.samples(1, n_devices, 0.0, count, INTERVAL_S)]
    batch = 90  # about one 1 MiB read of this stream
    recs = [decode(x) for x in lines]
    m = Model()
    t = time.perf_counter()
    for i in range(0, len(recs), batch):
        m.feed_many(1, recs[i:i + batch])
    model_rate = count / (time.perf_counter() - t)
    m = Model()
    t = time.perf_counter()
    for i in range(0, len(lines), batch):
        ingest(m, 1, lines[i:i + batch])
    out = {"model": model_rate, "end_to_end": count / (time.perf_counter() - t)}
    try:
        from jaxtop.wire.records import Sample
    except ImportError:
        return out
    # The floors under any decoder of these lines, in the same process:
    # msgspec building the typed records and nothing else, and msgspec
    # only tokenizing them (a type that keeps no field skips the rest).
    import msgspec

    class Kind(msgspec.Struct):
        type: str

    for name, decoder in (("typed_decode", msgspec.json.Decoder(Sample)), ("tokenize", msgspec.json.Decoder(Kind))):
        t = time.perf_counter()
        for line in lines[1:]:
            decoder.decode(line)
        out[name] = count / (time.perf_counter() - t)
    return out


def measure_key_latency(n_devices: int, count: int, as_cli: bool) -> list[float]:
    """Seconds from a key to the screen drawn after it, keys pressed back to
    back while ``count`` samples of ``n_devices`` devices are decoded and fed
    from another thread, as the live source reads a backfill.

    The keys are typed by :func:`jaxtop.dashboard.keytiming.type_keys` on a
    thread of their own, as the terminal driver's thread posts them. ``as_cli``: the app as
    ``jaxtop attach`` runs it (the collector tuned, the reader stepping aside
    for keys); else as it ran before 4 Dec's change (neither).
    """
    import asyncio

    from jaxtop.wire import protocol
    from jaxtop.testing import synthetic
    from jaxtop.dashboard.app import JaxtopApp
    from jaxtop.dashboard.collector import tune_gc
    from jaxtop.dashboard.keytiming import KeyNotAnswered, type_keys
    from jaxtop.dashboard.sources import PushSource
    from jaxtop.dashboard.sources.live import ingest

    t0 = time.time() - count * 0.1
    lines = [protocol.encode(synthetic.hello(7, n_devices, t0))]
    lines += [protocol.encode(r) for r in synthetic.samples(7, n_devices, t0, count)]

    async def run() -> list[float]:
        source = PushSource(pids=[7])
        app = JaxtopApp(source)
        async with app.run_test(size=(120, 40)):
            if as_cli:
                tune_gc()  # what run_as_main does, the widgets mounted
            else:
                app.model.pace = None
            loaded, done = threading.Event(), threading.Event()
            out: list[float] = []
            failed: list[BaseException] = []

            def reader() -> None:  # as the live source reads: decode and feed a read at a time
                for i in range(0, len(lines), 90):
                    ingest(app.model, 7, lines[i:i + 90])
                    source.on_update()
                    loaded.set()
                done.set()

            def typist() -> None:
                loaded.wait(30)
                try:
                    out.extend(type_keys(app, done))
                except KeyNotAnswered as exc:
                    failed.append(exc)

            threading.Thread(target=reader, daemon=True).start()
            typing = threading.Thread(target=typist)
            typing.start()
            while typing.is_alive():
                await asyncio.sleep(0.05)
            if failed:
                raise failed[0]
            return out

    return asyncio.run(run())


def child(kind: str, args: argparse.Namespace, tree: str | None = None) -> dict:
    """Run one in-process measure in a fresh Python: the collector's state is
    the whole process's, so each configuration gets its own. ``tree``: a
    revision's jaxtop (``tree_at``) to import instead of the working tree's."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, "--devices", str(args.devices),
           "--ingest-samples", str(args.ingest_samples), "--baseline", args.baseline]
    env = dict(os.environ, PYTHONPATH=tree) if tree else None
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"{kind}: {res.stderr.strip()[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_child(kind: str, args: argparse.Namespace) -> dict:
    if kind == "ingest-tuned":
        import importlib

        from jaxtop.dashboard.collector import tune_gc
        importlib.import_module("jaxtop.dashboard.app")  # the modules a dashboard has, frozen with it
        tune_gc()
        return measure_ingest(args.devices, args.ingest_samples)
    as_cli = kind == "keys-cli"
    keys = []
    for _ in range(3):  # three backfills, one list: a few dozen keys in all
        keys += measure_key_latency(args.devices, args.ingest_samples, as_cli)
    return {"keys": keys}


def key_stats(keys: list[float]) -> str:
    keys = sorted(keys)
    p = lambda q: keys[min(len(keys) - 1, int(q * len(keys)))] * 1000
    return f"{len(keys)} keys, median {p(0.5):.0f} ms, 95th percentile {p(0.95):.0f} ms, max {keys[-1] * 1000:.0f} ms"


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=24.0, help="length of the backlog (default 24)")
    ap.add_argument("--measure-s", type=float, default=60.0, help="steady-state window at 10 Hz (default 60)")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--size", default="120x40", help="terminal COLSxROWS (default 120x40)")
    ap.add_argument("--refresh", type=float, help="pass --refresh S to jaxtop attach (default: its own default)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    ap.add_argument("--ingest-samples", type=int, default=6000, help="samples for the in-process ingest measure (0: skip)")
    ap.add_argument("--baseline", default="HEAD", help="git revision of the model to compare with (default HEAD)")
    ap.add_argument("--prebuild-hours", type=float, default=2.0,
                    help="a backlog up to this long is made and encoded before connecting (default 2)")
    ap.add_argument("--dashboard-ref", help="run the dashboard of this git revision (e.g. 1d95fde) instead of the "
                    "working tree's, to compare first frames and CPU before/after")
    ap.add_argument("--child", choices=["ingest-tuned", "keys-before", "keys-cli"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_child(args.child, args)))
        return 0
    targets: list[str] = []
    if args.ingest_samples:
        # The baseline's own decoder and model against today's, each in a
        # fresh process with the collector tuned as `jaxtop attach` tunes
        # it, alternating, three rounds; the best of each is kept.
        baseline_tree = tree_at(args.baseline)
        rounds: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        for _ in range(3):
            rounds["before"].append(child("ingest-tuned", args, baseline_tree))
            rounds["after"].append(child("ingest-tuned", args))
        best = {side: {k: max(r[k] for r in runs) for k in runs[0]} for side, runs in rounds.items()}
        for side, runs in rounds.items():
            print(f"ingest, {side} ({args.baseline if side == 'before' else 'working tree'}), samples/s of "
                  f"{args.devices} devices: decoding included " + ", ".join(f"{r['end_to_end']:,.0f}" for r in runs)
                  + "; decoded beforehand " + ", ".join(f"{r['model']:,.0f}" for r in runs))
        after, before = best["after"], best["before"]
        if "tokenize" in after:
            print(f"  the floors on these lines (msgspec, no jaxtop code): typed decode alone "
                  + ", ".join(f"{r['typed_decode']:,.0f}" for r in rounds["after"]) + "/s; tokenizing alone "
                  + ", ".join(f"{r['tokenize']:,.0f}" for r in rounds["after"]) + "/s")
        targets.append(f"(2) ingest >= 50,000 samples/s of {args.devices} devices, decoding included: "
                       f"{verdict(after['end_to_end'] >= 50_000)} ({after['end_to_end']:,.0f}/s; {args.baseline}: "
                       f"{before['end_to_end']:,.0f}/s, x{after['end_to_end'] / before['end_to_end']:.1f}; records "
                       f"decoded beforehand {after['model']:,.0f}/s, {args.baseline}: {before['model']:,.0f}/s)")
        before = child("keys-before", args)["keys"]
        after = child("keys-cli", args)["keys"]
        print(f"keys (tab, back to back) to the screen drawn while a {args.ingest_samples:,}-sample backfill loads:")
        print(f"  as the dashboard ran before 4 Dec: {key_stats(before)}")
        print(f"  as jaxtop attach runs it:          {key_stats(after)}")
        # The verdict is on the 95th percentile, as a latency target is
        # usually put: the few slower keys are the first ones, pressed while
        # the first frames of the backlog are drawn, and the count and the
        # max are printed with it.
        slow = sum(k > 0.1 for k in after)
        p95 = sorted(after)[min(len(after) - 1, int(0.95 * len(after)))]
        targets.append(f"(2) keys answered within 100 ms while a backlog loads (95th percentile): {verdict(p95 <= 0.1)} "
                       f"({key_stats(after)}; {slow} over 100 ms; before: {key_stats(before)})")
    cols, rows = (int(v) for v in args.size.split("x"))

    sockdir = tempfile.mkdtemp(prefix="jaxtop-tui-bench-")
    os.chmod(sockdir, 0o700)
    pid = os.getpid()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(os.path.join(sockdir, f"{pid}.sock"))
    listener.listen(1)
    env = dict(os.environ, JAXTOP_SOCKET_DIR=sockdir, TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows))
    if args.dashboard_ref:
        env["PYTHONPATH"] = tree_at(args.dashboard_ref)
        print(f"the dashboard of {args.dashboard_ref}")
    extra = ["--refresh", str(args.refresh)] if args.refresh else []
    proc, master = start_dashboard(pid, env, cols, rows, extra)
    out_bytes = [0]
    threading.Thread(target=drain, args=(master, out_bytes), daemon=True).start()
    dash = psutil.Process(proc.pid)
    results: dict[str, object] = {"devices": args.devices, "hz": HZ, "hours": args.hours, "terminal": args.size,
                                  "refresh_s": args.refresh}
    try:
        listener.settimeout(60)
        conn, _ = listener.accept()
        # `jaxtop attach` may probe the socket (connect, then close) before
        # it connects for good: serve the connection that stays open.
        while True:
            conn.settimeout(0.3)
            try:
                closed = conn.recv(1, socket.MSG_PEEK) == b""
            except (TimeoutError, BlockingIOError):
                closed = False
            conn.settimeout(None)
            if not closed:
                break
            conn.close()
            conn, _ = listener.accept()
        n_backlog = int(args.hours * 3600 * HZ)
        # An agent holds its backfill encoded, as its Backfill keeps it (the
        # newest buffer maps only): up to 10 minutes of it is built first and
        # sent as the agent sends it; a longer backlog streams after that,
        # made as it is sent, unless --prebuild-hours covers it (making and
        # encoding a sample here takes about as long as the dashboard takes
        # to read it: a backlog made while sent measures this process).
        # A real backfill ends now: the samples are dated so that it ends
        # when building it (timed on a first 200) is done.
        ready = min(n_backlog, int(max(600, args.prebuild_hours * 3600) * HZ))
        trial = synthetic.samples(pid, args.devices, time.time(), min(ready, 200), INTERVAL_S)
        began = time.perf_counter()
        Backfill().append(0.0, b"")
        for rec in trial:
            protocol.encode(rec)
        build_s = (time.perf_counter() - began) * ready / max(1, min(ready, 200))
        now = time.time() + build_s
        t0 = now - n_backlog * INTERVAL_S
        total = n_backlog + int((args.measure_s + 120) * HZ)  # and the samples taken while the backlog goes out
        stream = synthetic.samples(pid, args.devices, t0, total, INTERVAL_S)
        backfill = Backfill()
        for _ in range(ready):
            rec = next(stream)
            backfill.append(rec["t"], protocol.encode(rec))
        accepted = time.monotonic()
        conn.sendall(protocol.encode(synthetic.hello(pid, args.devices, t0, INTERVAL_S)))

        print(f"dashboard pid {proc.pid}, terminal {args.size}, refresh {args.refresh or 'default'}; backlog {n_backlog:,} samples x {args.devices} devices ({args.hours:g} h at {HZ} Hz)")
        rss_curve = []
        sent_bytes = 0
        started = time.monotonic()
        cpu0 = dash.cpu_times()
        marks = {max(1, n_backlog * k // 10) for k in range(1, 11)} if n_backlog else set()
        held = backfill.lines(backfill.start, backfill.end)
        chunk: list[bytes] = []
        for k in range(n_backlog):
            line = held[k] if k < len(held) else protocol.encode(next(stream))
            chunk.append(line)
            sent_bytes += len(line)
            # A megabyte a write, as an agent's connection writes its
            # backfill: a write a line would time this process's loop.
            if sum(map(len, chunk)) >= 1 << 20 or k + 1 in marks or k + 1 == n_backlog:
                conn.sendall(b"".join(chunk))  # blocks while the dashboard is behind: it sets the pace
                chunk = []
            if k + 1 in marks:
                rss = dash.memory_info().rss
                rss_curve.append((k + 1, rss))
                print(f"  {k + 1:>9,} samples  {time.monotonic() - started:7.1f} s  dashboard RSS {mib(rss)}", flush=True)
        backlog_s = time.monotonic() - started
        behind_s = time.time() - (t0 + (n_backlog - 1) * INTERVAL_S)  # what the dashboard sees as "behind"
        # An agent samples on while its backfill goes out: the samples it
        # took meanwhile follow at once, dated up to now, and the stream is
        # current. (Without them the stream stays as far behind as sending
        # took, the dashboard keeps saying "loading", and its frame waits
        # for the redraw period: no agent does that.)
        last_t = t0 + (n_backlog - 1) * INTERVAL_S
        queued: list[bytes] = []
        while last_t + INTERVAL_S <= time.time():
            rec = next(stream)
            last_t += INTERVAL_S
            rec["t"] = last_t
            queued.append(protocol.encode(rec))
        if queued:
            conn.sendall(b"".join(queued))
        cpu1 = dash.cpu_times()
        # First complete frame: the first terminal output after the whole
        # backlog was read (the frame that draws its last sample).
        out_sent = out_bytes[0]
        deadline = time.monotonic() + 10
        while out_bytes[0] == out_sent and time.monotonic() < deadline:
            time.sleep(0.005)
        first_frame_s = time.monotonic() - accepted
        print(f"first complete frame {first_frame_s:.2f} s after connecting (backlog of {n_backlog:,} samples; "
              f"its newest sample {behind_s:.2f} s old when the last was sent, then the {len(queued)} taken "
              "meanwhile)")
        results.update(first_frame_s=round(first_frame_s, 2))
        if abs(args.hours * 3600 - 600) < 1:
            targets.append(f"(1) first complete frame of a 10-minute backfill within 1 s: {verdict(first_frame_s <= 1.0)} ({first_frame_s:.2f} s)")
        if abs(args.hours - 1) < 1e-9:
            targets.append(f"(1) first complete frame of a 1 h backlog within 2 s: {verdict(first_frame_s <= 2.0)} ({first_frame_s:.2f} s)")
        if n_backlog:
            rate = n_backlog / backlog_s
            print(f"backlog: {n_backlog:,} samples, {mib(sent_bytes)} of JSON in {backlog_s:.1f} s "
                  f"({rate:,.0f} samples/s; the dashboard used {(cpu1.user + cpu1.system - cpu0.user - cpu0.system):.1f} s CPU)")
            results.update(backlog_samples=n_backlog, backlog_s=round(backlog_s, 1), backlog_json_bytes=sent_bytes,
                           rss_curve=rss_curve)
        time.sleep(2.0)  # let it finish drawing the backlog

        # Steady state: real time.
        cpu_a, wall_a = dash.cpu_times(), time.monotonic()
        out_a = out_bytes[0]
        next_t = wall_a
        for _ in range(int(args.measure_s * HZ)):
            rec = next(stream)
            rec["t"] = time.time()
            conn.sendall(protocol.encode(rec))
            next_t += INTERVAL_S
            time.sleep(max(0.0, next_t - time.monotonic()))
        cpu_b, wall_b = dash.cpu_times(), time.monotonic()
        cpu_s = (cpu_b.user + cpu_b.system) - (cpu_a.user + cpu_a.system)
        pct = 100.0 * cpu_s / (wall_b - wall_a)
        rss_end = dash.memory_info().rss
        print(f"steady state: {args.measure_s:g} s at {HZ} Hz: dashboard CPU {pct:.2f} % of one core "
              f"({cpu_s:.2f} s), terminal output {mib(out_bytes[0] - out_a)} ({(out_bytes[0] - out_a) / (wall_b - wall_a) / 1024:.1f} KiB/s)")
        print(f"dashboard RSS at the end: {mib(rss_end)}" + (f" (after the backlog's first tenth: {mib(rss_curve[0][1])})" if rss_curve else ""))
        spool = sum(os.path.getsize(f.path) for f in dash.open_files() if f.path.endswith(".jsonl.gz"))
        if spool:
            print(f"session spool on disk (for `w`): {mib(spool)}")
        targets.append(f"(3) steady state <= 3 % of one core: {verdict(pct <= 3.0)} ({pct:.2f} %); "
                       f"RSS < 150 MB: {verdict(rss_end < 150 * (1 << 20))} ({mib(rss_end)})")
        print("targets:")
        for line in targets:
            print("  " + line)
        results.update(cpu_percent=round(pct, 2), rss_end_bytes=rss_end, measure_s=args.measure_s,
                       terminal_bytes_per_s=round((out_bytes[0] - out_a) / (wall_b - wall_a)), spool_bytes=spool)
        if args.json:
            print(json.dumps(results))
        conn.close()
        return 0
    finally:
        try:
            os.killpg(proc.pid, 15)
        except OSError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        listener.close()
        shutil.rmtree(sockdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
