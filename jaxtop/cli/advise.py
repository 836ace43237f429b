"""``jaxtop advise PID|RECORDING [--json]``: the strategies a program misses,
line by line.

A PID: the agent's greeting and its history (up to ten minutes of samples),
then live samples until the evidence window is covered or ``--timeout``
passes; nothing is sent to the agent, the program is not paused. A
recording (``jaxtop run --log``, plain or gzip): every record, one advisor
per process (a ``hello`` starts one), evaluated at its last sample.

A big plain recording is read from its last window on (found by
bisection on the lines' times), and before it only the lines that carry
what the advisor keeps of a whole run; ``JAXTOP_ADVISE_WHOLE=1`` decodes
every line instead (benchmarks/advice.py compares the two).

Text: the advice, highest expected gain first, each with its evidence,
gain and fix, then what could not be judged and why. ``--json``: one
document, ``{"processes": [{"pid", "argv", "advice": [...], "not_judged":
[...]}], "read": {...}}``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import math
import os
import sys
import time
from typing import Any

import msgspec

from jaxtop.cli.exits import EXIT_USAGE
from jaxtop.wire import protocol

__all__ = ["advise_recording", "cmd_advise"]


#: Seconds of samples `jaxtop advise PID` reads at least (the agent's
#: history, then live samples, within --timeout): a younger program is
#: watched until it has run this long. Rates need 4 s of samples, and the
#: agent ties its first transfers to lines a few seconds in.
PID_SPAN_S = 10.0
#: A plain recording larger than this is read from shortly before its last
#: window (found by bisection on the lines' times), after its greeting.
BISECT_BYTES = 8 << 20
#: Seconds before the window's start read as well: the base of each running
#: total is its last value before the window, and the agent writes the jit
#: ledger's whole table at least every 10 s (changes in between): the
#: newest whole table before the window is in what is read.
WINDOW_MARGIN_S = 15.0
#: The greeting at a recording's start is read up to its first sample, at
#: most this much of it.
HEAD_BYTES = 1 << 20


class _Time(msgspec.Struct):
    t: float | None = None


_time_of = msgspec.json.Decoder(_Time).decode


def _line_t(line: bytes) -> float | None:
    """A line's time, read cheaply; None when it has none or is not JSON."""
    try:
        t = _time_of(line).t
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return t if t is not None and math.isfinite(t) else None


def _window_offset(f: Any, size: int, window_s: float) -> int:
    """Where in a plain recording its last window (less the margin) starts:
    the start of a line at or before it; 0 when its times do not tell.
    Lines are in time order as one agent wrote them; where they are not,
    the start found is another line's, and the advisor sees the lines from
    there in the order they are."""
    f.seek(max(0, size - (4 << 20)))
    tail = f.read()
    end = None
    lines = tail.split(b"\n")
    for line in reversed(lines[1:] if size > len(tail) else lines):
        end = _line_t(line)
        if end is not None:
            break
    if end is None:
        return 0
    start = end - window_s - WINDOW_MARGIN_S
    lo, hi = 0, size
    for _ in range(64):
        if hi - lo < (1 << 20):
            break
        mid = (lo + hi) // 2
        f.seek(mid)
        f.readline(protocol.MAX_RECORD_LINE_BYTES + 1)  # to the next whole line
        t = None
        for _ in range(32):  # lines without a time (replies) are stepped over
            line = f.readline(protocol.MAX_RECORD_LINE_BYTES + 1)
            if not line:
                break
            t = _line_t(line)
            if t is not None:
                break
        if t is None or t >= start:
            hi = mid
        else:
            lo = mid
    return lo


def _read(stream: Any, stats: Any, processes: list[tuple[Any, Any]], window_s: float, head: bool = False) -> None:
    """Feed the records of ``stream`` to the advisors (a ``hello`` starts a
    new one); ``head``: only the greeting, up to the first sample."""
    from jaxtop.advice import Advisor
    from jaxtop.wire.records import Hello, Sample, decode

    for lineno, line in protocol.iter_lines(stream, stats):
        try:
            record = decode(line)
        except protocol.ProtocolError as exc:
            stats.note(lineno, str(exc))
            continue
        if head and isinstance(record, Sample):
            return
        stats.records += 1
        if isinstance(record, Hello) or not processes:
            processes.append((record if isinstance(record, Hello) else None, Advisor(window_s=window_s)))
        processes[-1][1].feed(record)
        if head and stream.tell() > HEAD_BYTES:
            return


