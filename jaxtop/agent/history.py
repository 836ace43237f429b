"""The agent's history of its own stream, for clients that connect late.

One history for every client (:class:`Backfill`): the fine level (every
record of the last ``backfill_s``, only the newest buffer maps kept), the
coarse level (:class:`Coarse`: min/max/sums per 10 s bucket over a day,
stored compressed) and the present (:class:`Present`: the newest sample with
the last map and sparse fields filled in). A client that connects is sent
the present first, then the coarse level, then the fine one
(:class:`Greeting`), each a range of shared entries, never a copy.

Runs on the agent thread; stdlib only (the agent runs in the user's job).
"""

from __future__ import annotations

import bisect
import collections
import json
import math
import re
import time
import zlib
from typing import Any, NamedTuple

from jaxtop.wire import protocol, timeline


#: A device's buffer map in an encoded sample, with the comma before it
#: (``map`` never comes first in ``live_arrays``): compact JSON, integer pairs.
_MAP_FIELD_RE = re.compile(rb',"map":\[(?:\[-?\d+,-?\d+\](?:,\[-?\d+,-?\d+\])*)?\]')
_MAP_KEY = b'"map":'
#: How a kept sample starts, and how it starts when sent as history.
_SAMPLE_PREFIX = b'{"type":"sample",'
_BACKFILL_PREFIX = b'{"type":"backfill",'

#: The coarse level: one bucket of this many seconds...
COARSE_STEP_S = 10.0
#: ... over this much of the past (a day: 8,640 buckets).
COARSE_HORIZON_S = 24 * 3600.0
#: Buckets per ``history`` record, the unit the coarse level is stored
#: (compressed) and sent in: 10 minutes.
COARSE_CHUNK_ROWS = 60
#: Sample fields every sample carries: a present takes them from the newest
#: sample only. Any other field is sparse (sent when it has news: ``holders``,
#: ``labels``, ``host_syncs``, ``jit``, ``demo``…): the present carries the
#: last value each had.
_DENSE_FIELDS = frozenset(("type", "t", "seq", "devices", "transfers", "transfer_capture", "process", "compile",
                           "donation", "nvml", "agent", "events", "final", "present"))
#: A device's ``live_arrays`` keys that belong to the scan that made its map:
#: taken together from the last sample that had a map.
_MAP_GROUP = ("map", "map_complete", "unmapped", "map_t")
#: ``jit`` change sets kept after the last whole table (one comes at least
#: every 10 s): past this the present carries the whole table alone.
_MAX_JIT_CHANGES = 256
#: Census records kept for the present when they age out of the fine level.
_MAX_CENSUSES = 5

_ROW_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _extremes(column: tuple[Any, ...]) -> tuple[Any, Any]:
    """(min, max) of the numbers of one column of a bucket, as JSON numbers."""
    values = [v for v in column if (v.__class__ is int or v.__class__ is float) and v == v]
    if not values:
        return None, None
    return timeline.number(min(values)), timeline.number(max(values))


