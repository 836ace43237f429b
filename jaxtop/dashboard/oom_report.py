"""``jaxtop oom FILE``: an OOM census as text.

FILE is a census file (``jaxtop-oom-PID-TIME.json``, one JSON object) or a
recording (JSON lines, plain or gzip) holding ``oom_census`` records, or
samples carrying one in their ``oom_census`` field. :func:`format_report` is
pure (a census dict in, text out); the dashboard's OOM screen shows the same
facts with Rich.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import sys
import time
from typing import Any, Iterable, Sequence

from jaxtop.probes.oom import OOM_CENSUS
from jaxtop.wire.safe_text import safe_record
from jaxtop.wire.units import fmt_bytes, fmt_bytes_pair

#: Block characters of the timeline's sparklines, lowest first.
SPARK = "▁▂▃▄▅▆▇█"
#: Exit statuses of ``jaxtop oom``.
EXIT_OK, EXIT_NO_CENSUS, EXIT_USAGE = 0, 1, 2


# --------------------------------------------------------------------------
# Finding censuses
# --------------------------------------------------------------------------

def censuses_in(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The censuses of a stream, oldest first, one per ``id`` (the last
    copy wins: an uncaught OOM's census is sent again once it is known to be
    fatal).

    Both forms are found: ``oom_census`` records, and samples whose
    ``oom_census`` field carries one (an agent that lets the monitor ride
    in its samples).
    """
    by_id: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for n, rec in enumerate(records):
        if not isinstance(rec, dict):
            continue
        census = None
        if rec.get("type") == OOM_CENSUS:
            census = rec
        elif rec.get("type") == "sample" and isinstance(rec.get(OOM_CENSUS), dict):
            census = rec[OOM_CENSUS]
        if census is None:
            continue
        key = str(census.get("id") or f"#{n}")
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


def load_censuses(path: str) -> list[dict[str, Any]]:
    """Every census in a census file or a recording, read in bounded memory:
    a recording line by line (no line over the protocol's limit is kept), a
    census file up to :data:`MAX_CENSUS_FILE_BYTES`.

    Raises:
        OSError: the file cannot be read.
        ValueError: the file is neither a census nor a recording, or a
            single JSON document larger than a census can be.
    """
    with open(path, "rb") as raw:
        head = raw.read(2)
    opener = gzip.open if head == b"\x1f\x8b" else open
    with opener(path, "rb") as f:  # type: ignore[operator]
        first = f.readline(MAX_CENSUS_FILE_BYTES)
        if first.lstrip().startswith(b"{") and not _whole_record(first):
            # A JSON document over several lines (a census file, indented).
            data = first + f.read(MAX_CENSUS_FILE_BYTES + 1 - len(first))
            if len(data) > MAX_CENSUS_FILE_BYTES:
                raise ValueError(f"{path}: a JSON document over {MAX_CENSUS_FILE_BYTES >> 20} MiB is no OOM census")
            try:
                whole = json.loads(data.decode("utf-8", "replace"))
            except ValueError:
                raise ValueError(f"{path}: not an OOM census nor a jaxtop recording") from None
            if isinstance(whole, dict) and whole.get("type") == OOM_CENSUS:
                return [whole]
            found = censuses_in([whole]) if isinstance(whole, dict) else []
            if found:
                return found
            raise ValueError(f"{path}: not an OOM census nor a jaxtop recording")
        if not first.endswith(b"\n") and _whole_record(first):
            return censuses_in([json.loads(first)])  # one object, the whole file, no newline
        from jaxtop.wire.protocol import ReadStats, iter_records

        stats = ReadStats()
        found = censuses_in(iter_records(io.BufferedReader(_chain(first, f)), stats))
    if not found and stats.records == 0:
        raise ValueError(f"{path}: not an OOM census nor a jaxtop recording")
    return found


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

def _when(t: Any) -> str:
    if not isinstance(t, (int, float)):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


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
    known = [v for v in vals if isinstance(v, (int, float))]
    if not known:
        return " " * len(vals)
    lo, hi = min(known), max(known)
    out = []
    for v in vals:
        if not isinstance(v, (int, float)):
            out.append(" ")
        elif hi == lo:
            out.append(SPARK[3] if hi else SPARK[0])  # flat: neither empty nor full
        else:
            out.append(SPARK[min(len(SPARK) - 1, int((v - lo) / (hi - lo) * (len(SPARK) - 1) + 0.5))])
    return "".join(out)


