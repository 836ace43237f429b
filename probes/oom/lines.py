"""Out-of-memory text: the sizes, exception messages and allocator log lines
XLA prints when memory runs out, and the scanner that picks those lines out
of stderr.

Stdlib only, and no ``typing`` at run time: the stderr relay (a ``python -S``
child with only the probes folder on its path) imports this package for
:class:`OomLineScanner`.
"""

from __future__ import annotations

import re
import time
try:
    from ..forksafe import ForkLock
except ImportError:  # the stderr relay imports this package as top-level `oom` (python -S, probes/ first on sys.path)
    from forksafe import ForkLock  # type: ignore[no-redef]

# The relay imports this file without ``site``; ``typing`` alone would cost
# it ~8 ms at every start. Type checkers read the import; Python skips it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "ALLOCATOR_MATCH_S",
    "MESSAGE_CHARS",
    "AllocatorLog",
    "OomLineScanner",
    "is_oom_text",
    "parse_allocator_line",
    "parse_oom_message",
    "parse_size",
]

#: An allocator event this much older than an exception is not its cause.
ALLOCATOR_MATCH_S = 30.0
#: Longest message text kept.
MESSAGE_CHARS = 2000


# --------------------------------------------------------------------------
# Sizes
# --------------------------------------------------------------------------

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
        self._lock = ForkLock()
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

