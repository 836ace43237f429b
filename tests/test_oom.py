"""OOM census: parsers, the census's parts, the hooks, the report, the screen.

The slow tests run tests/targets/oom_hold.py for real: an address-space
limit makes a 2 GiB request fail on CPU with RESOURCE_EXHAUSTED while the
program holds known arrays made at known lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jaxtop.probes import oom
from jaxtop.probes.oom import (
    AllocatorLog, OomLineScanner, OomMonitor, build_census, device_verdict, group_live_arrays, host_verdict,
    parse_allocator_line, parse_oom_message, parse_size,
)
from jaxtop.wire.records import OomCensus, decode, from_dict
from jaxtop.wire.units import fmt_bytes

TARGETS = Path(__file__).parent / "targets"
HOLD = TARGETS / "oom_hold.py"
ROOT = Path(__file__).resolve().parent.parent
MiB, GiB = 1 << 20, 1 << 30

#: How a comprehension's frame is named (Python < 3.12 runs it in a frame of its own).
LISTCOMP = ".<listcomp>" if sys.version_info < (3, 12) else ""


def decoded(census: dict) -> OomCensus:
    """A census as the dashboard and ``jaxtop oom`` read it, through both of
    the decoder's paths: every part the agent writes has its declared type
    (jaxtop.wire.records.oom), so nothing is noted as odd."""
    line = json.dumps(census)
    fast, careful = decode(line), from_dict(json.loads(line))
    assert isinstance(fast, OomCensus) and not fast.odd, fast.odd
    assert careful == fast
    return fast


def marker_line(path: Path, marker: str) -> int:
    """The line number of the line holding ``# MARKER`` in ``path``."""
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if f"# {marker}" in line:
            return n
    raise AssertionError(f"{marker} not in {path}")


@pytest.fixture(autouse=True)
def no_monitor_left():
    """Every test leaves the process's hooks as it found them."""
    hooks = (sys.excepthook, threading.excepthook)
    yield
    oom.uninstall()
    assert (sys.excepthook, threading.excepthook) == hooks


# ---------------------------------------------------------------------------
# Sizes and messages
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("2147483648", 2147483648), ("2147483648 bytes", 2147483648), ("1.00GiB", GiB), ("512B", 512),
    ("1.5KiB", 1536), ("11.04G", round(11.04 * GiB)), ("3 MiB", 3 * MiB), ("16.00GiB", 16 * GiB), ("0B", 0),
    ("lots", None), ("", None), (None, None),
])
def test_parse_size_reads_xla_sizes(text, expected):
    assert parse_size(text) == expected


def test_the_census_reads_sizes_with_the_one_formatter():
    # One formatter, so the census reads as every panel does ("3.10 GiB").
    assert fmt_bytes(3.1 * GiB) == "3.10 GiB" and fmt_bytes(None) == "n/a"
    assert not hasattr(oom, "human_bytes")  # the old second name is gone


@pytest.mark.parametrize("text,form,nbytes,ordinal", [
    # CPU (jaxlib's TFRT client), as the exception reads in a traceback.
    ("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory allocating 2147483648 bytes.", "cpu", 2147483648, None),
    # GPU: stream executor, and the device allocator with its ordinal.
    ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.", "gpu", 17179869184, None),
    ("RESOURCE_EXHAUSTED: Failed to allocate request for 4.00GiB (4294967296B) on device ordinal 1", "gpu", 4294967296, 1),
    # TPU: human sizes.
    ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 11.04G.", "tpu", round(11.04 * GiB), None),
    (("RESOURCE_EXHAUSTED: Attempting to reserve 12.50G at the bottom of memory. That was not possible. "
      "There are 9.98G free, 0B reserved, and 9.98G reservable."), "tpu", round(12.5 * GiB), None),
])
def test_parse_oom_message_reads_each_backend(text, form, nbytes, ordinal):
    got = parse_oom_message(text)
    assert got is not None and got["form"] == form and got["bytes"] == nbytes and got["device_ordinal"] == ordinal