def trigger_line(census: dict[str, Any]) -> str:
    """"Out of memory: uncaught jax.errors.JaxRuntimeError in MainThread at
    train.py:120 in step" and the like."""
    trig = census.get("trigger") or {}
    how = trig.get("how")
    exc = trig.get("exception") or "an error"
    if how == "allocator_log":
        text = "the allocator logged a failed allocation (no Python exception seen)"
    elif trig.get("uncaught"):
        text = f"uncaught {exc}"
        if trig.get("reported_as"):
            text += f" (reported as {trig['reported_as']})"
    elif how == "raised":
        text = f"{exc} raised (caught by the program, or not yet handled)"
    elif how == "failed_array":
        text = (f"a computation failed asynchronously ({exc} held by an array the program has not read yet; "
                "reading it raises)")
    else:
        text = f"{how or 'census'}"
    if trig.get("thread"):
        text += f" in thread {trig['thread']}"
    where = trig.get("raised_at")
    if isinstance(where, dict) and where.get("site"):
        text += f" at {where['site']}"
    return "Out of memory: " + text


def request_line(census: dict[str, Any]) -> str:
    """The failed request: size, exact bytes, device, allocator and op."""
    req = census.get("request") or {}
    nbytes = req.get("bytes")
    if nbytes is None:
        if req.get("form") == "tpu_compile":
            return (f"Failed: compiling needs {fmt_bytes(req.get('used_bytes'))} of {req.get('memory_space')} "
                    f"but there is {fmt_bytes(req.get('capacity_bytes'))} "
                    f"(over by {fmt_bytes(req.get('over_bytes'))})")
        return "Failed request: size not given by the error"
    text = f"Failed request: {fmt_bytes(nbytes)} ({nbytes} bytes)"
    rounded = req.get("rounded_bytes")
    if rounded and rounded != nbytes:
        text += f", rounded to {rounded}"
    if req.get("device"):
        text += f" on {req['device']}"
    if req.get("allocator"):
        text += f" (allocator {req['allocator']})"
    if req.get("op"):
        text += f", op {req['op']}"
    return text


def _device_line(dev: dict[str, Any]) -> str:
    label = f"{dev.get('platform', '?')}:{dev.get('id', '?')}"
    parts = [f"{label:<8}"]
    if dev.get("source") == "memory_stats":
        if dev.get("bytes_limit") is not None:
            parts.append(f"in use {fmt_bytes_pair(dev.get('bytes_in_use'), dev.get('bytes_limit'))}")
        else:
            parts.append(f"in use {fmt_bytes(dev.get('bytes_in_use'))}")
        if dev.get("pool_bytes") is not None:
            parts.append(f"pool {fmt_bytes(dev['pool_bytes'])}")
        if dev.get("largest_free_block_bytes") is not None:
            parts.append(f"largest free block {fmt_bytes(dev['largest_free_block_bytes'])}")
        if isinstance(dev.get("fragmentation"), (int, float)):
            parts.append(f"fragmentation {dev['fragmentation']:.2f}")
        if dev.get("live_array_bytes") is not None:
            parts.append(f"live arrays {fmt_bytes(dev['live_array_bytes'])}")
        if isinstance(dev.get("unheld_bytes"), int):
            parts.append(f"not in arrays {fmt_bytes(dev['unheld_bytes'])}")
    else:
        parts.append(f"live arrays {fmt_bytes(dev.get('live_array_bytes'))} (no allocator statistics)")
    if dev.get("failed"):
        parts.append("<- the request failed here")
    return "  ".join(parts)


def host_line(host: dict[str, Any]) -> str:
    """RSS, address space and the limits that apply."""
    parts = [f"RSS {fmt_bytes(host.get('rss_bytes'))}"]
    if host.get("peak_rss_bytes") is not None:
        parts[-1] += f" (peak {fmt_bytes(host['peak_rss_bytes'])})"
    if host.get("vms_bytes") is not None:
        parts.append(f"address space {fmt_bytes(host['vms_bytes'])}")
    for key, name in (("rlimit_as_bytes", "RLIMIT_AS"), ("rlimit_data_bytes", "RLIMIT_DATA"),
                      ("cgroup_limit_bytes", "cgroup memory.max")):
        if host.get(key) is not None:
            parts.append(f"{name} {fmt_bytes(host[key])}")
    if host.get("mem_total_bytes") is not None:
        parts.append(f"MemTotal {fmt_bytes(host['mem_total_bytes'])} "
                     f"({fmt_bytes(host.get('mem_available_bytes'))} available)")
    return " · ".join(parts)


