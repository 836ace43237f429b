"""Speed of `jaxtop export` (CSV and Perfetto) on a recording of the demo:
typed decoding against orjson on every line.

Records the demo workload (`python -m jaxtop.demo.worker --small --log`)
for --record-s seconds, then repeats its samples with shifted times and seq
numbers up to --samples samples (the recording stays a real one; only its
length is stretched), and times the export in both formats, each run a
fresh Python process as a user runs `jaxtop export`, with the default --jobs
(the CPUs this process may use) and with --jobs 1, by two paths:

- typed: what `jaxtop export` runs (``fast=True``): msgspec decodes each
  sample into just the fields the writer writes (jaxtop/export/typed.py);
- orjson: every line decoded with orjson.loads (json.loads where orjson
  would read it otherwise) and written by the writers' plain path
  (``fast=False``).

(Until 4 Dec a third path, learned line layouts matched as text, served
between the two: 1.37 s for CSV and 1.53 s for Perfetto on one process where
the typed path took 0.94 s and 0.92 s; it was removed.)

All variants alternate within each round (the order reversed every other
round), so drifts of a noisy machine hit each alike; it prints each median,
the ratio to the typed path, and checks that every path wrote the same bytes.
For scale it also prints two floors measured in the same run: json.loads
and orjson.loads of every line, nothing else.

Target: under 1 s per 100,000 samples on one process (--jobs 1).

    .venv/bin/python benchmarks/export.py                 # 100,000 samples, 5 rounds
    .venv/bin/python benchmarks/export.py --recording my.jsonl --runs 7
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import orjson

from jaxtop import export

PATHS = ("typed", "orjson")

# What `jaxtop export FILE -o OUT` does, minus argument parsing, the same for
# both paths (the command line has no switch for the plain one).
RUNNER = """
import sys
from jaxtop import export
path, fmt, mode, jobs, out = sys.argv[1:]
write = export.write_csv if fmt == "csv" else export.write_perfetto
with open(out, "w", newline="") as f:
    write(path, f, fast=mode != "orjson", jobs=int(jobs))
"""


def record_demo(path: str, seconds: float) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "jaxtop.demo.worker", "--small", "--log", path],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(seconds)
    proc.terminate()
    proc.wait(timeout=30)


def stretch(src: str, dst: str, n_samples: int) -> int:
    """Repeat the samples of ``src`` (times and seq shifted) up to n_samples."""
    head, samples = [], []
    with open(src, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            rec = json.loads(line)
            (samples if rec.get("type") == "sample" else head).append(rec)
    if not samples:
        raise SystemExit(f"no samples in {src}")
    span = samples[-1]["t"] - samples[0]["t"] + 0.1
    with open(dst, "w") as out:
        for rec in head:
            if rec.get("type") != "exit":
                out.write(json.dumps(rec, separators=(",", ":")) + "\n")
        for k in range(n_samples):
            rec = dict(samples[k % len(samples)])
            lap = k // len(samples)
            rec["t"] = rec["t"] + lap * span
            rec["seq"] = k + 1
            out.write(json.dumps(rec, separators=(",", ":")) + "\n")
    return n_samples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recording", help="use this recording instead of recording the demo")
    ap.add_argument("--record-s", type=float, default=20.0)
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=5, help="rounds; each runs every variant once (default 5)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="jaxtop-export-bench-")
    try:
        run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the inputs are hundreds of MiB
    return 0


def floors(path: str, rounds: int) -> dict[str, list[float]]:
    """Seconds to decode every line of ``path`` with each library, alternating."""
    times: dict[str, list[float]] = {"json.loads": [], "orjson.loads": []}
    loads = {"json.loads": json.loads, "orjson.loads": orjson.loads}
    for r in range(rounds):
        for name in list(loads) if r % 2 == 0 else list(loads)[::-1]:
            decode = loads[name]
            started = time.perf_counter()
            with open(path, "rb") as f:
                for line in f:
                    decode(line)
            times[name].append(time.perf_counter() - started)
    return times


def run(args: argparse.Namespace, work: str) -> None:
    """Record (or take) a recording, stretch it, time the exports in ``work``."""
    src = args.recording
    if src is None:
        src = os.path.join(work, "demo.jsonl")
        print(f"recording the demo for {args.record_s:g} s …", flush=True)
        record_demo(src, args.record_s)
    big = os.path.join(work, "big.jsonl")
    n = stretch(src, big, args.samples)
    size = os.path.getsize(big)
    per_100k = 100_000 / n
    print(f"input: {n:,} samples, {size / 2**20:.1f} MiB ({size / n:.0f} bytes a sample)")
    floor = {name: statistics.median(t) for name, t in floors(big, 3).items()}
    for name, seconds in floor.items():
        print(f"floor {name:12s} {seconds * per_100k:5.2f} s per 100,000 samples: {name} of every line, nothing else")
    jobs = export.default_jobs()
    variants = [(fmt, j, path) for j in dict.fromkeys([jobs, 1]) for fmt in ("csv", "perfetto") for path in PATHS]
    times: dict[tuple[str, int, str], list[float]] = {v: [] for v in variants}
    digests: dict[tuple[str, int, str], str] = {}
    sizes: dict[str, int] = {}
    for r in range(args.runs):  # the variants alternate, so drifts of the machine hit each alike
        for fmt, j, path in variants if r % 2 == 0 else variants[::-1]:
            out = os.path.join(work, f"out.{fmt}")
            cmd = [sys.executable, "-c", RUNNER, big, fmt, path, str(j), out]
            started = time.perf_counter()
            res = subprocess.run(cmd, capture_output=True, text=True)
            times[(fmt, j, path)].append(time.perf_counter() - started)
            if res.returncode != 0:
                raise SystemExit(res.stderr)
            with open(out, "rb") as f:
                digests[(fmt, j, path)] = hashlib.sha256(f.read()).hexdigest()
            sizes[fmt] = os.path.getsize(out)
    same = all(digests[v] == digests[(v[0], jobs, "typed")] for v in variants)
    print(f"a fresh process each run; {args.runs} rounds, median; default --jobs {jobs}; "
          f"outputs byte-identical across paths and jobs: {'yes' if same else 'NO'}")
    for fmt, j, path in variants:
        median = statistics.median(times[(fmt, j, path)])
        verdict = ("meets" if median * per_100k < 1.0 else "MISSES") + " the 1 s target" if j == 1 else "-"
        runs = " ".join(f"{t:.2f}" for t in times[(fmt, j, path)])
        ratio = median / statistics.median(times[(fmt, j, "typed")])
        print(f"{fmt:9s} -j {j}  {path:8s} {median * per_100k:5.2f} s per 100,000 samples ({verdict})  "
              f"{ratio:.2f}x typed  {median / floor['json.loads']:.2f}x the json floor  [runs: {runs} s]  "
              f"output {sizes[fmt] / 2**20:.1f} MiB")
    if not same:
        raise SystemExit("the paths wrote different bytes")


if __name__ == "__main__":
    sys.exit(main())