def test_parse_oom_message_tpu_compile_and_unknown_and_unrelated():
    got = parse_oom_message("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory "
                            "space hbm. Used 20.50G of 15.48G hbm. Exceeded hbm capacity by 5.02G.")
    assert got["form"] == "tpu_compile" and got["bytes"] is None
    assert got["capacity_bytes"] == round(15.48 * GiB) and got["over_bytes"] == round(5.02 * GiB)
    vague = parse_oom_message("RESOURCE_EXHAUSTED: something new ran dry")
    assert vague is not None and vague["bytes"] is None and vague["form"] == "unknown"
    assert parse_oom_message("INTERNAL: Failed to open libtpu.so") is None
    assert parse_oom_message("") is None


# Realistic allocator output, written from XLA's bfc_allocator.cc and
# allocator.cc: the failure (older and newer wording), its continuation
# lines, the INFO dump (shown when INFO logs are on), the occupancy picture,
# then PJRT's error line.
GPU_STDERR = (
    "step 100 loss 0.25\n"
    "Limit: 5 retries\n"  # the program's own words: never reported
    "W1203 19:09:21.852989   12345 bfc_allocator.cc:528] Allocator (GPU_0_bfc) ran out of memory trying to allocate "
    "16.00GiB (rounded to 17179869184) from the lower end requested by op jit(train_step)/dot_general\n"
    "If this is caused by memory fragmentation, the environment variable 'TF_GPU_ALLOCATOR=cuda_malloc_async' "
    "may improve the situation.\n"
    "Current allocation summary follows.\n"
    "I1203 19:09:21.853201   12345 bfc_allocator.cc:1074] BFCAllocator dump for GPU_0_bfc\n"
    "I1203 19:09:21.853210   12345 bfc_allocator.cc:1081] Bin (256): \tTotal Chunks: 12, Chunks in use: 11. 3.0KiB "
    "allocated for chunks. 2.8KiB in use in bin. 1.2KiB client-requested in use in bin.\n"
    "I1203 19:09:21.853299   12345 bfc_allocator.cc:1121] InUse at 7f2a40000000 of size 2147483648 tag 0 next 5\n"
    "I1203 19:09:21.853300   12345 bfc_allocator.cc:1121] Free  at 7f2ac0000000 of size 431964160 tag 0 next 6\n"
    "I1203 19:09:21.853400   12345 bfc_allocator.cc:1148] 36 Chunks of size 2147483648 totalling 72.00GiB\n"
    "I1203 19:09:21.853401   12345 bfc_allocator.cc:1152] Sum Total of in-use chunks: 74.50GiB\n"
    "I1203 19:09:21.853402   12345 bfc_allocator.cc:1168] Allocator memory summary: rounded request 16.00GiB, total "
    "free in pool 3.12GiB, largest free chunk usable by lower end 412.00MiB, unallocated bytes 0B, pool size "
    "77.62GiB, pool limit 77.62GiB\n"
    "I1203 19:09:21.853403   12345 bfc_allocator.cc:1199] Stats: \n"
    "Limit:                        77.62GiB\n"
    "InUse:                        74.50GiB\n"
    "MaxInUse:                     75.00GiB\n"
    "NumAllocs:                        1234\n"
    "MaxAllocSize:                  2.00GiB\n"
    "Reserved:                           0B\n"
    "PeakReserved:                       0B\n"
    "LargestFreeBlock:            412.00MiB\n"
    "\n"
    "W1203 19:09:21.853500   12345 bfc_allocator.cc:540] " + "*" * 96 + "____\n"
    "E1203 19:09:21.853600   12345 pjrt_stream_executor_client.cc:3084] Execution of replica 0 failed: "
    "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.\n"
    "step 101 loss 0.24\n"
)
# The older jaxlib's TSL header and wording (no "from the ... end", no space
# before "requested").
GPU_OLD_LINE = ("2026-12-03 19:09:21.852989: W external/xla/xla/tsl/framework/bfc_allocator.cc:497] Allocator "
                "(GPU_1_bfc) ran out of memory trying to allocate 1.00GiB (rounded to 1073741824)requested by op ")
GPU_NOT_FAILURE = ("W1203 19:09:21.000001   12345 bfc_allocator.cc:290] Allocator (GPU_0_bfc) ran out of memory "
                   "trying to allocate 3.46GiB from the lower end with freed_by_count=0. The caller indicates that "
                   "this is not a failure, but this may mean that there could be performance gains if more memory "
                   "were available.")