class Coarse:
    """The agent's coarse history: per bucket of ``step_s``, the min and max
    of every timeline series (:mod:`jaxtop.wire.timeline`: what the dashboard's
    timelines draw) and the sums of the transfer counters, over the last
    ``horizon_s``.

    A sample costs a row of references until its bucket closes; a closed
    bucket is encoded once, as a row of a ``history`` record, and every
    :data:`COARSE_CHUNK_ROWS` rows become one record, kept compressed. A day
    at 10 Hz is 8,640 buckets: about 0.5 MB with one device and 3 MB with
    eight (tests/test_history_levels.py), whatever the sample rate.
    """

    def __init__(self, step_s: float = COARSE_STEP_S, horizon_s: float = COARSE_HORIZON_S,
                 chunk_rows: int = COARSE_CHUNK_ROWS) -> None:
        self.step_s = float(step_s)
        self.horizon_s = float(horizon_s)
        self.chunk_rows = max(1, int(chunk_rows))
        self.cursor = timeline.Cursor()
        self._bucket: int | None = None
        self._samples: list[tuple[list[Any], list[tuple[Any, list[Any]]], list[Any]]] = []
        # Samples of the open bucket not yet folded into rows: kept as they
        # came (a list append per sample) and folded together when the bucket
        # closes or a client asks. Folding a hundred at once, with the code
        # and data warm, costs a fraction of folding each on its own tick
        # beside a busy program (whose work evicts ours between ticks).
        self._queued: list[dict[str, Any]] = []
        self._rows: list[bytes] = []  # encoded closed buckets not yet in a chunk, oldest first
        self._rows_bytes = 0
        # Closed chunks, oldest first: (last bucket's time, zlib of the record line).
        self._chunks: collections.deque[tuple[float, bytes]] = collections.deque()
        self._chunks_bytes = 0
        self._header = self._make_header()

    def _make_header(self) -> bytes:
        head = _ROW_ENCODER.encode({
            "level_s": self.step_s, "process_columns": list(timeline.PROCESS_SERIES),
            "device_columns": list(timeline.DEVICE_SERIES), "sum_columns": list(timeline.SUM_SERIES),
        })
        return b',' + head[1:-1].encode() + b',"rows":['

    def __len__(self) -> int:
        """Buckets held, the open one included."""
        return len(self._chunks) * self.chunk_rows + len(self._rows) + (1 if self._samples or self._queued else 0)

    def add(self, record: dict[str, Any]) -> None:
        """Take one sample (in the order they are taken). Its values are
        read when its bucket closes or :meth:`entries` is called: the record
        and what it holds must not change meanwhile (the agent's never do)."""
        t = record.get("t")
        if not isinstance(t, (int, float)) or isinstance(t, bool):
            return  # no time: what Cursor.rows skips
        bucket = math.floor(t / self.step_s)
        if bucket != self._bucket:
            if self._samples or self._queued:
                self._close()
            self._bucket = bucket
        self._queued.append(record)

    def _fold(self) -> None:
        """The queued samples into rows of the open bucket, in order."""
        rows_of = self.cursor.rows
        for record in self._queued:
            rows = rows_of(record)
            if rows is not None:
                self._samples.append(rows[1:])
        self._queued = []

    def _row(self) -> bytes:
        """The open bucket as an encoded row: ``[t, samples, process lows,
        process highs, [[device id, lows, highs], …], sums]``."""
        samples = self._samples
        plo, phi = [], []
        for column in zip(*(s[0] for s in samples)):
            lo, hi = _extremes(column)
            plo.append(lo)
            phi.append(hi)
        by_device: dict[Any, list[list[Any]]] = {}
        for s in samples:
            for did, row in s[1]:
                by_device.setdefault(did, []).append(row)
        devices = []
        for did, rows in by_device.items():
            lo_hi = [_extremes(column) for column in zip(*rows)]
            devices.append([did, [x[0] for x in lo_hi], [x[1] for x in lo_hi]])
        sums = []
        for column in zip(*(s[2] for s in samples)):
            values = [v for v in column if (v.__class__ is int or v.__class__ is float) and v == v]
            sums.append(timeline.number(sum(values)) if values else None)
        row = [timeline.number(self._bucket * self.step_s), len(samples), plo, phi, devices, sums]
        try:
            return _ROW_ENCODER.encode(row).encode()
        except (TypeError, ValueError):  # a device id JSON cannot carry
            row[4] = [d for d in devices if isinstance(d[0], (int, str))]
            return _ROW_ENCODER.encode(row).encode()

    def _close(self) -> None:
        self._fold()
        if not self._samples:
            return
        row = self._row()
        last_t = self._bucket * self.step_s
        self._samples = []
        self._rows.append(row)
        self._rows_bytes += len(row)
        if len(self._rows) >= self.chunk_rows:
            blob = zlib.compress(self._record(self._rows), 6)
            self._chunks.append((last_t, blob))
            self._chunks_bytes += len(blob)
            self._rows, self._rows_bytes = [], 0
        horizon = last_t - self.horizon_s
        while self._chunks and self._chunks[0][0] < horizon:
            self._chunks_bytes -= len(self._chunks.popleft()[1])

    def _record(self, rows: list[bytes]) -> bytes:
        return (b'{"type":"' + protocol.HISTORY.encode() + b'","t":' + repr(time.time()).encode()
                + self._header + b",".join(rows) + b"]}\n")

    def entries(self) -> list[tuple[bool, bytes]]:
        """The ``history`` records to send, newest first (the rows of each
        oldest first): ``(compressed, data)``. The newest is made now (the
        buckets not yet in a chunk and the open one); the others are the
        stored chunks, shared, not copied."""
        out: list[tuple[bool, bytes]] = []
        rows = list(self._rows)
        self._fold()
        if self._samples:
            rows.append(self._row())
        if rows:
            out.append((False, self._record(rows)))
        out.extend((True, blob) for _, blob in reversed(self._chunks))
        return out

    def nbytes(self) -> int:
        """Bytes held (the lines and blobs; the open bucket's rows of
        references are not counted: at most a bucket of samples)."""
        return self._chunks_bytes + self._rows_bytes

    def clear(self) -> None:
        self._bucket = None
        self._samples, self._rows, self._rows_bytes = [], [], 0
        self._queued = []
        self._chunks.clear()
        self._chunks_bytes = 0


