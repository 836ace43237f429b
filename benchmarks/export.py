"""Speed of `jaxtop export` (CSV and Perfetto), before and after, side by side.

    .venv/bin/python benchmarks/export.py                     # a 1 h 8-device recording, 5 rounds
    .venv/bin/python benchmarks/export.py --hours 0.25 --runs 3
    .venv/bin/python benchmarks/export.py --demo              # the demo, stretched to --samples samples
    .venv/bin/python benchmarks/export.py --recording my.jsonl --careful

The input, by default: ``--hours`` of a synthetic GPU job
(``jaxtop.testing.synthetic``: 8 devices at 10 Hz, a 200-buffer map of each
device every 10th sample; about 11 KB a sample, so 1 h is 36,000 samples,
390 MiB). ``--demo`` records the demo workload (`python -m jaxtop.demo.worker
--small --log`) for --record-s seconds and repeats its samples with shifted
times and seq numbers up to --samples samples (2 KB a sample: the recording
stays a real one, only its length is stretched).

Each run is a fresh Python process, as a user runs `jaxtop export FILE -o
OUT`, with the default --jobs (the CPUs this process may use, at most 8) and
with --jobs 1. The code exported with:

- before: the export of ``--baseline`` (a git revision; by default 1d95fde,
  the export before it decoded with the wire's types: its own msgspec
  structs, the rest by a dict path), taken with ``git archive`` into a
  temporary folder and put first on sys.path;
- after: this checkout's (what `jaxtop export` runs);
- after-careful (``--careful``): this checkout's with ``fast=False``: every
  line decoded whole (orjson) and taken field by field.

All variants alternate within each round (the order reversed every other
round), so drifts of a noisy machine hit each alike. Per variant it prints
the median wall time and the median CPU time of the process and its forked
pieces (user + system: steadier than wall time on a shared machine), the
speed-up of after over before by each, and checks that every variant wrote
the same bytes. For scale it also prints two floors measured in the same
run: json.loads and orjson.loads of every line, nothing else.

Target (the "one record, decoded once" refactor): after at least 2x faster
than before on the 1 h recording. The demo's target (4 Dec): under 1 s per
100,000 samples on one process (--jobs 1).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import orjson

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from jaxtop import export  # noqa: E402

#: The export before the wire's types (6 Dec 2026).
DEFAULT_BASELINE = "1d95fde"

# What `jaxtop export FILE -o OUT` does, minus argument parsing, with the
# export of the code at argv[1] (the command line has no switch for fast=False).
RUNNER = """
import sys
sys.path.insert(0, sys.argv[1])
from jaxtop import export
path, fmt, mode, jobs, out = sys.argv[2:]
write = export.write_csv if fmt == "csv" else export.write_perfetto
with open(out, "w", newline="", encoding="utf-8") as f:
    write(path, f, fast=mode != "careful", jobs=int(jobs))