def test_gpu_allocator_lines_parse():  # (c)
    failure = parse_allocator_line(GPU_STDERR.splitlines()[2])
    assert failure["kind"] == "failure"
    req = failure["request"]
    assert req["bytes"] == 16 * GiB and req["rounded_bytes"] == 17179869184
    assert req["allocator"] == "GPU_0_bfc" and req["device_ordinal"] == 0 and req["op"] == "jit(train_step)/dot_general"
    old = parse_allocator_line(GPU_OLD_LINE)
    assert old["kind"] == "failure" and old["request"]["rounded_bytes"] == GiB
    assert old["request"]["device_ordinal"] == 1 and old["request"]["op"] is None
    assert parse_allocator_line(GPU_NOT_FAILURE)["kind"] == "not_a_failure"
    assert parse_allocator_line("LargestFreeBlock:            412.00MiB") == {
        "kind": "stat", "key": "largest_free_block_bytes", "bytes": 412 * MiB}
    assert parse_allocator_line("NumAllocs:                        1234")["bytes"] == 1234
    error = parse_allocator_line(GPU_STDERR.splitlines()[-2])
    assert error["kind"] == "error" and error["request"]["bytes"] == 17179869184
    assert parse_allocator_line("step 100 loss 0.25") is None


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096, None])
def test_scanner_reports_the_allocator_lines_however_stderr_is_cut(chunk):  # (c)
    data = GPU_STDERR.encode()
    scanner = OomLineScanner()
    reported: list[bytes] = []
    if chunk is None:
        reported += scanner.feed(data)
    else:
        for i in range(0, len(data), chunk):
            reported += scanner.feed(data[i:i + chunk])
    reported += scanner.finish()
    text = [r.decode() for r in reported]
    assert len(text) == 13, text
    assert "ran out of memory trying to allocate 16.00GiB" in text[0]
    assert not any(t.startswith("Limit: 5") or "step 10" in t or "InUse at" in t or "Bin (256)" in t for t in text)
    assert [t.split(":")[0] for t in text[3:11]] == [
        "Limit", "InUse", "MaxInUse", "NumAllocs", "MaxAllocSize", "Reserved", "PeakReserved", "LargestFreeBlock"]
    assert text[11].endswith("*" * 96 + "____") and "RESOURCE_EXHAUSTED" in text[12]
    # The lines go to the agent, which builds the allocator's account of the failure.
    log = AllocatorLog()
    for line in text:
        log.add(line)
    event = log.latest()
    assert event["request"]["rounded_bytes"] == 17179869184
    assert event["stats"]["bytes_limit"] == round(77.62 * GiB) and event["stats"]["largest_free_block_bytes"] == 412 * MiB
    assert event["summary"]["free"] == round(3.12 * GiB) and event["occupancy"].startswith("****")
    assert event["errors"] == [("Execution of replica 0 failed: RESOURCE_EXHAUSTED: Out of memory while trying "
                                "to allocate 17179869184 bytes.")]
    log_part = decoded({"type": "oom_census", "allocator_log": event}).allocator_log
    assert log_part.stats.largest_free_block_bytes == 412 * MiB and log_part.summary.free == round(3.12 * GiB)
    assert log_part.in_use_total_bytes == round(74.5 * GiB) and log_part.errors == event["errors"]


FIXTURES_OOM = Path(__file__).parent / "fixtures" / "oom_lines"


def _through_the_relay(data: bytes, chunk: int) -> tuple[bytes, list[str]]:
    """What the stderr relay forwards, and the allocator lines it reports."""
    import tempfile

    from jaxtop.probes._relay import Relay

    report_r, report_w = os.pipe()
    with tempfile.TemporaryFile() as out:
        relay = Relay(out.fileno(), report_w, b"tok", set())
        for i in range(0, len(data), chunk):
            relay.feed(data[i:i + chunk])
        relay.finish()
        os.close(report_w)
        reports = b""
        while True:
            part = os.read(report_r, 65536)
            if not part:
                break
            reports += part
        os.close(report_r)
        out.seek(0)
        forwarded = out.read()
    return forwarded, [line[2:].decode() for line in reports.splitlines() if line.startswith(b"O ")]