def arrays_summary(census: dict[str, Any]) -> str:
    """"11 live arrays, 900 MiB in 5 groups (100 % of what is in use)"."""
    arrays = census.get("arrays") or {}
    text = (f"{arrays.get('count', 0)} live arrays, {fmt_bytes(arrays.get('bytes'))} "
            f"in {arrays.get('groups_total', 0)} groups")
    in_use = [d.get("bytes_in_use") for d in census.get("devices") or [] if d.get("source") == "memory_stats"]
    if in_use and all(isinstance(v, int) for v in in_use) and sum(in_use) > 0 and arrays.get("bytes") is not None:
        text += f" ({100 * arrays['bytes'] / sum(in_use):.0f} % of the {fmt_bytes(sum(in_use))} in use)"
    if arrays.get("aliases"):
        n = arrays["aliases"]
        text += f"; {n} {'arrays share' if n != 1 else 'array shares'} another's buffer (counted once)"
    if arrays.get("not_scanned"):
        text += f"; {arrays['not_scanned']} arrays not looked at (time budget)"
    return text


def site_line(site: dict[str, Any]) -> str:
    """"train.py:88 in prefetch: 12 arrays, 9.40 GiB"."""
    count = site.get("count", 0)
    text = f"{site.get('site')}: {count} array{'s' if count != 1 else ''}, {fmt_bytes(site.get('bytes'))}"
    if site.get("via"):
        text += f" (via {site['via']})"
    if not site.get("user", True):
        text += " (no frame of your code in its stack)"
    return text


def timeline_rows(census: dict[str, Any], width: int = 40) -> list[tuple[str, str, str]]:
    """``(label, sparkline, "first → last")`` per device, then the host's RSS."""
    tl = census.get("timeline")
    if not isinstance(tl, dict) or not tl.get("t"):
        return []
    rows = []
    labels = {str(d.get("id")): f"{d.get('platform', '?')}:{d.get('id')}" for d in census.get("devices") or []}
    for dev_id, values in (tl.get("bytes_in_use") or {}).items():
        known = [v for v in values if isinstance(v, (int, float))]
        if not known:
            continue
        rows.append((labels.get(dev_id, f"device {dev_id}"), sparkline(values, width),
                     f"{fmt_bytes(known[0])} -> {fmt_bytes(known[-1])}"))
    rss = [v for v in tl.get("rss_bytes") or [] if isinstance(v, (int, float))]
    if rss:
        rows.append(("RSS", sparkline(tl["rss_bytes"], width), f"{fmt_bytes(rss[0])} -> {fmt_bytes(rss[-1])}"))
    return rows


def timeline_span(census: dict[str, Any]) -> float | None:
    tl = census.get("timeline")
    if not isinstance(tl, dict) or len(tl.get("t") or []) < 2:
        return None
    return float(tl["t"][-1] - tl["t"][0])


def timing_line(census: dict[str, Any]) -> str:
    timing = census.get("timing") or {}
    text = f"Census took {1000 * (timing.get('seconds') or 0):.1f} ms of a {timing.get('budget_s', '?')} s budget"
    skipped = census.get("skipped") or []
    if skipped:
        text += "; skipped: " + "; ".join(f"{s.get('part')} ({s.get('reason')})" for s in skipped)
    else:
        text += "; complete"
    if census.get("suppressed_before"):
        text += f"; {census['suppressed_before']} earlier OOMs were not censused (rate limit)"
    return text