"""


def synthetic_recording(path: str, hours: float, devices: int = 8) -> int:
    """``hours`` of a synthetic GPU job at 10 Hz; returns its samples."""
    from jaxtop.testing import synthetic
    from jaxtop.wire import protocol

    n = round(hours * 36_000)
    with open(path, "wb") as f:
        f.write(protocol.encode(synthetic.hello(1, devices, 1.8e9, 0.1)))
        for rec in synthetic.samples(1, devices, 1.8e9, n, 0.1):
            f.write(protocol.encode(rec))
    return n


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


def baseline_tree(revision: str, work: str) -> str | None:
    """The ``jaxtop`` package of ``revision`` in a folder of ``work``, or
    None (with a note) where git cannot give it."""
    where = os.path.join(work, "before")
    os.makedirs(where)
    archive = subprocess.run(["git", "-C", ROOT, "archive", revision, "jaxtop"], capture_output=True)
    if archive.returncode != 0:
        print(f"before: git archive {revision} failed ({archive.stderr.decode().strip()}); no baseline")
        return None
    subprocess.run(["tar", "-x", "-C", where], input=archive.stdout, check=True)
    return where


def floors(path: str, rounds: int) -> dict[str, list[float]]:
    """Seconds to decode every line of ``path`` with each library, alternating."""
    times: dict[str, list[float]] = {"json.loads": [], "orjson.loads": []}
    loads = {"json.loads": json.loads, "orjson.loads": orjson.loads}
    for r in range(rounds):
        for name in list(loads) if r % 2 == 0 else list(loads)[::-1]:
            decode = loads[name]
            started = time.perf_counter()
            with export.open_recording(path) as f:
                for line in f:
                    decode(line)
            times[name].append(time.perf_counter() - started)
    return times


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = ap.add_mutually_exclusive_group()
    source.add_argument("--hours", type=float, default=1.0, help="of the synthetic 8-device job (default 1)")
    source.add_argument("--demo", action="store_true", help="record the demo and stretch it to --samples")
    source.add_argument("--recording", help="use this recording")
    ap.add_argument("--record-s", type=float, default=20.0, help="--demo: seconds to record it")
    ap.add_argument("--samples", type=int, default=100_000, help="--demo: samples to stretch it to")
    ap.add_argument("--runs", type=int, default=5, help="rounds; each runs every variant once (default 5)")
    ap.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision of 'before' ('' for none)")
    ap.add_argument("--careful", action="store_true", help="also time this checkout's careful path (fast=False)")
    ap.add_argument("--formats", default="csv,perfetto", help="comma-separated (default csv,perfetto)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="jaxtop-export-bench-")
    try:
        run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the inputs are hundreds of MiB
    return 0


def run(args: argparse.Namespace, work: str) -> None:
    """Make (or take) a recording, time the exports in ``work``."""
    if args.recording:
        big = args.recording
        with export.open_recording(big) as f:
            n = max(1, sum(1 for line in f if b'"type":"sample"' in line[:40]))
    elif args.demo:
        src = os.path.join(work, "demo.jsonl")
        print(f"recording the demo for {args.record_s:g} s …", flush=True)
        record_demo(src, args.record_s)
        big = os.path.join(work, "big.jsonl")
        n = stretch(src, big, args.samples)
    else:
        big = os.path.join(work, "synthetic.jsonl")
        print(f"writing {args.hours:g} h of a synthetic 8-device job …", flush=True)
        n = synthetic_recording(big, args.hours)
    size = os.path.getsize(big)
    per_100k = 100_000 / n
    print(f"input: {n:,} samples, {size / 2**20:.1f} MiB ({size / n:,.0f} bytes a sample)")
    floor = {name: statistics.median(t) for name, t in floors(big, 3).items()}
    for name, seconds in floor.items():
        print(f"floor {name:12s} {seconds:6.2f} s ({seconds * per_100k:5.2f} s per 100,000 samples): "
              f"{name} of every line, nothing else")
    trees = {"after": ROOT}
    if args.baseline:
        before = baseline_tree(args.baseline, work)
        if before is not None:
            trees = {"before": before, "after": ROOT}
    codes = [(name, "fast") for name in trees] + ([("after", "careful")] if args.careful else [])
    jobs = export.default_jobs()
    fmts = args.formats.split(",")
    variants = [(fmt, j, code, mode) for fmt in fmts for j in dict.fromkeys([jobs, 1]) for code, mode in codes]
    wall: dict[tuple[str, int, str, str], list[float]] = {v: [] for v in variants}
    cpu: dict[tuple[str, int, str, str], list[float]] = {v: [] for v in variants}
    digests: dict[tuple[str, int, str, str], str] = {}
    sizes: dict[str, int] = {}
    for r in range(args.runs):  # the variants alternate, so drifts of the machine hit each alike
        for v in variants if r % 2 == 0 else variants[::-1]:
            fmt, j, code, mode = v
            out = os.path.join(work, f"out.{fmt}")
            cmd = [sys.executable, "-c", RUNNER, trees[code], big, fmt, mode, str(j), out]
            cpu_before = children_cpu()
            started = time.perf_counter()
            res = subprocess.run(cmd, capture_output=True, text=True)
            wall[v].append(time.perf_counter() - started)
            cpu[v].append(children_cpu() - cpu_before)
            if res.returncode != 0:
                raise SystemExit(f"{v}: {res.stderr}")
            with open(out, "rb") as f:
                digests[v] = hashlib.sha256(f.read()).hexdigest()
            sizes[fmt] = os.path.getsize(out)
    same = all(digests[v] == digests[(v[0], jobs, "after", "fast")] for v in variants)
    print(f"a fresh process each run; {args.runs} rounds, median; default --jobs {jobs}; "
          f"outputs byte-identical across code, paths and jobs: {'yes' if same else 'NO'}")
    for v in variants:
        fmt, j, code, mode = v
        w, c = statistics.median(wall[v]), statistics.median(cpu[v])
        name = code if mode == "fast" else f"{code}-{mode}"
        line = (f"{fmt:9s} -j {j}  {name:14s} wall {w:6.2f} s  cpu {c:6.2f} s  "
                f"({w * per_100k:5.2f} s wall per 100,000 samples, {w / floor['json.loads']:.2f}x the json floor)")
        if code == "after" and "before" in trees:
            b = (fmt, j, "before", "fast")
            line += (f"  before/after: {statistics.median(wall[b]) / w:.2f}x wall, "
                     f"{statistics.median(cpu[b]) / c:.2f}x cpu")
        if args.demo and j == 1 and code == "after" and mode == "fast":
            line += "  meets the 1 s target" if w * per_100k < 1.0 else "  MISSES the 1 s target"
        print(f"{line}  [wall: {' '.join(f'{t:.2f}' for t in wall[v])} s]  output {sizes[fmt] / 2**20:.1f} MiB")
    if not same:
        raise SystemExit("the variants wrote different bytes")


if __name__ == "__main__":
    sys.exit(main())
