"""What one Prometheus scrape costs the process it is served from, and what
a job adds to a Prometheus server.

Two measurements, side by side in one run:

1. In process: the exposition of one agent with D devices (a GPU-shaped
   synthetic sample: every device gauge, NVML, transfers), built the way a
   scrape builds it (``generate_latest`` over the agent's collector), timed
   over many rounds on the scraping thread's CPU clock. It runs on a thread
   of the user's process and holds the GIL while it formats.
2. Over HTTP: a real agent (CPU, 2 devices) started with ``--prometheus``,
   scraped N times by this process, its own CPU time read from ``/proc``
   before and after: what the scrapes cost the target, all threads together.

Then the series a job puts into Prometheus: series per process x processes
/ scrape interval = samples per second ingested.

    .venv/bin/python benchmarks/scrape.py --devices 8 --rounds 2000
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from jaxtop.testing import synthetic  # noqa: E402
from jaxtop.wire import prometheus  # noqa: E402


def in_process(devices: int, rounds: int) -> tuple[float, int, int]:
    """(CPU seconds per scrape, bytes per scrape, series per process)."""
    from prometheus_client import generate_latest

    state = prometheus.StreamState()
    state.update(synthetic.hello(1, devices, 1000.0))
    state.update(next(synthetic.samples(1, devices, 1000.0, 1)))
    registry = prometheus.make_registry(state)
    body = generate_latest(registry)
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    for _ in range(20):
        generate_latest(registry)  # warm
    start = time.thread_time()
    for _ in range(rounds):
        generate_latest(registry)
    return (time.thread_time() - start) / rounds, len(body), series


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def over_http(scrapes: int) -> tuple[float, float]:
    """(target CPU seconds per scrape, idle CPU seconds per second): a real
    agent scraped ``scrapes`` times, against the same agent left alone."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = tempfile.mkdtemp()
    script = os.path.join(tmp, "idle.py")
    with open(script, "w") as f:
        f.write(textwrap.dedent("""
            import time, jax.numpy as jnp
            x = [jnp.ones(1000) for _ in range(100)]
            time.sleep(600)
        """))
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAXTOP_SOCKET_DIR=os.path.join(tmp, "sock"))
    proc = subprocess.Popen([sys.executable, "-m", "jaxtop", "run", "--prometheus", str(port), script], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if b"jaxtop_device_bytes_in_use" in urllib.request.urlopen(url, timeout=2).read():
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the agent did not serve metrics")
            time.sleep(0.2)
        time.sleep(2.0)
        idle_start, t0 = _cpu_s(proc.pid), time.monotonic()
        time.sleep(5.0)
        idle = (_cpu_s(proc.pid) - idle_start) / (time.monotonic() - t0)
        start, t0 = _cpu_s(proc.pid), time.monotonic()
        for _ in range(scrapes):
            urllib.request.urlopen(url, timeout=5).read()
            time.sleep(0.1)  # a scraper's pace, well within the endpoint's 200 connections/s
        spent = _cpu_s(proc.pid) - start - idle * (time.monotonic() - t0)
        return spent / scrapes, idle
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--scrapes", type=int, default=100)
    parser.add_argument("--interval", type=float, default=5.0, help="scrape interval for the job's figures (s)")
    args = parser.parse_args()
    cpu, nbytes, series = in_process(args.devices, args.rounds)
    print(f"one agent, {args.devices} devices: {series} series, {nbytes} bytes per scrape, "
          f"{cpu * 1e3:.2f} ms of CPU per scrape ({cpu / args.interval * 100:.3f} % of a core at one scrape "
          f"every {args.interval:g} s)")
    per_scrape, idle = over_http(args.scrapes)
    print(f"a real agent (CPU, 2 devices) over HTTP: {per_scrape * 1e3:.2f} ms of the target's CPU per scrape "
          f"(all its threads; the idle agent alone: {idle * 100:.2f} % of a core)")
    for hosts, per_host in ((64, 8), (256, 8)):
        total = series * hosts * per_host
        print(f"{hosts} hosts x {per_host} processes: {total:,} series, {total / args.interval:,.0f} samples/s "
              f"into Prometheus at a {args.interval:g} s interval")


if __name__ == "__main__":
    main()