@pytest.mark.parametrize("chunk", [5, 4096])
def test_recorded_gpu_allocator_lines_through_the_relay(chunk):
    # Lines JAX users recorded on real GPUs (tests/fixtures/oom_lines/README.md).
    data = (FIXTURES_OOM / "cuda_async_abseil.txt").read_bytes()
    forwarded, lines = _through_the_relay(data, chunk)
    assert forwarded == data  # the user's stderr is untouched
    log = AllocatorLog()
    for line in lines:
        log.add(line)
    event = log.latest()
    req = event["request"]
    assert (req["form"], req["allocator"], req["device_ordinal"], req["bytes"]) == (
        "gpu_cuda_async", "gpu_async_1", 1, 1225195446464)
    assert event["stats"] == {"bytes_in_use": 61982909300, "peak_bytes_in_use": 61982909300, "num_allocs": 21841,
                              "largest_alloc_size": 59743666176}  # its printed 0s are "not tracked", not measured
    assert event["cuda"] == {"free_bytes": 22635544576, "total_bytes": 85095874560}
    log_part = decoded({"type": "oom_census", "allocator_log": event}).allocator_log
    assert (log_part.cuda.free_bytes, log_part.request.form) == (22635544576, "gpu_cuda_async")
    assert log_part.stats.items() == (("bytes_in_use", 61982909300), ("peak_bytes_in_use", 61982909300),
                                      ("num_allocs", 21841), ("largest_alloc_size", 59743666176))

    data = (FIXTURES_OOM / "bfc_not_a_failure_tsl.txt").read_bytes()
    forwarded, lines = _through_the_relay(data, chunk)
    assert forwarded == data
    log = AllocatorLog()
    for line in lines:
        log.add(line)
    assert log.latest() is None and log.not_failures == 3  # the caller coped: no census


def test_scanner_ignores_plain_output_cheaply():
    scanner = OomLineScanner()
    block = b"epoch 1 step 2 loss 0.5 Limit: 3\n" * 2000
    started = time.perf_counter()
    for _ in range(100):
        assert scanner.feed(block) == []
    # Two substring searches per block: far below what the relay spends reading it.
    assert (time.perf_counter() - started) / 100 < 0.002
    assert scanner.feed(b"not a failure: Allocator (GPU_0_bfc) ran out of memory trying to allocate 1B") == []
    assert scanner.finish() == [b"not a failure: Allocator (GPU_0_bfc) ran out of memory trying to allocate 1B"]


