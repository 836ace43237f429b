"""Speed of `jaxtop export` (CSV and Perfetto) on a recording of the demo.

Records the demo workload (`python -m jaxtop.demo.worker --small --log`)
for --record-s seconds, then repeats its samples with shifted times and seq
numbers up to --samples samples (the recording stays a real one; only its
length is stretched), and times `jaxtop export` in both formats, each as a
fresh `python -m jaxtop export` process, as a user runs it: with the default
--jobs (the CPUs this process may use) and with --jobs 1, alternating, and
prints each median next to the floor measured in the same run (the standard
library decoding every line with json.loads, nothing else).

Target (issue 6): under 2 s per 100,000 samples.

    .venv/bin/python benchmarks/export.py                 # 100,000 samples
    .venv/bin/python benchmarks/export.py --recording my.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from jaxtop import export


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
    ap.add_argument("--runs", type=int, default=3, help="runs of each variant (default 3)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="jaxtop-export-bench-")
    try:
        run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the inputs are hundreds of MiB
    return 0


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
    print(f"input: {n:,} samples, {size / 2**20:.1f} MiB ({size / n:.0f} bytes a sample)")
    # The floor: only decoding every line with the standard library's json.
    started = time.perf_counter()
    with open(big, "rb") as f:
        for line in f:
            json.loads(line)
    floor = time.perf_counter() - started
    print(f"floor     {floor:6.2f} s  = {floor * 100_000 / n:.2f} s per 100,000 samples: json.loads of every line, nothing else")
    jobs = export.default_jobs()
    variants = [(fmt, j) for j in dict.fromkeys([jobs, 1]) for fmt in ("csv", "perfetto")]
    times: dict[tuple[str, int], list[float]] = {v: [] for v in variants}
    sizes: dict[str, int] = {}
    for r in range(args.runs):  # the variants alternate, so drifts of the VM hit each alike
        for fmt, j in variants if r % 2 == 0 else variants[::-1]:
            out = os.path.join(work, f"out.{fmt}")
            started = time.perf_counter()
            res = subprocess.run([sys.executable, "-m", "jaxtop", "export", big, "--format", fmt, "-j", str(j), "-o", out],
                                 capture_output=True, text=True)
            times[(fmt, j)].append(time.perf_counter() - started)
            if res.returncode != 0:
                raise SystemExit(res.stderr)
            sizes[fmt] = os.path.getsize(out)
    print(f"`jaxtop export` as a user runs it (a fresh process each run; {args.runs} runs, median; default --jobs {jobs}):")
    for fmt, j in variants:
        median = statistics.median(times[(fmt, j)])
        per_100k = median * 100_000 / n
        verdict = "meets" if per_100k < 2.0 else "MISSES"
        runs = " ".join(f"{t:.2f}" for t in times[(fmt, j)])
        print(f"{fmt:9s} -j {j}  {per_100k:5.2f} s per 100,000 samples ({verdict} the 2 s target)  "
              f"{median / floor:.2f}x the floor  [runs: {runs} s]  output {sizes[fmt] / 2**20:.1f} MiB")


if __name__ == "__main__":
    sys.exit(main())