def format_report(census: dict[str, Any], width: int = 100) -> str:
    """The census as plain text, for a terminal or a bug report.

    Args:
        census: a census dict (``type: "oom_census"``).
        width: the widest line wanted (sparklines and tables fit it).
    """
    out: list[str] = []
    argv = " ".join(census.get("argv") or []) or "?"
    out.append(f"jaxtop OOM census · pid {census.get('pid', '?')} · {_when(census.get('t'))} · {argv}"[:width])
    out.append(trigger_line(census))
    message = (census.get("trigger") or {}).get("message") or (census.get("request") or {}).get("text")
    if message:
        first = str(message).strip().splitlines()[0] if str(message).strip() else ""
        out.append(f"  {first[:width - 2]}")
    out.append(request_line(census))
    out.append(f"Verdict: {census.get('verdict') or 'n/a'}")
    out.append("")
    devices = census.get("devices") or []
    if devices:
        out.append("Devices")
        for dev in devices:
            out.append("  " + _device_line(dev))
            if dev.get("verdict") and dev.get("verdict") != census.get("verdict"):
                out.append(f"           {dev['verdict']}")
    if census.get("host"):
        out.append("Host: " + host_line(census["host"]))
    out.append("")
    arrays = census.get("arrays")
    if arrays:
        out.append("Largest live arrays: " + arrays_summary(census))
        groups = arrays.get("groups") or []
        if groups:
            out.append(f"  {'count':>7}  {'bytes':>10}  {'each':>10}  {'array':<32} where")
            for g in groups:
                out.append(f"  {g.get('count', 0):>7}  {fmt_bytes(g.get('bytes')):>10}  "
                           f"{fmt_bytes(g.get('bytes_each')):>10}  {_dims(g.get('shape'), g.get('dtype')):<32} "
                           f"{g.get('placement', '')}")
            rest = (arrays.get("bytes") or 0) - (arrays.get("shown_bytes") or 0)
            if arrays.get("groups_total", 0) > len(groups):
                out.append(f"  … {arrays['groups_total'] - len(groups)} more groups, {fmt_bytes(rest)}")
    else:
        out.append("Largest live arrays: n/a (not scanned)")
    out.append("")
    sites = census.get("sites")
    if sites and sites.get("top"):
        out.append("Allocation sites holding the most (innermost frame of your code)")
        for site in sites["top"]:
            out.append("  " + site_line(site))
        out.append(f"  (device memory profile: {sites.get('count', 0)} buffers, {fmt_bytes(sites.get('bytes'))})")
    else:
        out.append("Allocation sites: n/a" + (" (skipped)" if any(s.get("part") == "sites" for s in census.get("skipped") or [])
                                               else ""))
    rows = timeline_rows(census, width=max(10, min(60, width - 40)))
    if rows:
        span = timeline_span(census)
        out.append("")
        out.append("Before the OOM (bytes in use" + (f", last {span:.0f} s)" if span else ")"))
        for label, spark, change in rows:
            out.append(f"  {label:<8} {spark}  {change}")
    log = census.get("allocator_log")
    if isinstance(log, dict):
        out.append("")
        out.append("Allocator log")
        for line in log.get("lines") or []:
            out.append(f"  {line[:width - 2]}")
        stats = log.get("stats") or {}
        if stats:
            out.append("  at the failure: " + ", ".join(
                f"{k} {v if k == 'num_allocs' else fmt_bytes(v)}" for k, v in stats.items()))
        if log.get("occupancy"):
            out.append(f"  pool: {log['occupancy'][:width - 8]}")
    out.append("")
    out.append(timing_line(census))
    if census.get("errors"):
        out.append("Errors: " + "; ".join(str(e) for e in census["errors"]))
    if census.get("path"):
        out.append(f"File: {census['path']}")
    return "\n".join(out) + "\n"


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
    try:
        found = load_censuses(args.file)
    except (OSError, ValueError, EOFError) as exc:
        print(f"jaxtop oom: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not found:
        print(f"jaxtop oom: no OOM census in {args.file}", file=sys.stderr)
        return EXIT_NO_CENSUS
    # Someone else's census: its strings (argv, messages, file names) are
    # shown, never obeyed (jaxtop.wire.safe_text).
    chosen = [safe_record(c) for c in (found if args.all else found[-1:])]
    try:
        width = max(60, min(160, os.get_terminal_size().columns))
    except OSError:
        width = 100
    for i, census in enumerate(chosen):
        if i:
            print()
        if args.json:
            print(json.dumps(census, indent=1))
        else:
            sys.stdout.write(format_report(census, width=width))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