def advise_recording(path: str, window_s: float) -> tuple[list[tuple[Any, Any]], Any]:
    """The advisors of a recording's processes, fed: ``([(hello, advisor)],
    read stats)``. Lines that are not records are skipped and counted.

    A big plain recording is read in two parts: its greeting, then from
    shortly before its last window on (:data:`WINDOW_MARGIN_S`); where that
    part holds a jit ledger but none of its whole tables (an agent that did
    not repeat them), the recording is read again, whole. A compressed one
    is read whole.
    """
    from jaxtop.export.convert import guarded, open_recording

    with open_recording(path) as raw:
        if not isinstance(raw, gzip.GzipFile) and not os.environ.get("JAXTOP_ADVISE_WHOLE"):
            size = os.fstat(raw.fileno()).st_size
            offset = _window_offset(raw, size, window_s) if size > BISECT_BYTES else 0
            if offset:
                stats = protocol.ReadStats()
                processes: list[tuple[Any, Any]] = []
                raw.seek(0)
                _read(raw, stats, processes, window_s, head=True)
                raw.seek(offset)
                if offset:
                    raw.readline(protocol.MAX_RECORD_LINE_BYTES + 1)  # the line cut by the offset
                _read(raw, stats, processes, window_s)
                ledgers = [advisor.evidence.ledger() for _, advisor in processes]
                if all(ledger is None or ledger.complete for ledger in ledgers):
                    return processes, stats
            raw.seek(0)
        stats = protocol.ReadStats()
        processes = []
        _read(guarded(raw, stats), stats, processes, window_s)
    return processes, stats


def _advise_pid(pid: int, window_s: float, timeout_s: float) -> tuple[Any, Any]:
    """Read the agent's greeting and history, then live samples while the
    window is not covered (at most ``timeout_s``)."""
    from jaxtop.advice import Advisor
    from jaxtop.cli.agent_records import agent_records
    from jaxtop.wire.records import Hello, HistoryEnd, Sample

    advisor = Advisor(window_s=window_s)
    hello = None
    history_done = False
    # The agent sends its present (the newest sample) first, then its
    # history, oldest first: the present goes in after the history.
    present: list[Sample] = []
    deadline = time.monotonic() + timeout_s
    with contextlib.closing(agent_records(pid, timeout_s, lambda: time.monotonic() > deadline)) as records:
        for record in records:
            if isinstance(record, Hello):
                hello = record
            if not history_done and isinstance(record, Sample) and record.present:
                present.append(record)
                continue
            advisor.feed(record)
            if isinstance(record, HistoryEnd):
                history_done = True
                for sample in present:
                    advisor.feed(sample)
            if history_done and isinstance(record, Sample) and advisor.evidence.span_s >= PID_SPAN_S:
                break
    if not history_done:  # an agent without a history: what came is all there is
        for sample in present:
            advisor.feed(sample)
    if advisor.evidence.last_t is None:
        raise TimeoutError(f"no sample from pid {pid} within {timeout_s:g} s")
    return hello, advisor


def cmd_advise(args: argparse.Namespace) -> int:
    """``jaxtop advise PID|RECORDING``; returns the exit status."""
    from jaxtop.advice import advice_json, report_lines
    from jaxtop.wire import client

    target = args.target
    if target.isdigit() and not os.path.exists(target):
        try:
            processes = [_advise_pid(int(target), args.window, args.timeout)]
        except client.AgentNotFound:
            print(f"jaxtop advise: {client.no_agent_message(int(target))}", file=sys.stderr)
            return EXIT_USAGE
        except (TimeoutError, OSError) as exc:
            print(f"jaxtop advise: {exc}", file=sys.stderr)
            return 1
        stats = None
    else:
        if not os.path.isfile(target):
            print(f"jaxtop advise: no such file (and not a process id): {target}", file=sys.stderr)
            return EXIT_USAGE
        try:
            processes, stats = advise_recording(target, args.window)
        except OSError as exc:
            print(f"jaxtop advise: {target}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    reports = [(hello, advisor.evaluate()) for hello, advisor in processes]
    if args.json:
        doc: dict[str, Any] = {"processes": [
            {"pid": hello.pid if hello is not None else None, "argv": hello.argv if hello is not None else None,
             **advice_json(report)} for hello, report in reports]}
        if stats is not None:
            doc["read"] = {"records": stats.records, "malformed": stats.malformed, "truncated": stats.truncated,
                           "stopped": stats.stopped, "first_error": stats.first_error}
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return 0
    out: list[str] = []
    if not reports:
        out.append("advice: n/a (the recording holds no record)")
    for hello, report in reports:
        if len(reports) > 1 or hello is not None:
            who = f"pid {hello.pid}" if hello is not None and hello.pid is not None else "a process"
            argv = " ".join(hello.argv or ()) if hello is not None else ""
            out.append(f"== {who}" + (f": {argv[:120]}" if argv else ""))
        out += report_lines(report)
    if stats is not None and (stats.malformed or stats.truncated or stats.stopped):
        parts = []
        if stats.malformed:
            parts.append(f"{stats.malformed} line(s) skipped (first: {stats.first_error})")
        if stats.truncated:
            parts.append("the last line was cut short")
        if stats.stopped:
            parts.append(stats.stopped)
        out.append("read: " + "; ".join(parts))
    sys.stdout.write("\n".join(out) + "\n")
    return 0
