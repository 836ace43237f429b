"""``jaxtop export``: a recording as a CSV table or a Perfetto (Chrome
trace-event) JSON file. Both stream: memory stays flat for any file size.

CSV columns are listed in :data:`CSV_COLUMNS` and documented in
docs/protocol.md ("Exports"); the trace format is Chrome's trace-event JSON
(``{"traceEvents": [...]}``), which ui.perfetto.dev and chrome://tracing open.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
from typing import IO, Any, Iterator

from jaxtop import protocol

DIRECTIONS = ("h2d", "d2h", "d2d")

# One row per (sample, device). Process-wide columns (transfers, host,
# compiles) repeat on each device row of the same sample.
CSV_COLUMNS = (
    "t", "seq", "pid", "device_id", "platform", "source",
    "bytes_in_use", "peak_bytes_in_use", "peak_rise_bytes", "pool_bytes", "bytes_limit",
    "largest_free_block_bytes", "fragmentation", "num_allocs",
    "live_array_bytes", "live_array_count", "largest_live_array_bytes",
    *(f"{d}_{k}" for d in DIRECTIONS for k in ("count", "bytes_known", "count_total", "bytes_known_total")),
    "rss_bytes", "cpu_percent", "compiles_total", "compile_seconds_total", "donation_failed_total",
)


def open_recording(path: str) -> IO[bytes]:
    """A recording, plain or gzip-compressed (as `w` in the dashboard may write)."""
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def _records(path: str, stats: protocol.ReadStats) -> Iterator[dict[str, Any]]:
    with open_recording(path) as stream:
        yield from protocol.iter_records(stream, stats)


def _num(value: Any) -> Any:
    return "" if value is None else value


_DEVICE_KEYS = ("id", "platform", "source", "bytes_in_use", "peak_bytes_in_use", "peak_rise_bytes", "pool_bytes",
                "bytes_limit", "largest_free_block_bytes", "fragmentation", "num_allocs")
_LIVE_KEYS = ("bytes", "count", "largest_bytes")
_TRANSFER_KEYS = ("count", "bytes_known", "count_total", "bytes_known_total")
_EMPTY: dict[str, Any] = {}


def write_csv(path: str, out: IO[str]) -> protocol.ReadStats:
    """Write the CSV table of the recording at ``path`` to ``out``."""
    stats = protocol.ReadStats()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    rows: list[list[Any]] = []
    pid: Any = ""
    for rec in _records(path, stats):
        kind = rec.get("type")
        if kind != "sample":
            if kind == "hello":
                pid = _num(rec.get("pid"))
            continue
        tr = rec.get("transfers") or _EMPTY
        proc = rec.get("process") or _EMPTY
        comp = rec.get("compile") or _EMPTY
        tail = [_num(x.get(k)) for d in DIRECTIONS for x in (tr.get(d) or _EMPTY,) for k in _TRANSFER_KEYS]
        tail += [_num(proc.get("rss_bytes")), _num(proc.get("cpu_percent")), _num(comp.get("count_total")),
                 _num(comp.get("seconds_total")), _num((rec.get("donation") or _EMPTY).get("failed_total"))]
        head = [rec.get("t"), rec.get("seq"), pid]
        for dev in rec.get("devices") or (_EMPTY,):
            live = dev.get("live_arrays") or _EMPTY
            rows.append(head + [_num(dev.get(k)) for k in _DEVICE_KEYS] + [_num(live.get(k)) for k in _LIVE_KEYS] + tail)
        if len(rows) >= 4096:
            writer.writerows(rows)
            rows.clear()
    writer.writerows(rows)
    return stats


_MEMORY_KEYS = ("bytes_in_use", "pool_bytes", "peak_bytes_in_use", "bytes_limit")


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def write_perfetto(path: str, out: IO[str]) -> protocol.ReadStats:
    """Write a Chrome trace-event JSON of the recording at ``path`` to ``out``.

    Counter tracks ("ph": "C") per device for memory and fragmentation, per
    process for transfers per second, RSS and CPU; instant events ("ph": "i")
    for compiles, failed donations and the agent's events.
    """
    stats = protocol.ReadStats()
    out.write('{"displayTimeUnit":"ms","traceEvents":[\n')
    first = True

    def emit(event: dict[str, Any]) -> None:
        nonlocal first
        out.write(("" if first else ",\n") + json.dumps(event, separators=(",", ":")))
        first = False

    def counter(name: str, ts: int, args: dict[str, Any]) -> None:
        # The bulk of a trace: formatted directly (numbers only, names fixed).
        nonlocal first
        body = ",".join(f'"{k}":{v!r}' for k, v in args.items() if _finite(v))
        if body:
            out.write(f'{"" if first else ","}\n{{"ph":"C","name":"{name}","ts":{ts},"pid":{pid},"tid":0,"args":{{{body}}}}}')
            first = False

    pid = 0
    last_t: float | None = None
    last_compiles = last_failed = None
    for rec in _records(path, stats):
        kind = rec.get("type")
        t = rec.get("t")
        if not isinstance(t, (int, float)):
            continue
        ts = round(t * 1e6)
        if kind == "hello":
            pid = rec.get("pid") if isinstance(rec.get("pid"), int) else 0
            name = " ".join(rec.get("argv") or []) or f"pid {pid}"
            emit({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"{name} (pid {pid})"}})
            continue
        if kind == "exit":
            emit({"ph": "i", "name": "process exited", "s": "p", "ts": ts, "pid": pid, "tid": 0})
            continue
        if kind != "sample":
            continue
        for dev in rec.get("devices") or []:
            did = dev.get("id")
            if not isinstance(did, int):
                continue
            counter(f"device {did} memory (bytes)", ts, {k: dev.get(k) for k in _MEMORY_KEYS})
            counter(f"device {did} fragmentation", ts, {"fragmentation": dev.get("fragmentation")})
        tr = rec.get("transfers") or {}
        if last_t is not None and t > last_t:
            dt = t - last_t
            counter("implicit transfers/s", ts,
                    {d: tr[d].get("count", 0) / dt for d in DIRECTIONS if isinstance(tr.get(d), dict)})
        last_t = t
        proc = rec.get("process") or {}
        counter("host RSS (bytes)", ts, {"rss": proc.get("rss_bytes")})
        comp = (rec.get("compile") or {}).get("count_total")
        if isinstance(comp, int):
            if last_compiles is not None and comp > last_compiles:
                emit({"ph": "i", "name": f"compile ×{comp - last_compiles}", "s": "p", "ts": ts, "pid": pid, "tid": 0,
                      "args": {"compiles_total": comp}})
            last_compiles = comp
        failed = (rec.get("donation") or {}).get("failed_total")
        if isinstance(failed, int):
            if last_failed is not None and failed > last_failed:
                emit({"ph": "i", "name": "donation failed", "s": "p", "ts": ts, "pid": pid, "tid": 0,
                      "args": {"message": (rec.get("donation") or {}).get("last_message")}})
            last_failed = failed
        for ev in rec.get("events") or []:
            if isinstance(ev, dict):
                emit({"ph": "i", "name": str(ev.get("kind", "event")), "s": "p", "ts": ts, "pid": pid, "tid": 0,
                      "args": {k: v for k, v in ev.items() if k not in ("kind", "t")}})
    out.write("\n]}\n")
    return stats
