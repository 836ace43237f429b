"""Budgets: limits on what a program or a test may cost, checked by jaxtop.

A budget is a list of limits such as ``h2d=0,recompiles=0,peak=2GiB``
(docs/budgets.md has the grammar, every name, the units and what each
measures). ``jaxtop run --budget SPEC`` checks one against the whole run;
the pytest plugin (:mod:`jaxtop.pytest_plugin`) against one test.

This module has two halves:

* Pure, stdlib only: the grammar (:func:`parse_spec`, :func:`from_mapping`,
  :func:`load_pyproject`, :func:`resolve`), the folding of wire records into
  measured values (:class:`Reading`, :class:`WindowState`), the check
  (:func:`check`) and its report as text or JSON (:class:`Report`). Tests
  drive these with plain dicts.
* In-process measurement (:class:`Meter`, :class:`Window`,
  :class:`RunBudget`), for the program that runs the agent. It reads the
  agent's own stream through its socket, asks the agent for exact transfer
  and compile totals at the edges of a window, and keeps a log of backend
  compiles with their call sites (for ``recompiles``). It touches jax only
  through ``jax.monitoring`` once the program has imported jax.

A value that was not measured is never reported as 0: it is ``n/a`` with
the reason, and an ``n/a`` limit neither passes nor fails (the report lists
it as not checked).
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from jaxtop.protocol import DIRECTIONS

#: ``jaxtop run`` exits with this when the program succeeded but its budget
#: was exceeded (listed in ``jaxtop --help``; docs/budgets.md).
EXIT_BUDGET = 3

#: The report's JSON format, for readers that check it.
REPORT_VERSION = 1

NOT_MEASURED = "not measured by this jaxtop"

_DIRECTION_WORDS = {"h2d": "host-to-device", "d2h": "device-to-host", "d2d": "device-to-device"}

#: Byte units, as written in a budget (case does not matter): decimal
#: KB/MB/GB/TB and binary KiB/MiB/GiB/TiB.
BYTE_UNITS = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}


class BudgetError(ValueError):
    """A budget that cannot be read: the message says where and why."""


class BudgetExceeded(AssertionError):
    """A measured block went over its budget (the message is the report).

    An AssertionError, so that pytest shows it as a test failure.

    Attributes:
        report: the :class:`Report`.
    """

    def __init__(self, report: "Report") -> None:
        super().__init__(report.text())
        self.report = report


# -- the names -------------------------------------------------------------------

@dataclass(frozen=True)
class MetricDef:
    """One name a budget may limit.

    Attributes:
        name: as written in a budget.
        kind: ``count`` (a whole number), ``bytes`` (a size, units allowed)
            or ``rate`` (a number per second).
        wire: the field of the stream it comes from.
        about: one line for reports and docs.
    """

    name: str
    kind: str
    wire: str
    about: str


def _metric_defs() -> dict[str, MetricDef]:
    defs: list[MetricDef] = []
    for d in DIRECTIONS:
        words = _DIRECTION_WORDS[d]
        defs.append(MetricDef(d, "count", f"transfers.{d}.count_total", f"implicit {words} transfers"))
    defs.append(MetricDef("transfers", "count", "transfers.*.count_total", "implicit transfers, all directions"))
    for d in DIRECTIONS:
        defs.append(MetricDef(f"{d}_bytes", "bytes", f"transfers.{d}.bytes_known_total",
                              f"bytes of implicit {_DIRECTION_WORDS[d]} transfers"))
    for d in (*DIRECTIONS, "transfers"):
        what = "implicit transfers" if d == "transfers" else f"implicit {_DIRECTION_WORDS[d]} transfers"
        defs.append(MetricDef(f"{d}_per_s", "rate", f"transfers.{d}.count_total / seconds",
                              f"{what} per second, on average over the window"))
    defs += [
        MetricDef("compiles", "count", "compile.count_total", "backend compiles"),
        MetricDef("recompiles", "count", "compile events (jax.monitoring)",
                  "compiles of a function at a call site where the window already compiled it"),
        MetricDef("peak", "bytes", "devices[].peak_bytes_in_use (CPU: devices[].bytes_in_use, live arrays)",
                  "peak device memory of the busiest device"),
        MetricDef("in_use", "bytes", "devices[].bytes_in_use",
                  "device memory in use at the end of the window, busiest device"),
        MetricDef("peak_rss", "bytes", "process.peak_rss_bytes", "peak resident memory of the process (host)"),
        MetricDef("host_syncs", "count", "host_syncs.count", "host reads of device arrays (host syncs)"),
        MetricDef("host_syncs_per_step", "count", "host_syncs.per_step_max", "host syncs in the worst step"),
    ]
    return {m.name: m for m in defs}


#: Every name a budget may use.
METRICS: dict[str, MetricDef] = _metric_defs()

#: Names measured from the transfer guard's log lines (stderr capture).
TRANSFER_NAMES = frozenset(n for n, m in METRICS.items() if m.wire.startswith("transfers"))


# -- the grammar -----------------------------------------------------------------

@dataclass(frozen=True)
class Limit:
    """``name <= value``.

    Attributes:
        name: a key of :data:`METRICS`.
        value: the most allowed (bytes for sizes, a count, or per second).
        text: the value as a budget writes it back (``2GiB``).
    """

    name: str
    value: float
    text: str

    @property
    def kind(self) -> str:
        """``count``, ``bytes`` or ``rate``."""
        return METRICS[self.name].kind


@dataclass(frozen=True)
class Budget:
    """Limits, each name at most once, in the order written.

    Attributes:
        limits: the limits.
        source: where it was read (for messages).
    """

    limits: tuple[Limit, ...]
    source: str = "budget"

    def spec(self) -> str:
        """The budget in the ``--budget`` grammar (it parses back to itself)."""
        return ",".join(f"{lim.name}={lim.text}" for lim in self.limits)

    def names(self) -> set[str]:
        """The limited names."""
        return {lim.name for lim in self.limits}

    def __bool__(self) -> bool:
        return bool(self.limits)

    def merged(self, other: "Budget") -> "Budget":
        """These limits, with ``other``'s replacing those of the same name."""
        theirs = {lim.name: lim for lim in other.limits}
        kept = [theirs.pop(lim.name, lim) for lim in self.limits]
        return Budget(tuple(kept) + tuple(theirs.values()), source=f"{self.source} + {other.source}")


_NUMBER = r"[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?"
_VALUE_RE = re.compile(rf"^\s*({_NUMBER})\s*([A-Za-z/]*)\s*$")


