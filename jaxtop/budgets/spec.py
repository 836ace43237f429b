"""A budget's limits: the names a budget may limit, and reading them from a
``--budget`` spec, keyword arguments (a marker, the fixture) or the
``[tool.jaxtop.budget]`` table of a ``pyproject.toml``.

The grammar, every name and its unit are in docs/budgets.md. Pure and
standard library only.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping

from jaxtop.wire.protocol import DIRECTIONS

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
