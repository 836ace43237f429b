"""Samples decoded straight into the few fields an export writes.

A demo sample is about 2 KB of JSON, of which the CSV export writes some 40
numbers: the transfers' shape table, the jit ledger, the capture status and
the agent's own counters are decoded for nothing. msgspec decodes a line
into :class:`Sample`, which names only the fields the CSV rows read, and
skips the rest without building Python objects for it: 100,000 demo samples
decode in 0.26 s where ``orjson.loads`` takes 0.47 s, and the rows are then
read from attributes, not looked up in dicts.

The output must be what the plain path (json.loads, then the writer's
``sample(rec)``) writes, byte for byte. msgspec reads every value the same
way json.loads does (big integers exactly, duplicate keys: the last wins,
floats correctly rounded); where the two differ, msgspec refuses the line
and the plain path takes it: ``NaN``/``Infinity``, a number beyond a float's
range, a lone surrogate, a byte order mark, deep nesting. A field of an
unexpected shape (a list where an object belongs, a non-object device)
also fails validation here and goes the plain way, which has the rules for
it. ``tests/test_export_paths.py`` holds the two paths to the same bytes on real
and hostile recordings.
"""

from __future__ import annotations

from typing import Any

try:
    import msgspec
except ImportError:  # an install without it: every line goes the plain way
    msgspec = None  # type: ignore[assignment]

#: What makes a line go the plain way.
if msgspec is not None:
    ERRORS: tuple[type[BaseException], ...] = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)
else:
    ERRORS = ()


if msgspec is not None:

    class Live(msgspec.Struct):
        bytes: Any = None
        count: Any = None
        largest_bytes: Any = None

    class Device(msgspec.Struct):
        id: Any = None
        platform: Any = None
        source: Any = None
        bytes_in_use: Any = None
        peak_bytes_in_use: Any = None
        peak_rise_bytes: Any = None
        pool_bytes: Any = None
        bytes_limit: Any = None
        largest_free_block_bytes: Any = None
        fragmentation: Any = None
        num_allocs: Any = None
        live_arrays: Live | None = None

    class Transfer(msgspec.Struct):
        count: Any = None
        bytes_known: Any = None
        count_total: Any = None
        bytes_known_total: Any = None

    class Transfers(msgspec.Struct):
        h2d: Transfer | None = None
        d2h: Transfer | None = None
        d2d: Transfer | None = None

    class Process(msgspec.Struct):
        rss_bytes: Any = None
        cpu_percent: Any = None

    class Compile(msgspec.Struct):
        count_total: Any = None
        seconds_total: Any = None

    class Donation(msgspec.Struct):
        failed_total: Any = None

    class Sample(msgspec.Struct):
        type: str
        t: Any = None
        seq: Any = None
        devices: list[Device] | None = None
        transfers: Transfers | None = None
        process: Process | None = None
        compile: Compile | None = None
        donation: Donation | None = None

    decode_sample = msgspec.json.Decoder(Sample).decode

    # The trace needs fewer fields, but must tell a missing transfer count
    # (counted as 0) from a null one (left out). Events and the sparse
    # fields (holders, labels, host syncs: a few samples in a hundred) are
    # decoded whole, as json.loads would, when a sample has them.
    UNSET: Any = msgspec.UNSET

    class TraceDevice(msgspec.Struct):
        id: Any = None
        bytes_in_use: Any = None
        pool_bytes: Any = None
        peak_bytes_in_use: Any = None
        bytes_limit: Any = None
        fragmentation: Any = None

    class TraceTransfer(msgspec.Struct):
        count: Any = msgspec.UNSET

    class TraceTransfers(msgspec.Struct):
        h2d: TraceTransfer | None = None
        d2h: TraceTransfer | None = None
        d2d: TraceTransfer | None = None

    class TraceDonation(msgspec.Struct):
        failed_total: Any = None
        last_message: Any = None

    class TraceSample(msgspec.Struct):
        type: str
        t: Any = None
        devices: list[TraceDevice] | None = None
        transfers: TraceTransfers | None = None
        process: Process | None = None
        compile: Compile | None = None
        donation: TraceDonation | None = None
        events: Any = msgspec.UNSET
        holders: Any = msgspec.UNSET
        labels: Any = msgspec.UNSET
        host_syncs: Any = msgspec.UNSET

    decode_trace_sample = msgspec.json.Decoder(TraceSample).decode

    class SparseSample(msgspec.Struct):
        """The long tables (``holders-csv`` …): one field each, most samples
        have none, so nearly every line is skipped whole."""
        type: str
        t: Any = None
        holders: Any = msgspec.UNSET
        labels: Any = msgspec.UNSET
        host_syncs: Any = msgspec.UNSET
        transfer_sites: Any = msgspec.UNSET

    decode_sparse_sample = msgspec.json.Decoder(SparseSample).decode
else:
    decode_sample = decode_trace_sample = decode_sparse_sample = None
    UNSET = object()

_NO_TRANSFER = [None] * 4
_NO_LIVE = [None] * 3


def csv_rows(s: Any, pid: Any) -> list[list[Any]]:
    """The CSV rows of a decoded :class:`Sample`: what ``_CsvWriter._rows``
    makes of the same sample decoded by json.loads, in the order of
    ``formats.CSV_COLUMNS``."""
    tail: list[Any] = []
    tr = s.transfers
    for x in (tr.h2d, tr.d2h, tr.d2d) if tr is not None else (None, None, None):
        tail += _NO_TRANSFER if x is None else [x.count, x.bytes_known, x.count_total, x.bytes_known_total]
    p, c, d = s.process, s.compile, s.donation
    tail += [None, None] if p is None else [p.rss_bytes, p.cpu_percent]
    tail += [None, None] if c is None else [c.count_total, c.seconds_total]
    tail.append(None if d is None else d.failed_total)
    head = [s.t, s.seq, pid]
    if not s.devices:
        return [head + [None] * 14 + tail]
    rows = []
    for dev in s.devices:
        live = dev.live_arrays
        rows.append(head + [dev.id, dev.platform, dev.source, dev.bytes_in_use, dev.peak_bytes_in_use, dev.peak_rise_bytes,
                            dev.pool_bytes, dev.bytes_limit, dev.largest_free_block_bytes, dev.fragmentation, dev.num_allocs]
                    + (_NO_LIVE if live is None else [live.bytes, live.count, live.largest_bytes]) + tail)
    return rows
