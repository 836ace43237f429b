"""``jaxtop export``: a recording as a CSV table or a Perfetto (Chrome
trace-event) JSON file. Both stream: memory stays flat for any file size.

CSV columns are listed in :data:`CSV_COLUMNS` and documented in
docs/protocol.md ("Exports"); the trace format is Chrome's trace-event JSON
(``{"traceEvents": [...]}``), which ui.perfetto.dev and chrome://tracing open.

Speed (:mod:`jaxtop.export.convert` drives the writers): each sample is
decoded into just the fields a writer writes (:mod:`jaxtop.export.typed`,
``typed()``); a line that decoding refuses, and every other record, is
decoded whole (with orjson; a record is what :func:`json.loads` makes of the
line) and written by the plain path (``sample``/``other``). Both paths
write the same bytes. A big plain file is also split across processes.
"""

from __future__ import annotations

import csv
import json
import math
from typing import IO, Any, Callable

from jaxtop.wire import protocol, schema
from jaxtop.export import convert, typed
from jaxtop.export.convert import default_jobs, open_recording  # noqa: F401  (part of this module's API)
from jaxtop.wire.protocol import D2D, D2H, DIRECTIONS, H2D

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

# The sample's figures each column reads (jaxtop.wire.schema), in column order.
_DEVICE_KEYS = schema.keys(schema.DEVICE)[:11]  # id ... num_allocs: what every allocator reports
_LIVE_KEYS = schema.keys(schema.LIVE_ARRAYS)[:3]
_TRANSFER_KEYS = ("count", "bytes_known", "count_total", "bytes_known_total")
_MEMORY_KEYS = ("bytes_in_use", "pool_bytes", "peak_bytes_in_use", "bytes_limit")
_EMPTY: dict[str, Any] = {}


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else _EMPTY


