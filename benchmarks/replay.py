"""Replay of a big recording: first frame, seeks, the index.

    python benchmarks/replay.py                      # makes a 1 GB recording, then measures
    python benchmarks/replay.py --recording F.jsonl  # measures an existing one

The recording is synthetic (``jaxtop.testing.synthetic``: 8 GPU-shaped devices at
10 Hz, a 200-buffer memory map every 10th sample; 11 KB a sample, so 1 GB
is about 96,000 samples, 2 h 40 min). Side by side in one run:

* **before** — the replay as it was before the index (``--baseline``, a git
  revision): it read and decoded the whole file when opened, and a seek
  folded every record from the start (or from where it stood);
* **cold** — today's code, nothing kept: playback starts from the file at
  once while a separate process builds the index;
* **kept** — opened again: the index comes from the cache;
* the real app, ``jaxtop replay FILE`` in a 120x40 pseudo-terminal, cold
  and kept: seconds until the first frame that shows a device.

"First frame" at the source level is the model holding the first sample
(what the dashboard draws first). Every case runs in a fresh process; the
recording is in the page cache for all of them (it was just written or
read). Targets: first frame within 3 s, a seek anywhere within 1 s, the index
built in the background with progress shown, and invalidated when the
recording changes.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import shutil
import struct
import subprocess
import sys
import tempfile
import termios
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: The replay before the index (4 Dec 2026).
DEFAULT_BASELINE = "720de83"

# Runs in a child: measures one ReplaySource (today's or the baseline's).
_CHILD = r'''
import json, os, random, resource, sys, time
sys.path.insert(0, sys.argv[3])
path, which = sys.argv[1], sys.argv[2]
from jaxtop.dashboard.model import Model
if which == "before":
    import importlib.util
    spec = importlib.util.spec_from_file_location("replay_before", sys.argv[4])
    module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
    ReplaySource = module.ReplaySource
else:
    from jaxtop.dashboard.sources import ReplaySource
out = {}
t = time.perf_counter()
src = ReplaySource(path, start_playing=True)
out["open_s"] = time.perf_counter() - t
model = Model()
src.start(model, lambda: None)
while not model.processes.get(src.pid) or model.processes[src.pid].samples == 0:
    time.sleep(0.002)
out["first_frame_s"] = time.perf_counter() - t
src.toggle()
def times():
    if which == "before":
        return src._times[0], src._times[-1]
    return float(src.index.times[0]), float(src.index.times[-1])
if which != "before":
    out["from_cache"] = src.index is not None
    out["note"] = src.index_note
    if src.index is None:
        t0 = src.current_t()
        asked = time.perf_counter()
        src.seek_fraction(0.5)          # asked for before the index is in: kept
        progress = []
        while src.index is None and src.index_error is None:
            if src.indexing: progress.append(src.indexing[0])
            time.sleep(0.01)
        out["index_error"] = src.index_error
        out["indexed_s"] = time.perf_counter() - t
        while src.replay_state()["pending_seek"] is not None:
            time.sleep(0.002)
        out["kept_seek_done_s"] = time.perf_counter() - asked
        out["progress_reports"] = len(set(progress))
        out["indexer_peak_rss_mib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    out["records"] = src.length
start, end = times()
def timed(target):
    t = time.perf_counter(); src.seek(target); return time.perf_counter() - t
out["seek_middle_s"] = timed(start + (end - start) / 2)
out["seek_back_quarter_s"] = timed(start + (end - start) / 4)
out["seek_end_s"] = timed(end)
if which != "before":
    rng = random.Random(0)
    rand = sorted(timed(rng.uniform(start, end)) for _ in range(20))
    out["seek_random_median_s"], out["seek_random_max_s"] = rand[10], rand[-1]
out["span_s"] = end - start
out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
rollup = dict(l.split(":", 1) for l in open("/proc/self/smaps_rollup").read().splitlines()[1:])
out["rss_anon_mib"] = int(rollup["Anonymous"].split()[0]) / 1024  # the rest is mapped files: the index, libraries
src.stop()
print(json.dumps(out))
'''


def make_recording(path: str, gib: float) -> tuple[int, float]:
    """A synthetic 8-device recording of about ``gib`` GiB."""
    from jaxtop.wire import protocol
    from jaxtop.testing import synthetic

    t0 = time.time()
    n = 0
    with open(path, "wb") as f:
        f.write(protocol.encode(synthetic.hello(1, 8, 1.8e9, 0.1)))
        for rec in synthetic.samples(1, 8, 1.8e9, 10_000_000, 0.1):
            f.write(protocol.encode(rec))
            n += 1
            if n % 1000 == 0 and f.tell() >= gib * (1 << 30):
                break
    return n, time.time() - t0


def child(path: str, which: str, cache: str, before_file: str | None = None) -> dict:
    env = dict(os.environ, JAXTOP_CACHE_DIR=cache)
    argv = [sys.executable, "-c", _CHILD, path, which, ROOT] + ([before_file] if before_file else [])
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    if res.returncode != 0:
        raise SystemExit(f"{which}: child failed:\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def app_first_frame(path: str, cache: str, cols: int = 120, rows: int = 40, timeout: float = 60.0) -> tuple[float, bool]:
    """``jaxtop replay path`` in a pseudo-terminal: seconds until the screen
    shows a device, and whether "indexing" was on screen meanwhile."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = dict(os.environ, JAXTOP_CACHE_DIR=cache, TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows))
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "jaxtop", "replay", path], stdin=slave, stdout=slave, stderr=slave,
                            env=env, start_new_session=True, close_fds=True)
    os.close(slave)
    seen = b""
    first = None
    indexing = False
    try:
        while time.perf_counter() - t < timeout:
            try:
                data = os.read(master, 1 << 16)
            except OSError:
                break
            if not data:
                break
            seen = (seen + data)[-200_000:]
            if first is None and b"gpu:0" in seen:
                first = time.perf_counter() - t
            indexing = indexing or b"indexing" in seen
            if first is not None and (indexing or time.perf_counter() - t > first + 1.0):
                break
    finally:
        proc.kill()
        proc.wait()
        os.close(master)
    return (first if first is not None else float("nan")), indexing


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recording", help="an existing recording (else one is made)")
    ap.add_argument("--size-gb", type=float, default=1.0, help="size of the recording made (GiB)")
    ap.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision of the replay to compare with ('' for none)")
    ap.add_argument("--keep", action="store_true", help="keep the recording made")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="jaxtop-bench-replay-")
    try:
        path = args.recording
        if path is None:
            path = os.path.join(work, "big.jsonl")
            n, secs = make_recording(path, args.size_gb)
            print(f"recording: {n:,} samples, 8 devices, {os.path.getsize(path) / 1e9:.2f} GB, made in {secs:.0f} s ({path})")
        else:
            print(f"recording: {path}, {os.path.getsize(path) / 1e9:.2f} GB")
        before_file = None
        if args.baseline:
            before_file = os.path.join(work, "replay_before.py")
            src = subprocess.run(["git", "-C", ROOT, "show", f"{args.baseline}:jaxtop/dashboard/sources/replay.py"],
                                 capture_output=True, text=True)
            if src.returncode != 0:
                print(f"before: git show {args.baseline} failed ({src.stderr.strip()}); no baseline")
                before_file = None
            else:
                with open(before_file, "w") as f:
                    f.write(src.stdout)
        cache = os.path.join(work, "cache")
        rows = []
        if before_file:
            rows.append(("before", child(path, "before", cache, before_file)))
        cold = child(path, "today", cache)
        kept = child(path, "today", cache)
        rows += [("cold", cold), ("kept", kept)]
        keys = ["open_s", "first_frame_s", "indexed_s", "kept_seek_done_s", "seek_middle_s", "seek_back_quarter_s", "seek_end_s",
                "seek_random_median_s", "seek_random_max_s", "peak_rss_mib", "rss_anon_mib", "indexer_peak_rss_mib"]
        print(f"{'':24}" + "".join(f"{name:>10}" for name, _ in rows))
        for k in keys:
            cells = [r.get(k) for _, r in rows]
            if all(c is None for c in cells):
                continue
            print(f"{k:24}" + "".join(f"{c:10.2f}" if isinstance(c, (int, float)) else f"{'–':>10}" for c in cells))
        print(f"cold: {cold.get('note')}; progress reports while indexing: {cold.get('progress_reports')}")
        print(f"kept: {kept.get('note')}")
        index_files = [os.path.join(cache, "replay-index", f) for f in os.listdir(os.path.join(cache, "replay-index"))]
        index_bytes = sum(os.path.getsize(f) for f in index_files)
        print(f"index kept: {index_bytes / 1e6:.0f} MB ({index_bytes / os.path.getsize(path):.1%} of the recording)")

        app_cache = os.path.join(work, "app-cache")
        app_cold, showed_indexing = app_first_frame(path, app_cache)
        app_kept, _ = app_first_frame(path, cache)
        print(f"jaxtop replay in a 120x40 terminal: first frame {app_cold:.2f} s with nothing kept "
              f"(\"indexing\" on screen: {showed_indexing}), {app_kept:.2f} s with the index kept")

        # Invalidation: the recording grows by one sample.
        from jaxtop.wire import protocol
        from jaxtop.testing import synthetic

        grown = path
        if args.recording is not None:  # never write to the user's file: a copy, indexed first
            grown = os.path.join(work, "copy.jsonl")
            shutil.copyfile(path, grown)
            kept = child(grown, "today", cache)
        with open(grown, "ab") as f:
            f.write(protocol.encode(next(synthetic.samples(1, 8, 1.9e9, 1))))
        after = child(grown, "today", cache)
        changed = (not after["from_cache"]) and "changed" in (after.get("note") or "")
        print(f"after appending a sample: {after.get('note')}; {after['records']:,} records (was {kept['records']:,})")

        seeks = [kept[k] for k in ("seek_middle_s", "seek_back_quarter_s", "seek_end_s", "seek_random_max_s")]
        print()
        print(f"(3) first frame within 3 s: {verdict(max(app_cold, app_kept, cold['first_frame_s']) <= 3.0)} "
              f"(app {app_cold:.2f} s cold, {app_kept:.2f} s kept; before: {rows[0][1]['first_frame_s']:.2f} s at the source)"
              if before_file else f"(3) first frame within 3 s: {verdict(max(app_cold, app_kept) <= 3.0)}")
        print(f"(3) a seek anywhere within 1 s, index kept: {verdict(max(seeks) <= 1.0)} (slowest {max(seeks):.3f} s)")
        print(f"(3) cold: the index built in the background in {cold['indexed_s']:.1f} s, progress shown: "
              f"{verdict(cold['progress_reports'] > 1 and showed_indexing)}; a seek asked for at once landed "
              f"{cold['kept_seek_done_s']:.1f} s later")
        print(f"(3) the index is built again when the recording changes: {verdict(changed and after['records'] == kept['records'] + 1)}")
    finally:
        if args.keep and args.recording is None:
            print(f"kept {os.path.join(work, 'big.jsonl')}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