def test_scanner_runs_where_the_relay_does():
    # The relay is `python -S -E -s probes/_relay.py`: it imports this module
    # by file name, without site-packages, and it must stay cheap to start.
    code = ("import sys, time; t = time.perf_counter(); import oom; "
            "s = oom.OomLineScanner(); print(s.feed(b'x: Out of memory y\\n'), "
            "'typing' in sys.modules, round(time.perf_counter() - t, 4))")
    out = subprocess.run([sys.executable, "-S", "-E", "-s", "-c", code], cwd=ROOT / "probes",
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    _, typing_loaded, _ = out.stdout.split()[-3:]
    assert "Out of memory" in out.stdout and typing_loaded == "False"


# ---------------------------------------------------------------------------
# Verdicts
# ---------------------------------------------------------------------------

def test_device_verdict_tells_fragmentation_from_a_full_pool():
    frag = {"bytes_in_use": int(76 * GiB), "bytes_limit": int(79.1 * GiB), "pool_bytes": int(79.1 * GiB),
            "largest_free_block_bytes": int(0.4 * GiB)}
    assert device_verdict(frag, GiB) == ("fragmentation: 3.10 GiB free in the pool but the largest free block is "
                                         "410 MiB; the request was 1.00 GiB")
    full = {"bytes_in_use": int(78.2 * GiB), "bytes_limit": int(79.1 * GiB), "pool_bytes": int(79.1 * GiB),
            "largest_free_block_bytes": int(0.9 * GiB)}
    assert device_verdict(full, 2 * GiB).startswith("the pool is full: 78.2 of 79.1 GiB in use; the request of "
                                                    "2.00 GiB needed 1.10 GiB more")
    # Without a known request, BFC's own fragmentation measure decides.
    assert device_verdict(frag).startswith("fragmentation:")
    assert device_verdict(full).startswith("the pool is full")
    assert device_verdict(None) is None


def test_host_verdict_names_the_limit_that_applies():
    host = {"rss_bytes": int(1.2 * GiB), "vms_bytes": int(2.9 * GiB), "rlimit_as_bytes": 3 * GiB, "mem_total_bytes": 64 * GiB}
    text = host_verdict(host, 900 * MiB, 2 * GiB)
    assert text == ("live arrays hold 900 MiB of the process's RSS 1.20 GiB; limit 3.00 GiB (RLIMIT_AS; 2.90 GiB of "
                    "address space in use); the request was 2.00 GiB")
    text = host_verdict({"rss_bytes": GiB, "mem_total_bytes": 64 * GiB, "mem_available_bytes": GiB}, 0)
    assert "limit 64.0 GiB (MemTotal; 1.00 GiB available)" in text


# ---------------------------------------------------------------------------
# The census's parts, in this process
# ---------------------------------------------------------------------------

def _make_for_sites(jnp):
    return [jnp.full((1024,), i, jnp.int32) for i in range(3)]  # SITES_LINE


def test_arrays_grouped_once_per_buffer_and_sites_at_the_users_line():
    import jax
    import jax.numpy as jnp
    from jaxtop.probes.oom import allocation_sites

    from jaxtop.probes.jax_memory import addresses_askable

    held = _make_for_sites(jnp)
    jax.block_until_ready(held)
    # A second Array object on the same buffer: listed twice by jax, counted once.
    alias = jax.device_put(held[0], held[0].sharding)
    put_line = sys._getframe().f_lineno - 1
    assert alias is not held[0]
    live = [a for a in jax.live_arrays() if a.shape == (1024,) and a.dtype == jnp.int32]
    groups = group_live_arrays(live)
    if addresses_askable():
        assert alias.unsafe_buffer_pointer() == held[0].unsafe_buffer_pointer()
        assert groups["aliases"] == len(live) - 3 >= 1
        assert groups["groups"] == [{"shape": [1024], "dtype": "int32", "placement": "cpu:0", "count": 3,
                                     "bytes": 3 * 4096, "bytes_each": 4096}]
    else:
        # Before jaxlib 0.10.1 only a new Array would tell the addresses: the
        # census asks none, and an alias made by device_put counts apart.
        assert len(live) == 4 and groups["aliases"] == 0
        assert groups["groups"][0]["count"] == 4
    sites = allocation_sites(jax.profiler.device_memory_profile(), top=1000)
    line = marker_line(Path(__file__), "SITES_LINE")
    site = next(s for s in sites["top"] if s["file"] == __file__ and s["line"] == line)
    # Named as every probe names it (jaxtop.probes.frames): after the function
    # the comprehension is written in, and, before Python 3.12, as one.
    assert site["site"] == f"test_oom.py:{line} in _make_for_sites{LISTCOMP}"
    # jax 0.4.30's profile names a shared buffer by its newest Array (the
    # device_put line) where 0.10.2's names its first: the buffers here
    # number 3 either way.
    at_put_line = sum(s["count"] for s in sites["top"] if s["file"] == __file__ and s["line"] == put_line)
    assert site["count"] + at_put_line == 3 and site["count"] * 4096 == site["bytes"] and site["user"]
    del alias, held, live


class _SlowArray:
    """Stands in for a jax Array whose attributes take time."""

    def __init__(self, delay):
        self.delay = delay

    @property
    def shape(self):
        time.sleep(self.delay)
        return (4,)


def test_grouping_stops_at_its_deadline_and_says_how_many_it_left():
    arrays = [_SlowArray(0.0002) for _ in range(5000)]
    started = time.perf_counter()
    got = group_live_arrays(arrays, deadline=started + 0.05)
    assert time.perf_counter() - started < 0.5
    assert not got["complete"] and 0 < got["not_scanned"] < 5000


def test_timeline_keeps_the_climb():
    t0 = 1000.0
    records = [{"type": "sample", "t": t0 + i, "devices": [{"id": 0, "bytes_in_use": i * MiB}],
                "process": {"rss_bytes": 100 * MiB + i}} for i in range(300)]
    records.insert(5, {"type": "hello", "t": t0})
    tl = oom.timeline_from_records(records, until=t0 + 299, span_s=60, points=50)
    assert len(tl["t"]) == 50 and tl["t"][-1] == t0 + 299 and tl["t"][0] >= t0 + 239
    assert tl["bytes_in_use"]["0"][-1] == 299 * MiB and tl["rss_bytes"][-1] == 100 * MiB + 299


def test_build_census_in_process_is_complete_and_json(tmp_path):
    import jax.numpy as jnp

    held = jnp.ones((256, 1024), jnp.float32)
    census = build_census(message="RESOURCE_EXHAUSTED: Out of memory allocating 2147483648 bytes.",
                          trigger={"how": "manual"}, budget_s=5.0, records=[])
    assert census["type"] == "oom_census" and census["complete"] and not census["errors"]
    assert census["request"]["bytes"] == 2147483648
    assert census["arrays"]["bytes"] >= held.nbytes
    assert census["verdict"].startswith("live arrays hold")
    path = oom.write_census(census, str(tmp_path))
    assert oom.FILE_NAME.fullmatch(os.path.basename(path))
    assert json.loads(Path(path).read_text())["id"] == census["id"]
    typed = decoded(json.loads(Path(path).read_text()))
    assert typed.arrays.bytes == census["arrays"]["bytes"] and typed.request.bytes == 2147483648
    assert typed.devices and typed.devices[0].source == "live_arrays" and typed.host.rss_bytes


# ---------------------------------------------------------------------------
# The monitor: hooks, rate limit, the stream
# ---------------------------------------------------------------------------

class FakeAgent:
    """The agent's public surface the monitor uses."""

    running = True
    interval_s = 0.1
    memory = None

    def __init__(self):
        self.fields = {}
        self.events = []

    def register_sample_field(self, name, fn):
        self.fields[name] = fn

    def post_event(self, kind, **fields):
        self.events.append((kind, fields))

    def transfer_totals(self, sync_timeout_s=0.0):
        return {}


def _oom_error(nbytes=123):
    try:
        raise RuntimeError(f"RESOURCE_EXHAUSTED: Out of memory allocating {nbytes} bytes.")
    except RuntimeError as exc:
        return exc


def test_excepthook_chains_and_says_where_the_census_is(tmp_path, capsys):
    calls = []
    previous = sys.excepthook
    sys.excepthook = lambda *args: calls.append(args)
    try:
        agent = FakeAgent()
        monitor = oom.install(agent, directory=str(tmp_path))
        exc = _oom_error()
        sys.excepthook(type(exc), exc, exc.__traceback__)
        assert calls == [(type(exc), exc, exc.__traceback__)]  # the previous hook, same arguments
        census = monitor.censuses[-1]
        assert census["trigger"]["how"] == "uncaught" and census["trigger"]["uncaught"]
        assert census["trigger"]["raised_at"]["function"] == "_oom_error"
        assert Path(census["path"]).exists()
        assert capsys.readouterr().err == (f"jaxtop: out of memory: census written to {census['path']} "
                                           f"(read it with: jaxtop oom {census['path']})\n")
        # A non-OOM exception only passes through.
        other = ValueError("nope")
        sys.excepthook(ValueError, other, None)
        assert calls[-1] == (ValueError, other, None) and len(monitor.censuses) == 1
        # The census goes to the agent's stream once, as a record of its own.
        records = monitor.take_records()
        assert [r["id"] for r in records] == [census["id"]] and monitor.take_records() == []
        typed = decoded(records[0])
        assert typed.path == census["path"] and typed.trigger.raised_at.function == "_oom_error"
        assert not agent.fields  # never a sample field
        assert agent.events[0][0] == "oom" and census["path"] in agent.events[0][1]["text"]
        oom.uninstall()
        assert sys.excepthook.__name__ == "<lambda>"
    finally:
        sys.excepthook = previous


def test_a_wrapped_oom_is_found_through_its_cause(tmp_path):
    monitor = oom.install(None, directory=str(tmp_path), note=False)
    try:
        try:
            raise _oom_error(4096)
        except RuntimeError as inner:
            raise KeyError("step failed") from inner
    except KeyError as outer:
        census = monitor._on_uncaught(outer, outer.__traceback__, "MainThread")
    assert census["request"]["bytes"] == 4096 and census["trigger"]["reported_as"] == "KeyError"


def test_threading_excepthook_takes_the_census_and_chains(tmp_path):
    seen = []
    previous = threading.excepthook
    threading.excepthook = lambda args: seen.append(args.exc_type)
    try:
        monitor = oom.install(None, directory=str(tmp_path), note=False)

        def work():
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 64 bytes.")

        t = threading.Thread(target=work, name="loader")
        t.start()
        t.join()
        assert seen == [RuntimeError]
        assert monitor.censuses[-1]["trigger"]["thread"] == "loader"
    finally:
        oom.uninstall()
        threading.excepthook = previous


def test_jax_error_is_seen_when_made_even_if_caught(tmp_path, monkeypatch):
    import jax

    monkeypatch.setattr(oom.monitor, "MIN_INTERVAL_S", 0.0)
    cls = getattr(jax.errors, "JaxRuntimeError", None) or jax.lib.xla_client.XlaRuntimeError  # its name before jax 0.4.3x
    before = cls.__dict__.get("__init__")
    monitor = oom.install(None, directory=str(tmp_path), note=False)
    assert monitor._patched
    try:
        raise cls("RESOURCE_EXHAUSTED: Out of memory allocating 2147483648 bytes.")  # MADE_LINE
    except cls as exc:
        caught = exc
    census = monitor.censuses[-1]
    assert census["trigger"]["how"] == "raised" and not census["trigger"]["uncaught"]
    assert census["trigger"]["raised_at"]["line"] == marker_line(Path(__file__), "MADE_LINE")
    assert str(caught) == "RESOURCE_EXHAUSTED: Out of memory allocating 2147483648 bytes."
    cls("INTERNAL: not memory")  # other runtime errors: nothing
    assert len(monitor.censuses) == 1
    oom.uninstall()
    assert cls.__dict__.get("__init__") is before


def test_rate_limit_counts_what_it_skipped(tmp_path, monkeypatch):
    monitor = OomMonitor(None, directory=str(tmp_path), note=False, profile=False)
    monitor.installed = True
    for _ in range(3):
        monitor.census("RESOURCE_EXHAUSTED: Out of memory allocating 1 bytes.", {"how": "raised"})
    assert len(monitor.censuses) == 1 and monitor.suppressed == 2
    # An uncaught OOM is taken even within the interval: the program ends.
    fatal = monitor.census("RESOURCE_EXHAUSTED: Out of memory allocating 1 bytes.", {"how": "uncaught"}, force=True)
    assert fatal is not None and fatal["suppressed_before"] == 2
    assert decoded(fatal).suppressed_before == 2
    monkeypatch.setattr(oom.monitor, "MIN_INTERVAL_S", 0.0)
    for _ in range(10):
        monitor.census("RESOURCE_EXHAUSTED: Out of memory allocating 1 bytes.", {"how": "raised"})
    assert len(monitor.censuses) == oom.MAX_CENSUSES
    assert len(list(tmp_path.glob("jaxtop-oom-*.json"))) == oom.MAX_CENSUSES


def test_allocator_line_without_an_exception_brings_a_census_on_the_agent_thread(tmp_path, monkeypatch):
    monkeypatch.setattr(oom.monitor, "GRACE_S", 0.0)
    agent = FakeAgent()
    monitor = OomMonitor(agent, directory=str(tmp_path), note=False, profile=False)
    monitor.installed = True
    assert monitor.take_records() == []  # the agent takes records: no census rides in samples
    for line in GPU_STDERR.splitlines():
        monitor.on_allocator_line(line)
    records = monitor.take_records()
    assert len(records) == 1
    census = records[0]
    assert census["type"] == "oom_census" and census["trigger"]["how"] == "allocator_log"
    assert census["request"]["rounded_bytes"] == 17179869184 and census["request"]["allocator"] == "GPU_0_bfc"
    assert census["allocator_log"]["stats"]["largest_free_block_bytes"] == 412 * MiB
    assert monitor.take_records() == []
    typed = decoded(census)
    assert typed.allocator_log.stats.largest_free_block_bytes == 412 * MiB
    assert typed.allocator_log.verdict == census["allocator_log"]["verdict"]


def test_an_exception_census_takes_the_allocators_account(tmp_path):
    monitor = OomMonitor(None, directory=str(tmp_path), note=False, profile=False)
    monitor.installed = True
    for line in GPU_STDERR.splitlines():
        monitor.on_allocator_line(line)
    census = monitor.census("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.",
                            {"how": "raised"})
    assert census["request"]["op"] == "jit(train_step)/dot_general" and census["request"]["allocator"] == "GPU_0_bfc"
    # An allocator event about another size is not this error's.
    other = oom.build_census(message="RESOURCE_EXHAUSTED: Out of memory allocating 1024 bytes.",
                             allocator=monitor.allocator.latest(), profile=False)
    assert "allocator_log" not in other and other["request"]["op"] is None
    assert decoded(census).request.op == "jit(train_step)/dot_general" and decoded(other).allocator_log is None
