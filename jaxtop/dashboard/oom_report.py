"""``jaxtop oom FILE``: an OOM census as text.

FILE is a census file (``jaxtop-oom-PID-TIME.json``, one JSON object) or a
recording (JSON lines, plain or gzip) holding ``oom_census`` records, or
samples carrying one in their ``oom_census`` field. Every record is decoded
by :func:`jaxtop.wire.records.decode` (its strings shown, never obeyed; a
part of the wrong type read as n/a), and :func:`format_report` is pure (a
typed census in, text out); the dashboard's OOM screen shows the same
facts with Rich, in the same words.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from typing import Any, Iterable, Iterator, Sequence

import msgspec

from jaxtop.dashboard.oom_views import device_label, said
from jaxtop.export.convert import guarded, open_recording
from jaxtop.wire.protocol import ProtocolError, ReadStats, iter_records
from jaxtop.wire.records import (
    CensusArrays, CensusDevice, CensusHost, CensusRequest, CensusSite, CensusTiming, CensusTrigger, OomCensus, Record,
    Sample, Unknown, decode,
)
from jaxtop.wire.records.core import ODD_KEY
from jaxtop.wire.units import fmt_bytes, fmt_bytes_pair

#: Block characters of the timeline's sparklines, lowest first.
SPARK = "▁▂▃▄▅▆▇█"
#: Exit statuses of ``jaxtop oom``.
EXIT_OK, EXIT_NO_CENSUS, EXIT_USAGE = 0, 1, 2

#: The parts of a census that did not say anything: each reads n/a.
NO_TRIGGER, NO_REQUEST, NO_HOST, NO_ARRAYS, NO_TIMING = (CensusTrigger(), CensusRequest(), CensusHost(),
                                                         CensusArrays(), CensusTiming())


# --------------------------------------------------------------------------
# Finding censuses
# --------------------------------------------------------------------------

def censuses_in(records: Iterable[Record | Unknown]) -> list[OomCensus]:
    """The censuses of a stream of decoded records, oldest first, one per
    ``id`` (the last copy wins: an uncaught OOM's census is sent again once
    it is known to be fatal).

    Both forms are found: ``oom_census`` records, and samples whose
    ``oom_census`` field carries one (an agent that lets the monitor ride
    in its samples).
    """
    by_id: dict[str, OomCensus] = {}
    order: list[str] = []
    for n, rec in enumerate(records):
        census: OomCensus | None = None
        if isinstance(rec, OomCensus):
            census = rec
        elif isinstance(rec, Sample):  # a sample, or its backfill copy
            census = rec.oom_census
        if census is None:
            continue
        key = census.id or f"#{n}"
        if key not in by_id:
            order.append(key)
        by_id[key] = census
    return [by_id[k] for k in order]


#: The most a census file (one JSON object, not JSON lines) may hold once
#: decompressed. The agent writes a few hundred KiB at most (arrays and sites
#: are cut to their largest); a file beyond this is no census of ours, and
#: reading it whole would take its size in memory, twice (a gzip bomb of
#: 54 MB held 8 GiB).
MAX_CENSUS_FILE_BYTES = 64 << 20


def load_censuses(path: str, stats: ReadStats | None = None) -> list[OomCensus]:
    """Every census in a census file or a recording, read in bounded memory:
    a recording line by line (no line over the protocol's limit is kept), a
    census file up to :data:`MAX_CENSUS_FILE_BYTES`.

    Args:
        stats: filled with what the reading met: ``stopped`` says why it
            ended early (a gzip that expands past any recording's ratio).

    Raises:
        OSError: the file cannot be read.
        ValueError: the file is neither a census nor a recording, or a
            single JSON document larger than a census can be.
    """
    stats = stats if stats is not None else ReadStats()
    with open_recording(path) as raw:
        # A gzip file read through the guard: a decompression bomb ends
        # after its first 64 MiB, said in stats.stopped.
        f = guarded(raw, stats)
        first = f.readline(MAX_CENSUS_FILE_BYTES)
        if first.lstrip().startswith(b"{") and not _whole_record(first):
            # A JSON document over several lines (a census file, indented).
            data = first + _read_up_to(f, MAX_CENSUS_FILE_BYTES + 1 - len(first))
            if len(data) > MAX_CENSUS_FILE_BYTES or stats.stopped:
                raise ValueError(f"{path}: a JSON document over {MAX_CENSUS_FILE_BYTES >> 20} MiB is no OOM census"
                                 + (f" ({stats.stopped})" if stats.stopped else ""))
            try:
                found = censuses_in([decode(data)])
            except ProtocolError:
                found = []
            if found:
                return found
            raise ValueError(f"{path}: not an OOM census nor a jaxtop recording")
        if not first.endswith(b"\n") and _whole_record(first):
            # One object, the whole file, no newline.
            try:
                return censuses_in([decode(first)])
            except ProtocolError:
                return []
        found = censuses_in(_records(io.BufferedReader(_chain(first, f)), stats))
    if not found and stats.records == 0:
        raise ValueError(f"{path}: not an OOM census nor a jaxtop recording"
                         + (f" ({stats.stopped})" if stats.stopped else ""))
    return found


def _read_up_to(f: Any, n: int) -> bytes:
    """``n`` bytes of ``f``, fewer only at its end (a guarded gzip stream
    gives one step of decompression per read)."""
    parts, left = [], n
    while left > 0:
        chunk = f.read(left)
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _records(stream: Any, stats: ReadStats) -> Iterator[Record | Unknown]:
    """The records of a recording, decoded; a line that is no record is
    counted in ``stats`` and skipped."""
    return iter_records(stream, stats, decode)


def _whole_record(line: bytes) -> bool:
    """True when ``line`` is a JSON object by itself (a recording's line, or
    a census written on one line)."""
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


class _chain(io.RawIOBase):
    """``first`` and then the rest of ``f``, as one binary stream (the line
    already read to tell a recording from a census file is not lost)."""

    def __init__(self, first: bytes, f: Any) -> None:
        self._first, self._f = first, f

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        if self._first:
            n = min(len(buf), len(self._first))
            buf[:n], self._first = self._first[:n], self._first[n:]
            return n
        data = self._f.read(len(buf))
        buf[: len(data)] = data
        return len(data)


# --------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------

def _when(t: float | None) -> str:
    if t is None:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _or(value: Any, missing: str = "?") -> Any:
    """``value``, or ``missing`` where the census has none."""
    return missing if value is None else value


def _dims(shape: Any, dtype: Any) -> str:
    if isinstance(shape, (list, tuple)):
        return f"{dtype}[{', '.join(str(s) for s in shape)}]"
    return f"{dtype}{shape}"


def sparkline(values: Sequence[float | None], width: int) -> str:
    """Values as block characters, at most ``width`` of them (the last ones
    kept when thinning); a gap (None) is a space."""
    if width <= 0:
        return ""
    vals = list(values)
    if len(vals) > width:
        step = len(vals) / width
        vals = [vals[int(i * step)] for i in range(width - 1)] + [vals[-1]]
    known = [v for v in vals if v is not None]
    if not known:
        return " " * len(vals)
    lo, hi = min(known), max(known)
    out = []
    for v in vals:
        if v is None:
            out.append(" ")
        elif hi == lo:
            out.append(SPARK[3] if hi else SPARK[0])  # flat: neither empty nor full
        else:
            out.append(SPARK[min(len(SPARK) - 1, int((v - lo) / (hi - lo) * (len(SPARK) - 1) + 0.5))])
    return "".join(out)


def trigger_line(census: OomCensus) -> str:
    """"Out of memory: uncaught jax.errors.JaxRuntimeError in MainThread at
    train.py:120 in step" and the like."""
    trig = census.trigger or NO_TRIGGER
    how = trig.how
    exc = trig.exception or "an error"
    if how == "allocator_log":
        text = "the allocator logged a failed allocation (no Python exception seen)"
    elif trig.uncaught:
        text = f"uncaught {exc}"
        if trig.reported_as:
            text += f" (reported as {trig.reported_as})"
    elif how == "raised":
        text = f"{exc} raised (caught by the program, or not yet handled)"
    elif how == "failed_array":
        text = (f"a computation failed asynchronously ({exc} held by an array the program has not read yet; "
                "reading it raises)")
    else:
        text = f"{how or 'census'}"
    if trig.thread:
        text += f" in thread {trig.thread}"
    where = trig.raised_at
    if where is not None and where.site:
        text += f" at {where.site}"
    return "Out of memory: " + text


def request_line(census: OomCensus) -> str:
    """The failed request: size, exact bytes, device, allocator and op."""
    req = census.request or NO_REQUEST
    nbytes = req.bytes
    if nbytes is None:
        if req.form == "tpu_compile":
            return (f"Failed: compiling needs {fmt_bytes(req.used_bytes)} of {req.memory_space} "
                    f"but there is {fmt_bytes(req.capacity_bytes)} "
                    f"(over by {fmt_bytes(req.over_bytes)})")
        return "Failed request: size not given by the error"
    text = f"Failed request: {fmt_bytes(nbytes)} ({nbytes} bytes)"
    rounded = req.rounded_bytes
    if rounded and rounded != nbytes:
        text += f", rounded to {rounded}"
    if req.device:
        text += f" on {req.device}"
    if req.allocator:
        text += f" (allocator {req.allocator})"
    if req.op:
        text += f", op {req.op}"
    return text


def _device_line(dev: CensusDevice) -> str:
    parts = [f"{device_label(dev):<8}"]
    if dev.source == "memory_stats":
        if dev.bytes_limit is not None:
            parts.append(f"in use {fmt_bytes_pair(dev.bytes_in_use, dev.bytes_limit)}")
        else:
            parts.append(f"in use {fmt_bytes(dev.bytes_in_use)}")
        if dev.pool_bytes is not None:
            parts.append(f"pool {fmt_bytes(dev.pool_bytes)}")
        if dev.largest_free_block_bytes is not None:
            parts.append(f"largest free block {fmt_bytes(dev.largest_free_block_bytes)}")
        if dev.fragmentation is not None:
            parts.append(f"fragmentation {dev.fragmentation:.2f}")
        if dev.live_array_bytes is not None:
            parts.append(f"live arrays {fmt_bytes(dev.live_array_bytes)}")
        if dev.unheld_bytes is not None:
            parts.append(f"not in arrays {fmt_bytes(dev.unheld_bytes)}")
    else:
        parts.append(f"live arrays {fmt_bytes(dev.live_array_bytes)} (no allocator statistics)")
    if dev.failed:
        parts.append("<- the request failed here")
    return "  ".join(parts)


def host_line(host: CensusHost) -> str:
    """RSS, address space and the limits that apply."""
    parts = [f"RSS {fmt_bytes(host.rss_bytes)}"]
    if host.peak_rss_bytes is not None:
        parts[-1] += f" (peak {fmt_bytes(host.peak_rss_bytes)})"
    if host.vms_bytes is not None:
        parts.append(f"address space {fmt_bytes(host.vms_bytes)}")
    for limit, name in ((host.rlimit_as_bytes, "RLIMIT_AS"), (host.rlimit_data_bytes, "RLIMIT_DATA"),
                        (host.cgroup_limit_bytes, "cgroup memory.max")):
        if limit is not None:
            parts.append(f"{name} {fmt_bytes(limit)}")
    if host.mem_total_bytes is not None:
        parts.append(f"MemTotal {fmt_bytes(host.mem_total_bytes)} "
                     f"({fmt_bytes(host.mem_available_bytes)} available)")
    return " · ".join(parts)


def arrays_summary(census: OomCensus) -> str:
    """"11 live arrays, 900 MiB in 5 groups (100 % of what is in use)"."""
    arrays = census.arrays or NO_ARRAYS
    text = (f"{_or(arrays.count)} live arrays, {fmt_bytes(arrays.bytes)} "
            f"in {_or(arrays.groups_total)} groups")
    in_use = [d.bytes_in_use for d in census.devices or () if d.source == "memory_stats"]
    total = sum(v for v in in_use if v is not None)
    if in_use and None not in in_use and total > 0 and arrays.bytes is not None:
        text += f" ({100 * arrays.bytes / total:.0f} % of the {fmt_bytes(total)} in use)"
    if arrays.aliases:
        n = arrays.aliases
        text += f"; {n} {'arrays share' if n != 1 else 'array shares'} another's buffer (counted once)"
    if arrays.not_scanned:
        text += f"; {arrays.not_scanned} arrays not looked at (time budget)"
    return text


def site_line(site: CensusSite) -> str:
    """"train.py:88 in prefetch: 12 arrays, 9.40 GiB"."""
    count = site.count
    text = f"{site.site}: {_or(count)} array{'s' if count != 1 else ''}, {fmt_bytes(site.bytes)}"
    if site.via:
        text += f" (via {site.via})"
    if site.user is False:
        text += " (no frame of your code in its stack)"
    return text


def timeline_rows(census: OomCensus, width: int = 40) -> list[tuple[str, str, str]]:
    """``(label, sparkline, "first → last")`` per device, then the host's RSS."""
    tl = census.timeline
    if tl is None or not tl.t:
        return []
    rows = []
    labels = {str(d.id): device_label(d) for d in census.devices or ()}
    for dev_id, values in (tl.bytes_in_use or {}).items():
        known = [v for v in values if v is not None]
        if not known:
            continue
        rows.append((labels.get(dev_id, f"device {dev_id}"), sparkline(values, width),
                     f"{fmt_bytes(known[0])} -> {fmt_bytes(known[-1])}"))
    rss = [v for v in tl.rss_bytes or () if v is not None]
    if rss:
        rows.append(("RSS", sparkline(tl.rss_bytes or (), width), f"{fmt_bytes(rss[0])} -> {fmt_bytes(rss[-1])}"))
    return rows


def timeline_span(census: OomCensus) -> float | None:
    """Seconds from the timeline's first point to its last (None: fewer than two)."""
    tl = census.timeline
    times = [t for t in (tl.t if tl is not None else None) or () if t is not None]
    if len(times) < 2:
        return None
    return float(times[-1] - times[0])


def timing_line(census: OomCensus) -> str:
    timing = census.timing or NO_TIMING
    text = f"Census took {1000 * (timing.seconds or 0):.1f} ms of a {_or(timing.budget_s)} s budget"
    skipped = census.skipped or []
    if skipped:
        text += "; skipped: " + "; ".join(f"{s.part} ({s.reason})" for s in skipped)
    else:
        text += "; complete"
    if census.suppressed_before:
        text += f"; {census.suppressed_before} earlier OOMs were not censused (rate limit)"
    return text


def format_report(census: OomCensus, width: int = 100) -> str:
    """The census as plain text, for a terminal or a bug report.

    Args:
        census: a decoded census (:func:`jaxtop.wire.records.decode`).
        width: the widest line wanted (sparklines and tables fit it).
    """
    out: list[str] = []
    argv = " ".join(census.argv or []) or "?"
    out.append(f"jaxtop OOM census · pid {_or(census.pid)} · {_when(census.t)} · {argv}"[:width])
    out.append(trigger_line(census))
    message = (census.trigger or NO_TRIGGER).message or (census.request or NO_REQUEST).text
    if message:
        first = message.strip().splitlines()[0] if message.strip() else ""
        out.append(f"  {first[:width - 2]}")
    out.append(request_line(census))
    out.append(f"Verdict: {census.verdict or 'n/a'}")
    out.append("")
    devices = census.devices or []
    if devices:
        out.append("Devices")
        for dev in devices:
            out.append("  " + _device_line(dev))
            if dev.verdict and dev.verdict != census.verdict:
                out.append(f"           {dev.verdict}")
    if census.host is not None and said(census.host):
        out.append("Host: " + host_line(census.host))
    out.append("")
    arrays = census.arrays
    if arrays is not None and said(arrays):
        out.append("Largest live arrays: " + arrays_summary(census))
        groups = arrays.groups or []
        if groups:
            out.append(f"  {'count':>7}  {'bytes':>10}  {'each':>10}  {'array':<32} where")
            for g in groups:
                out.append(f"  {_or(g.count):>7}  {fmt_bytes(g.bytes):>10}  "
                           f"{fmt_bytes(g.bytes_each):>10}  {_dims(g.shape, g.dtype):<32} "
                           f"{g.placement or ''}")
            rest = (arrays.bytes or 0) - (arrays.shown_bytes or 0)
            if (arrays.groups_total or 0) > len(groups):
                out.append(f"  … {arrays.groups_total - len(groups)} more groups, {fmt_bytes(rest)}")
    else:
        out.append("Largest live arrays: n/a (not scanned)")
    out.append("")
    sites = census.sites
    if sites is not None and sites.top:
        out.append("Allocation sites holding the most (innermost frame of your code)")
        for site in sites.top:
            out.append("  " + site_line(site))
        out.append(f"  (device memory profile: {_or(sites.count)} buffers, {fmt_bytes(sites.bytes)})")
    else:
        out.append("Allocation sites: n/a" + (" (skipped)" if any(s.part == "sites" for s in census.skipped or ())
                                               else ""))
    rows = timeline_rows(census, width=max(10, min(60, width - 40)))
    if rows:
        span = timeline_span(census)
        out.append("")
        out.append("Before the OOM (bytes in use" + (f", last {span:.0f} s)" if span else ")"))
        for label, spark, change in rows:
            out.append(f"  {label:<8} {spark}  {change}")
    log = census.allocator_log
    if log is not None:
        out.append("")
        out.append("Allocator log")
        for line in log.lines or ():
            out.append(f"  {line[:width - 2]}")
        stats = log.stats.items() if log.stats is not None else ()
        if stats:
            out.append("  at the failure: " + ", ".join(
                f"{k} {v if k == 'num_allocs' else fmt_bytes(v)}" for k, v in stats))
        if log.occupancy:
            out.append(f"  pool: {log.occupancy[:width - 8]}")
    out.append("")
    out.append(timing_line(census))
    if census.errors:
        out.append("Errors: " + "; ".join(census.errors))
    if census.odd:
        # Parts of the wrong type (a newer agent's, a damaged or forged file):
        # each read n/a above, said here once.
        out.append("Not read: " + "; ".join(f"{o.where} is {o.value}, not {o.should}" for o in census.odd))
    if census.path:
        out.append(f"File: {census.path}")
    return "\n".join(out) + "\n"


def census_json(census: OomCensus) -> str:
    """The census as JSON (``jaxtop oom --json``): every field the census
    has, as read (a field it lacks is null; one of the wrong type too)."""
    obj = msgspec.to_builtins(census)
    obj.pop(ODD_KEY, None)  # the decoder's notes, not the census's
    return json.dumps(obj, indent=1)


def main(argv: Sequence[str] | None = None) -> int:
    """``jaxtop oom FILE [--all] [--json]``: print a census as text.

    Returns:
        0 when a census was printed, 1 when FILE holds none, 2 when FILE
        cannot be read or is not a census nor a recording.
    """
    parser = argparse.ArgumentParser(
        prog="jaxtop oom",
        description="Print an out-of-memory census: what held the memory when the program ran out.",
    )
    parser.add_argument("file", help="a census file (jaxtop-oom-PID-TIME.json) or a recording holding one")
    parser.add_argument("--all", action="store_true", help="every census in FILE, not only the last")
    parser.add_argument("--json", action="store_true", help="print the census as JSON")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    stats = ReadStats()
    try:
        found = load_censuses(args.file, stats)
    except FileNotFoundError:
        print(f"jaxtop oom: no such file: {args.file}", file=sys.stderr)
        return EXIT_USAGE
    except IsADirectoryError:
        print(f"jaxtop oom: a directory, not a census or recording: {args.file}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, ValueError, EOFError) as exc:
        print(f"jaxtop oom: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if stats.stopped:  # what came before is shown; the line says why no more
        print(f"jaxtop oom: {args.file}: {stats.stopped}", file=sys.stderr)
    if not found:
        print(f"jaxtop oom: no OOM census in {args.file}", file=sys.stderr)
        return EXIT_NO_CENSUS
    # Someone else's census: its strings (argv, messages, file names) were
    # made safe to show by the decoder (jaxtop.wire.safe_text).
    chosen = found if args.all else found[-1:]
    try:
        width = max(60, min(160, os.get_terminal_size().columns))
    except OSError:
        width = 100
    for i, census in enumerate(chosen):
        if i:
            print()
        if args.json:
            print(census_json(census))
        else:
            sys.stdout.write(format_report(census, width=width))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
