"""``jaxtop export``: a recording as a CSV table or a Perfetto (Chrome
trace-event) JSON file. Both stream: memory stays flat for any file size.

CSV columns are listed in :data:`CSV_COLUMNS` and documented in
docs/protocol.md ("Exports"); the trace format is Chrome's trace-event JSON
(``{"traceEvents": [...]}``), which ui.perfetto.dev and chrome://tracing
open (its writer: :mod:`jaxtop.export.trace`).

Each writer reads typed records: a sample as the lean type of
:mod:`jaxtop.export.typed` its format names (``SAMPLE``), any other record
as :class:`~jaxtop.export.typed.Other`. :mod:`jaxtop.export.convert` decodes
them (msgspec straight from the line, or field by field from a line decoded
whole: the same record) and drives the writers, a big plain file split
across processes.

A value is written as the recording has it: a number as Python writes it
(``repr``: for recordings written by jaxtop, the recording's own text), an
integer of any size, a string where a number belongs in a CSV cell. The
trace's counters take finite numbers only.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from itertools import repeat
from operator import is_not, itemgetter
from typing import IO, Any

import msgspec

from jaxtop.export import convert, typed
from jaxtop.export.shapes import ShapeFormats
from jaxtop.export.trace import PerfettoWriter
from jaxtop.export.typed import UNSET
from jaxtop.wire import protocol
from jaxtop.wire.protocol import DIRECTIONS

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

# The sample's figures the columns read, in column order (the lean types'
# fields, which jaxtop.export.typed checks against the wire's types and
# tests/test_schema.py against jaxtop.wire.schema).
_DEVICE_KEYS = tuple(k for k in typed.CsvDevice.__struct_fields__ if k != "live_arrays")
_LIVE_KEYS = typed.CsvLive.__struct_fields__
_TRANSFER_KEYS = typed.CsvTransfer.__struct_fields__
_is_int = typed.is_int


# --------------------------------------------------------------------------- CSV cells
# What csv.writer (QUOTE_MINIMAL) writes for each value, made faster: the
# main table's rows are written by hand, most of their cells numbers.

_NUMBERS = frozenset((int, float, type(None)))
_ONE = io.StringIO()
_ONE_ROW = csv.writer(_ONE, lineterminator="\n")
#: Text cells already quoted as csv quotes them (platforms, sources: a few).
_TEXT_CELLS: dict[str, str] = {}
_MAX_TEXT_CELLS = 4096


def _cell(value: Any) -> str:
    """One cell as csv.writer writes it."""
    kind = value.__class__
    if kind is int or kind is float:
        return repr(value)  # csv writes an int's str and a float's repr: the same text
    if value is None:
        return ""
    if kind is str:
        text = _TEXT_CELLS.get(value)
        if text is not None:
            return text
    # Anything else as csv itself writes it, beside an empty cell (a row's
    # only cell, when empty, is quoted).
    _ONE.seek(0)
    _ONE.truncate()
    _ONE_ROW.writerow((value, ""))
    text = _ONE.getvalue()[:-2]
    if kind is str:
        if len(_TEXT_CELLS) >= _MAX_TEXT_CELLS:
            _TEXT_CELLS.clear()
        _TEXT_CELLS[value] = text
    return text


def _cells(values: list[Any]) -> str:
    """Cells as csv.writer writes them, comma-separated."""
    if _NUMBERS.issuperset(map(type, values)):
        # Numbers and n/a, nearly every time: the list's repr is the cells,
        # with ", " between them and "None" for an empty one (a number's
        # repr holds neither).
        return repr(values)[1:-1].replace(", ", ",").replace("None", "")
    return ",".join(map(_cell, values))


# --------------------------------------------------------------------------- CSV

class _Table:
    """A CSV table: the header, the pid of the last hello, one or more
    rows per sample (``sample``, in the subclasses)."""

    COLUMNS: tuple[str, ...] = ()
    SAMPLE: type = typed.CsvSample

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

    def other(self, rec: typed.Other) -> None:
        if rec.type == "hello":
            self.pid = "" if rec.pid is None else rec.pid

    def close(self) -> None:
        pass


_NO_TRANSFER = [None] * 4
_NO_LIVE = (None, None, None)
_NO_DEVICE = _cells([None] * (len(_DEVICE_KEYS) + len(_LIVE_KEYS)))
#: What a row's figures may be for the shapes' formats (numbers and n/a),
#: and its labels (of these, two equal values are written alike: not so 1
#: and True, 0 and 0.0).
_FIGURES = frozenset((int, float, type(None)))
_LABELS = frozenset((int, str, type(None)))
_NONES = repeat(None)
_astuple = msgspec.structs.astuple
# A device is read whole (astuple): its lean type's fields are the columns,
# in their order: id, platform and source, the figures, live_arrays last.
if ("device_id", *_DEVICE_KEYS[1:], *(f"live_array_{k}" for k in _LIVE_KEYS)) != (
        *CSV_COLUMNS[3:14], "live_array_bytes", "live_array_count", "live_array_largest_bytes"):
    raise TypeError("typed.CsvDevice's fields are not the CSV columns' order")


class _CsvWriter(_Table):
    COLUMNS = CSV_COLUMNS
    SAMPLE = typed.CsvSample

    def __init__(self, out: IO[str], part: bool = False) -> None:
        super().__init__(out, part)
        # Row formats by shape of sample: its devices' id, platform and
        # source, which of their figures are numbers.
        self._shapes = ShapeFormats(self._shape_format)

    def sample(self, s: typed.CsvSample) -> None:
        """The sample's rows, one per device (one with the device's cells
        empty when it has none), in the order of :data:`CSV_COLUMNS`.

        The rows' text is the same from one sample to the next but for the
        figures, as long as the devices are the same and the same figures
        are numbers: that text is made once per such shape (a %-format,
        :meth:`_shape_format`) and filled in. A sample with a figure of
        another type is written row by row (:meth:`_rows`)."""
        tail = []
        tr = s.transfers
        for x in (tr.h2d, tr.d2h, tr.d2d) if tr is not None else (None, None, None):
            tail += _NO_TRANSFER if x is None else [x.count, x.bytes_known, x.count_total, x.bytes_known_total]
        p, c, d = s.process, s.compile, s.donation
        tail += [None, None] if p is None else [p.rss_bytes, p.cpu_percent]
        tail += [None, None] if c is None else [c.count_total, c.seconds_total]
        tail.append(None if d is None else d.failed_total)
        head = f"{_cells([s.t, s.seq])},{_cell(self.pid)},"
        end = f",{_cells(tail)}\n"
        if not s.devices:
            self.out.write(f"{head}{_NO_DEVICE}{end}")
            return
        labels: list[Any] = []  # per device: id, platform, source
        figures: list[Any] = []  # per device: its figures, then its live arrays'
        for dev in s.devices:
            row = _astuple(dev)
            labels += row[:3]
            figures += row[3:-1]
            live = row[-1]
            figures += _NO_LIVE if live is None else _astuple(live)
        if not (_FIGURES.issuperset(map(type, figures)) and _LABELS.issuperset(map(type, labels))):
            self._rows(s.devices, head, end)
            return
        key = (tuple(labels), tuple(map(is_not, figures, _NONES)))
        fmt, pick = self._shapes.get(key)
        figures += (head, end)
        self.out.write(fmt % pick(figures))

    @staticmethod
    def _shape_format(key: tuple[Any, ...]) -> tuple[str, Callable[[list[Any]], tuple[Any, ...]]]:
        """The rows of one shape of sample: a %-format (``%r`` of an int or a
        float is the text csv writes for it; an empty cell stays empty) and
        what picks its values from the figures, the head and the end
        (:meth:`sample`'s list)."""
        labels, present = key
        head, end = len(present), len(present) + 1
        per_device = len(present) * 3 // len(labels)  # figures a device has in the list
        text, picks = "", []
        for k in range(0, len(labels), 3):
            first = k // 3 * per_device
            cells = []
            picks.append(head)
            for i in range(first, first + per_device):
                cells.append("%r" if present[i] else "")
                if present[i]:
                    picks.append(i)
            picks.append(end)
            label = ",".join(map(_cell, labels[k:k + 3])).replace("%", "%%")
            text += f"%s{label},{','.join(cells)}%s"
        return text, itemgetter(*picks)

    def _rows(self, devices: list[typed.CsvDevice], head: str, end: str) -> None:
        """The rows one by one; a row that cannot be written (a value whose
        text Python cannot make) raises after the rows before it are
        written, as csv's writerows would."""
        rows = []
        try:
            for dev in devices:
                live = dev.live_arrays
                figures = [dev.bytes_in_use, dev.peak_bytes_in_use, dev.peak_rise_bytes, dev.pool_bytes,
                           dev.bytes_limit, dev.largest_free_block_bytes, dev.fragmentation, dev.num_allocs]
                figures += _NO_LIVE if live is None else [live.bytes, live.count, live.largest_bytes]
                rows.append(f"{head}{_cell(dev.id)},{_cell(dev.platform)},{_cell(dev.source)},{_cells(figures)}{end}")
        finally:
            self.out.write("".join(rows))


def write_csv(path: str, out: IO[str], fast: bool = True, jobs: int = 1) -> protocol.ReadStats:
    """Write the CSV table of the recording at ``path`` to ``out``.

    ``fast=False`` decodes every line whole (orjson) and takes its fields
    one by one: the same output, slower; ``jobs`` > 1 converts a big plain
    file in that many processes (same output).
    """
    return convert.run(path, _CsvWriter, out, fast, jobs)


# ----------------------------------------- holders, labels, host syncs, transfer sites
# Sparse sample fields, one long table each: a row per (record, site) or
# (record, tree). Each table decodes samples into its field alone: samples
# without it (nearly all) write nothing, so a long recording still streams fast.


def _site_cells(site: typed.HolderSite | typed.SyncSite) -> list[Any]:
    return [site.site, site.function, site.file, site.line]


def _part_t(part: typed.Holders | typed.Labels | typed.HostSyncs, t: Any) -> Any:
    """A sparse part's own time, or its sample's where it has none."""
    return t if part.t is UNSET else part.t


class _HoldersCsvWriter(_Table):
    SAMPLE = typed.HoldersSample
    COLUMNS = ("t", "pid", "profile_seq", "site", "function", "file", "line", "bytes", "count", "suspect",
               "rises", "bytes_per_min", "count_per_min", "mark_bytes", "mark_count")

    def sample(self, s: typed.HoldersSample) -> None:
        if s.holders is not None:
            self.writer.writerows(self.rows(s.holders, s.t))

    def rows(self, part: typed.Holders, t: Any) -> list[list[Any]]:
        out = []
        t = _part_t(part, t)
        for site in part.sites or ():
            growth, mark = site.growth, site.mark
            out.append([t, self.pid, part.seq, *_site_cells(site), site.bytes, site.count, bool(site.suspect),
                        *((None, None, None) if growth is None else (growth.rises, growth.bytes_per_min,
                                                                    growth.count_per_min)),
                        *((None, None) if mark is None else (mark.bytes, mark.count))])
        other = part.other
        if other is not None and other.sites:
            out.append([t, self.pid, part.seq, f"({other.sites} other sites)", "", "", "", other.bytes, other.count,
                        False, "", "", "", "", ""])
        return out


class _LabelsCsvWriter(_Table):
    SAMPLE = typed.LabelsSample
    COLUMNS = ("t", "pid", "name", "bytes", "arrays", "alive", "leaves", "labelled_t")

    def sample(self, s: typed.LabelsSample) -> None:
        if s.labels is not None:
            self.writer.writerows(self.rows(s.labels, s.t))

    def rows(self, part: typed.Labels, t: Any) -> list[list[Any]]:
        t = _part_t(part, t)
        return [[t, self.pid, tree.name, tree.bytes, tree.arrays, tree.alive, tree.leaves, tree.labelled_t]
                for tree in part.trees or ()]


class _HostSyncsCsvWriter(_Table):
    SAMPLE = typed.HostSyncsSample
    COLUMNS = ("t", "pid", "site", "function", "file", "line", "count", "kinds", "last_t")

    def sample(self, s: typed.HostSyncsSample) -> None:
        if s.host_syncs is not None:
            self.writer.writerows(self.rows(s.host_syncs, s.t))

    def rows(self, part: typed.HostSyncs, t: Any) -> list[list[Any]]:
        t = _part_t(part, t)
        return [[t, self.pid, *_site_cells(site), site.count,
                 " ".join(f"{k}={v}" for k, v in sorted((site.kinds or {}).items())), site.last_t]
                for site in part.sites or ()]


def _arg_cell(arg: typed.TransferArg | None) -> str:
    """``batch['x'] NumPy array float32[8,4] 128 B`` (unnamed: what jax's slow path saw)."""
    if arg is None:
        return ""
    size = arg.bytes
    parts = [str(arg.name or "(unnamed)"), str(arg.kind or ""), str(arg.shape or ""),
             f"{size} B" if _is_int(size) else ""]
    return " ".join(p for p in parts if p)


class _TransferSitesCsvWriter(_Table):
    """A row per (sample, site) whose count grew since the previous record
    that carried the field (its ``count``), and a row per direction whose
    unattributed total changed (``callee`` reads ``(unattributed)``, ``args``
    the reasons so far)."""

    SAMPLE = typed.TransferSitesSample
    COLUMNS = ("t", "pid", "direction", "file", "line", "function", "callee", "count", "count_total", "calls_total",
               "bytes_total", "args", "args_seen", "scalar")

    def __init__(self, out: IO[str], part: bool = False) -> None:
        super().__init__(out, part)
        self.unattributed: list[list[Any]] = []  # [direction, total] pairs, sorted: the last totals written

    def state(self) -> list[Any]:
        return [self.pid, self.unattributed]

    def set_state(self, state: list[Any]) -> None:
        self.pid, self.unattributed = state[0], [list(p) for p in state[1]]

    def sample(self, s: typed.TransferSitesSample) -> None:
        if s.transfer_sites is not None:
            self.writer.writerows(self.rows(s.transfer_sites, s.t))

    def rows(self, part: typed.TransferSites, t: Any) -> list[list[Any]]:
        out = []
        for site in part.sites or ():
            if not (_is_int(site.count) and site.count > 0):
                continue
            out.append([t, self.pid, site.direction, site.file, site.line, site.function, site.callee, site.count,
                        site.count_total, site.calls_total, site.bytes_total,
                        "; ".join(_arg_cell(a) for a in site.args or ()), site.args_seen, site.scalar is True])
        now = sorted([str(d), n] for d, n in (part.unattributed or {}).items() if _is_int(n))
        if now != self.unattributed:
            before = dict((d, n) for d, n in self.unattributed)
            reasons = "; ".join(f"{k}: {v}" for k, v in sorted((part.unattributed_reasons or {}).items()))
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


def write_perfetto(path: str, out: IO[str], fast: bool = True, jobs: int = 1) -> protocol.ReadStats:
    """Write a Chrome trace-event JSON of the recording at ``path`` to ``out``.

    ``fast=False`` decodes every line whole (orjson) and takes its fields
    one by one: the same output, slower; ``jobs`` > 1 converts a big plain
    file in that many processes (same output).
    """
    return convert.run(path, PerfettoWriter, out, fast, jobs)
