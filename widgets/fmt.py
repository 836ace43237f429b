"""Numbers and captions as the dashboard writes them: sizes, rates, durations,
counts, percents, and the longest caption that fits.

Sizes are :func:`jaxtop.wire.units.fmt_bytes`, the one byte formatter that the
agent, the budgets and the OOM census use too, so a size reads the same on
every screen. Every formatter here takes any number without raising: None,
NaN and infinities read "n/a"; an integer too large for a float (a hostile
recording holds ``10**4000``) reads as the most its format writes
(">999 EiB", ">999T", ">99999d", ">999%").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from rich.cells import cell_len

from jaxtop.widgets.safe_math import float_of
from jaxtop.wire.units import NA, fmt_bytes, is_missing

__all__ = [
    "MAX_DAYS", "NA", "ago", "axis_value", "fmt_bytes", "fmt_count", "fmt_duration", "fmt_rate", "longest", "pct",
    "plural_s", "si3",
]

#: Durations from this many days on read ">99999d" rather than a run of digits.
MAX_DAYS = 99999


def si3(x: Any) -> str:
    """A count with 3 significant digits and a k/M/G/T suffix: "12.3", "1.23k".

    From 999.5T on it reads ">999T": a rate that large is a recording's
    corruption, and "1e+03T" would say less.
    """
    if is_missing(x):
        return NA
    sign = "-" if x < 0 else ""
    v = abs(float_of(x))
    for suffix in ("", "k", "M", "G", "T"):
        if float(f"{v:.3g}") < 1000:
            return f"{sign}{v:.3g}{suffix}"
        v /= 1000
    return f"{sign}>999T"


def pct(p: Any) -> str:
    """A percentage that never rounds a non-zero share to 0% or a partial one to 100%.

    Beyond ±999% it reads ">999%" ("<-999%"): a layer ten times its limit is
    said well enough, and a figure of a hostile recording stays short.
    NaN and None read "n/a".
    """
    if p is None or p != p:
        return NA
    if 0 < p < 1:
        return "<1%"
    if 99 < p < 100:
        return ">99%"
    if p >= 999.5:
        return ">999%"
    if p <= -999.5:
        return "<-999%"
    return f"{p:.0f}%"


def fmt_rate(x: Any, unit: str = "") -> str:
    """A per-second value: "12.3/s", "1.23k allocs/s"; bytes go through fmt_bytes.

    Args:
        x: the rate; None, NaN or infinity means "not measured".
        unit: what is counted ("" for a bare count, "B" or "bytes" for bytes).
    """
    if is_missing(x):
        return NA
    if unit in ("B", "bytes"):
        return f"{fmt_bytes(x)}/s"
    return f"{si3(x)} {unit}/s" if unit else f"{si3(x)}/s"


def fmt_duration(s: Any) -> str:
    """An uptime in its two largest units: "59s", "3m04s", "2h03m", "1d04h".

    From :data:`MAX_DAYS` + 1 days on it reads ">99999d" (an integer of
    thousands of digits could not even be written).
    """
    if is_missing(s):
        return NA
    sign = "-" if s < 0 else ""
    total = int(abs(s))
    if total >= (MAX_DAYS + 1) * 86400:
        return f"{sign}>{MAX_DAYS}d"
    for size, unit, sub, sub_unit in ((86400, "d", 3600, "h"), (3600, "h", 60, "m"), (60, "m", 1, "s")):
        if total >= size:
            return f"{sign}{total // size}{unit}{total % size // sub:02d}{sub_unit}"
    return f"{sign}{total}s"


def fmt_count(n: Any) -> str:
    """A count of things: exact below a trillion ("4096"), else as :func:`si3`."""
    if is_missing(n):
        return NA
    return str(n) if abs(n) < 10**12 else si3(n)


def ago(s: float) -> str:
    """A compact time offset for axis labels: 600 -> "10m", 90 -> "1m30s"."""
    return re.sub(r"(?<=[a-z])00[smh]$", "", fmt_duration(s))


def axis_value(v: float, unit: str) -> str:
    """A y-axis value: binary sizes, a ratio in percent, or a plain number.

    Args:
        v: the value (a ratio for "%": 0.5 reads "50%").
        unit: "bytes", "%", or a unit appended to plain numbers ("/s").
    """
    if is_missing(v):
        return NA
    if unit == "bytes":
        return fmt_bytes(v)
    if unit == "%":
        p = 100 * float_of(v)
        return f"{p:.0f}%" if -999.5 < p < 999.5 else pct(p)
    sep = "" if not unit or unit.startswith("/") else " "
    return f"{si3(v)}{sep}{unit}"


def plural_s(n: Any) -> str:
    """The "s" of a plural: "" for exactly one, else "s"."""
    return "" if n == 1 else "s"


def longest(choices: Sequence[str], width: int) -> str:
    """The first (most detailed) choice that fits in ``width`` cells, else the last."""
    return next((c for c in choices if cell_len(c) <= width), choices[-1])