class Present:
    """The newest sample, completed with what earlier samples said last.

    Samples carry some fields only when they have news: a device's buffer map
    and its largest buffers (``live_arrays.map``, ``top``) on a scan, and the
    sparse fields (``holders``, ``labels``, ``host_syncs``, ``jit``, a demo's
    state…). A client that connects gets the newest sample with the last of
    each filled in (``jit``: the last whole table with the changes since
    applied), so that every panel has the present before any history comes.
    What is kept are references to the samples' own objects.
    """

    def __init__(self) -> None:
        self._record: dict[str, Any] | None = None
        # Samples not yet folded in: appended per tick, folded when the
        # present is read or the queue is long (see Coarse._queued for why).
        self._queued: list[dict[str, Any]] = []
        self._maps: dict[Any, dict[str, Any]] = {}
        self._tops: dict[Any, Any] = {}
        self._sparse: dict[str, Any] = {}
        self._jit_full: dict[str, Any] | None = None
        self._jit_changes: list[dict[str, Any]] = []
        self.censuses: collections.deque[tuple[float, bytes]] = collections.deque(maxlen=_MAX_CENSUSES)

    #: Samples queued at most before they are folded in.
    MAX_QUEUED = 100

    def add(self, record: dict[str, Any]) -> None:
        """Take the newest sample (folded in later: it must not change)."""
        self._queued.append(record)
        if len(self._queued) >= self.MAX_QUEUED:
            self._fold()

    def _fold(self) -> None:
        queued, self._queued = self._queued, []
        for record in queued:
            self._add(record)

    @property
    def record(self) -> dict[str, Any] | None:
        """The newest sample."""
        return self._queued[-1] if self._queued else self._record

    @property
    def maps(self) -> dict[Any, dict[str, Any]]:
        self._fold()
        return self._maps

    @property
    def tops(self) -> dict[Any, Any]:
        self._fold()
        return self._tops

    @property
    def sparse(self) -> dict[str, Any]:
        self._fold()
        return self._sparse

    @property
    def jit_full(self) -> dict[str, Any] | None:
        self._fold()
        return self._jit_full

    @property
    def jit_changes(self) -> list[dict[str, Any]]:
        self._fold()
        return self._jit_changes

    def _add(self, record: dict[str, Any]) -> None:
        self._record = record
        for dev in record.get("devices") or ():
            live = dev.get("live_arrays") if isinstance(dev, dict) else None
            if isinstance(live, dict):
                if "map" in live:
                    self._maps[dev.get("id")] = {k: live[k] for k in _MAP_GROUP if k in live}
                if "top" in live:
                    self._tops[dev.get("id")] = live["top"]
        for key, value in record.items():
            if key in _DENSE_FIELDS:
                continue
            if key == "jit":
                self._jit(value)
            else:
                self._sparse[key] = value

    def _jit(self, value: Any) -> None:
        if not isinstance(value, dict):
            return
        if value.get("full") or value.get("available") is False:
            self._jit_full, self._jit_changes = value, []
        elif self._jit_full is not None and len(self._jit_changes) < _MAX_JIT_CHANGES:
            self._jit_changes.append(value)

    def jit(self) -> dict[str, Any] | None:
        """The last whole ``jit`` table with the changes since applied, as a
        reader folds them (docs/protocol.md, the sample field ``jit``)."""
        self._fold()
        full = self._jit_full
        if full is None or not self._jit_changes:
            return full
        merged = dict(full)
        functions = {f.get("name"): f for f in full.get("functions") or () if isinstance(f, dict)}
        executables = {e.get("id"): e for e in full.get("executables") or () if isinstance(e, dict)}
        for change in self._jit_changes:
            for key, value in change.items():
                if key not in ("functions", "executables", "gone", "full"):
                    merged[key] = value
            for key in ("executables_reason", "compiles_reason"):
                if key not in change:
                    merged.pop(key, None)
            for f in change.get("functions") or ():
                if isinstance(f, dict):
                    functions[f.get("name")] = f
            for e in change.get("executables") or ():
                if isinstance(e, dict):
                    executables[e.get("id")] = e
            for ident in change.get("gone") or ():
                executables.pop(ident, None)
        merged.update(full=True, functions=list(functions.values()), executables=list(executables.values()))
        return merged

    def line(self) -> bytes | None:
        """The present as sent: the newest sample, ``present: true``, with
        the last map, largest buffers and sparse fields filled in."""
        self._fold()
        record = self._record
        if record is None:
            return None
        out = dict(record)
        out["present"] = True
        if self._maps or self._tops:
            devices = []
            for dev in record.get("devices") or ():
                live = dev.get("live_arrays") if isinstance(dev, dict) else None
                if isinstance(live, dict):
                    extra: dict[str, Any] = {}
                    did = dev.get("id")
                    if "map" not in live and did in self.maps:
                        extra.update(self.maps[did])
                    if "top" not in live and did in self.tops:
                        extra["top"] = self.tops[did]
                    if extra:
                        dev = dict(dev, live_arrays=dict(live, **extra))
                devices.append(dev)
            out["devices"] = devices
        for key, value in self.sparse.items():
            out.setdefault(key, value)
        jit = self.jit()
        if jit is not None:
            out["jit"] = jit
        return protocol.encode(out)

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]


