"""Out-of-memory census: what held the memory when the program ran out.

When an allocation fails, JAX's error names only the failed request
(``RESOURCE_EXHAUSTED: Out of memory allocating 2147483648 bytes.``), and by
the time someone attaches a monitor the process is gone. The agent lives in
the process, so it can look before anything is freed: this module builds a
**census** at that moment and writes it to a file and to the stream.

A census (a JSON object, ``type: "oom_census"``) holds:

* ``request``: the failed request parsed from the error text (CPU, GPU, TPU
  forms) and, on GPU, from the BFC allocator's own log lines;
* ``devices``: each device's ``memory_stats()`` at that instant (in use,
  pool, limit, largest free block, fragmentation) with a one-line verdict,
  and ``host``: RSS, address space, ``RLIMIT_AS``, cgroup limit, MemTotal;
* ``arrays``: the live arrays grouped by (shape, dtype, placement), each
  device buffer counted once, with count and bytes, and their total;
* ``sites``: the allocation sites holding the most bytes, each the innermost
  frame of the user's code in the device memory profile;
* ``timeline``: the last samples' bytes in use, so the climb is visible.

When (see :class:`OomMonitor`):

1. ``JaxRuntimeError.__init__``: jaxlib makes the exception by calling its
   class, so a patched ``__init__`` sees every RESOURCE_EXHAUSTED the moment
   it is created, caught later or not, while the program's arrays are all
   still referenced. Nothing runs on any other path: no tracing or
   profiling hook, no wrapper around the program's calls.
2. ``sys.excepthook`` / ``threading.excepthook``: an uncaught exception
   whose text (or a chained cause's) says RESOURCE_EXHAUSTED or "Out of
   memory". The census taken at creation is marked uncaught; without one
   (another exception type, or the patch was not possible) it is taken
   here, while the traceback's frames still hold the arrays. The previous
   hooks then run with the same arguments: traceback and exit status are
   those of a plain run.
3. The GPU allocator's stderr line, passed on by the stderr relay as an
   ``O <line>`` report (:class:`OomLineScanner` finds them): its request,
   op name and dump statistics join the census, and a census is taken on
   the agent's thread if no exception brought one within :data:`GRACE_S`.

Every census finishes within its time budget (:data:`DEFAULT_BUDGET_S`):
the cheap parts come first, the live-array scan checks the clock every 256
arrays, the memory profile runs only when its estimated cost fits what is
left, and whatever was cut short is listed under ``skipped``.

Stdlib only at import time: the stderr relay, a ``python -S`` child, runs
this file as a top-level module for :class:`OomLineScanner`. jax and the
other probes are imported inside the functions that need them.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time

# The relay imports this file without ``site``; ``typing`` alone would cost
# it ~8 ms at every start. Type checkers read the import; Python skips it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable

__all__ = [
    "CENSUS_VERSION",
    "DEFAULT_BUDGET_S",
    "OOM_CENSUS",
    "AllocatorLog",
    "OomLineScanner",
    "OomMonitor",
    "allocation_sites",
    "build_census",
    "current",
    "device_verdict",
    "group_live_arrays",
    "host_memory",
    "host_verdict",
    "human_bytes",
    "install",
    "is_oom_text",
    "parse_allocator_line",
    "parse_oom_message",
    "parse_size",
    "timeline_from_records",
    "uninstall",
    "write_census",
]

#: The record type of a census on the stream (and in its file).
OOM_CENSUS = "oom_census"
#: Version of the census layout (docs/protocol.md, "oom_census").
CENSUS_VERSION = 1
#: Wall-clock seconds one census may take. Measured on a 2-core CPU machine
#: (benchmarks/oom_census.py): 10,000 live arrays ~0.05 s (worst of 5 runs
#: 0.09 s), 100,000 ~0.7 s. Past the budget only ``jax.live_arrays()``
#: itself (~0.2 us an array) and the cheap parts still run.
DEFAULT_BUDGET_S = 2.0
#: Censuses one process writes at most: a program that catches the OOM and
#: retries smaller batches must not fill the disk.
MAX_CENSUSES = 5
#: Least seconds between two censuses; the OOMs in between are counted in
#: the next census (``suppressed_before``).
MIN_INTERVAL_S = 10.0
#: After an allocator line that says an allocation failed, how long the
#: agent waits for the exception (which brings a better census) before it
#: takes one itself.
GRACE_S = 1.0
#: On GPU, how long a census first waits for the allocator's lines to come
#: through the stderr relay (they are written just before the error).
SYNC_S = 0.3
#: An allocator event this much older than an exception is not its cause.
ALLOCATOR_MATCH_S = 30.0
#: How many groups / sites / timeline points a census keeps.
TOP_GROUPS = 20
TOP_SITES = 10
TIMELINE_POINTS = 120
TIMELINE_SPAN_S = 60.0
#: Frames kept in each site's stack.
SITE_STACK = 6
#: Longest message text kept.
MESSAGE_CHARS = 2000
#: The census file's name: ``jaxtop-oom-PID-YYYYmmdd-HHMMSS[-N].json``.
FILE_NAME = re.compile(r"jaxtop-oom-\d+-\d{8}-\d{6}(?:-\d+)?\.json")

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


# --------------------------------------------------------------------------
# Sizes
# --------------------------------------------------------------------------

def _unit_for(n: float) -> int:
    i = 0
    n = abs(n)
    while n >= 1024 and i < len(_UNITS) - 1:
        n /= 1024
        i += 1
    return i


def _scaled(n: float, unit: int) -> str:
    value = n / (1024 ** unit)
    if unit == 0:
        return f"{int(n)}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}"


def human_bytes(n: int | float | None, *also: int | float | None) -> str:
    """Bytes in binary units, one decimal below 100 ("3.1 GiB", "768 MiB").

    Args:
        n: the byte count; None reads "n/a".
        also: more counts to print in the same unit, as "78.2 of 79.1 GiB"
            does: the unit is the one of the largest, and the result is
            the numbers joined by " of " with the unit once at the end.
    """
    values = [n, *also]
    if any(v is None for v in values):
        if also:
            return " of ".join(human_bytes(v) for v in values)
        return "n/a"
    unit = _unit_for(max(abs(v) for v in values))  # type: ignore[arg-type]
    return " of ".join(_scaled(v, unit) for v in values) + f" {_UNITS[unit]}"  # type: ignore[arg-type]


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([KMGTPE])(i?)B?|(B|bytes?))?\s*$", re.IGNORECASE)
_SIZE_TEXT = r"\d+(?:\.\d+)?\s?(?:[KMGTPE]i?B?|B\b|bytes?\b)?"


def parse_size(text: str | None) -> int | None:
    """A size as XLA prints it, in bytes: "2147483648", "1.00GiB", "512B",
    "1.5KiB", "11.04G" (TPU), "3 MiB". Units are binary (XLA's are).

    Returns:
        The byte count (rounded), or None when the text is not a size.
    """
    if not text:
        return None
    m = _SIZE_RE.match(text)
    if m is None:
        return None
    value = float(m.group(1))
    letter = m.group(2)
    if letter:
        value *= 1024 ** ("KMGTPE".index(letter.upper()) + 1)
    return round(value)


# --------------------------------------------------------------------------
# Text: exception messages and allocator log lines
# --------------------------------------------------------------------------

#: What the relay looks for in stderr: the BFC allocator's "ran out of
#: memory" and the runtime's "Out of memory" both hold it. One substring
#: search per read (~0.4 ns a byte; RESOURCE_EXHAUSTED alone, without these
#: words, is an exception's text, which the exception hooks see).
_MARK = b"ut of memory"
_TEXT_MARKS = ("ut of memory", "RESOURCE_EXHAUSTED", "Resource exhausted")

# A log header, removed before parsing: abseil's "W0102 03:04:05.678901  1234
# file.cc:12] " (before absl is set up it prints "W0000 00:00:1733256000.123456"),
# or TSL's "2026-01-02 03:04:05.678901: W file.cc:12] ".
_HEADER_RE = re.compile(
    r"^(?:[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+\s+\S+:\d+\] "
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF](?:\s+\d+)?\s+\S+:\d+\] )"
)

_BFC_RE = re.compile(
    r"Allocator \((?P<allocator>[^)]*)\) ran out of memory trying to allocate (?P<human>" + _SIZE_TEXT + r")"
    r"(?: \(rounded to (?P<rounded>\d+)\))?(?P<rest>.*)"
)
_OP_RE = re.compile(r"requested by op ?(?P<op>[^\s.][^\s]*)?")
_FREED_RE = re.compile(r"freed_by_count=(\d+)")
_NOT_FAILURE = "indicates that this is not a failure"
_REQUEST_PATTERNS = (
    # GPU, XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async: "gpu_async_1 cuMemAllocAsync
    # failed to allocate 1225195446464 bytes: RESOURCE_EXHAUSTED: …"
    ("gpu_cuda_async", re.compile(r"(?P<allocator>gpu_async_(?P<ordinal>\d+)) cuMemAllocAsync failed to allocate "
                                  r"(?P<bytes>\d+) bytes")),
    # CPU (TFRT client): "Out of memory allocating 2147483648 bytes."
    ("cpu", re.compile(r"Out of memory allocating (?P<bytes>\d+) bytes")),
    # GPU (stream executor): "Out of memory while trying to allocate 17179869184 bytes."
    ("gpu", re.compile(r"Out of memory while trying to allocate (?P<bytes>\d+) bytes")),
    # GPU device allocator: "Failed to allocate request for 4.00GiB (4294967296B) on device ordinal 0"
    ("gpu", re.compile(r"Failed to allocate request for (?P<human>\S+) \((?P<bytes>\d+)B\)(?: on device ordinal (?P<ordinal>\d+))?")),
    # TPU and older GPU runtimes print a human size: "... trying to allocate 11.04G."
    ("tpu", re.compile(r"Out of memory while trying to allocate (?P<human>" + _SIZE_TEXT + r")")),
    # TPU runtime: "Attempting to reserve 12.50G at the bottom of memory. That was not possible."
    ("tpu", re.compile(r"Attempting to (?:reserve|allocate) (?P<human>" + _SIZE_TEXT + r")[^.]*\. That was not possible")),
)
_TPU_COMPILE_RE = re.compile(
    r"Ran out of memory in memory space (?P<space>\w+)\. Used (?P<used>" + _SIZE_TEXT + r") of "
    r"(?P<capacity>" + _SIZE_TEXT + r") \w+\. Exceeded \w+ capacity by (?P<over>" + _SIZE_TEXT + r")"
)
_GENERIC_RE = re.compile(r"(?:allocat|request)\w*\D{0,40}?(?P<bytes>\d{3,}) ?bytes")
_ORDINAL_RE = re.compile(r"(?:device ordinal |GPU_|gpu:|cuda:|TPU_|tpu:)(\d+)")


def is_oom_text(text: str | None) -> bool:
    """True when an error text says the memory ran out (RESOURCE_EXHAUSTED,
    "Out of memory", "ran out of memory", "Resource exhausted")."""
    return bool(text) and any(mark in text for mark in _TEXT_MARKS)  # type: ignore[operator]


def _strip_header(line: str) -> str:
    return _HEADER_RE.sub("", line, count=1)


def parse_oom_message(text: str | None) -> dict[str, Any] | None:
    """The failed request of an out-of-memory error or log line.

    Tolerant by design: XLA's wording differs between backends and
    versions, so each known form is tried, then a generic "allocat… N
    bytes"; what no form matches stays ``None``.

    Args:
        text: an exception's text or one log line (its header is ignored).

    Returns:
        None when the text does not speak of memory running out; else a
        dict with ``bytes`` (the request, or None), ``human`` (the size as
        printed), ``rounded_bytes``, ``allocator``, ``device_ordinal``,
        ``op``, ``form`` (``cpu``, ``gpu``, ``gpu_bfc``, ``tpu``,
        ``tpu_compile`` or ``unknown``), ``not_a_failure`` (the BFC
        allocator's note that the caller copes), ``used_bytes`` /
        ``capacity_bytes`` / ``over_bytes`` (TPU compile) and ``text`` (the
        line that matched, at most :data:`MESSAGE_CHARS` characters).
    """
    if not text or not (is_oom_text(text) or "not possible" in text):
        return None
    out: dict[str, Any] = {
        "bytes": None, "human": None, "rounded_bytes": None, "allocator": None, "device_ordinal": None,
        "op": None, "form": "unknown", "not_a_failure": False,
    }
    lines = [_strip_header(line) for line in text.splitlines() if line.strip()]
    matched = None
    for line in lines:
        m = _BFC_RE.search(line)
        if m:
            out["form"] = "gpu_bfc"
            out["allocator"] = m.group("allocator")
            out["human"] = m.group("human")
            out["bytes"] = parse_size(m.group("human"))
            if m.group("rounded"):
                out["rounded_bytes"] = int(m.group("rounded"))
            rest = m.group("rest") or ""
            op = _OP_RE.search(rest)
            if op and op.group("op"):
                out["op"] = op.group("op")
            freed = _FREED_RE.search(rest)
            if freed:
                out["freed_by_count"] = int(freed.group(1))
            out["not_a_failure"] = _NOT_FAILURE in text
            ordinal = _ORDINAL_RE.search(m.group("allocator"))
            if ordinal:
                out["device_ordinal"] = int(ordinal.group(1))
            matched = line
            break
    if matched is None:
        for line in lines:
            for form, pattern in _REQUEST_PATTERNS:
                m = pattern.search(line)
                if m is None:
                    continue
                groups = m.groupdict()
                nbytes = int(groups["bytes"]) if groups.get("bytes") else parse_size(groups.get("human"))
                if nbytes is None:
                    continue
                out.update(form=form, bytes=nbytes, human=groups.get("human"))
                if groups.get("allocator"):
                    out["allocator"] = groups["allocator"]
                if groups.get("ordinal"):
                    out["device_ordinal"] = int(groups["ordinal"])
                matched = line
                break
            if matched is not None:
                break
    if matched is None:
        for line in lines:
            m = _TPU_COMPILE_RE.search(line)
            if m:
                out.update(form="tpu_compile", used_bytes=parse_size(m.group("used")),
                           capacity_bytes=parse_size(m.group("capacity")), over_bytes=parse_size(m.group("over")),
                           memory_space=m.group("space"))
                matched = line
                break
    if matched is None:
        for line in lines:
            m = _GENERIC_RE.search(line)
            if m and is_oom_text(text):
                out["bytes"] = int(m.group("bytes"))
                matched = line
                break
    if matched is None:
        matched = next((line for line in lines if is_oom_text(line)), lines[0] if lines else text)
    if out["device_ordinal"] is None:
        m = _ORDINAL_RE.search(matched)
        if m:
            out["device_ordinal"] = int(m.group(1))
    out["text"] = matched.strip()[:MESSAGE_CHARS]
    return out


_STAT_KEYS = {
    "Limit": "bytes_limit", "InUse": "bytes_in_use", "MaxInUse": "peak_bytes_in_use", "NumAllocs": "num_allocs",
    "MaxAllocSize": "largest_alloc_size", "Reserved": "bytes_reserved", "PeakReserved": "peak_bytes_reserved",
    "LargestFreeBlock": "largest_free_block_bytes",
}
_STAT_RE = re.compile(r"^\s*(" + "|".join(_STAT_KEYS) + r"):\s+(\S+)\s*$")
#: The cuda_async allocator's follow-up to a failure: what CUDA itself said.
_CUDA_FREE_TOTAL_RE = re.compile(r"Reported by CUDA: Free memory/Total memory: (\d+)/(\d+)")
#: Statistics the cuda_async allocator prints as 0 because it keeps no such figure.
_ASYNC_UNTRACKED = frozenset({"bytes_limit", "largest_free_block_bytes", "bytes_reserved", "peak_bytes_reserved"})
_OCCUPANCY_RE = re.compile(r"^[*x_]{20,}\s*$")
_SUMMARY_RE = re.compile(
    r"Allocator memory summary: rounded request (?P<request>[^,]+), total free in pool (?P<free>[^,]+), "
    r"largest free chunk usable by \w+ end (?P<largest>[^,]+), unallocated bytes (?P<unallocated>[^,]+), "
    r"pool size (?P<pool>[^,]+), pool limit (?P<limit>[^,\s]+)"
)
_IN_USE_TOTAL_RE = re.compile(r"Sum Total of in-use chunks: (?P<size>\S+)")


def parse_allocator_line(text: str) -> dict[str, Any] | None:
    """One line of the allocator's out-of-memory report (an ``O`` report).

    Returns:
        None for a line this parser does not know, else ``{"kind": ...}``:

        * ``failure``: ``Allocator (GPU_0_bfc) ran out of memory trying to
          allocate 1.00GiB (rounded to 1073741824)requested by op …``, with
          :func:`parse_oom_message`'s fields under ``request``;
        * ``not_a_failure``: the same words, for a request the caller can do
          without ("The caller indicates that this is not a failure…");
        * ``stat``: a line of the ``Stats:`` block (``Limit:``, ``InUse:``,
          ``LargestFreeBlock:``…), with ``key`` (``memory_stats()``'s name)
          and ``bytes`` (or the count for ``num_allocs``);
        * ``summary``: "Allocator memory summary: …" in bytes;
        * ``in_use_total``: "Sum Total of in-use chunks: …";
        * ``occupancy``: the allocator's 100-character picture of its pool
          (``*`` used, ``x`` wasted, ``_`` free);
        * ``error``: any other line holding RESOURCE_EXHAUSTED or "Out of
          memory" (e.g. "Execution of replica 0 failed: …"), with ``request``.
    """
    line = _strip_header(text.rstrip("\r\n"))
    if "ran out of memory trying to allocate" in line or "cuMemAllocAsync failed to allocate" in line:
        request = parse_oom_message(line)
        if request is None:
            return None
        return {"kind": "not_a_failure" if request.get("not_a_failure") else "failure", "request": request}
    m = _CUDA_FREE_TOTAL_RE.search(line)
    if m:
        return {"kind": "cuda_memory", "free_bytes": int(m.group(1)), "total_bytes": int(m.group(2))}
    if line.startswith("Stats: "):  # the cuda_async allocator puts its first statistic on this line
        line = line[len("Stats: "):]
    m = _STAT_RE.match(line)
    if m:
        key = _STAT_KEYS[m.group(1)]
        value = int(m.group(2)) if key == "num_allocs" and m.group(2).isdigit() else parse_size(m.group(2))
        return {"kind": "stat", "key": key, "bytes": value}
    m = _SUMMARY_RE.search(line)
    if m:
        return {"kind": "summary", **{k: parse_size(v) for k, v in m.groupdict().items()}}
    m = _IN_USE_TOTAL_RE.search(line)
    if m:
        return {"kind": "in_use_total", "bytes": parse_size(m.group("size"))}
    if _OCCUPANCY_RE.match(line):
        return {"kind": "occupancy", "picture": line.strip()}
    request = parse_oom_message(line)
    if request is not None:
        return {"kind": "error", "request": request}
    return None


class AllocatorLog:
    """What the allocator's lines said about its latest failure.

    Lines arrive one at a time (``O`` reports); a ``failure`` line opens a
    new event and the lines after it (statistics, summary, picture) fill it
    in. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event: dict[str, Any] | None = None
        self.not_failures = 0

    def add(self, text: str, t: float | None = None) -> dict[str, Any] | None:
        """Take one line; returns its parse (None for lines it ignores)."""
        parsed = parse_allocator_line(text)
        if parsed is None:
            return None
        now = time.time() if t is None else t
        kind = parsed["kind"]
        with self._lock:
            if kind == "not_a_failure":
                self.not_failures += 1
            elif kind == "failure":
                self._event = {"t": now, "request": parsed["request"], "stats": {}, "lines": [text.strip()[:MESSAGE_CHARS]]}
            elif kind == "error":
                if self._event is None or now - self._event["t"] > ALLOCATOR_MATCH_S:
                    self._event = {"t": now, "request": parsed["request"], "stats": {}, "lines": []}
                self._event.setdefault("errors", []).append(parsed["request"].get("text"))
                del self._event["errors"][:-4]
            elif self._event is not None:
                if kind == "stat":
                    if (parsed["bytes"] == 0 and self._event["request"].get("form") == "gpu_cuda_async"
                            and parsed["key"] in _ASYNC_UNTRACKED):
                        pass  # the cuda_async allocator prints 0 for what it does not track: not a measured 0
                    else:
                        self._event["stats"][parsed["key"]] = parsed["bytes"]
                elif kind == "cuda_memory":
                    self._event["cuda"] = {"free_bytes": parsed["free_bytes"], "total_bytes": parsed["total_bytes"]}
                elif kind == "summary":
                    self._event["summary"] = {k: v for k, v in parsed.items() if k != "kind"}
                elif kind == "in_use_total":
                    self._event["in_use_total_bytes"] = parsed["bytes"]
                elif kind == "occupancy":
                    self._event["occupancy"] = parsed["picture"]
        return parsed

    def latest(self, since: float | None = None) -> dict[str, Any] | None:
        """A copy of the latest event (None if none, or older than ``since``)."""
        with self._lock:
            event = self._event
            if event is None or (since is not None and event["t"] < since):
                return None
            copy = dict(event)
            copy["stats"] = dict(event["stats"])
            return copy


class OomLineScanner:
    """Finds the allocator's out-of-memory lines in the bytes of stderr.

    Runs in the stderr relay (a ``python -S`` child, stdlib only) on every
    block it reads, so the usual block costs one substring search. It
    never changes what is forwarded: it only picks lines to report to the
    agent as ``O <line>``.

    A line holding "out of memory" or "Out of memory" is reported. After a
    BFC allocator failure the scanner stays armed until the occupancy
    picture that ends the allocator's report (at most :attr:`ARM_LINES`
    lines) and also reports the lines of its dump that carry numbers (the
    ``Stats:`` block, the summary); the per-chunk lines are not reported.
    """

    #: Lines after a failure in which dump lines are looked for.
    ARM_LINES = 20000
    #: Longest line reported (the rest is cut).
    LINE_MAX = 2000
    #: Reports per armed window, at most: a dump never floods the agent.
    REPORTS_MAX = 200
    #: The unfinished line kept between blocks, at most.
    TAIL_MAX = 4096

    _DUMP_MARKS = ("Limit:", "InUse:", "MaxInUse:", "NumAllocs:", "MaxAllocSize:", "Reserved:", "PeakReserved:",
                   "LargestFreeBlock:", "Sum Total of in-use chunks", "Allocator memory summary", "Stats: Limit:",
                   "Reported by CUDA:")

    def __init__(self) -> None:
        self._tail = b""
        self._tail_hit = False
        self._armed = 0
        self._reports = 0

    def _wanted(self, line: bytes) -> bool:
        if _MARK in line:
            if (b"ran out of memory trying" in line and b"not a failure" not in line) or b"cuMemAllocAsync failed" in line:
                self._armed, self._reports = self.ARM_LINES, 0
            return True
        if not self._armed:
            return False
        self._armed -= 1
        text = line.decode("utf-8", "replace")
        body = _strip_header(text).strip()
        if body.startswith(self._DUMP_MARKS):
            return True
        if _OCCUPANCY_RE.match(body):
            self._armed = 0  # the picture of the pool ends the allocator's report
            return True
        return False

    def feed(self, data: bytes) -> list[bytes]:
        """Take the next bytes read from stderr; returns the lines to report
        (without their newline, at most :attr:`LINE_MAX` bytes each)."""
        if not data:
            return []
        tail = self._tail
        if not self._armed and not self._tail_hit and _MARK not in data:
            # A marker cut in two by the read is only in tail + the head of data.
            edge = tail[-16:] + data[:16] if tail else b""
            if _MARK not in edge:
                cut = data.rfind(b"\n")
                if cut >= 0:
                    self._tail = data[cut + 1:][-self.TAIL_MAX:]
                elif len(data) >= self.TAIL_MAX:
                    self._tail = data[-self.TAIL_MAX:]
                else:
                    self._tail = (tail + data)[-self.TAIL_MAX:]
                return []
        *lines, rest = (tail + data).split(b"\n")
        self._tail = rest[-self.TAIL_MAX:]
        # An unfinished line that holds a marker is judged when its newline
        # comes, however many reads later: the slow path until then.
        self._tail_hit = _MARK in self._tail
        out = []
        for line in lines:
            if self._wanted(line) and self._reports < self.REPORTS_MAX:
                self._reports += 1
                out.append(line.rstrip(b"\r")[: self.LINE_MAX])
        return out

    def finish(self) -> list[bytes]:
        """At EOF: the last line, if it had no newline and is wanted."""
        rest, self._tail, self._tail_hit = self._tail, b"", False
        if rest and self._wanted(rest) and self._reports < self.REPORTS_MAX:
            return [rest[: self.LINE_MAX]]
        return []


# --------------------------------------------------------------------------
# Where code lives: the user's frames and the others
# --------------------------------------------------------------------------

_LIBRARY_MARKERS = ("/jax/", "/jaxlib/", "/numpy/", "/site-packages/jax", "<frozen")
_THIRD_PARTY_MARKERS = ("/site-packages/", "/dist-packages/")
_dirs: tuple[tuple[str, ...], str] | None = None


def _own_and_stdlib_dirs() -> tuple[tuple[str, ...], str]:
    """jaxtop's own directories, and the standard library's: never the user's."""
    global _dirs
    if _dirs is None:
        own = {os.path.dirname(os.path.abspath(__file__))}
        pkg = sys.modules.get("jaxtop")
        if pkg is not None and getattr(pkg, "__file__", None):
            own.add(os.path.dirname(os.path.abspath(pkg.__file__)))
        stdlib = os.path.dirname(os.path.abspath(os.__file__)).rstrip(os.sep) + os.sep
        _dirs = (tuple(d.rstrip(os.sep) + os.sep for d in own), stdlib)
    return _dirs


def _is_stdlib(filename: str) -> bool:
    # An installed package may live below the standard library's directory
    # (/usr/local/lib/python3.X/site-packages): it is not the standard library.
    return filename.startswith(_own_and_stdlib_dirs()[1]) and not any(m in filename for m in _THIRD_PARTY_MARKERS)


def is_library_file(filename: str) -> bool:
    """jax, jaxlib, numpy, jaxtop, the standard library, or Python's import
    machinery: frames that are never an allocation site."""
    if not filename:
        return True
    if any(m in filename for m in _LIBRARY_MARKERS):
        return True
    return filename.startswith(_own_and_stdlib_dirs()[0]) or _is_stdlib(filename)


def is_user_file(filename: str) -> bool:
    """Code the user wrote: not jax/numpy/jaxtop, not an installed package,
    not the standard library. ``<string>``, ``<stdin>`` and notebook cells
    are the user's; ``<frozen …>`` is not."""
    if not filename:
        return False
    if filename.startswith("<"):
        return not filename.startswith("<frozen")
    if any(m in filename for m in _THIRD_PARTY_MARKERS):
        return False
    return not is_library_file(filename)


def _site_text(filename: str, line: int, function: str) -> str:
    return f"{os.path.basename(filename) or filename}:{line} in {function or '?'}"


def _user_frame_of_stack(frame: Any) -> dict[str, Any] | None:
    """The innermost frame of the user's code from ``frame`` outwards."""
    depth = 0
    while frame is not None and depth < 200:
        code = frame.f_code
        if is_user_file(code.co_filename):
            return {"file": code.co_filename, "line": frame.f_lineno, "function": code.co_name,
                    "site": _site_text(code.co_filename, frame.f_lineno, code.co_name)}
        frame = frame.f_back
        depth += 1
    return None


def _user_frame_of_traceback(tb: Any) -> dict[str, Any] | None:
    """The innermost frame of the user's code in a traceback."""
    found = None
    depth = 0
    while tb is not None and depth < 1000:
        code = tb.tb_frame.f_code
        if is_user_file(code.co_filename):
            found = {"file": code.co_filename, "line": tb.tb_lineno, "function": code.co_name,
                     "site": _site_text(code.co_filename, tb.tb_lineno, code.co_name)}
        tb = tb.tb_next
        depth += 1
    return found


# --------------------------------------------------------------------------
# The census's parts
# --------------------------------------------------------------------------

def _read_kv(path: str, keys: tuple[str, ...]) -> dict[str, int]:
    """``Key:   123 kB`` lines of a /proc file, in bytes."""
    out: dict[str, int] = {}
    try:
        with open(path, "rb") as f:
            for raw in f:
                name, _, rest = raw.decode("ascii", "replace").partition(":")
                if name in keys:
                    parts = rest.split()
                    if parts and parts[0].isdigit():
                        out[name] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    except OSError:
        pass
    return out


def _cgroup_memory() -> dict[str, int | None]:
    """The cgroup v2 memory limit and use of this process, where there is one."""
    try:
        with open("/proc/self/cgroup", "rb") as f:
            entries = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return {}
    rel = next((e.split(":", 2)[2] for e in entries if e.startswith("0::")), None)
    if rel is None:
        return {}
    out: dict[str, int | None] = {}
    base = "/sys/fs/cgroup" + rel.rstrip("/")
    for name, key in (("memory.max", "cgroup_limit_bytes"), ("memory.current", "cgroup_current_bytes")):
        try:
            with open(os.path.join(base, name), "rb") as f:
                text = f.read().strip()
        except OSError:
            continue
        out[key] = int(text) if text.isdigit() else None  # "max": no limit
    return out


def host_memory() -> dict[str, Any]:
    """The process's memory as the OS sees it, and its limits.

    Returns:
        ``rss_bytes``, ``vms_bytes`` (address space: what ``RLIMIT_AS``
        counts), ``peak_rss_bytes``, ``rlimit_as_bytes`` and
        ``rlimit_data_bytes`` (None: unlimited), ``mem_total_bytes``,
        ``mem_available_bytes`` and, in a cgroup v2 with a limit,
        ``cgroup_limit_bytes`` / ``cgroup_current_bytes``. Missing where
        the OS does not say.
    """
    out: dict[str, Any] = {}
    status = _read_kv("/proc/self/status", ("VmRSS", "VmSize", "VmHWM"))
    for src, dst in (("VmRSS", "rss_bytes"), ("VmSize", "vms_bytes"), ("VmHWM", "peak_rss_bytes")):
        if src in status:
            out[dst] = status[src]
    try:
        import resource

        for name, key in (("RLIMIT_AS", "rlimit_as_bytes"), ("RLIMIT_DATA", "rlimit_data_bytes")):
            soft = resource.getrlimit(getattr(resource, name))[0]
            out[key] = None if soft == resource.RLIM_INFINITY else int(soft)
        if "peak_rss_bytes" not in out:
            out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except (ImportError, OSError, ValueError, AttributeError):
        pass
    meminfo = _read_kv("/proc/meminfo", ("MemTotal", "MemAvailable"))
    if "MemTotal" in meminfo:
        out["mem_total_bytes"] = meminfo["MemTotal"]
    if "MemAvailable" in meminfo:
        out["mem_available_bytes"] = meminfo["MemAvailable"]
    cgroup = _cgroup_memory()
    if cgroup.get("cgroup_limit_bytes") is not None:
        out.update(cgroup)
    return out


def _placement(sharding: Any, devices: Any) -> str:
    """A short name for where an array lives: ``cpu:0``, or for a sharded
    array its partition spec and device count."""
    if len(devices) == 1:
        (dev,) = devices
        return f"{dev.platform}:{dev.id}"
    n = len(devices)
    try:
        if getattr(sharding, "is_fully_replicated", False):
            return f"replicated on {n} devices"
    except Exception:
        pass
    spec = getattr(sharding, "spec", None)
    if spec is not None:
        return f"{spec} on {n} devices"
    return f"{type(sharding).__name__} on {n} devices"


def _shard_bytes(shape: tuple[int, ...], dtype: Any, sharding: Any) -> int:
    import math

    shard_shape = tuple(sharding.shard_shape(shape))
    itemsize = getattr(dtype, "itemsize", None)
    if itemsize is None:
        import numpy as np

        itemsize = np.dtype(dtype).itemsize
    return math.prod(shard_shape) * int(itemsize)


def group_live_arrays(arrays: Iterable[Any], deadline: float | None = None, top: int = TOP_GROUPS) -> dict[str, Any]:
    """Live arrays grouped by (shape, dtype, placement), each buffer once.

    Like the sampling probe's scan, nothing is materialised: a single-device
    array is deduplicated by (device, buffer address) when its buffer is
    ready (two Arrays on one buffer count once), a sharded array's bytes
    come from its sharding (``shard_shape`` x itemsize on each device of
    this process), never from ``addressable_shards``.

    Args:
        arrays: ``jax.live_arrays()``.
        deadline: ``time.perf_counter()`` value at which to stop; the arrays
            not looked at are counted in ``not_scanned``.
        top: groups kept (the largest by bytes).

    Returns:
        ``{"groups": [{shape, dtype, placement, count, bytes, bytes_each}],
        "count", "bytes", "groups_total", "shown_bytes", "per_device":
        {device id (str): bytes}, "aliases", "errors", "not_scanned",
        "complete"}``.
    """
    from jaxtop.probes.jax_memory import _addressable, guard_deletes, ready_address

    guard_deletes()  # so that addresses can be asked for safely (a no-op under the agent, which did it)

    groups: dict[tuple[Any, ...], list[int]] = {}
    per_device: dict[str, int] = {}
    seen: set[tuple[int, int]] = set()
    # numpy's str(dtype) is Python code (~8 us): once per dtype, not per array.
    dtype_names: dict[Any, str] = {}
    device_names: dict[Any, str] = {}
    aliases = errors = count = total = 0
    not_scanned = 0
    arrays = list(arrays)
    for i, arr in enumerate(arrays):
        if deadline is not None and not (i & 255) and time.perf_counter() > deadline:
            not_scanned = len(arrays) - i
            break
        try:
            shape = tuple(arr.shape)
            dtype = arr.dtype
            sharding = arr.sharding
            devices = sharding.device_set
            if len(devices) == 1:
                (dev,) = devices
                ptr = ready_address(arr)  # never is_ready() on an array deleted meanwhile
                if ptr is not None:
                    if (dev.id, ptr) in seen:
                        aliases += 1
                        continue
                    seen.add((dev.id, ptr))
                nbytes = int(arr.nbytes)
                placement = device_names.get(dev)
                if placement is None:
                    placement = device_names[dev] = f"{dev.platform}:{dev.id}"
                key_dev = str(dev.id)
                per_device[key_dev] = per_device.get(key_dev, 0) + nbytes
            else:
                per = _shard_bytes(shape, dtype, sharding)
                local = list(_addressable(sharding, devices))
                nbytes = per * len(local)
                for d in local:
                    per_device[str(d.id)] = per_device.get(str(d.id), 0) + per
                placement = _placement(sharding, devices)
            dtype_name = dtype_names.get(dtype)
            if dtype_name is None:
                dtype_name = dtype_names[dtype] = str(dtype)
        except Exception:
            errors += 1  # deleted or donated while we looked
            continue
        key = (shape, dtype_name, placement)
        entry = groups.get(key)
        if entry is None:
            groups[key] = [1, nbytes]
        else:
            entry[0] += 1
            entry[1] += nbytes
        count += 1
        total += nbytes
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1][1], -kv[1][0], str(kv[0])))
    shown = []
    for (shape, dtype, placement), (n, nbytes) in ordered[:max(0, top)]:
        shown.append({"shape": list(shape), "dtype": dtype, "placement": placement, "count": n, "bytes": nbytes,
                      "bytes_each": nbytes // n if n else 0})
    return {
        "groups": shown,
        "count": count,
        "bytes": total,
        "groups_total": len(groups),
        "shown_bytes": sum(g["bytes"] for g in shown),
        "per_device": per_device,
        "aliases": aliases,
        "errors": errors,
        "not_scanned": not_scanned,
        "complete": not_scanned == 0,
    }


_COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")


def _fold_comprehensions(stack: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    """Name a comprehension's frame after the function it is written in.

    Before Python 3.12 a comprehension runs in a frame of its own, called
    ``<listcomp>``; the site "train.py:88 in <listcomp>" should read as the
    function the line is in, as it does on 3.12 and later.
    """
    if not any(name in _COMPREHENSIONS for name, _, _ in stack):
        return stack
    out = []
    skip = False
    for i, (name, filename, line) in enumerate(stack):
        if skip:
            skip = False
            continue
        if name in _COMPREHENSIONS and i + 1 < len(stack) and stack[i + 1][1] == filename:
            out.append((stack[i + 1][0], filename, line))
            skip = stack[i + 1][2] == line  # the same line twice: keep one
            continue
        out.append((name, filename, line))
    return out


def allocation_sites(raw: bytes, top: int = TOP_SITES) -> dict[str, Any]:
    """Allocation sites of the live device buffers in a memory profile.

    Each buffer is charged to the innermost frame of the user's code in the
    Python stack jax recorded when it was made (:func:`is_user_file`); a
    buffer made from library code only (a flax initialiser called from an
    installed package) falls back to the innermost frame outside jax,
    numpy and jaxtop, marked ``"user": false``. Executables are left out
    (their bytes are code, not data) and only totalled.

    Args:
        raw: ``jax.profiler.device_memory_profile()``'s bytes (gzipped pprof).
        top: sites kept.

    Returns:
        ``{"top": [{site, file, line, function, bytes, count, user, via,
        stack, devices}], "bytes", "count", "sites_total",
        "executable_bytes"}``; ``via`` is the innermost non-jax frame when
        it is not the site itself (the library call that made the buffer).

    Raises:
        jaxtop.probes.memory_profile.ProfileDecodeError: not a profile.
    """
    import gzip

    from jaxtop.probes.memory_profile import ProfileDecodeError, decode_profile

    data = raw
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise ProfileDecodeError(f"bad gzip data: {exc}") from exc
    profile = decode_profile(data)
    names = [t for t, _ in profile.sample_types]
    units = [u for _, u in profile.sample_types]
    bytes_i = next((i for i, n in enumerate(names) if n in ("space", "inuse_space")),
                   next((i for i, u in enumerate(units) if u == "bytes"), None))
    count_i = next((i for i, n in enumerate(names) if n in ("allocations", "inuse_objects")), None)
    if bytes_i is None:
        raise ProfileDecodeError(f"no bytes sample type in {profile.sample_types}")

    frames_cache: dict[int, list[tuple[str, str, int]]] = {}
    sites: dict[tuple[str, str, int], dict[str, Any]] = {}
    total = n_total = exe = 0
    for sample in profile.samples:
        values = sample.values
        nbytes = values[bytes_i] if bytes_i < len(values) else 0
        n = (values[count_i] if count_i is not None and count_i < len(values) else 1) or 0
        if str(sample.labels.get("kind", "buffer")) == "executable":
            exe += nbytes
            continue
        total += nbytes
        n_total += n
        stack: list[tuple[str, str, int]] = []
        for loc in sample.location_ids:
            frames = frames_cache.get(loc)
            if frames is None:
                frames = []
                for func_id, line in profile.locations.get(loc, ()):
                    name, filename = profile.functions.get(func_id, ("", ""))
                    frames.append((name, filename, line))
                frames_cache[loc] = frames
            stack.extend(frames)
        stack = _fold_comprehensions(stack)
        user_i = next((i for i, (_, f, _) in enumerate(stack) if is_user_file(f)), None)
        lib_i = next((i for i, (_, f, _) in enumerate(stack) if not is_library_file(f)), None)
        site_i = user_i if user_i is not None else lib_i
        key = stack[site_i] if site_i is not None else ("<no stack>", "", 0)
        entry = sites.get(key)
        if entry is None:
            entry = sites[key] = {"bytes": 0, "count": 0, "user": user_i is not None, "devices": set(),
                                  "_best": -1, "stack": [], "via": None}
        entry["bytes"] += nbytes
        entry["count"] += n
        device = sample.labels.get("device")
        if device is not None:
            entry["devices"].add(str(device))
        if nbytes > entry["_best"]:
            entry["_best"] = nbytes
            start = site_i if site_i is not None else 0
            entry["stack"] = [_site_text(f, ln, name) for name, f, ln in stack[start:start + SITE_STACK]]
            if lib_i is not None and site_i is not None and lib_i < site_i:
                name, f, ln = stack[lib_i]
                entry["via"] = _site_text(f, ln, name)
    ordered = sorted(sites.items(), key=lambda kv: (-kv[1]["bytes"], -kv[1]["count"], str(kv[0])))
    out_top = []
    for (name, filename, line), entry in ordered[:max(0, top)]:
        out_top.append({
            "site": _site_text(filename, line, name) if filename else name,
            "file": filename,
            "line": line,
            "function": name,
            "bytes": entry["bytes"],
            "count": entry["count"],
            "user": entry["user"],
            "via": entry["via"],
            "stack": entry["stack"],
            "devices": sorted(entry["devices"]),
        })
    return {"top": out_top, "bytes": total, "count": n_total, "sites_total": len(sites), "executable_bytes": exe}


def timeline_from_records(records: Iterable[dict[str, Any]], until: float | None = None,
                          span_s: float = TIMELINE_SPAN_S, points: int = TIMELINE_POINTS) -> dict[str, Any] | None:
    """The recent climb from the agent's samples: bytes in use per device.

    Args:
        records: decoded stream records, oldest first (non-samples ignored).
        until: the census's time; samples after it are left out.
        span_s: how far back to go.
        points: at most this many points (evenly thinned, last one kept).

    Returns:
        ``{"t": [...], "bytes_in_use": {device id: [...]}, "rss_bytes": [...],
        "live_bytes": {device id: [...]}}`` (None where a sample lacks the
        value), or None without samples.
    """
    rows = []
    for rec in records:
        if not isinstance(rec, dict) or rec.get("type") != "sample":
            continue
        t = rec.get("t")
        if not isinstance(t, (int, float)) or (until is not None and t > until + 1.0):
            continue
        rows.append(rec)
    if not rows:
        return None
    end = rows[-1]["t"]
    rows = [r for r in rows if r["t"] >= end - span_s]
    if len(rows) > points:
        step = len(rows) / points
        picked = [rows[int(i * step)] for i in range(points - 1)] + [rows[-1]]
        rows = picked
    dev_ids: list[str] = []
    for r in rows:
        for d in r.get("devices") or []:
            if isinstance(d, dict) and str(d.get("id")) not in dev_ids:
                dev_ids.append(str(d.get("id")))
    out: dict[str, Any] = {"t": [], "bytes_in_use": {d: [] for d in dev_ids}, "live_bytes": {d: [] for d in dev_ids},
                           "rss_bytes": []}
    for r in rows:
        out["t"].append(r["t"])
        by_id = {str(d.get("id")): d for d in r.get("devices") or [] if isinstance(d, dict)}
        for d in dev_ids:
            dev = by_id.get(d) or {}
            out["bytes_in_use"][d].append(dev.get("bytes_in_use"))
            out["live_bytes"][d].append((dev.get("live_arrays") or {}).get("bytes"))
        out["rss_bytes"].append((r.get("process") or {}).get("rss_bytes"))
    return out


def device_verdict(stats: dict[str, Any] | None, request_bytes: int | None = None) -> str | None:
    """One line on why an allocation failed on a device with allocator stats.

    Fragmentation when the free bytes would hold the request but no free
    block does ("fragmentation: 3.1 GiB free in the pool but the largest free
    block is 0.4 GiB"), else a full pool ("the pool is full: 78.2 of 79.1 GiB
    in use"). Without a known request, fragmentation when BFC's measure is
    at least 0.5 and a fiftieth of the limit is free.

    Returns:
        The sentence, or None without ``bytes_in_use``.
    """
    if not stats:
        return None
    in_use = stats.get("bytes_in_use")
    if in_use is None:
        return None
    limit = stats.get("bytes_limit")
    pool = stats.get("pool_bytes")
    largest = stats.get("largest_free_block_bytes")
    free_pool = pool - in_use if pool is not None else None
    free_total = (limit - in_use) if limit is not None else free_pool
    fragmented = False
    if largest is not None and free_pool is not None and free_pool > 0:
        if request_bytes is not None:
            fragmented = free_total is not None and free_total >= request_bytes and largest < request_bytes
        else:
            frac = 1 - largest / free_pool
            fragmented = frac >= 0.5 and limit is not None and free_pool >= limit / 50
    request = f"; the request was {human_bytes(request_bytes)}" if request_bytes is not None else ""
    if fragmented:
        text = f"fragmentation: {human_bytes(free_pool)} free in the pool but the largest free block is {human_bytes(largest)}"
        if limit is not None and pool is not None and limit - pool > 0:
            text += f" ({human_bytes(limit - pool)} not yet in the pool)"
        return text + request
    if limit is not None:
        text = f"the pool is full: {human_bytes(in_use, limit)} in use"
        if request_bytes is not None and free_total is not None and request_bytes > free_total:
            text += f"; the request of {human_bytes(request_bytes)} needed {human_bytes(request_bytes - free_total)} more"
            return text
        return text + request
    return f"{human_bytes(in_use)} in use (the allocator reports no limit){request}"


def host_verdict(host: dict[str, Any], live_bytes: int | None, request_bytes: int | None = None) -> str:
    """One line for a backend without allocator statistics (CPU): live
    arrays against the process's RSS and the limit that applies."""
    parts = [f"live arrays hold {human_bytes(live_bytes)} of the process's RSS {human_bytes(host.get('rss_bytes'))}"]
    if host.get("rlimit_as_bytes") is not None:
        parts.append(f"limit {human_bytes(host['rlimit_as_bytes'])} (RLIMIT_AS; {human_bytes(host.get('vms_bytes'))} "
                     "of address space in use)")
    elif host.get("rlimit_data_bytes") is not None:
        parts.append(f"limit {human_bytes(host['rlimit_data_bytes'])} (RLIMIT_DATA)")
    elif host.get("cgroup_limit_bytes") is not None:
        parts.append(f"limit {human_bytes(host['cgroup_limit_bytes'])} (cgroup memory.max; "
                     f"{human_bytes(host.get('cgroup_current_bytes'))} in use)")
    elif host.get("mem_total_bytes") is not None:
        parts.append(f"limit {human_bytes(host['mem_total_bytes'])} (MemTotal; "
                     f"{human_bytes(host.get('mem_available_bytes'))} available)")
    text = "; ".join(parts)
    if request_bytes is not None:
        text += f"; the request was {human_bytes(request_bytes)}"
    return text


def _exception_text(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        text = ""
    return text


def find_oom_exception(exc: BaseException | None, depth: int = 8) -> BaseException | None:
    """``exc`` or the first exception it was raised from (``__cause__``,
    then ``__context__``) whose text says the memory ran out."""
    seen: set[int] = set()
    while exc is not None and depth > 0 and id(exc) not in seen:
        seen.add(id(exc))
        if is_oom_text(_exception_text(exc)):
            return exc
        exc = exc.__cause__ or exc.__context__
        depth -= 1
    return None


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    module = getattr(cls, "__module__", "") or ""
    return f"{module}.{cls.__qualname__}" if module and module != "builtins" else cls.__qualname__


def _local_devices() -> list[Any]:
    from jaxtop.probes.jax_memory import backend_ready

    if not backend_ready():
        return []
    import jax

    return list(jax.local_devices())


def _device_for(request: dict[str, Any] | None, devices: list[Any]) -> Any:
    """The jax device a request names (by local ordinal), else the only one."""
    request = request or {}
    ordinal = request.get("device_ordinal")
    if ordinal is not None:
        # An ordinal from a GPU allocator or executor names a GPU, never a CPU device.
        if str(request.get("form", "")).startswith("gpu") or str(request.get("allocator") or "").startswith("GPU"):
            candidates = [d for d in devices if d.platform in ("gpu", "cuda", "rocm")]
        else:
            candidates = list(devices)
        for d in candidates:
            if getattr(d, "local_hardware_id", None) == ordinal:
                return d
        for d in candidates:
            if d.id == ordinal:
                return d
        return None
    if len(devices) == 1:
        return devices[0]
    return None


def _same_request(request: dict[str, Any] | None, logged: dict[str, Any]) -> bool:
    """Whether an allocator line can be about the same failure as an error:
    the sizes agree where both are known (the error may give the rounded
    size, the log line the requested one, or a human-rounded one)."""
    if request is None or request.get("bytes") is None or logged.get("bytes") is None:
        return True
    mine = request["bytes"]
    theirs = {logged.get("bytes"), logged.get("rounded_bytes")}
    if mine in theirs:
        return True
    # "1.00GiB" in the log stands for anything that prints so: within 1 %.
    return any(v and abs(v - mine) <= 0.01 * max(v, mine) for v in theirs)


def build_census(
    *,
    message: str | None = None,
    trigger: dict[str, Any] | None = None,
    allocator: dict[str, Any] | None = None,
    records: Iterable[dict[str, Any]] | Callable[[], Iterable[dict[str, Any]]] | None = None,
    budget_s: float = DEFAULT_BUDGET_S,
    profile: bool = True,
    census_id: str | None = None,
) -> dict[str, Any]:
    """Take a census of this process's memory now.

    Never raises (``KeyboardInterrupt`` aside): a part that fails says so
    under ``errors`` and the rest is still taken. Creates no JAX backend.

    Args:
        message: the error's text; the failed request is parsed from it.
        trigger: how the OOM was seen (``how``, ``exception``, ``thread``…),
            stored as given.
        allocator: the allocator's latest event (:meth:`AllocatorLog.latest`),
            whose request, op and statistics complete the exception's.
        records: the agent's recent records (or a callable returning them)
            for the timeline.
        budget_s: wall-clock seconds this census may take.
        profile: take the device memory profile for the allocation sites.
        census_id: the census's ``id``.

    Returns:
        The census (a ``type: "oom_census"`` record; docs/protocol.md).
    """
    try:
        return _build_census(message, trigger, allocator, records, budget_s, profile, census_id)
    except Exception as exc:  # a bug here must not take the census's file and event with it
        now = time.time()
        return {"type": OOM_CENSUS, "t": now, "version": CENSUS_VERSION,
                "id": census_id or f"{os.getpid()}-{int(now * 1000)}", "pid": os.getpid(),
                "argv": list(getattr(sys, "argv", None) or [])[:16], "trigger": dict(trigger or {}),
                "request": parse_oom_message(message) if message else None, "verdict": None,
                "errors": [f"census: {type(exc).__name__}: {exc}"], "skipped": [], "complete": False}


def _build_census(message: str | None, trigger: dict[str, Any] | None, allocator: dict[str, Any] | None,
                  records: Any, budget_s: float, profile: bool, census_id: str | None) -> dict[str, Any]:
    """:func:`build_census`'s work, which may raise."""
    started = time.perf_counter()
    deadline = started + max(0.0, budget_s)
    now = time.time()
    steps: dict[str, float] = {}
    skipped: list[dict[str, str]] = []
    errors: list[str] = []

    def lap(name: str, since: float) -> float:
        t = time.perf_counter()
        steps[name] = round(t - since, 6)
        return t

    census: dict[str, Any] = {
        "type": OOM_CENSUS,
        "t": now,
        "version": CENSUS_VERSION,
        "id": census_id or f"{os.getpid()}-{int(now * 1000)}",
        "pid": os.getpid(),
        "argv": list(getattr(sys, "argv", None) or [])[:16],
        "trigger": dict(trigger or {}),
    }
    # 1. The request: the exception's text, completed by the allocator's line.
    t = time.perf_counter()
    request = parse_oom_message(message) if message else None
    if allocator and allocator.get("request") and _same_request(request, allocator["request"]):
        alloc_req = allocator["request"]
        if request is None or request.get("bytes") is None:
            request = dict(alloc_req)
        else:
            for key in ("rounded_bytes", "allocator", "device_ordinal", "op"):
                if request.get(key) is None and alloc_req.get(key) is not None:
                    request[key] = alloc_req[key]
        census["allocator_log"] = allocator
    census["request"] = request
    t = lap("request", t)

    # 2. Device statistics and host memory: cheap, and the most exact now.
    devices: list[Any] = []
    try:
        devices = _local_devices()
    except Exception as exc:
        errors.append(f"devices: {type(exc).__name__}: {exc}")
    from jaxtop.probes.jax_memory import fragmentation, normalize_stats

    dev_records = []
    for d in devices:
        rec: dict[str, Any] = {"id": d.id, "platform": d.platform, "kind": getattr(d, "device_kind", d.platform)}
        try:
            stats = normalize_stats(d.memory_stats())
        except Exception as exc:
            stats = None
            rec["stats_error"] = f"{type(exc).__name__}: {exc}"
        if stats:
            rec["source"] = "memory_stats"
            for key in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit", "pool_bytes", "largest_free_block_bytes",
                        "bytes_reserved", "num_allocs", "largest_alloc_size"):
                if key in stats:
                    rec[key] = stats[key]
        else:
            rec["source"] = "live_arrays"
        frag, reason = fragmentation(stats, d.platform)
        rec["fragmentation"] = frag
        if reason:
            rec["fragmentation_reason"] = reason
        rec["_stats"] = stats
        dev_records.append(rec)
    target = _device_for(request, devices)
    if request is not None and target is not None:
        request["device"] = f"{target.platform}:{target.id}"
        request["device_id"] = target.id
    try:
        census["host"] = host_memory()
    except Exception as exc:
        census["host"] = {}
        errors.append(f"host: {type(exc).__name__}: {exc}")
    t = lap("stats", t)

    # 3. Live arrays: the clock is checked every 256 arrays.
    n_live = 0
    arrays_part: dict[str, Any] | None = None
    if devices:
        try:
            import jax

            live = jax.live_arrays()
            n_live = len(live)
            # The arrays get most of what is left; the profile and the
            # timeline share the rest.
            share = deadline - (deadline - time.perf_counter()) * 0.35
            arrays_part = group_live_arrays(live, deadline=share)
            del live
            if arrays_part["not_scanned"]:
                skipped.append({"part": "arrays", "reason": f"time budget: {arrays_part['not_scanned']} of {n_live} "
                                "live arrays not grouped"})
        except Exception as exc:
            errors.append(f"arrays: {type(exc).__name__}: {exc}")
    census["arrays"] = arrays_part
    t = lap("arrays", t)

    # 4. Allocation sites, when the profile's estimated cost fits.
    sites = None
    if devices and profile:
        estimate = 0.02 + 4e-6 * n_live
        left = deadline - time.perf_counter()
        if estimate > left:
            skipped.append({"part": "sites", "reason": f"time budget: {max(0.0, left):.3f} s left, the memory profile "
                            f"of {n_live} arrays needs ~{estimate:.3f} s"})
        else:
            try:
                import jax.profiler as jax_profiler

                raw = jax_profiler.device_memory_profile()
                sites = allocation_sites(bytes(raw))
            except Exception as exc:
                errors.append(f"sites: {type(exc).__name__}: {str(exc)[:300]}")
    census["sites"] = sites
    t = lap("sites", t)

    # 5. The timeline from the agent's recent samples.
    timeline = None
    if records is not None:
        if time.perf_counter() >= deadline:
            skipped.append({"part": "timeline", "reason": "time budget: none left"})
        else:
            try:
                got = records() if callable(records) else records
                timeline = timeline_from_records(got, until=now)
            except Exception as exc:
                errors.append(f"timeline: {type(exc).__name__}: {exc}")
    census["timeline"] = timeline
    t = lap("timeline", t)

    # 6. Verdicts.
    request_bytes = (request or {}).get("rounded_bytes") or (request or {}).get("bytes")
    per_device = (arrays_part or {}).get("per_device") or {}
    overall = None
    for rec in dev_records:
        stats = rec.pop("_stats")
        # A device the complete scan found no array on holds none.
        none_held = 0 if (arrays_part or {}).get("complete") else None
        rec["live_array_bytes"] = per_device.get(str(rec["id"]), none_held)
        if rec["source"] == "live_arrays":
            rec["bytes_in_use"] = rec["live_array_bytes"]
        failed = target is not None and rec["id"] == target.id
        rec["failed"] = failed
        # None on CPU (no allocator statistics): the host verdict speaks for it.
        verdict = device_verdict(stats, request_bytes if failed or target is None else None)
        rec["verdict"] = verdict
        if failed and verdict:
            overall = verdict
    census["devices"] = dev_records
    if timeline is not None:
        # The census's own moment ends the climb: on CPU the samples' sizes
        # come from a scan once a second, which can miss the last second.
        timeline["t"].append(now)
        for rec in dev_records:
            key = str(rec["id"])
            for series, value in (("bytes_in_use", rec.get("bytes_in_use")), ("live_bytes", rec.get("live_array_bytes"))):
                column = timeline[series].setdefault(key, [None] * (len(timeline["t"]) - 1))
                column.append(value)
        timeline["rss_bytes"].append((census.get("host") or {}).get("rss_bytes"))
        for series in ("bytes_in_use", "live_bytes"):
            for column in timeline[series].values():
                column.extend([None] * (len(timeline["t"]) - len(column)))
        timeline["last_is_census"] = True
    if overall is None:
        with_stats = [r for r in dev_records if r.get("verdict")]
        if with_stats:
            def fill(r: dict[str, Any]) -> float:
                limit = r.get("bytes_limit") or 0
                return (r.get("bytes_in_use") or 0) / limit if limit else 0.0
            overall = max(with_stats, key=fill)["verdict"]
        else:
            live_total = (arrays_part or {}).get("bytes")
            overall = host_verdict(census.get("host") or {}, live_total, request_bytes)
    log_stats = (census.get("allocator_log") or {}).get("stats") or {}
    if log_stats.get("bytes_in_use") is not None:
        # The allocator's own account at the failure: exact even when the
        # census comes later (the agent waited for an exception), and there
        # when the device's statistics are not (a failed memory_stats()).
        stats = dict(log_stats)
        pool = ((census.get("allocator_log") or {}).get("summary") or {}).get("pool")
        stats.setdefault("pool_bytes", pool)
        census["allocator_log"]["verdict"] = device_verdict(stats, request_bytes)
        if not any(r.get("failed") and r.get("verdict") for r in dev_records):
            overall = census["allocator_log"]["verdict"] or overall
    census["verdict"] = overall
    lap("verdict", t)
    elapsed = time.perf_counter() - started
    census["timing"] = {"seconds": round(elapsed, 6), "budget_s": budget_s, "steps": steps, "live_arrays": n_live}
    census["skipped"] = skipped
    census["errors"] = errors
    census["complete"] = not skipped
    return census


def census_directory() -> str:
    """Where census files go: ``$JAXTOP_OOM_DIR``, else the working directory."""
    env = os.environ.get("JAXTOP_OOM_DIR")
    try:
        return os.path.abspath(env) if env else os.getcwd()
    except OSError:
        return env or "."


def write_census(census: dict[str, Any], directory: str | None = None, path: str | None = None) -> str:
    """Write a census as JSON: a new ``jaxtop-oom-PID-TIME.json`` in
    ``directory`` (default :func:`census_directory`), or over ``path``.

    Written beside and renamed, so a reader never sees half a census.

    Returns:
        The file's path.

    Raises:
        OSError: the file cannot be written.
    """
    import json

    if path is None:
        directory = directory or census_directory()
        os.makedirs(directory, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(census.get("t") or time.time()))
        base = os.path.join(directory, f"jaxtop-oom-{census.get('pid', os.getpid())}-{stamp}")
        path = f"{base}.json"
        n = 1
        while os.path.exists(path):
            path = f"{base}-{n}.json"
            n += 1
    text = json.dumps(census, indent=1, default=str, allow_nan=False) + "\n"
    from jaxtop.probes.memory_profile import write_atomic

    write_atomic(path, text.encode("utf-8"))
    return path


# --------------------------------------------------------------------------
# The monitor: hooks, the allocator's lines, the stream
# --------------------------------------------------------------------------

def _jax_imported() -> bool:
    """True once ``import jax`` has finished (not while it runs on some
    thread: importing from another thread then would break it)."""
    jax = sys.modules.get("jax")
    spec = getattr(jax, "__spec__", None)
    return jax is not None and spec is not None and not getattr(spec, "_initializing", False)


def _error_classes() -> list[type]:
    """jax's runtime error class(es): ``jax.errors.JaxRuntimeError``, and
    ``XlaRuntimeError`` where it is another class (older jaxlib).

    Imports nothing: it may run on the agent's thread, and jax imports
    both modules itself.
    """
    found: list[type] = []
    if not _jax_imported():
        return found
    candidates = [getattr(sys.modules.get("jax.errors"), "JaxRuntimeError", None),
                  getattr(sys.modules.get("jax._src.lib.xla_client"), "XlaRuntimeError", None),
                  getattr(sys.modules.get("jaxlib.xla_client"), "XlaRuntimeError", None)]
    for cls in candidates:
        if isinstance(cls, type) and issubclass(cls, BaseException) and cls not in found:
            found.append(cls)
    return found


class OomMonitor:
    """Takes censuses when the program runs out of memory.

    Build it with :func:`install`. It keeps the censuses' records until the
    agent takes them (:meth:`take_records`), writes each to a file, and
    posts a one-line ``oom`` event to the agent.

    Args:
        agent: the running :class:`jaxtop.agent.Agent` (None: files only).
        directory: where census files go (default :func:`census_directory`,
            read at each census).
        budget_s: seconds one census may take.
        note: print one line naming the file on stderr after the traceback
            of an uncaught OOM.
        profile: take the device memory profile for the allocation sites.
    """

    def __init__(self, agent: Any = None, directory: str | None = None, budget_s: float = DEFAULT_BUDGET_S,
                 note: bool = True, profile: bool = True) -> None:
        self.agent = agent
        self.directory = directory
        self.budget_s = budget_s
        self.note = note
        self.profile = profile
        self.allocator = AllocatorLog()
        self.censuses: list[dict[str, Any]] = []  # every census taken, oldest first
        self.suppressed = 0  # OOMs seen while censuses were rate limited or at their maximum
        self._lock = threading.Lock()
        self._busy = threading.local()  # a census in progress on this thread
        self._running = False  # a census in progress on any thread
        self._last_t = 0.0  # monotonic time of the last census
        self._by_exc: dict[int, dict[str, Any]] = {}  # id(exception) -> census taken when it was made
        self._pending: list[dict[str, Any]] = []  # records for the agent's stream
        self._for_sample: list[dict[str, Any]] = []  # the same, while the agent does not take records
        self._agent_takes = False  # the agent calls take_records()
        self._pending_line_t: float | None = None  # a failure line awaiting its exception
        self._prev_excepthook: Any = None
        self._prev_threading_hook: Any = None
        self._patched: list[tuple[type, Any]] = []  # (class, its own __init__ or None)
        self._seq = 0
        self.installed = False

    # -- installing ------------------------------------------------------------
    def _install(self) -> None:
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        self._prev_threading_hook = threading.excepthook
        threading.excepthook = self._threading_excepthook
        self.installed = True
        self.on_jax_imported()
        if self.agent is not None:
            try:
                self.agent.register_sample_field(OOM_CENSUS, self._sample_field)
            except Exception:
                pass

    def on_jax_imported(self, _module: Any = None) -> None:
        """Patch jax's runtime error class once jax is imported (idempotent;
        the agent calls this from its import hook)."""
        if not self.installed or self._patched or not _jax_imported():
            return
        found = _error_classes()
        # A subclass of a patched class goes through the patched __init__
        # already: patching it too would see each error twice.
        roots = [c for c in found if not any(o is not c and issubclass(c, o) for o in found)]
        monitor = self
        for cls in roots:
            own = cls.__dict__.get("__init__")
            original = cls.__init__

            def __init__(exc: BaseException, *args: Any, _original: Any = original, **kwargs: Any) -> None:
                _original(exc, *args, **kwargs)
                monitor._on_error_created(exc)

            __init__.__qualname__ = f"{cls.__qualname__}.__init__"
            __init__.__wrapped__ = original  # type: ignore[attr-defined]
            try:
                cls.__init__ = __init__  # type: ignore[misc]
            except (TypeError, AttributeError):
                continue  # an immutable type: the excepthook still sees uncaught ones
            self._patched.append((cls, own))

    def uninstall(self) -> None:
        """Put back every hook this monitor replaced (those replaced again by
        someone else since are left alone: they chain to ours, which then
        only passes on)."""
        if not self.installed:
            return
        self.installed = False
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_excepthook
        if threading.excepthook == self._threading_excepthook:
            threading.excepthook = self._prev_threading_hook
        for cls, own in self._patched:
            try:
                if own is None:
                    del cls.__init__
                else:
                    cls.__init__ = own  # type: ignore[misc]
            except (TypeError, AttributeError):
                pass
        self._patched = []

    # -- the hooks ---------------------------------------------------------------
    def _on_error_created(self, exc: BaseException) -> None:
        """Every jax runtime error passes here when it is made: cheap unless
        its text says RESOURCE_EXHAUSTED."""
        if not self.installed or getattr(self._busy, "on", False):
            return
        try:
            text = _exception_text(exc)
            if not is_oom_text(text):
                return
            trigger = {"how": "raised", "exception": _type_name(exc), "message": text[:MESSAGE_CHARS],
                       "thread": threading.current_thread().name, "uncaught": False}
            where = _user_frame_of_stack(sys._getframe(1))
            if where is not None:
                trigger["raised_at"] = where
            census = self.census(text, trigger)
            if census is not None:
                with self._lock:
                    self._by_exc[id(exc)] = census
                    while len(self._by_exc) > 16:
                        self._by_exc.pop(next(iter(self._by_exc)))
        except Exception:
            pass  # the program's own error must go on as it was

    def _on_uncaught(self, value: BaseException | None, tb: Any, thread: str) -> dict[str, Any] | None:
        if not self.installed or value is None:
            return None
        oom = find_oom_exception(value)
        if oom is None:
            return None
        text = _exception_text(oom)
        with self._lock:
            census = self._by_exc.get(id(oom))
        if census is not None and census.get("trigger", {}).get("message") != text[:MESSAGE_CHARS]:
            census = None  # another exception that got the same id
        where = _user_frame_of_traceback(tb) or _user_frame_of_traceback(getattr(oom, "__traceback__", None))
        if census is not None:
            census["trigger"]["uncaught"] = True
            census["trigger"]["thread"] = thread
            if where is not None:
                census["trigger"]["raised_at"] = where
            self._publish(census, update=True)
            return census
        trigger = {"how": "uncaught", "exception": _type_name(oom), "message": text[:MESSAGE_CHARS],
                   "thread": thread, "uncaught": True}
        if oom is not value:
            trigger["reported_as"] = _type_name(value)
        if where is not None:
            trigger["raised_at"] = where
        return self.census(text, trigger, force=True)

    def _excepthook(self, etype: Any, value: Any, tb: Any) -> None:
        census = None
        try:
            census = self._on_uncaught(value, tb, threading.current_thread().name)
        except Exception:
            pass
        prev = self._prev_excepthook or sys.__excepthook__
        try:
            prev(etype, value, tb)
        finally:
            self._say_where(census)

    def _threading_excepthook(self, args: Any) -> None:
        census = None
        try:
            name = args.thread.name if args.thread is not None else "?"
            census = self._on_uncaught(args.exc_value, args.exc_traceback, name)
        except Exception:
            pass
        prev = self._prev_threading_hook or threading.__excepthook__
        try:
            prev(args)
        finally:
            self._say_where(census)

    def _say_where(self, census: dict[str, Any] | None) -> None:
        """The one line after the program's traceback: where the census is."""
        if census is None or not self.note:
            return
        path = census.get("path")
        if path:
            text = f"jaxtop: out of memory: census written to {path} (read it with: jaxtop oom {path})\n"
        else:
            text = f"jaxtop: out of memory: the census could not be written: {census.get('file_error')}\n"
        try:
            stream = sys.stderr
            if stream is not None:
                stream.write(text)
                stream.flush()
        except Exception:
            pass

    # -- the allocator's lines (agent thread) --------------------------------------
    def on_allocator_line(self, text: str) -> None:
        """One ``O`` report from the stderr relay: an allocator or runtime
        line about memory running out. Called on whichever thread reads the
        relay's reports; never raises."""
        try:
            parsed = self.allocator.add(text)
            if parsed is not None and parsed["kind"] == "failure":
                with self._lock:
                    self._pending_line_t = time.monotonic()
        except Exception:
            pass

    def _maybe_census_from_line(self) -> None:
        """A failure line with no exception after :data:`GRACE_S`: the program
        may handle the failure out of Python's sight; take the census here."""
        with self._lock:
            pending = self._pending_line_t
            if pending is None or time.monotonic() - pending < GRACE_S:
                return
            self._pending_line_t = None
            recent = self._last_t and self._last_t >= pending - 5.0
        if recent:
            return
        event = self.allocator.latest()
        message = (event or {}).get("request", {}).get("text")
        self.census(message, {"how": "allocator_log", "thread": threading.current_thread().name, "uncaught": False},
                    sync=False)

    # -- taking a census -----------------------------------------------------------
    def _begin(self, force: bool) -> bool:
        with self._lock:
            if self._running:
                self.suppressed += 1
                return False
            now = time.monotonic()
            limited = len(self.censuses) >= MAX_CENSUSES or (self._last_t and now - self._last_t < MIN_INTERVAL_S)
            if limited and not (force and len(self.censuses) < MAX_CENSUSES + 1):
                self.suppressed += 1
                return False
            self._running = True
            self._last_t = now
            self._seq += 1
            return True

    def _sync_relay(self) -> None:
        """On GPU the allocator logged its failure just before the error:
        let the relay pass that line on before the census reads it."""
        agent = self.agent
        if agent is None or not getattr(agent, "running", False):
            return
        memory = getattr(agent, "memory", None)
        if memory is None or getattr(memory, "backend", "cpu") == "cpu":
            return
        try:
            agent.transfer_totals(sync_timeout_s=SYNC_S)
        except Exception:
            pass

    def _recent_records(self) -> list[dict[str, Any]]:
        """The agent's samples of the last :data:`TIMELINE_SPAN_S` seconds,
        thinned before decoding: a sample with a buffer map is tens of KB."""
        agent = self.agent
        if agent is None:
            return []
        import json

        lines: list[bytes] = []
        recent = getattr(agent, "recent_lines", None)
        if callable(recent):
            lines = list(recent(int(TIMELINE_SPAN_S / max(getattr(agent, "interval_s", 0.1), 0.01)) + 1))
        else:
            ring = getattr(agent, "_backfill", None)
            if ring is not None:
                first = ring.since(time.time() - TIMELINE_SPAN_S)
                lines = list(ring.lines(first, ring.end))
        lines = [line for line in lines if b'"type":"sample"' in line[:64]]
        if len(lines) > TIMELINE_POINTS:
            step = len(lines) / TIMELINE_POINTS
            lines = [lines[int(i * step)] for i in range(TIMELINE_POINTS - 1)] + [lines[-1]]
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def census(self, message: str | None, trigger: dict[str, Any], force: bool = False,
               sync: bool = True) -> dict[str, Any] | None:
        """Take, write and publish one census (rate limited, see
        :data:`MAX_CENSUSES` and :data:`MIN_INTERVAL_S`).

        Args:
            message: the error's text.
            trigger: how the OOM was seen (stored in the census).
            force: an uncaught OOM: taken even within :data:`MIN_INTERVAL_S`
                of the last census (the program is about to end).
            sync: first let the stderr relay pass on pending allocator lines.

        Returns:
            The census, or None when rate limited or already in progress.
        """
        if not self._begin(force):
            return None
        self._busy.on = True
        try:
            if sync:
                self._sync_relay()
            with self._lock:
                seq, suppressed = self._seq, self.suppressed
            census = build_census(
                message=message,
                trigger=trigger,
                allocator=self.allocator.latest(since=time.time() - ALLOCATOR_MATCH_S),
                records=self._recent_records if self.agent is not None else None,
                budget_s=self.budget_s,
                profile=self.profile,
                census_id=f"{os.getpid()}-{seq}",
            )
            if suppressed:
                census["suppressed_before"] = suppressed
            try:
                census["path"] = write_census(census, self.directory)
            except Exception as exc:
                census["path"] = None
                census["file_error"] = f"{type(exc).__name__}: {exc}"
            with self._lock:
                self.censuses.append(census)
            self._publish(census)
            return census
        finally:
            self._busy.on = False
            with self._lock:
                self._running = False

    def _publish(self, census: dict[str, Any], update: bool = False) -> None:
        """Queue the census for the stream; on an update, write its file again."""
        if update and census.get("path"):
            try:
                write_census(census, path=census["path"])
            except Exception:
                pass
        with self._lock:
            for queue in (self._pending, self._for_sample):
                if not any(c is census for c in queue):
                    queue.append(census)
        agent = self.agent
        if agent is not None and not update:
            try:
                where = census.get("path") or census.get("file_error")
                agent.post_event("oom", text=f"out of memory: {census.get('verdict')} (census: {where})",
                                 census_id=census.get("id"))
            except Exception:
                pass

    # -- the stream (agent thread) ---------------------------------------------------
    def take_records(self) -> list[dict[str, Any]]:
        """The census records not yet sent, for the agent to emit; called on
        the agent's thread once per tick. Also does the monitor's deferred
        work: the patch once jax is imported, the census of an allocator
        failure no exception followed."""
        self._agent_takes = True
        if not self._patched and self.installed and _jax_imported():
            self.on_jax_imported()
        if self._pending_line_t is not None:
            self._maybe_census_from_line()
        if not self._pending:
            return []
        with self._lock:
            out, self._pending = self._pending, []
            self._for_sample = []
        return [dict(c) for c in out]

    def _sample_field(self) -> dict[str, Any] | None:
        """Until the agent takes records itself, each census rides in the
        next sample as its ``oom_census`` field (a public hook of the agent)."""
        if self._agent_takes:
            return None
        if not self._patched and self.installed and _jax_imported():
            self.on_jax_imported()
        if self._pending_line_t is not None:
            self._maybe_census_from_line()
        with self._lock:
            if not self._for_sample:
                return None
            census = self._for_sample.pop(0)
        return dict(census)


_monitor: OomMonitor | None = None
_install_lock = threading.Lock()


def install(agent: Any = None, *, directory: str | None = None, budget_s: float = DEFAULT_BUDGET_S,
            note: bool | None = None, profile: bool = True) -> OomMonitor:
    """Start taking OOM censuses in this process (idempotent).

    Installs the exception hooks (chained to the ones in place), patches
    jax's runtime error class now or, if jax is not imported yet, on
    :meth:`OomMonitor.on_jax_imported` / the agent's next tick, and, with
    an agent, registers the ``oom_census`` sample field.

    Args:
        agent: the running agent (``jaxtop.instrument().agent``), or None to
            write census files only.
        directory: where census files go (default ``$JAXTOP_OOM_DIR`` or the
            working directory, read at each census).
        budget_s: seconds one census may take.
        note: the one-line note on stderr after an uncaught OOM's traceback;
            default: on with an agent (under ``jaxtop run``/``instrument()``),
            off without.
        profile: take the device memory profile for allocation sites.

    Returns:
        The process's monitor (the one already installed, if any: its agent
        is set when it had none).
    """
    global _monitor
    with _install_lock:
        if _monitor is not None and _monitor.installed:
            if _monitor.agent is None and agent is not None:
                _monitor.agent = agent
                if note is None:
                    _monitor.note = True
                try:
                    agent.register_sample_field(OOM_CENSUS, _monitor._sample_field)
                except Exception:
                    pass
            return _monitor
        monitor = OomMonitor(agent, directory=directory, budget_s=budget_s,
                             note=(agent is not None) if note is None else note, profile=profile)
        monitor._install()
        _monitor = monitor
        return monitor


def uninstall() -> None:
    """Undo :func:`install` (hooks and the patch)."""
    global _monitor
    with _install_lock:
        if _monitor is not None:
            _monitor.uninstall()
            _monitor = None


def current() -> OomMonitor | None:
    """The installed monitor, or None."""
    return _monitor if _monitor is not None and _monitor.installed else None