def _devices(rec: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """(position, device) for every device object of a sample."""
    devices = rec.get("devices")
    if not isinstance(devices, list):
        return []
    return [(i, dev) for i, dev in enumerate(devices) if isinstance(dev, dict)]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: Integers this small convert to a finite float; bigger ones are checked.
_SAFE_INT = 1 << 1023


def _finite(v: Any) -> bool:
    """True for a number (not a bool) that is finite as a float.

    Called for every value of every counter of a trace (a million times for
    100,000 samples): the exact types a decoder returns are tested first,
    None next, without a call."""
    t = type(v)
    if t is float:
        return v - v == 0.0  # inf - inf and nan - nan are nan
    if t is int and -_SAFE_INT < v < _SAFE_INT:
        return True
    if v is None:
        return False
    try:
        return protocol.is_number(v) and math.isfinite(v)
    except OverflowError:  # an integer beyond a float's range
        return False


def _ts(t: Any) -> int | None:
    """Trace timestamp (µs) of a record time, or None when it has none."""
    if not _finite(t):
        return None
    us = t * 1e6
    return round(us) if math.isfinite(us) else None


def _rate(count: Any, dt: float) -> float | None:
    if not _finite(count):
        return None
    rate = count / dt
    return rate if math.isfinite(rate) else None


# --------------------------------------------------------------------------- CSV

class _CsvWriter:
    COLUMNS = CSV_COLUMNS

    def __init__(self, out: IO[str], part: bool = False) -> None:
        """``part``: write only rows (a piece of a file written in parallel)."""
        self.out = out
        self.writer = csv.writer(out, lineterminator="\n")
        if not part:
            self.writer.writerow(self.COLUMNS)
        self.first = False  # CSV rows need no separator
        self.pid: Any = ""

    def state(self) -> list[Any]:
        """What the rows of the next sample depend on besides the sample."""
        return [self.pid]

    def set_state(self, state: list[Any]) -> None:
        (self.pid,) = state

    def other(self, rec: dict[str, Any]) -> None:
        if rec.get("type") == "hello":
            pid = rec.get("pid")
            self.pid = "" if pid is None else pid

    def close(self) -> None:
        pass

    def _rows(self, rec: dict[str, Any]) -> list[list[Any]]:
        """Each row's cells, in the order of :data:`CSV_COLUMNS` and of
        :func:`_row_paths` (None: an empty cell, as csv writes it)."""
        get = rec.get
        transfers = _dict(get("transfers"))
        tail = []
        for d in DIRECTIONS:
            x = _dict(transfers.get(d))
            tail += [x.get(k) for k in _TRANSFER_KEYS]
        proc, comp = _dict(get("process")), _dict(get("compile"))
        tail += [proc.get("rss_bytes"), proc.get("cpu_percent"), comp.get("count_total"), comp.get("seconds_total"),
                 _dict(get("donation")).get("failed_total")]
        head = [get("t"), get("seq"), self.pid]
        rows = []
        for _, dev in _devices(rec) or [(-1, _EMPTY)]:
            live = _dict(dev.get("live_arrays"))
            rows.append(head + [dev.get(k) for k in _DEVICE_KEYS] + [live.get(k) for k in _LIVE_KEYS] + tail)
        return rows

    def sample(self, rec: dict[str, Any]) -> None:
        self.writer.writerows(self._rows(rec))

    def typed(self) -> tuple[Callable[[bytes], Any], Callable[[Any], None]] | None:
        """Decode samples into just the fields the rows read (see
        :mod:`jaxtop.export.typed`); None where msgspec is missing, and for
        subclasses (their rows are other fields)."""
        if typed.decode_sample is None or type(self) is not _CsvWriter:
            return None
        writerows = self.writer.writerows
        return typed.decode_sample, lambda s: writerows(typed.csv_rows(s, self.pid))

def write_csv(path: str, out: IO[str], fast: bool = True, jobs: int = 1) -> protocol.ReadStats:
    """Write the CSV table of the recording at ``path`` to ``out``.

    ``fast=False`` decodes every line (orjson) and writes it by the plain
    path: the same output, slower; ``jobs`` > 1 converts a big plain file in
    that many processes (same output).
    """
    return convert.run(path, _CsvWriter, out, fast, jobs)


# ----------------------------------------- holders, labels, host syncs, transfer sites
# Sparse sample fields, one long table each: a row per (record, site) or
# (record, tree). Samples without the field write nothing, and their shapes
# get an emitter that does nothing, so a long recording still streams fast.


def _site_cells(site: dict[str, Any]) -> list[Any]:
    return [site.get("site"), site.get("function"), site.get("file"), site.get("line")]


class _SparseCsvWriter(_CsvWriter):
    """A long table of one sparse sample field; subclasses name the field,
    the columns, and ``rows(field, rec)``."""

    FIELD = ""

    def sample(self, rec: dict[str, Any]) -> None:
        field = rec.get(self.FIELD)
        if isinstance(field, dict):
            self.writer.writerows(self.rows(field, rec))  # type: ignore[attr-defined]

    def typed(self) -> tuple[Callable[[bytes], Any], Callable[[Any], None]] | None:
        """Decode samples into their sparse fields only (see
        :mod:`jaxtop.export.typed`); None where msgspec is missing."""
        if typed.decode_sparse_sample is None:
            return None
        name, unset, writerows = self.FIELD, typed.UNSET, self.writer.writerows

        def emit(s: Any) -> None:
            field = getattr(s, name)
            if field is not unset and isinstance(field, dict):
                writerows(self.rows(field, {"t": s.t}))  # type: ignore[attr-defined]
        return typed.decode_sparse_sample, emit

class _HoldersCsvWriter(_SparseCsvWriter):
    FIELD = "holders"
    COLUMNS = ("t", "pid", "profile_seq", "site", "function", "file", "line", "bytes", "count", "suspect",
               "rises", "bytes_per_min", "count_per_min", "mark_bytes", "mark_count")

    def rows(self, field: dict[str, Any], rec: dict[str, Any]) -> list[list[Any]]:
        out = []
        sites = field.get("sites")
        for site in sites if isinstance(sites, list) else ():
            if not isinstance(site, dict):
                continue
            growth, mark = _dict(site.get("growth")), _dict(site.get("mark"))
            out.append([field.get("t", rec.get("t")), self.pid, field.get("seq"), *_site_cells(site),
                        site.get("bytes"), site.get("count"), bool(site.get("suspect")), growth.get("rises"),
                        growth.get("bytes_per_min"), growth.get("count_per_min"), mark.get("bytes"),
                        mark.get("count")])
        other = _dict(field.get("other"))
        if other.get("sites"):
            out.append([field.get("t", rec.get("t")), self.pid, field.get("seq"), f"({other.get('sites')} other sites)",
                        "", "", "", other.get("bytes"), other.get("count"), False, "", "", "", "", ""])
        return out


class _LabelsCsvWriter(_SparseCsvWriter):
    FIELD = "labels"
    COLUMNS = ("t", "pid", "name", "bytes", "arrays", "alive", "leaves", "labelled_t")

    def rows(self, field: dict[str, Any], rec: dict[str, Any]) -> list[list[Any]]:
        trees = field.get("trees")
        return [[field.get("t", rec.get("t")), self.pid, tree.get("name"), tree.get("bytes"), tree.get("arrays"),
                 tree.get("alive"), tree.get("leaves"), tree.get("labelled_t")]
                for tree in (trees if isinstance(trees, list) else ()) if isinstance(tree, dict)]


class _HostSyncsCsvWriter(_SparseCsvWriter):
    FIELD = "host_syncs"
    COLUMNS = ("t", "pid", "site", "function", "file", "line", "count", "kinds", "last_t")

    def rows(self, field: dict[str, Any], rec: dict[str, Any]) -> list[list[Any]]:
        sites = field.get("sites")
        return [[field.get("t", rec.get("t")), self.pid, *_site_cells(site), site.get("count"),
                 " ".join(f"{k}={v}" for k, v in sorted(_dict(site.get("kinds")).items())), site.get("last_t")]
                for site in (sites if isinstance(sites, list) else ()) if isinstance(site, dict)]


def _arg_cell(arg: Any) -> str:
    """``batch['x'] NumPy array float32[8,4] 128 B`` (unnamed: what jax's slow path saw)."""
    if not isinstance(arg, dict):
        return ""
    size = arg.get("bytes")
    parts = [str(arg.get("name") or "(unnamed)"), str(arg.get("kind") or ""), str(arg.get("shape") or ""),
             f"{size} B" if _is_int(size) else ""]
    return " ".join(p for p in parts if p)


class _TransferSitesCsvWriter(_SparseCsvWriter):
    """A row per (sample, site) whose count grew since the previous record
    that carried the field (its ``count``), and a row per direction whose
    unattributed total changed (``callee`` reads ``(unattributed)``, ``args``
    the reasons so far)."""

    FIELD = "transfer_sites"
    COLUMNS = ("t", "pid", "direction", "file", "line", "function", "callee", "count", "count_total", "calls_total",
               "bytes_total", "args", "args_seen", "scalar")

    def __init__(self, out: IO[str], part: bool = False) -> None:
        super().__init__(out, part)
        self.unattributed: list[list[Any]] = []  # [direction, total] pairs, sorted: the last totals written

    def state(self) -> list[Any]:
        return [self.pid, self.unattributed]

    def set_state(self, state: list[Any]) -> None:
        self.pid, self.unattributed = state[0], [list(p) for p in state[1]]

    def rows(self, field: dict[str, Any], rec: dict[str, Any]) -> list[list[Any]]:
        t = rec.get("t")
        out = []
        sites = field.get("sites")
        for site in sites if isinstance(sites, list) else ():
            if not isinstance(site, dict) or not (_is_int(site.get("count")) and site["count"] > 0):
                continue
            args = site.get("args")
            out.append([t, self.pid, site.get("direction"), site.get("file"), site.get("line"), site.get("function"),
                        site.get("callee"), site.get("count"), site.get("count_total"), site.get("calls_total"),
                        site.get("bytes_total"),
                        "; ".join(_arg_cell(a) for a in (args if isinstance(args, list) else ())),
                        site.get("args_seen"), site.get("scalar") is True])
        totals = _dict(field.get("unattributed"))
        now = sorted([str(d), n] for d, n in totals.items() if _is_int(n))
        if now != self.unattributed:
            before = dict((d, n) for d, n in self.unattributed)
            reasons = "; ".join(f"{k}: {v}" for k, v in sorted(_dict(field.get("unattributed_reasons")).items()))
            for d, n in now:
                if n != before.get(d):
                    out.append([t, self.pid, d, "", "", "", "(unattributed)", n - before.get(d, 0), n, "", "",
                                reasons, "", ""])
            self.unattributed = now
        return out


#: ``jaxtop export --format`` names of the long tables.
SPARSE_CSV = {"holders-csv": _HoldersCsvWriter, "labels-csv": _LabelsCsvWriter, "host-syncs-csv": _HostSyncsCsvWriter,
              "transfer-sites-csv": _TransferSitesCsvWriter}


def write_sparse_csv(kind: str, path: str, out: IO[str], fast: bool = True, jobs: int = 1) -> protocol.ReadStats:
    """Write one of :data:`SPARSE_CSV`'s tables of the recording at ``path``."""
    return convert.run(path, SPARSE_CSV[kind], out, fast, jobs)


# --------------------------------------------------------------------- Perfetto

_TS = -1  # in a counter's sources: the sample's timestamp
#: Counter formats kept for typed samples (one per shape of sample).
MAX_SHAPES = 256


class _PerfettoWriter:
    """Counter tracks ("ph": "C") per device for memory and fragmentation, per
    process for transfers per second and RSS; instant events ("ph": "i") for
    compiles, failed donations and the agent's events."""

    def __init__(self, out: IO[str], part: bool = False) -> None:
        """``part``: write only events, each after a comma (a piece of a file
        written in parallel)."""
        self.out = out
        self.part = part
        if not part:
            out.write('{"displayTimeUnit":"ms","traceEvents":[\n')
        self.first = not part  # no event written yet: the next goes without a comma
        self.pid = 0
        self.last_t: float | None = None
        self.last_compiles: int | None = None
        self.last_failed: int | None = None
        self._shapes: dict[tuple[Any, ...], str] = {}  # the counters' %-format per sample shape (typed samples)

    def state(self) -> list[Any]:
        """What the events of the next sample depend on besides the sample."""
        return [self.pid, self.last_t, self.last_compiles, self.last_failed]

    def set_state(self, state: list[Any]) -> None:
        self.pid, self.last_t, self.last_compiles, self.last_failed = state

    def _write(self, text: str) -> None:
        """Write events formatted as ',\\n{...}' (the first without its comma)."""
        if text:
            if self.first:
                text = text[1:]
                self.first = False
            self.out.write(text)

    def _instant(self, name: str, ts: int, args: dict[str, Any] | None = None) -> str:
        event: dict[str, Any] = {"ph": "i", "name": name, "s": "p", "ts": ts, "pid": self.pid, "tid": 0}
        if args is not None:
            event["args"] = args
        return ",\n" + json.dumps(event, separators=(",", ":"))

    def _counter(self, name: str, ts: int, args: list[tuple[str, Any]]) -> str:
        # The bulk of a trace: formatted directly (numbers only, names fixed).
        body = ",".join([f'"{k}":{v!r}' for k, v in args if _finite(v)])
        if not body:
            return ""
        return f',\n{{"ph":"C","name":"{name}","ts":{ts},"pid":{self.pid},"tid":0,"args":{{{body}}}}}'

    def _user_counter(self, name: str, ts: int, args: list[tuple[str, Any]]) -> str:
        """A counter whose series are named by the program (tree names, call
        sites): escaped, as any text may be in them."""
        body = ",".join([f"{json.dumps(k)}:{v!r}" for k, v in args if _finite(v)])
        if not body:
            return ""
        return f',\n{{"ph":"C","name":"{name}","ts":{ts},"pid":{self.pid},"tid":0,"args":{{{body}}}}}'

    def _device_counters(self, rec: dict[str, Any]) -> list[tuple[str, list[tuple[str, Any]]]]:
        counters = []
        for _, dev in _devices(rec):
            did = dev.get("id")
            if _is_int(did):
                counters.append((f"device {did} memory (bytes)", [(k, dev.get(k)) for k in _MEMORY_KEYS]))
                counters.append((f"device {did} fragmentation", [("fragmentation", dev.get("fragmentation"))]))
        return counters

    def _transfers(self, counts: list[tuple[str, Any]], t: float, ts: int) -> str:
        """The transfers/s counter (from the previous sample) and the new last_t."""
        text = ""
        if self.last_t is not None and t > self.last_t:
            dt = t - self.last_t
            text = self._counter("implicit transfers/s", ts, [(d, _rate(c, dt)) for d, c in counts])
        self.last_t = t
        return text

    def _instants(self, ts: int, compiles: Any, failed: Any, message: Any) -> str:
        text = ""
        if _is_int(compiles):
            if self.last_compiles is not None and compiles > self.last_compiles:
                text += self._instant(f"compile ×{compiles - self.last_compiles}", ts, {"compiles_total": compiles})
            self.last_compiles = compiles
        if _is_int(failed):
            if self.last_failed is not None and failed > self.last_failed:
                text += self._instant("donation failed", ts, {"message": message})
            self.last_failed = failed
        return text

    @staticmethod
    def _counts(rec: dict[str, Any]) -> list[tuple[str, Any]]:
        """(direction, this interval's count) for each direction the sample has."""
        transfers = _dict(rec.get("transfers"))
        return [(d, transfers[d].get("count", 0)) for d in DIRECTIONS if isinstance(transfers.get(d), dict)]

    def other(self, rec: dict[str, Any]) -> None:
        ts = _ts(rec.get("t"))
        if ts is None:
            return
        kind = rec.get("type")
        if kind == "hello":
            self.pid = rec.get("pid") if _is_int(rec.get("pid")) else 0
            argv = rec.get("argv")
            name = " ".join(str(a) for a in argv) if isinstance(argv, list) else ""
            event = {"ph": "M", "name": "process_name", "pid": self.pid, "tid": 0,
                     "args": {"name": f"{name or f'pid {self.pid}'} (pid {self.pid})"}}
            self._write(",\n" + json.dumps(event, separators=(",", ":")))
        elif kind == "exit":
            self._write(self._instant("process exited", ts))

    def sample(self, rec: dict[str, Any]) -> None:
        t = rec.get("t")
        ts = _ts(t)
        if ts is None:
            return
        counter = self._counter
        text = "".join([counter(name, ts, args) for name, args in self._device_counters(rec)])
        text += self._transfers(self._counts(rec), t, ts)
        text += counter("host RSS (bytes)", ts, [("rss", _dict(rec.get("process")).get("rss_bytes"))])
        donation = _dict(rec.get("donation"))
        text += self._instants(ts, _dict(rec.get("compile")).get("count_total"), donation.get("failed_total"),
                               donation.get("last_message"))
        text += self._events(rec, ts) + self._sparse(rec, ts)
        self._write(text)

    def _events(self, rec: dict[str, Any], ts: int) -> str:
        """The agent's events of a sample, as instants at their own time (the
        sample's when they have none): the profiler's trace merged beside
        them (``--with-jax-profile``) lines up to the microsecond."""
        text = ""
        events = rec.get("events")
        for ev in events if events and isinstance(events, list) else ():
            if isinstance(ev, dict):
                own = _ts(ev.get("t"))
                text += self._instant(str(ev.get("kind", "event")), ts if own is None else own,
                                      {k: v for k, v in ev.items() if k not in ("kind", "t")})
        return text

    def typed(self) -> tuple[Callable[[bytes], Any], Callable[[Any], bool]] | None:
        """Decode samples into just the fields the trace reads (see
        :mod:`jaxtop.export.typed`); None where msgspec is missing."""
        if typed.decode_trace_sample is None or type(self) is not _PerfettoWriter:
            return None
        return typed.decode_trace_sample, self._typed_sample

    def _typed_sample(self, s: Any) -> bool:
        """:meth:`sample` for a typed sample.

        The counters' text is the same from one sample to the next but for
        the numbers, as long as the same values are numbers: that text is
        made once per such shape (a %-format, :meth:`_shape_format`) and
        filled in, rather than built counter by counter (half the time)."""
        unset = typed.UNSET
        t = s.t
        ts = _ts(t)
        if ts is None:
            return True
        finite = _finite
        shape: list[Any] = []  # per device: its id and which of its values are numbers
        values: list[Any] = []  # per counter written: the timestamp, then its numbers
        for dev in s.devices or ():
            did = dev.id
            if type(did) is int or _is_int(did):
                mem = (dev.bytes_in_use, dev.pool_bytes, dev.peak_bytes_in_use, dev.bytes_limit)
                flags = (finite(mem[0]), finite(mem[1]), finite(mem[2]), finite(mem[3]))
                if True in flags:
                    values.append(ts)
                    values += [v for v, ok in zip(mem, flags) if ok]
                frag = dev.fragmentation
                frag_ok = finite(frag)
                if frag_ok:
                    values += (ts, frag)
                shape.append((did, flags, frag_ok))
        rates = None  # the directions whose rate is a number; None: no rate this sample
        last = self.last_t
        if last is not None and t > last:
            dt = t - last
            rates = []
            got = []
            tr = s.transfers
            if tr is not None:
                for d, x in ((H2D, tr.h2d), (D2H, tr.d2h), (D2D, tr.d2d)):
                    if x is not None:
                        rate = _rate(0 if x.count is unset else x.count, dt)
                        if rate is not None:
                            rates.append(d)
                            got.append(rate)
            if got:
                values.append(ts)
                values += got
            rates = tuple(rates)
        self.last_t = t
        rss = None if s.process is None else s.process.rss_bytes
        rss_ok = finite(rss)
        if rss_ok:
            values += (ts, rss)
        key = (self.pid, tuple(shape), rates, rss_ok)
        fmt = self._shapes.get(key)
        if fmt is None:
            if len(self._shapes) >= MAX_SHAPES:  # a recording whose every sample differs: no cache pays
                self._shapes.clear()
            fmt = self._shapes[key] = self._shape_format(key)
        text = fmt % tuple(values)
        don, comp = s.donation, s.compile
        compiles = None if comp is None else comp.count_total
        failed = None if don is None else don.failed_total
        if compiles != self.last_compiles or failed != self.last_failed:  # equal: _instants would do nothing
            text += self._instants(ts, compiles, failed, None if don is None else don.last_message)
        # Events and the sparse fields (a few samples in a hundred), by the
        # plain path's code from the same values.
        if s.events is not unset or s.holders is not unset or s.labels is not unset or s.host_syncs is not unset:
            rare = {name: value for name, value in (("events", s.events), ("holders", s.holders), ("labels", s.labels),
                                                    ("host_syncs", s.host_syncs)) if value is not unset}
            text += self._events(rare, ts) + self._sparse(rare, ts)
        self._write(text)
        return True

    def _shape_format(self, key: tuple[Any, ...]) -> str:
        """The counters of :meth:`_typed_sample` for one shape, as
        :meth:`_counter` writes them, with ``%s`` for the timestamp and each
        number (``%s`` of an int or a float is its repr)."""
        pid, shape, rates, rss_ok = key

        def counter(name: str, keys: list[str]) -> str:
            if not keys:
                return ""
            body = ",".join(f'"{k}":%s' for k in keys)
            # Names are the program's numbers and fixed words: a "%" in one is escaped.
            return (f',\n{{"ph":"C","name":"{name.replace("%", "%%")}","ts":%s,"pid":{pid},"tid":0,'
                    f'"args":{{{body}}}}}')

        text = ""
        for did, flags, frag_ok in shape:
            text += counter(f"device {did} memory (bytes)", [k for k, ok in zip(_MEMORY_KEYS, flags) if ok])
            text += counter(f"device {did} fragmentation", ["fragmentation"] if frag_ok else [])
        if rates is not None:
            text += counter("implicit transfers/s", list(rates))
        text += counter("host RSS (bytes)", ["rss"] if rss_ok else [])
        return text

    #: Sites of a holders profile drawn as counters: the largest by bytes.
    HOLDER_SITES = 10

    def _sparse(self, rec: dict[str, Any], ts: int) -> str:
        """Counters for the sparse fields: bytes per labelled tree, the
        largest allocation sites' bytes, host reads so far."""
        text = ""
        labels = _dict(rec.get("labels"))
        trees = labels.get("trees")
        if isinstance(trees, list):
            args = [(str(t.get("name")), t.get("bytes")) for t in trees if isinstance(t, dict)]
            if args:
                text += self._user_counter("labelled trees (bytes)", ts, args)
        holders = _dict(rec.get("holders"))
        sites = holders.get("sites")
        if isinstance(sites, list):
            top = sorted((s for s in sites if isinstance(s, dict) and _finite(s.get("bytes"))),
                         key=lambda s: -s["bytes"])[: self.HOLDER_SITES]
            if top:
                text += self._user_counter("memory by allocation site (bytes)", ts,
                                      [(str(s.get("site")) + (f" {s.get('function')}" if s.get("function") else ""),
                                        s.get("bytes")) for s in top])
        syncs = _dict(rec.get("host_syncs"))
        if _finite(syncs.get("count")):
            text += self._counter("host reads of device arrays", ts, [("total", syncs.get("count"))])
        return text

    def close(self) -> None:
        if not self.part:
            self.out.write("\n]}\n")


def write_perfetto(path: str, out: IO[str], fast: bool = True, jobs: int = 1) -> protocol.ReadStats:
    """Write a Chrome trace-event JSON of the recording at ``path`` to ``out``.

    ``fast=False`` decodes every line (orjson) and writes it by the plain
    path: the same output, slower; ``jobs`` > 1 converts a big plain file in
    that many processes (same output).
    """
    return convert.run(path, _PerfettoWriter, out, fast, jobs)
