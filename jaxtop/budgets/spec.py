"""A budget's limits: the names a budget may limit, and reading them from a
``--budget`` spec, keyword arguments (a marker, the fixture) or the
``[tool.jaxtop.budget]`` table of a ``pyproject.toml``.

The grammar, every name and its unit are in docs/budgets.md. Pure and
standard library only.
"""

from __future__ import annotations

import difflib
import errno
import math
import os
import re
import reprlib
import stat
import sys
from dataclasses import dataclass
from typing import Any, Mapping

from jaxtop.budgets.sites import SiteName, parse_site_name
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


#: Every name a budget may use, but the per-line ones (``h2d@train.py:27``).
METRICS: dict[str, MetricDef] = _metric_defs()


def metric_of(name: str) -> MetricDef | None:
    """The metric a name limits: one of :data:`METRICS`, or the implicit
    transfers made at one line of the program (:mod:`jaxtop.budgets.sites`)."""
    metric = METRICS.get(name)
    if metric is not None:
        return metric
    site = parse_site_name(name)
    if isinstance(site, SiteName):
        return MetricDef(name, "count", "transfer_sites", site.about)
    return None

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
        metric = metric_of(self.name)
        return metric.kind if metric is not None else "count"


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
    return BudgetError(f"{source}: unknown name {_shown(name)!r}{hint} (names: {', '.join(METRICS)}; "
                       "and per line of the program, e.g. h2d@train.py:27)")


def _shown(value: Any) -> str:
    """A value as a message quotes it: a string as written, cut at 60
    characters; anything else as a short repr (a table nested a thousand
    deep has no printable repr, a long string no readable one)."""
    if isinstance(value, str):
        return value if len(value) <= 60 else value[:59] + "…"
    return reprlib.repr(value)


def _fmt_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def parse_value(name: str, value: Any, source: str = "budget") -> Limit:
    """One limit from its name and value (text like ``2GiB``, or a number).

    Raises:
        BudgetError: an unknown name, a negative or malformed value, a unit
            where none belongs, a fraction of a count.
    """
    name = str(name).strip()
    metric = metric_of(name)
    if metric is None:
        site = parse_site_name(name)
        if isinstance(site, str):
            raise BudgetError(f"{source}: {_shown(name)!r}: {site}")
        raise _unknown_name(name, source)
    where = f"{source}: {name}"
    if isinstance(value, str):
        value = value.strip()
        if value.startswith("-"):
            raise BudgetError(f"{where}={_shown(value)}: the limit must be >= 0")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise BudgetError(f"{where}: the limit must be a number or a size like '2GiB', not {_shown(value)}")
    if isinstance(value, str):
        match = _VALUE_RE.match(value)
        if match is None:
            raise BudgetError(f"{where}={_shown(value)!r}: not a number" + (
                " with a unit (KiB, MiB, GiB, KB, MB, GB)" if metric.kind == "bytes" else ""))
        number, unit = float(match.group(1)), match.group(2)
    else:
        try:
            number, unit = float(value), ""
        except OverflowError:  # an integer beyond a float (TOML reads up to 4,300 digits)
            raise BudgetError(f"{where}: the limit is too big ({_shown(value)})") from None
    if not math.isfinite(number) or number < 0:
        raise BudgetError(f"{where}: the limit must be a finite number >= 0, not {_shown(value)}")
    if metric.kind == "bytes":
        if unit:
            factor = BYTE_UNITS.get(unit.lower())
            if factor is None:
                raise BudgetError(f"{where}={_shown(value)}: unknown unit {unit!r} (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")
            number *= factor
        if not math.isfinite(number):  # 1e308GiB
            raise BudgetError(f"{where}: the limit must be a finite number >= 0, not {_shown(value)}")
        number = float(math.floor(number))
        text = _fmt_size_spec(number, unit, match.group(1) if isinstance(value, str) else None)
        return Limit(name, number, text)
    if metric.kind == "rate":
        if unit and unit.lower() not in ("/s", "persec"):
            raise BudgetError(f"{where}={_shown(value)}: a rate is a number per second, without a unit")
        return Limit(name, number, _fmt_number(number))
    if unit:
        raise BudgetError(f"{where}={_shown(value)}: {name} counts {metric.about}; it takes a whole number without a unit")
    if not number.is_integer():
        raise BudgetError(f"{where}={_shown(value)}: {name} counts {metric.about}; it takes a whole number")
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


