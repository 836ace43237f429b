"""How much CPU and memory the dashboard costs while it watches a big job.

This process plays the agent: it listens on ``PID.sock`` in a private socket
directory and streams a synthetic 8-device GPU job (``jaxtop.synthetic``).
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

Targets: <= 5 % of one core, RSS flat and under 200 MB.

    .venv/bin/python benchmarks/tui.py                 # 24 h backlog, 60 s measured
    .venv/bin/python benchmarks/tui.py --hours 1 --measure-s 20   # quick look
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

from jaxtop import protocol, synthetic

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=24.0, help="length of the backlog (default 24)")
    ap.add_argument("--measure-s", type=float, default=60.0, help="steady-state window at 10 Hz (default 60)")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--size", default="120x40", help="terminal COLSxROWS (default 120x40)")
    ap.add_argument("--refresh", type=float, help="pass --refresh S to jaxtop attach (default: its own default)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args()
    cols, rows = (int(v) for v in args.size.split("x"))

    sockdir = tempfile.mkdtemp(prefix="jaxtop-tui-bench-")
    os.chmod(sockdir, 0o700)
    pid = os.getpid()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(os.path.join(sockdir, f"{pid}.sock"))
    listener.listen(1)
    env = dict(os.environ, JAXTOP_SOCKET_DIR=sockdir, TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows))
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
        n_backlog = int(args.hours * 3600 * HZ)
        now = time.time()
        t0 = now - n_backlog * INTERVAL_S
        conn.sendall(protocol.encode(synthetic.hello(pid, args.devices, t0, INTERVAL_S)))
        total = n_backlog + int(args.measure_s * HZ) + 10
        stream = synthetic.samples(pid, args.devices, t0, total, INTERVAL_S)

        print(f"dashboard pid {proc.pid}, terminal {args.size}, refresh {args.refresh or 'default'}; backlog {n_backlog:,} samples x {args.devices} devices ({args.hours:g} h at {HZ} Hz)")
        rss_curve = []
        sent_bytes = 0
        started = time.monotonic()
        cpu0 = dash.cpu_times()
        marks = {max(1, n_backlog * k // 10) for k in range(1, 11)} if n_backlog else set()
        for k in range(n_backlog):
            line = protocol.encode(next(stream))
            conn.sendall(line)  # blocks while the dashboard is behind: it sets the pace
            sent_bytes += len(line)
            if k + 1 in marks:
                rss = dash.memory_info().rss
                rss_curve.append((k + 1, rss))
                print(f"  {k + 1:>9,} samples  {time.monotonic() - started:7.1f} s  dashboard RSS {mib(rss)}", flush=True)
        backlog_s = time.monotonic() - started
        cpu1 = dash.cpu_times()
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
        verdict_cpu = "meets" if pct <= 5.0 else "MISSES"
        verdict_rss = "meets" if rss_end < 200 * (1 << 20) else "MISSES"
        print(f"targets: CPU <= 5 % of one core: {verdict_cpu}; RSS < 200 MB: {verdict_rss}")
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