def _unknown_name(name: str, source: str) -> BudgetError:
    close = difflib.get_close_matches(name, list(METRICS), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return BudgetError(f"{source}: unknown name {name!r}{hint} (names: {', '.join(METRICS)})")


def _fmt_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def parse_value(name: str, value: Any, source: str = "budget") -> Limit:
    """One limit from its name and value (text like ``2GiB``, or a number).

    Raises:
        BudgetError: an unknown name, a negative or malformed value, a unit
            where none belongs, a fraction of a count.
    """
    name = str(name).strip()
    metric = METRICS.get(name)
    if metric is None:
        raise _unknown_name(name, source)
    where = f"{source}: {name}"
    if isinstance(value, str):
        value = value.strip()
        if value.startswith("-"):
            raise BudgetError(f"{where}={value}: the limit must be >= 0")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise BudgetError(f"{where}: the limit must be a number or a size like '2GiB', not {value!r}")
    if isinstance(value, str):
        match = _VALUE_RE.match(value)
        if match is None:
            raise BudgetError(f"{where}={value!r}: not a number" + (" with a unit (KiB, MiB, GiB, KB, MB, GB)"
                                                                      if metric.kind == "bytes" else ""))
        number, unit = float(match.group(1)), match.group(2)
    else:
        number, unit = float(value), ""
    if not math.isfinite(number) or number < 0:
        raise BudgetError(f"{where}: the limit must be a finite number >= 0, not {value!r}")
    if metric.kind == "bytes":
        if unit:
            factor = BYTE_UNITS.get(unit.lower())
            if factor is None:
                raise BudgetError(f"{where}={value}: unknown unit {unit!r} (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")
            number *= factor
        number = float(math.floor(number))
        text = _fmt_size_spec(number, unit, match.group(1) if isinstance(value, str) else None)
        return Limit(name, number, text)
    if metric.kind == "rate":
        if unit and unit.lower() not in ("/s", "persec"):
            raise BudgetError(f"{where}={value}: a rate is a number per second, without a unit")
        return Limit(name, number, _fmt_number(number))
    if unit:
        raise BudgetError(f"{where}={value}: {name} counts {metric.about}; it takes a whole number without a unit")
    if not number.is_integer():
        raise BudgetError(f"{where}={value}: {name} counts {metric.about}; it takes a whole number")
    return Limit(name, number, str(int(number)))


def _fmt_size_spec(number: float, unit: str, written: str | None) -> str:
    """A size as the budget wrote it (``2GiB``), or in bytes without a unit."""
    if unit and written is not None:
        canonical = {k.lower(): k for k in ("B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB")}
        return f"{written}{canonical[unit.lower()]}"
    return str(int(number))


def parse_spec(text: str, source: str = "budget") -> Budget:
    """Parse ``name=value,name=value,…``.

    Args:
        text: the spec; spaces around names and values are allowed, and so
            is a trailing comma.
        source: where it came from, for messages (``--budget``).

    Raises:
        BudgetError: an empty spec, an item without ``=``, an unknown or
            repeated name, or a bad value (see :func:`parse_value`).
    """
    if not isinstance(text, str) or not text.strip():
        raise BudgetError(f"{source}: empty budget; write limits like 'h2d=0,recompiles=0,peak=2GiB'")
    limits: list[Limit] = []
    seen: set[str] = set()
    for item in text.split(","):
        if not item.strip():
            continue
        name, eq, value = item.partition("=")
        if not eq:
            raise BudgetError(f"{source}: {item.strip()!r} is not NAME=VALUE (e.g. 'h2d=0')")
        limit = parse_value(name, value, source)
        if limit.name in seen:
            raise BudgetError(f"{source}: {limit.name} is given twice")
        seen.add(limit.name)
        limits.append(limit)
    if not limits:
        raise BudgetError(f"{source}: empty budget; write limits like 'h2d=0,recompiles=0,peak=2GiB'")
    return Budget(tuple(limits), source)


def from_mapping(mapping: Mapping[str, Any], source: str = "budget") -> Budget:
    """A budget from ``{name: value}`` (a TOML table, keyword arguments).

    Raises:
        BudgetError: as :func:`parse_spec`.
    """
    limits = tuple(parse_value(name, value, source) for name, value in mapping.items())
    if not limits:
        raise BudgetError(f"{source}: empty budget")
    return Budget(limits, source)


def _toml_loads(text: str) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise BudgetError("reading a budget from TOML needs Python 3.11+ or the tomli package "
                              "(pip install tomli)") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BudgetError(f"not valid TOML: {exc}") from None


def load_pyproject(path: str | os.PathLike[str]) -> Budget | None:
    """The ``[tool.jaxtop.budget]`` table of a ``pyproject.toml``.

    Returns:
        The budget, or None when the file has no such table.

    Raises:
        BudgetError: the file cannot be read, is not TOML, or the table
            holds something a budget cannot.
    """
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise BudgetError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = _toml_loads(text)
    except BudgetError as exc:
        raise BudgetError(f"{path}: {exc}") from None
    table = data.get("tool", {}).get("jaxtop", {}).get("budget")
    if table is None:
        return None
    source = f"{path} [tool.jaxtop.budget]"
    if not isinstance(table, dict):
        raise BudgetError(f"{source}: must be a table of NAME = VALUE")
    return from_mapping(table, source)


def resolve(text: str, source: str = "--budget") -> Budget:
    """What ``--budget`` names: a spec (``h2d=0,…``) or a TOML file.

    A value without ``=`` is a path to a ``pyproject.toml`` (or any TOML
    file) whose ``[tool.jaxtop.budget]`` table is the budget.

    Raises:
        BudgetError: a bad spec, or a file without that table.
    """
    if "=" in text:
        return parse_spec(text, source)
    if not os.path.isfile(text):
        raise BudgetError(f"{source}: {text!r} is neither limits like 'h2d=0,peak=2GiB' nor a TOML file")
    budget = load_pyproject(text)
    if budget is None:
        raise BudgetError(f"{source}: {text} has no [tool.jaxtop.budget] table")
    return budget


# -- formatting ------------------------------------------------------------------

def fmt_bytes(n: float | None) -> str:
    """``1.5 GiB``-style size (exact bytes below 1 KiB)."""
    if n is None:
        return "?"
    n = float(n)
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= factor:
            return f"{n / factor:.3g} {unit}"
    return f"{int(n)} B"


def fmt_value(kind: str, value: float | None) -> str:
    """A value of a name of this kind, for people."""
    if value is None:
        return "?"
    if kind == "bytes":
        return fmt_bytes(value)
    if kind == "rate":
        return f"{value:.3g}/s"
    return str(int(value))


# -- measured values -------------------------------------------------------------

@dataclass
class Measured:
    """One measured value for one name.

    Attributes:
        value: the measurement; None when it is not known.
        na: why there is no value (then it is reported as ``n/a: …``).
        at_most: a known upper bound when ``value`` is None (a process-wide
            maximum set before the window, which the window cannot have
            exceeded).
        first_exceeded_s: seconds into the window when the value was first
            seen over the limit (set by :class:`WindowState`).
        detail: lines that say what made the value (shapes, functions,
            buffers).
        data: the same, as JSON-ready data.
        note: a caveat on the value (a lower bound, say).
    """

    value: float | None = None
    na: str | None = None
    at_most: float | None = None
    first_exceeded_s: float | None = None
    detail: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    note: str | None = None


def not_measured(reason: str = NOT_MEASURED) -> Measured:
    """An ``n/a`` value."""
    return Measured(na=reason)


@dataclass
class LimitResult:
    """A limit and what was measured for it.

    Attributes:
        limit: the limit.
        measured: the measurement.
        status: ``ok``, ``exceeded`` or ``n/a``.
    """

    limit: Limit
    measured: Measured
    status: str


@dataclass
class Report:
    """The outcome of checking one budget against one window.

    Attributes:
        budget: what was checked.
        results: one per limit, in the budget's order.
        window: what was measured (``the run``, a test id) and for how long.
        extra: more top-level JSON fields (``program_failed``...).
    """

    budget: Budget
    results: list[LimitResult]
    window: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def exceeded(self) -> list[LimitResult]:
        return [r for r in self.results if r.status == "exceeded"]

    @property
    def unchecked(self) -> list[LimitResult]:
        return [r for r in self.results if r.status == "n/a"]

    @property
    def ok(self) -> bool:
        """True when no limit was exceeded (``n/a`` limits do not fail)."""
        return not self.exceeded

    def text(self, title: str | None = None) -> str:
        """The report for people: what broke the budget first, then the rest.

        Args:
            title: the first line's lead (default ``jaxtop budget``).
        """
        lead = title or "jaxtop budget"
        what = self.window.get("what", "the window")
        seconds = self.window.get("seconds")
        span = f"{what}, {seconds:.2f} s" if isinstance(seconds, (int, float)) else what
        if self.exceeded:
            names = ", ".join(r.limit.name for r in self.exceeded)
            head = f"{lead} exceeded: {names} ({span}; budget {self.budget.spec()})"
        else:
            head = f"{lead} within limits ({span}; budget {self.budget.spec()})"
        if "[tool.jaxtop.budget]" in self.budget.source:
            head = head[:-1] + f" from {self.budget.source})"
        lines = [head]
        width = max(len(r.limit.name) for r in self.results) if self.results else 0
        for r in sorted(self.results, key=lambda r: ("exceeded", "ok", "n/a").index(r.status)):
            lines += _result_lines(r, width)
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The report as data (``--budget-report``; docs/budgets.md)."""
        out: dict[str, Any] = {
            "jaxtop_budget_report": REPORT_VERSION,
            "ok": self.ok,
            "budget": self.budget.spec(),
            "budget_source": self.budget.source,
            "window": self.window,
            "exceeded": [r.limit.name for r in self.exceeded],
            "not_checked": [r.limit.name for r in self.unchecked],
            "limits": [],
        }
        out.update(self.extra)
        for r in self.results:
            m = r.measured
            out["limits"].append({
                "name": r.limit.name,
                "kind": r.limit.kind,
                "limit": _json_number(r.limit.kind, r.limit.value),
                "limit_text": r.limit.text,
                "status": r.status,
                "value": _json_number(r.limit.kind, m.value),
                "at_most": _json_number(r.limit.kind, m.at_most),
                "na": m.na,
                "note": m.note,
                "first_exceeded_s": m.first_exceeded_s,
                "detail": m.data,
            })
        return out


def _json_number(kind: str, value: float | None) -> float | int | None:
    if value is None or kind == "rate" or not math.isfinite(value):
        return value
    return int(value)


def _result_lines(r: LimitResult, width: int) -> list[str]:
    kind, m = r.limit.kind, r.measured
    name = r.limit.name.ljust(width)
    limit = fmt_value(kind, r.limit.value)
    about = METRICS[r.limit.name].about
    if r.status == "n/a":
        return [f"  {name}  n/a: {m.na}"]
    if m.value is None:  # within, by a bound
        line = f"  {name}  at most {fmt_value(kind, m.at_most)} <= {limit}: ok"
    elif r.status == "exceeded":
        line = f"  {name}  {fmt_value(kind, m.value)} > {limit}  {about}"
        if m.first_exceeded_s is not None:
            line += f"; first over the limit {m.first_exceeded_s:.2f} s in"
    else:
        line = f"  {name}  {fmt_value(kind, m.value)} <= {limit}: ok"
    out = [line]
    if m.note:
        out.append(f"  {' ' * width}    ({m.note})")
    if r.status == "exceeded":
        out += [f"  {' ' * width}    {d}" for d in m.detail]
    return out


def check(budget: Budget, measured: Mapping[str, Measured], window: dict[str, Any] | None = None,
          extra: dict[str, Any] | None = None) -> Report:
    """Compare each limit with its measurement.

    A name missing from ``measured`` is ``n/a: not measured by this
    jaxtop``; a value None is ``n/a`` unless a bound within the limit is
    known (``at_most``).
    """
    results = []
    for limit in budget.limits:
        m = measured.get(limit.name) or not_measured()
        if m.value is not None:
            status = "exceeded" if m.value > limit.value else "ok"
        elif m.at_most is not None and m.at_most <= limit.value:
            status = "ok"
        else:
            if m.na is None:
                m.na = NOT_MEASURED
            status = "n/a"
        results.append(LimitResult(limit, m, status))
    return Report(budget, results, dict(window or {}), dict(extra or {}))


# -- folding the stream ----------------------------------------------------------

#: Sample fields a budget reads as they are when present, for probes that
#: add their own field to the stream: name -> (field, key, kind). ``total``
#: values are differenced over a window; ``max`` values are process-wide
#: maxima, isolated like ``peak``.
WIRE_FIELDS: dict[str, tuple[str, str, str]] = {
    "host_syncs": ("host_syncs", "count", "total"),
    "host_syncs_per_step": ("host_syncs", "per_step_max", "max"),
}

#: Shapes per direction as the agent sends them: the 5 most frequent.
TOP_SHAPES_SENT = 5


@dataclass
class DeviceReading:
    """One device in one sample.

    Attributes:
        id: the device id.
        source: ``memory_stats`` (the allocator's counters) or
            ``live_arrays`` (CPU: bytes of live jax arrays, as last scanned).
        in_use: bytes in use.
        peak: ``peak_bytes_in_use`` (memory_stats only; a process-wide max).
        scanned_t: when the live arrays were last scanned.
        top: the largest live buffers of the last scan, when the sample
            carries them.
    """

    id: Any
    source: str
    in_use: int | None
    peak: int | None
    scanned_t: float | None
    top: list[dict[str, Any]] | None


@dataclass
class Reading:
    """The cumulative values of one ``sample`` record a budget needs."""

    t: float
    seq: int | None = None
    counts: dict[str, int] | None = None
    bytes_known: dict[str, int] = field(default_factory=dict)
    bytes_unknown: dict[str, int] = field(default_factory=dict)
    shapes: dict[tuple[str, str], int] = field(default_factory=dict)
    shapes_complete: bool = False
    compiles: int | None = None
    devices: dict[Any, DeviceReading] = field(default_factory=dict)
    rss: int | None = None
    peak_rss: int | None = None
    fields: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_sample(cls, rec: Mapping[str, Any], fields: Mapping[str, Any] | None = None) -> "Reading":
        """Read a ``sample`` record (docs/protocol.md).

        Args:
            rec: the record.
            fields: the latest value of each of :data:`WIRE_FIELDS`'s fields
                seen so far (a probe may send its field only when it changed);
                the record's own win.
        """
        r = cls(t=_num(rec.get("t")) or 0.0, seq=rec.get("seq") if isinstance(rec.get("seq"), int) else None)
        tr = rec.get("transfers")
        if isinstance(tr, dict) and all(isinstance(tr.get(d), dict) for d in DIRECTIONS):
            r.counts = {d: _int(tr[d].get("count_total")) for d in DIRECTIONS}
            r.bytes_known = {d: _int(tr[d].get("bytes_known_total")) for d in DIRECTIONS}
            r.bytes_unknown = {d: _int(tr[d].get("count_bytes_unknown_total")) for d in DIRECTIONS}
            top = tr.get("top_shapes") if isinstance(tr.get("top_shapes"), list) else []
            for s in top:
                if isinstance(s, dict) and isinstance(s.get("shape"), str):
                    r.shapes[(str(s.get("direction")), s["shape"])] = _int(s.get("count"))
            r.shapes_complete = len(top) < TOP_SHAPES_SENT
        comp = rec.get("compile")
        if isinstance(comp, dict) and comp.get("available", True) is not False:
            r.compiles = _int(comp.get("count_total")) if "count_total" in comp else None
        for dev in rec.get("devices") or []:
            if not isinstance(dev, dict):
                continue
            live = dev.get("live_arrays") if isinstance(dev.get("live_arrays"), dict) else {}
            source = str(dev.get("source") or "")
            r.devices[dev.get("id")] = DeviceReading(
                id=dev.get("id"),
                source=source,
                in_use=_opt_int(dev.get("bytes_in_use")),
                peak=_opt_int(dev.get("peak_bytes_in_use")) if source == "memory_stats" else None,
                scanned_t=_num(live.get("scanned_t")),
                top=live.get("top") if isinstance(live.get("top"), list) else None,
            )
        proc = rec.get("process")
        if isinstance(proc, dict):
            r.rss = _opt_int(proc.get("rss_bytes"))
            r.peak_rss = _opt_int(proc.get("peak_rss_bytes"))
        r.fields = dict(fields or {})
        for name, _key, _kind in WIRE_FIELDS.values():
            if isinstance(rec.get(name), dict):
                r.fields[name] = rec[name]
        return r


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _int(value: Any) -> int:
    n = _num(value)
    return int(n) if n is not None else 0


def _opt_int(value: Any) -> int | None:
    n = _num(value)
    return int(n) if n is not None else None


def _wire_value(reading: Reading | None, name: str) -> float | None:
    """A :data:`WIRE_FIELDS` value in a reading; None when not sent (or the
    probe says it is not available)."""
    if reading is None:
        return None
    fname, key, _kind = WIRE_FIELDS[name]
    rec = reading.fields.get(fname)
    if not isinstance(rec, dict) or rec.get("available") is False:
        return None
    return _num(rec.get(key))


@dataclass
class CompileSite:
    """Compiles of one function at one call site within a window.

    Attributes:
        name: the function (``jit(step)``), as jax names it.
        site: ``file:line (function)`` of the program's call that compiled it.
        count: compiles in the window.
        recompiled_t: when it was compiled the second time (epoch seconds).
    """

    name: str
    site: str
    count: int = 0
    recompiled_t: float | None = None


class WindowState:
    """Folds readings taken during a window into measured values.

    Pure: the in-process :class:`Window` feeds it readings from the agent's
    stream, tests feed it readings made from plain dicts.

    Args:
        limits: the budget (for the time each limit was first exceeded).
        start: the reading at the window's start; None when the window
            starts with the agent (every total is then counted from zero
            and a process-wide maximum is the window's own).
        start_t: when the window started (epoch seconds).
    """

    def __init__(self, limits: Budget, start: Reading | None, start_t: float) -> None:
        self.budget = limits
        self.start = start
        self.start_t = start_t
        self.first: dict[str, float] = {}
        self.readings = 0
        # Per device: the largest value seen and the reading's details then.
        self.peak: dict[Any, tuple[int, float, list[dict[str, Any]] | None]] = {}
        self.peak_rss: int | None = None
        self.wire_max: dict[str, float] = {}
        self.last_top: dict[Any, list[dict[str, Any]]] = {}

    # -- values at one reading --------------------------------------------------------
    def _total(self, reading: Reading, name: str) -> float | None:
        s = self.start
        if name in DIRECTIONS or name == "transfers":
            if reading.counts is None:
                return None
            dirs = DIRECTIONS if name == "transfers" else (name,)
            base = s.counts if s is not None and s.counts is not None else {}
            return float(sum(reading.counts[d] - base.get(d, 0) for d in dirs))
        if name.endswith("_bytes") and name[:-6] in DIRECTIONS:
            d = name[:-6]
            if reading.counts is None:
                return None
            return float(reading.bytes_known.get(d, 0) - (s.bytes_known.get(d, 0) if s is not None else 0))
        if name == "compiles":
            if reading.compiles is None:
                return None
            return float(reading.compiles - ((s.compiles or 0) if s is not None else 0))
        if name in WIRE_FIELDS and WIRE_FIELDS[name][2] == "total":
            now = _wire_value(reading, name)
            if now is None:
                return None
            if s is None:
                return now
            before = _wire_value(s, name)
            return None if before is None else now - before
        return None

    def _isolated(self, now: int | None, before: int | None) -> int | None:
        """A process-wide maximum as the window's: known only when the window
        starts with the process, or when the maximum rose during it."""
        if now is None:
            return None
        if self.start is None or before is None or now > before:
            return now
        return None

    def _device_peak(self, reading: Reading) -> tuple[int, Any] | None:
        best: tuple[int, Any] | None = None
        for dev in reading.devices.values():
            value: int | None
            if dev.source == "memory_stats":
                before = self.start.devices.get(dev.id) if self.start is not None else None
                value = self._isolated(dev.peak, before.peak if before is not None else None)
            elif dev.scanned_t is not None and dev.scanned_t >= self.start_t:
                value = dev.in_use  # live arrays scanned within the window
            else:
                value = None
            if value is not None and (best is None or value > best[0]):
                best = (value, dev.id)
        return best

    def observe(self, reading: Reading) -> None:
        """Take one reading made during the window."""
        self.readings += 1
        for dev in reading.devices.values():
            if dev.top is not None:
                self.last_top[dev.id] = dev.top
        peak = self._device_peak(reading)
        if peak is not None:
            value, dev_id = peak
            old = self.peak.get(dev_id)
            if old is None or value > old[0]:
                self.peak[dev_id] = (value, reading.t, self.last_top.get(dev_id))
        rss = self._isolated(reading.peak_rss, self.start.peak_rss if self.start is not None else None)
        if rss is not None:
            self.peak_rss = max(self.peak_rss or 0, rss)
        for name, (_f, _k, kind) in WIRE_FIELDS.items():
            if kind == "max":
                v = _wire_value(reading, name)
                if v is not None and (self.start is None or v > (_wire_value(self.start, name) or -1)):
                    self.wire_max[name] = max(self.wire_max.get(name, 0.0), v)
        for limit in self.budget.limits:
            if limit.name in self.first:
                continue
            value = self._value_now(reading, limit.name)
            if value is not None and value > limit.value:
                self.first[limit.name] = max(0.0, reading.t - self.start_t)

    def _value_now(self, reading: Reading, name: str) -> float | None:
        if name == "peak":
            return float(max((v for v, _t, _top in self.peak.values()), default=0)) if self.peak else None
        if name == "peak_rss":
            return None if self.peak_rss is None else float(self.peak_rss)
        if name in WIRE_FIELDS and WIRE_FIELDS[name][2] == "max":
            return self.wire_max.get(name)
        return self._total(reading, name)

    # -- the end ----------------------------------------------------------------------
    def finish(
        self,
        end: Reading | None,
        end_t: float,
        exact: Mapping[str, int] | None = None,
        transfer_na: Mapping[str, str] | None = None,
        compile_sites: Iterable[CompileSite] | None = None,
        compile_na: str | None = None,
        stream_na: str | None = None,
        shapes: Mapping[tuple[str, str], int] | None = None,
        shapes_complete: bool | None = None,
        end_scanned: bool = True,
    ) -> dict[str, Measured]:
        """Measured values for every name, the window ending at ``end``.

        Args:
            end: the reading taken after the window's end (None: the stream
                could not be read; ``stream_na`` says why).
            end_t: when the window ended.
            exact: exact totals over the window from the agent itself
                (``h2d``, ``d2h``, ``d2d``, ``compiles``); they win over the
                stream's, which may lag a sample.
            transfer_na: directions whose transfers were not counted, and why.
            compile_sites: the window's compiles per function and call site
                (None: not known; ``compile_na`` says why).
            shapes: exact transfer counts per (direction, shape) over the
                window, when the agent provides them; else the stream's 5
                most frequent shapes are differenced.
            shapes_complete: whether ``shapes`` lists every shape.
            end_scanned: whether the end reading's live-array bytes were
                scanned after the window ended (CPU ``in_use``).
        """
        if end is not None:
            self.observe(end)
        out: dict[str, Measured] = {}
        seconds = max(0.0, end_t - self.start_t)
        # The reading after the end is taken a little later: what it shows
        # for the first time happened by the end.
        self.first = {k: min(v, seconds) for k, v in self.first.items()}
        self._seconds = seconds
        exact = dict(exact or {})
        transfer_na = dict(transfer_na or {})
        no_stream = stream_na or "the agent's stream could not be read"

        def first(name: str) -> float | None:
            return self.first.get(name)

        # transfers
        for d in DIRECTIONS:
            if d in transfer_na:
                out[d] = Measured(na=transfer_na[d])
                continue
            value = exact.get(d)
            if value is None and end is not None:
                value = self._total(end, d)
            if value is None:
                out[d] = Measured(na=no_stream)
                continue
            m = Measured(value=float(value), first_exceeded_s=first(d))
            self._shape_detail(m, d, end, shapes, shapes_complete)
            out[d] = m
        if any(d in transfer_na for d in DIRECTIONS):
            out["transfers"] = Measured(na="; ".join(sorted(set(transfer_na.values()))))
        elif all(out[d].value is not None for d in DIRECTIONS):
            out["transfers"] = Measured(value=sum(out[d].value or 0 for d in DIRECTIONS),
                                        first_exceeded_s=first("transfers"))
            out["transfers"].detail = [line for d in DIRECTIONS for line in out[d].detail]
        else:
            out["transfers"] = Measured(na=no_stream)
        for d in (*DIRECTIONS, "transfers"):
            m = out[d]
            if m.value is None:
                out[f"{d}_per_s"] = Measured(na=m.na)
            elif seconds <= 0:
                out[f"{d}_per_s"] = Measured(na="the window took no measurable time")
            else:
                out[f"{d}_per_s"] = Measured(value=m.value / seconds, note=f"{int(m.value)} in {seconds:.2f} s")
        for d in DIRECTIONS:
            name = f"{d}_bytes"
            if d in transfer_na:
                out[name] = Measured(na=transfer_na[d])
            elif end is None:
                out[name] = Measured(na=no_stream)
            else:
                value = self._total(end, name)
                m = Measured(value=value, first_exceeded_s=first(name))
                unknown = end.bytes_unknown.get(d, 0) - (self.start.bytes_unknown.get(d, 0) if self.start else 0)
                if unknown > 0:
                    m.note = (f"a lower bound: {unknown} transfer(s) logged no shape "
                              "(a cached jit call logs none)")
                self._shape_detail(m, d, end, shapes, shapes_complete)
                out[name] = m
        # compiles
        if "compiles" in exact:
            out["compiles"] = Measured(value=float(exact["compiles"]), first_exceeded_s=first("compiles"))
        elif end is not None and self._total(end, "compiles") is not None:
            out["compiles"] = Measured(value=self._total(end, "compiles"), first_exceeded_s=first("compiles"))
        else:
            out["compiles"] = Measured(na=compile_na or no_stream)
        if compile_sites is None:
            out["recompiles"] = Measured(na=compile_na or NOT_MEASURED)
        else:
            out["recompiles"] = self._recompiles(list(compile_sites))
        if "compiles" in out and out["compiles"].value and compile_sites is not None:
            sites = sorted(compile_sites, key=lambda c: -c.count)
            out["compiles"].detail = [f"{c.name} at {c.site}: compiled {c.count} time(s)" for c in sites[:8]]
        # memory
        out["peak"] = self._peak_measured(end)
        out["in_use"] = self._in_use(end, end_scanned, no_stream)
        out["peak_rss"] = self._peak_rss(end, no_stream)
        # fields of other probes
        for name, (fname, key, kind) in WIRE_FIELDS.items():
            if end is None or fname not in end.fields:
                out[name] = Measured(na=NOT_MEASURED)
                continue
            if kind == "total":
                value = self._total(end, name)
                out[name] = (Measured(value=value, first_exceeded_s=first(name)) if value is not None
                             else Measured(na=NOT_MEASURED if _wire_value(end, name) is None
                                           else f"{fname}.{key} was not sent at the window's start"))
            else:
                now = _wire_value(end, name)
                if now is None:
                    out[name] = Measured(na=NOT_MEASURED)
                elif name in self.wire_max:
                    out[name] = Measured(value=self.wire_max[name], first_exceeded_s=first(name))
                else:
                    out[name] = Measured(at_most=now, na=f"{fname}.{key} is a process-wide maximum set before "
                                         f"this window ({int(now)}); the window's own cannot be isolated")
        return out

    def _shape_detail(self, m: Measured, d: str, end: Reading | None,
                      shapes: Mapping[tuple[str, str], int] | None, complete: bool | None) -> None:
        if shapes is not None:
            per = {s: n for (dd, s), n in shapes.items() if dd == d and n > 0}
            partial = not complete
        elif end is not None:
            per = {}
            partial = not end.shapes_complete
            start = self.start
            for (dd, s), n in end.shapes.items():
                if dd != d:
                    continue
                before = 0
                if start is not None:
                    if (dd, s) in start.shapes:
                        before = start.shapes[(dd, s)]
                    elif not start.shapes_complete:
                        partial = True  # not listed then: its count then is unknown
                        continue
                if n - before > 0:
                    per[s] = n - before
        else:
            return
        if not per:
            return
        ranked = sorted(per.items(), key=lambda kv: (-kv[1], kv[0]))
        text = ", ".join(f"{s} x{n}" for s, n in ranked[:8])
        scope = " (among the most frequent shapes of the process)" if partial else ""
        m.detail.append(f"shapes{scope}: {text}")
        m.data["shapes"] = [{"shape": s, "count": n} for s, n in ranked]
        m.data["shapes_complete"] = not partial

    def _recompiles(self, sites: list[CompileSite]) -> Measured:
        again = [c for c in sites if c.count > 1]
        value = float(sum(c.count - 1 for c in again))
        m = Measured(value=value)
        times = [c.recompiled_t for c in again if c.recompiled_t is not None]
        if times:
            m.first_exceeded_s = max(0.0, min(times) - self.start_t)
        again.sort(key=lambda c: (-c.count, c.site))
        m.detail = [f"{c.name} at {c.site}: compiled {c.count} times ({c.count - 1} recompile(s))"
                    for c in again[:8]]
        if len(again) > 8:
            m.detail.append(f"... and {len(again) - 8} more function(s)")
        m.data["functions"] = [{"name": c.name, "site": c.site, "compiles": c.count} for c in again]
        return m

    def _peak_measured(self, end: Reading | None) -> Measured:
        if self.peak:
            dev_id, (value, t, top) = max(self.peak.items(), key=lambda kv: kv[1][0])
            source = end.devices[dev_id].source if end is not None and dev_id in end.devices else ""
            m = Measured(value=float(value), first_exceeded_s=self.first.get("peak"))
            t_s = min(max(0.0, t - self.start_t), getattr(self, "_seconds", math.inf))
            when = f"{t_s:.2f} s in"
            m.detail.append(f"device {dev_id}: {fmt_bytes(value)} ({when})")
            if source == "live_arrays":
                m.note = "live-array bytes, sampled: arrays that lived between two scans are missed"
            if top:
                m.detail.append("largest live buffers then: " + ", ".join(
                    f"{b.get('dtype')}{b.get('shape')} {fmt_bytes(b.get('nbytes'))}" for b in top[:5]))
            m.data = {"device": dev_id, "t_s": round(t_s, 6), "source": source,
                      "top": list(top or [])[:10]}
            return m
        if end is None or not end.devices:
            return Measured(na="no device memory seen (the program created no JAX backend, "
                               "or the stream could not be read)")
        if any(d.source == "memory_stats" for d in end.devices.values()):
            bound = max((d.peak or 0) for d in end.devices.values())
            return Measured(at_most=float(bound),
                            na=f"peak_bytes_in_use is a process-lifetime maximum, set before this window "
                               f"({fmt_bytes(bound)}): the window's own peak cannot be isolated")
        return Measured(na="no live-array scan during the window (CPU peaks are sampled)")

    def _in_use(self, end: Reading | None, scanned: bool, no_stream: str) -> Measured:
        if end is None:
            return Measured(na=no_stream)
        best: tuple[int, Any] | None = None
        for dev in end.devices.values():
            if dev.source != "memory_stats" and not scanned:
                return Measured(na="no live-array scan after the window ended")
            if dev.in_use is not None and (best is None or dev.in_use > best[0]):
                best = (dev.in_use, dev.id)
        if best is None:
            return Measured(na="no device memory seen (the program created no JAX backend)")
        m = Measured(value=float(best[0]))
        m.detail.append(f"device {best[1]}: {fmt_bytes(best[0])} at the end")
        top = self.last_top.get(best[1])
        if top:
            m.detail.append("largest live buffers: " + ", ".join(
                f"{b.get('dtype')}{b.get('shape')} {fmt_bytes(b.get('nbytes'))}" for b in top[:5]))
        return m

    def _peak_rss(self, end: Reading | None, no_stream: str) -> Measured:
        if self.peak_rss is not None:
            return Measured(value=float(self.peak_rss), first_exceeded_s=self.first.get("peak_rss"))
        if end is None or end.peak_rss is None:
            return Measured(na=no_stream if end is None else "the agent reports no peak RSS here")
        return Measured(at_most=float(end.peak_rss),
                        na=f"peak RSS is a process-lifetime maximum, set before this window "
                           f"({fmt_bytes(end.peak_rss)}): the window's own cannot be isolated")


# -- in-process measurement --------------------------------------------------------

_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileLog:
    """Backend compiles, each with jax's function name and the program's
    call site, for the windows open at the time.

    jax names the compiled function (``fun_name``) from 0.6.2 on; the call
    site is the innermost frame outside jax, jaxlib, jaxtop and the standard
    library. One listener per process (jax.monitoring keeps them for good on
    older versions), idle while no window is open.
    """

    _instance: "CompileLog | None" = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.windows: list[dict[tuple[str, str], CompileSite]] = []
        self.names_seen: bool | None = None  # None until the first compile
        self.registered = False
        self.reason: str | None = "jax not imported yet"
        self._skip: tuple[str, ...] = ()
        self._mu = threading.Lock()

    @classmethod
    def get(cls) -> "CompileLog":
        """The process's log, registered with jax.monitoring once jax is imported."""
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
                from jaxtop.agent.import_hook import when_imported

                when_imported("jax", cls._instance._register)
            return cls._instance

    def _register(self, _module: Any = None) -> None:
        try:
            import sysconfig

            import jax
            import jaxlib
            from jax import monitoring

            skip = {os.path.dirname(jax.__file__), os.path.dirname(jaxlib.__file__),
                    os.path.dirname(os.path.abspath(__file__))}
            for key in ("stdlib", "platstdlib"):
                path = sysconfig.get_paths().get(key)
                if path:
                    skip.add(path)
            self._skip = tuple(os.path.join(p, "") for p in skip) + ("<frozen",)
            monitoring.register_event_duration_secs_listener(self._on_duration)
            self.registered = True
            self.reason = None
        except Exception as exc:
            self.reason = f"jax.monitoring unavailable: {type(exc).__name__}: {exc}"

    def _site(self) -> str:
        frame = sys._getframe(2)
        while frame is not None:
            filename = frame.f_code.co_filename
            if not filename.startswith(self._skip):
                try:
                    shown = os.path.relpath(filename)
                except ValueError:
                    shown = filename
                if shown.startswith(".."):
                    shown = filename
                return f"{shown}:{frame.f_lineno} ({frame.f_code.co_name})"
            frame = frame.f_back
        return "<no call site outside jax>"

    def _on_duration(self, event: str, duration: float, *args: Any, **kwargs: Any) -> None:
        # Runs on the compiling thread: quick, and never raises into jax.
        if event != _BACKEND_COMPILE_EVENT or not self.windows:
            return
        try:
            name = kwargs.get("fun_name")
            self.names_seen = name is not None
            if name is None:
                return
            key = (str(name), self._site())
            now = time.time()
            with self._mu:
                for sites in self.windows:
                    c = sites.get(key)
                    if c is None:
                        c = sites[key] = CompileSite(*key)
                    c.count += 1
                    if c.count == 2:
                        c.recompiled_t = now
        except Exception:
            pass

    def open(self) -> dict[tuple[str, str], CompileSite]:
        sites: dict[tuple[str, str], CompileSite] = {}
        with self._mu:
            self.windows.append(sites)
        return sites

    def close(self, sites: dict[tuple[str, str], CompileSite]) -> tuple[list[CompileSite] | None, str | None]:
        """Stop filling ``sites``; returns them, or None and why they are not known."""
        with self._mu:
            if sites in self.windows:
                self.windows.remove(sites)
            found = list(sites.values())
        if not self.registered:
            if "jax" not in sys.modules:
                return [], None  # no jax, no compile
            return None, self.reason or "jax.monitoring not hooked"
        if self.names_seen is False:
            return None, "this jax does not name compiled functions (jax.monitoring fun_name, jax 0.6.2+)"
        return found, None


class _Stream:
    """The agent's own stream, read in this process on a thread of its own.

    Each sample becomes a :class:`Reading`; the open windows observe it.
    """

    def __init__(self, agent: Any) -> None:
        from jaxtop.client import AgentConnection

        self.conn = AgentConnection.open(agent.pid)
        self.cond = threading.Condition()
        self.latest: Reading | None = None
        self.fields: dict[str, Any] = {}
        self.hello: dict[str, Any] = {}
        self.windows: list[WindowState] = []
        self.closed = False
        self.error: str | None = None
        self.thread = threading.Thread(target=self._read, name="jaxtop-budget", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        from jaxtop import protocol

        try:
            for line in self.conn.lines(should_stop=lambda: self.closed, poll_s=0.2):
                try:
                    rec = protocol.decode(line)
                except Exception:
                    continue
                kind = rec.get("type")
                if kind == protocol.HELLO:
                    self.hello = rec
                    continue
                if kind != protocol.SAMPLE:
                    continue
                reading = Reading.from_sample(rec, self.fields)
                self.fields = reading.fields
                with self.cond:
                    self.latest = reading
                    for w in self.windows:
                        w.observe(reading)
                    self.cond.notify_all()
        except Exception as exc:  # the stream, never the program
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            with self.cond:
                if not self.closed and self.error is None:
                    self.error = "the agent closed its stream"
                self.cond.notify_all()

    def wait(self, after_t: float, timeout_s: float, scanned_after: float | None = None) -> Reading | None:
        """The first reading taken at or after ``after_t`` (and, given
        ``scanned_after``, whose live arrays were scanned after it), or the
        latest one when none comes in time (None when there is none)."""

        def ready() -> bool:
            r = self.latest
            if r is None or r.t < after_t:
                return self.error is not None
            if scanned_after is not None:
                scans = [d.scanned_t for d in r.devices.values() if d.source == "live_arrays"]
                if scans and any(s is None or s < scanned_after for s in scans):
                    return self.error is not None
            return True

        with self.cond:
            self.cond.wait_for(ready, timeout=timeout_s)
            return self.latest

    def add(self, w: WindowState) -> None:
        with self.cond:
            self.windows.append(w)

    def remove(self, w: WindowState) -> None:
        with self.cond:
            if w in self.windows:
                self.windows.remove(w)

    def close(self) -> None:
        self.closed = True
        self.conn.shutdown()
        self.thread.join(timeout=2.0)
        self.conn.close()


#: Longest wait for the agent: the relay's acknowledgement, the next sample.
SYNC_TIMEOUT_S = 5.0


class Meter:
    """Measures windows of this process with its running agent.

    Args:
        agent: the running :class:`jaxtop.agent.Agent` (``handle.agent``).
        transfers_na: why this meter cannot count transfers although the
            agent may (its stderr pipe is not where the measured code writes);
            None when it can.
    """

    def __init__(self, agent: Any, transfers_na: str | None = None) -> None:
        self.agent = agent
        self.transfers_na = transfers_na
        self.compiles = CompileLog.get()
        self.stream: _Stream | None = None
        self.stream_na: str | None = None
        try:
            self.stream = _Stream(agent)
        except Exception as exc:
            self.stream_na = f"the agent's stream could not be read: {exc}"

    @property
    def running(self) -> bool:
        return bool(getattr(self.agent, "running", False))

    def window(self, budget: Budget, what: str, from_start: bool = False) -> "Window":
        """A window to measure against ``budget`` (not started yet)."""
        return Window(self, budget, what, from_start)

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None

    # -- exact totals from the agent ----------------------------------------------------
    def totals(self) -> dict[str, Any]:
        """Exact totals now: every guard line written so far counted."""
        out: dict[str, Any] = {}
        # A sync marker written where the relay does not read would only wait.
        sync_s = SYNC_TIMEOUT_S if self.transfers_na is None else 0.0
        detail = getattr(self.agent, "transfer_detail", None)
        if callable(detail):
            try:
                d = detail(sync_timeout_s=sync_s)
                out.update({k: int(d[k]["count"]) for k in DIRECTIONS})
                out["shapes"] = {(s["direction"], s["shape"]): int(s["count"]) for s in d.get("shapes", [])}
                out["synced"] = d.get("synced", True)
            except Exception:
                out = {}
        if not out:
            out.update(self.agent.transfer_totals(sync_timeout_s=sync_s))
        out["compiles"] = self.agent.compile_count()
        out["t"] = time.time()
        return out

    def transfer_problems(self) -> dict[str, str]:
        """Directions whose implicit transfers are not being counted, and why."""
        agent = self.agent
        if self.transfers_na is not None:
            return {d: f"transfers not counted: {self.transfers_na}" for d in DIRECTIONS}
        capture = getattr(agent, "capture", None)
        if capture is None or not getattr(capture, "active", False):
            reason = (self.stream.hello.get("transfer_capture", {}) or {}).get("reason") if self.stream else None
            reason = reason or getattr(capture, "reason", None) or "stderr capture is off"
            return {d: f"transfers not counted: {reason}" for d in DIRECTIONS}
        if "jax" not in sys.modules:
            return {}  # no jax, no transfer
        guard = getattr(agent, "guard", None)
        if guard is None or not getattr(guard, "active", False):
            return {d: "transfers not counted: the transfer guard is not armed" for d in DIRECTIONS}
        out = {}
        for d, level in guard_levels().items():
            if level in (None, "allow"):
                out[d] = (f"transfers not counted: the {d} transfer guard was set back to 'allow' "
                          "(jaxtop re-arms it within a second)")
        return out


def guard_levels() -> dict[str, str | None]:
    """The transfer guard's level per direction as jax has it now (global
    setting where a direction has none); {} before jax is imported."""
    jax = sys.modules.get("jax")
    if jax is None:
        return {}
    try:
        config = jax.config
        glob = config.jax_transfer_guard
        return {
            "h2d": config.jax_transfer_guard_host_to_device or glob,
            "d2h": config.jax_transfer_guard_device_to_host or glob,
            "d2d": config.jax_transfer_guard_device_to_device or glob,
        }
    except Exception:
        return {}


class Window:
    """One measured stretch of this process: :meth:`begin`, the work, :meth:`end`.

    Totals (transfers, compiles) are exact: at both edges the agent first
    counts every guard line written so far. Samples taken in between give
    when a limit was first exceeded, memory peaks and the shapes.
    """

    def __init__(self, meter: Meter, budget: Budget, what: str, from_start: bool) -> None:
        self.meter = meter
        self.budget = budget
        self.what = what
        self.from_start = from_start
        self.state: WindowState | None = None
        self._start_totals: dict[str, Any] = {}
        self._start_na: dict[str, str] = {}
        self._sites: dict[tuple[str, str], CompileSite] | None = None
        self._no_start: str | None = None
        self.report: Report | None = None

    def _needs_scan(self) -> bool:
        return bool(self.budget.names() & {"peak", "in_use"})

    def begin(self) -> "Window":
        meter = self.meter
        if self.from_start:
            start, start_t = None, time.time()
            self._start_totals = {d: 0 for d in DIRECTIONS}
            self._start_totals["compiles"] = 0
        else:
            self._start_totals = meter.totals()
            start_t = self._start_totals["t"]
            start = None
            if meter.stream is not None:
                start = meter.stream.wait(start_t, SYNC_TIMEOUT_S)
                if start is not None and start.t < start_t:
                    start = None  # the agent is stuck: totals only
        self._start_na = meter.transfer_problems()
        self.state = WindowState(self.budget, start, start_t)
        self._no_start = None
        if not self.from_start and start is None:
            # Without a reading at the start, the stream's totals and maxima
            # cannot be told apart from what came before: exact totals only.
            self._no_start = meter.stream_na or "the agent sent no sample at the window's start"
        elif meter.stream is not None:
            meter.stream.add(self.state)
        self._sites = meter.compiles.open()
        return self

    def end(self, extra: dict[str, Any] | None = None) -> Report:
        """Stop measuring; returns (and keeps in :attr:`report`) the check."""
        if self.state is None:
            raise RuntimeError("Window.end() before begin()")
        meter, state = self.meter, self.state
        sites, compile_na = meter.compiles.close(self._sites or {})
        if not meter.running:
            # Stopped mid-window (``jaxtop detach``): nothing after is counted.
            na = "the jaxtop agent stopped during the window"
            measured: dict[str, Measured] = {name: Measured(na=na) for name in METRICS}
            end_t = time.time()
        else:
            totals = meter.totals()
            end_t = totals["t"]
            end = None
            stream_na = self._no_start or meter.stream_na
            if meter.stream is not None and self._no_start is None:
                scan = end_t if self._needs_scan() and self._live_arrays() else None
                if scan:
                    # The agent scans on a cadence its cost sets (seconds apart
                    # with many arrays): the window asks for one now.
                    request = getattr(meter.agent, "request_scan", None)
                    if request is not None:
                        request()
                wait = SYNC_TIMEOUT_S + (float(getattr(meter.agent, "slow_interval_s", 1.0)) if scan else 0.0)
                end = meter.stream.wait(end_t, wait, scanned_after=scan)
                if end is not None and end.t < end_t:
                    stream_na = "the agent sent no sample after the window ended"
                    end = None
                elif end is None:
                    stream_na = meter.stream.error or "the agent sent no sample"
                meter.stream.remove(state)
            problems = dict(self._start_na)
            problems.update(meter.transfer_problems())
            if totals.get("synced") is False or self._start_totals.get("synced") is False:
                for d in DIRECTIONS:
                    problems.setdefault(d, "transfers not all counted: the stderr relay did not acknowledge "
                                           f"within {SYNC_TIMEOUT_S:g} s (a loaded machine)")
            exact = {k: totals[k] - self._start_totals.get(k, 0) for k in (*DIRECTIONS, "compiles") if k in totals}
            shapes = None
            if "shapes" in totals:
                before = self._start_totals.get("shapes", {})
                shapes = {k: n - before.get(k, 0) for k, n in totals["shapes"].items()}
            scanned = end is not None and all(
                d.scanned_t is not None and d.scanned_t >= end_t for d in end.devices.values()
                if d.source == "live_arrays")
            measured = state.finish(end, end_t, exact=exact, transfer_na=problems, compile_sites=sites,
                                    compile_na=compile_na, stream_na=stream_na, shapes=shapes,
                                    shapes_complete=True if shapes is not None else None, end_scanned=scanned)
        window = {"what": self.what, "seconds": round(max(0.0, end_t - state.start_t), 6),
                  "start_t": state.start_t, "end_t": end_t, "samples": state.readings}
        self.report = check(self.budget, measured, window, extra)
        return self.report

    def _live_arrays(self) -> bool:
        stream = self.meter.stream
        latest = stream.latest if stream is not None else None
        if latest is None:
            return True
        return any(d.source == "live_arrays" for d in latest.devices.values())

    def cancel(self) -> None:
        """Stop measuring without a report (the measured code failed)."""
        if self._sites is not None:
            self.meter.compiles.close(self._sites)
            self._sites = None
        if self.meter.stream is not None and self.state is not None:
            self.meter.stream.remove(self.state)


class RunBudget:
    """``jaxtop run --budget``: the whole run is one window.

    Args:
        budget: the limits.
        report_path: also write the report as JSON here.
    """

    def __init__(self, budget: Budget, report_path: str | None = None) -> None:
        self.budget = budget
        self.report_path = report_path
        self.meter: Meter | None = None
        self.window: Window | None = None
        self.error: str | None = None

    def start(self, agent: Any) -> None:
        """Begin measuring, before the program runs (jax not yet imported).

        Never raises: the program runs whatever happens here, and a meter
        that could not start is reported by :meth:`finish`.
        """
        try:
            self.meter = Meter(agent)
            self.window = self.meter.window(self.budget, "the run", from_start=True).begin()
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def finish(self, program_ok: bool, out: Any = None) -> bool:
        """Check the budget once the program has returned.

        Args:
            program_ok: the program ended normally (return, or exit status
                0). When it did not, nothing is printed (its own traceback
                and status win) and the JSON report says so.
            out: where the text report goes (default sys.stderr).

        Returns:
            True when the program succeeded and exceeded its budget: the run
            then exits with :data:`EXIT_BUDGET`.
        """
        stream = out or sys.stderr
        if self.window is None or self.meter is None:
            if program_ok:
                print(f"jaxtop run: the budget could not be checked: {self.error or 'not started'}", file=stream)
            return program_ok
        try:
            report = self.window.end(extra={"program_failed": not program_ok})
        except Exception as exc:
            # A check that cannot be made must not pass in CI: say so, and
            # fail the run unless the program's own failure decides it.
            if program_ok:
                print(f"jaxtop run: the budget could not be checked: {type(exc).__name__}: {exc}", file=stream)
            return program_ok
        finally:
            self.meter.close()
        if self.report_path:
            try:
                write_json(report, self.report_path)
            except OSError as exc:
                print(f"jaxtop run: cannot write the budget report {self.report_path}: {exc.strerror or exc}",
                      file=out or sys.stderr)
        if not program_ok:
            return False
        if report.exceeded or report.unchecked:
            try:
                stream.flush()
            except Exception:
                pass
            print(report.text("jaxtop run: budget"), file=stream, flush=True)
        return not report.ok


def write_json(report: Report, path: str) -> None:
    """Write ``report`` as JSON to ``path`` (``-`` for stdout)."""
    text = json.dumps(report.to_json(), indent=2, sort_keys=False, default=str) + "\n"
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