class Greeting(NamedTuple):
    """What a client that connects is sent, in order: ``head`` (hello, the
    present, censuses older than the fine level), the ``coarse`` history
    (``history`` records, newest first: ``(compressed, data)``), the fine
    level's entries ``[first, last)`` as ``backfill`` records, then ``tail``
    (``history_end``)."""

    head: list[bytes]
    coarse: list[tuple[bool, bytes]]
    first: int
    last: int
    tail: list[bytes]


class Backfill:
    """The agent's history, one for every client, at two resolutions, and
    the present.

    **Fine**: recent encoded records (samples, censuses) of the last
    ``backfill_s`` (the agent trims it). Entries have absolute indices that
    never change; trimming only moves :attr:`start`. A client that connects
    is handed the range of indices it should receive and reads the lines
    from here as it sends them, so a backfill costs each client a few
    integers, whatever its size.

    Only the newest buffer maps are kept: when a sample brings a map for as
    many devices as the previous map-carrying one had, that one loses its
    maps (the key goes, so a reader keeps the map it had rather than taking
    an empty one). A viewer draws only the newest map, and with 8 devices
    the maps were 60 % of a 10-minute backfill (65 MiB → 40 MiB): memory in
    the user's process, and the bytes a dashboard must read before its first
    frame. Live clients and the log still get every map as it is made.

    **Coarse** (:class:`Coarse`): min/max of the timeline series per 10 s
    over the last day, a few MB at most. **Present** (:class:`Present`): the
    newest sample with the last map and sparse fields, sent first.

    Args:
        coarse_step_s: the coarse level's bucket.
        coarse_horizon_s: how far back it reaches; 0: no coarse level.
    """

    def __init__(self, coarse_step_s: float = COARSE_STEP_S, coarse_horizon_s: float = COARSE_HORIZON_S) -> None:
        self._times: list[float] = []
        self._lines: list[bytes] = []
        self._head = 0  # list position of the oldest live entry
        #: Absolute index of the oldest entry still held.
        self.start = 0
        self._last_map: tuple[int, int] | None = None  # (absolute index, maps in it)
        self._bytes = 0
        self.coarse = Coarse(coarse_step_s, coarse_horizon_s) if coarse_horizon_s > 0 else None
        self.present = Present()

    @property
    def end(self) -> int:
        """Absolute index the next entry will get."""
        return self.start + len(self._lines) - self._head

    def __len__(self) -> int:
        return len(self._lines) - self._head

    def add(self, record: dict[str, Any], line: bytes) -> None:
        """Keep one record the agent emitted (``line``: as encoded): every
        level and the present learn from it."""
        kind = record.get("type")
        if kind == protocol.SAMPLE:
            self.present.add(record)
            if self.coarse is not None:
                self.coarse.add(record)
        elif kind == protocol.OOM_CENSUS:
            self.present.censuses.append((record.get("t"), line))
        self.append(record.get("t"), line)

    def note_hello(self, hello: dict[str, Any]) -> None:
        """What the coarse level needs from the agent's ``hello``: the sample
        period and which NVML GPU is which jax device."""
        if self.coarse is not None:
            interval = hello.get("interval_s")
            if isinstance(interval, (int, float)) and interval > 0:
                self.coarse.cursor.interval_s = float(interval)
            self.coarse.cursor.jax_to_nvml = timeline.nvml_map(hello)

    def describe(self, backfill_s: float) -> dict[str, Any]:
        """The ``hello`` field ``history``: what a client is sent on connecting."""
        out: dict[str, Any] = {"present_first": True, "backfill_s": backfill_s}
        if self.coarse is not None:
            out.update(coarse_bucket_s=self.coarse.step_s, coarse_s=self.coarse.horizon_s)
        return out

    def greeting(self, hello: bytes, horizon: float) -> Greeting:
        """What a client that connects now is sent (:class:`Greeting`): the
        fine level from ``horizon`` (Unix seconds) on."""
        first, last = self.since(horizon), self.end
        head = [hello]
        present = self.present.line()
        if present is not None:
            head.append(present)
        oldest = self._times[first - self.start + self._head] if first < last else math.inf
        head.extend(line for t, line in self.present.censuses if isinstance(t, (int, float)) and t < oldest)
        coarse = self.coarse.entries() if self.coarse is not None else []
        tail = [protocol.encode({"type": protocol.HISTORY_END, "t": time.time(), "records": last - first,
                                 "history_records": len(coarse)})]
        return Greeting(head, coarse, first, last, tail)

    def append(self, t: float, line: bytes) -> None:
        """Keep one encoded line in the fine level only."""
        if _MAP_KEY in line:
            maps = line.count(_MAP_KEY)
            previous = self._last_map
            if previous is not None and previous[1] <= maps and previous[0] >= self.start:
                i = previous[0] - self.start + self._head
                old = self._lines[i]
                self._lines[i] = _MAP_FIELD_RE.sub(b"", old)
                self._bytes += len(self._lines[i]) - len(old)
            self._last_map = (self.end, maps)
        self._times.append(t)
        self._lines.append(line)
        self._bytes += len(line)

    def trim(self, horizon: float) -> None:
        """Forget fine entries older than ``horizon`` (Unix seconds)."""
        cut = bisect.bisect_left(self._times, horizon, self._head)
        if cut > self._head:
            self._bytes -= sum(map(len, self._lines[self._head:cut]))
            self.start += cut - self._head
            self._head = cut
            # Compact now and then, not per entry: deleting the front of a
            # list moves the rest.
            if self._head >= 1024 and 2 * self._head >= len(self._lines):
                del self._times[:self._head]
                del self._lines[:self._head]
                self._head = 0

    def since(self, horizon: float) -> int:
        """Absolute index of the first entry at or after ``horizon``."""
        return self.start + bisect.bisect_left(self._times, horizon, self._head) - self._head

    def lines(self, first: int, last: int) -> list[bytes]:
        """Entries ``[first, last)`` that are still held."""
        first = max(first, self.start)
        offset = self._head - self.start
        return self._lines[first + offset:max(first, last) + offset]

    def nbytes(self) -> dict[str, int]:
        """Bytes held at each level: ``fine`` (the encoded lines), ``coarse``
        (its encoded and compressed chunks)."""
        return {"fine": self._bytes, "coarse": self.coarse.nbytes() if self.coarse is not None else 0}

    def clear(self) -> None:
        self.start = self.end
        self._times, self._lines, self._head = [], [], 0
        self._bytes = 0
        if self.coarse is not None:
            self.coarse.clear()
        self.present.clear()


class _Range:
    """Backfill entries ``[first, last)`` still to be sent to one client;
    ``retype``: samples go as ``backfill`` records."""

    __slots__ = ("first", "last", "retype")

    def __init__(self, first: int, last: int, retype: bool = False) -> None:
        self.first = first
        self.last = last
        self.retype = retype


class _Chunks:
    """Coarse ``history`` records still to be sent to one client:
    ``(compressed, data)``, shared with the agent's coarse level."""

    __slots__ = ("entries", "next")

    def __init__(self, entries: list[tuple[bool, bytes]]) -> None:
        self.entries = entries
        self.next = 0


_LAZY = (_Range, _Chunks)
