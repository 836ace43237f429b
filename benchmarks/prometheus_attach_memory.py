#!/usr/bin/env python
"""What ``jaxtop attach --prometheus`` holds in memory for a very large job,
or for one very large answer.

This process serves a stand-in Prometheus query API on 127.0.0.1; a fresh
child process runs the dashboard's reader against it as the dashboard does
(``PrometheusSource``: the first check, the backfill's range query, one
instant query, each fed to a real ``Model``) and reports its RSS (``VmRSS``)
and its peak (``VmHWM``) over what it held after its imports, the processes
and devices kept, and any error. The child is killed once its RSS passes
``--rss-limit-gb`` (the machine is shared): then the RSS is reported as
over the limit.

Scenarios:

* ``processes``: a job of ``--processes`` (5,000) processes with one device
  each; the range query's answer has one point per step asked for.
* ``answer``: every query answered with the same valid answer of about
  ``--answer-mib`` (60) MiB (an instant vector of as many processes as fill it).

Usage::

    .venv/bin/python benchmarks/prometheus_attach_memory.py
    .venv/bin/python benchmarks/prometheus_attach_memory.py --pythonpath /tmp/jaxtop-before   # another version
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

T = 1_800_000_000.0

CHILD = r"""
import json, sys, time
from jaxtop.dashboard.model import Model
from jaxtop.dashboard.sources.prometheus import PrometheusError, PrometheusSource

def status():
    with open("/proc/self/status") as f:
        return {k: int(v.split()[0]) * 1024 for k, v in (l.split(":", 1) for l in f) if k in ("VmRSS", "VmHWM")}

base = status()["VmRSS"]
errors = []
source = PrometheusSource(sys.argv[1], poll_s=2.0, backfill_s=600.0)
source.model = model = Model()
t0 = time.monotonic()
for step in ("check", "backfill", "poll"):
    try:
        if step == "check":
            source.check()
        else:
            source.poll(backfill=step == "backfill")
    except PrometheusError as exc:
        errors.append(f"{step}: {exc}"[:160])
now = status()
print(json.dumps({"rss_mb": (now["VmRSS"] - base) / 1e6, "peak_mb": (now["VmHWM"] - base) / 1e6,
                  "processes": len(model.processes), "devices": len(model.snapshot().devices),
                  "notices": model.notices, "errors": errors, "seconds": round(time.monotonic() - t0, 1)}))
"""


def series_json(i: int, n: int, points: list[float] | None) -> list[bytes]:
    """The series of process ``i`` of ``n``: instant values, or one per point time."""
    base = {"job": "big", "host": f"node-{i // 8}", "pid": str(1000 + i), "process_index": str(i),
            "process_count": str(n)}
    dev = dict(base, device="0", platform="gpu")
    out = []
    for name, labels, value in (("jaxtop_sample_seq", base, 7), ("jaxtop_process_resident_memory_bytes", base, 1 << 30),
                                ("jaxtop_device_bytes_in_use", dev, 1 << 20),
                                ("jaxtop_device_info", dict(dev, kind="H100", gpu="0"), 1)):
        item = {"metric": {"__name__": name, **labels}}
        if points is None:
            item["value"] = [T, str(value)]
        else:
            item["values"] = [[t, str(value + (name == "jaxtop_sample_seq") * k)] for k, t in enumerate(points)]
        out.append(json.dumps(item).encode())
    return out


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the end of the answer is the end of the connection: it can be streamed
    scenario: dict = {}

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        fixed = self.scenario.get("payload")
        try:
            if fixed is not None:
                self.wfile.write(fixed)
                return
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            points = None
            if "step" in query:
                start, end, step = (float(query[k][0]) for k in ("start", "end", "step"))
                points = [start + k * step for k in range(int((end - start) / step) + 1)]
            kind = "vector" if points is None else "matrix"
            self.wfile.write(b'{"status":"success","data":{"resultType":"%s","result":[' % kind.encode())
            n = self.scenario["processes"]
            for i in range(n):
                self.wfile.write((b"," if i else b"") + b",".join(series_json(i, n, points)))
            self.wfile.write(b"]}}")
        except OSError:
            pass  # the reader stopped reading (its cap): as it may


def answer_of(mib: float) -> bytes:
    parts, size, i = [], 0, 0
    while size < mib * (1 << 20):
        for item in series_json(i, 10**6, None):
            parts.append(item)
            size += len(item) + 1
        i += 1
    return b'{"status":"success","data":{"resultType":"vector","result":[' + b",".join(parts) + b"]}}"


def measure(scenario: dict, args: argparse.Namespace, env: dict) -> dict:
    Handler.scenario = scenario
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    child = subprocess.Popen([sys.executable, "-c", CHILD, url], env=env, cwd=tempfile.gettempdir(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    limit = args.rss_limit_gb * 1e9
    highest, killed = 0, False
    try:
        while child.poll() is None:
            try:
                with open(f"/proc/{child.pid}/status") as f:
                    rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
            except (OSError, StopIteration):
                rss = 0
            highest = max(highest, rss)
            if rss > limit:
                child.kill()
                killed = True
                break
            time.sleep(0.05)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
        server.shutdown()
        server.server_close()
    if killed:
        return {"killed_over_gb": args.rss_limit_gb, "highest_rss_mb": round(highest / 1e6)}
    lines = out.strip().splitlines()
    if child.returncode or not lines:
        return {"failed": err.strip().splitlines()[-1:] if err else child.returncode,
                "highest_rss_mb": round(highest / 1e6)}
    got = json.loads(lines[-1])
    return {k: round(v) if isinstance(v, float) and k != "seconds" else v for k, v in got.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--processes", type=int, default=5000)
    p.add_argument("--answer-mib", type=float, default=60.0)
    p.add_argument("--rss-limit-gb", type=float, default=6.0, help="kill the reader past this RSS")
    p.add_argument("--only", choices=("processes", "answer"))
    p.add_argument("--pythonpath", help="run the reader against this jaxtop (e.g. an older tree)")
    args = p.parse_args()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    if args.only in (None, "processes"):
        res = measure({"processes": args.processes}, args, env)
        print(json.dumps({"scenario": f"{args.processes} processes", **res}), flush=True)
    if args.only in (None, "answer"):
        payload = answer_of(args.answer_mib)
        res = measure({"payload": payload}, args, env)
        print(json.dumps({"scenario": f"a valid answer of {len(payload) / (1 << 20):.1f} MiB", **res}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