#: The largest budget file read: a pyproject.toml is a few KiB, and TOML is
#: parsed whole, in memory.
MAX_TOML_BYTES = 4 << 20
#: The most parts a dotted key or table header may have ("a.b.c" has 3):
#: tomllib's time grows with the square of it (10,000 parts: 1.6 s; a
#: 100,000-deep one ran for minutes), and no real file nests beyond a few.
MAX_KEY_PARTS = 100
#: One part of a key: bare, "basic" or 'literal'.
_KEY_PART = r"""[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*'"""
#: A dotted key or a table header: parts joined by dots.
_DOTTED_KEY = re.compile(rf"(?:{_KEY_PART})(?:[ \t]*\.[ \t]*(?:{_KEY_PART}))*")


def _deepest_key(text: str) -> int:
    """The most parts of a dotted key or header at the start of a line (a
    value's strings may hold dots: only where a key can be is looked at)."""
    deepest = 0
    for line in text.splitlines():
        stripped = line.lstrip(" \t[")
        if "." not in stripped:
            continue
        match = _DOTTED_KEY.match(stripped)
        if match is not None:
            deepest = max(deepest, len(re.findall(_KEY_PART, match.group(0))))
    return deepest


def _toml_loads(text: str) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise BudgetError("reading a budget from TOML needs Python 3.11+ or the tomli package "
                              "(pip install tomli)") from None
    if _deepest_key(text) > MAX_KEY_PARTS:
        raise BudgetError(f"not a budget: a key or table nested more than {MAX_KEY_PARTS} deep")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BudgetError(f"not valid TOML: {exc}") from None
    except RecursionError:  # arrays or inline tables nested about a thousand deep
        raise BudgetError("not a budget: arrays or tables nested too deeply") from None
    except ValueError:  # an integer of more digits than Python converts
        limit = getattr(sys, "get_int_max_str_digits", lambda: 4300)()
        raise BudgetError(f"not a budget: a number of more than {limit} digits") from None


def _read_toml_file(path: str) -> str:
    """The text of a budget file: a regular file, at most :data:`MAX_TOML_BYTES`,
    UTF-8. Opened without blocking, so that a FIFO is refused, not waited on.

    Raises:
        BudgetError: anything else, in one line.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.EISDIR:
            raise BudgetError(f"{path} is a directory, not a TOML file") from None
        raise BudgetError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise BudgetError(f"{path} is a directory, not a TOML file")
        if not stat.S_ISREG(st.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device"
            raise BudgetError(f"{path} is {kind}, not a TOML file")
        if st.st_size > MAX_TOML_BYTES:
            raise BudgetError(f"{path} is too big for a budget file ({st.st_size:,} bytes; at most {MAX_TOML_BYTES:,})")
        chunks = []
        size = 0
        while size <= MAX_TOML_BYTES:
            chunk = os.read(fd, MAX_TOML_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise BudgetError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_TOML_BYTES:  # it grew since
        raise BudgetError(f"{path} is too big for a budget file (over {MAX_TOML_BYTES:,} bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BudgetError(f"{path}: not valid TOML: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                          f"{exc.start})") from None


def load_pyproject(path: str | os.PathLike[str]) -> Budget | None:
    """The ``[tool.jaxtop.budget]`` table of a ``pyproject.toml``.

    Returns:
        The budget, or None when the file has no such table.

    Raises:
        BudgetError: the file cannot be read (not a regular file, too big,
            not UTF-8), is not TOML (or nests deeper than a budget file
            does), or the table holds something a budget cannot.
    """
    path = os.fspath(path)
    text = _read_toml_file(path)
    try:
        data = _toml_loads(text)
    except BudgetError as exc:
        raise BudgetError(f"{path}: {exc}") from None
    tool = data.get("tool")
    jaxtop = tool.get("jaxtop") if isinstance(tool, dict) else None
    table = jaxtop.get("budget") if isinstance(jaxtop, dict) else None
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
    if not os.path.lexists(text):
        raise BudgetError(f"{source}: {text!r} is neither limits like 'h2d=0,peak=2GiB' nor a TOML file")
    budget = load_pyproject(text)
    if budget is None:
        raise BudgetError(f"{source}: {text} has no [tool.jaxtop.budget] table")
    return budget
