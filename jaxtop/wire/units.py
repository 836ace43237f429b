"""How jaxtop writes sizes, and values it could not measure, everywhere:
panels, the OOM census, holders, budgets, exports and the CLI.

* One byte formatter, :func:`fmt_bytes`: binary units, three significant
  digits ("3.12 GiB"), exact below 1 KiB ("512 B"). A value that would read
  1000 or more of a unit moves to the next one ("0.977 MiB").
* One n/a convention: a figure that could not be measured travels as
  ``null`` (JSON) / None with a reason beside it, and reads "n/a", or
  "n/a (reason)" where there is room (:func:`na`). Never 0, never "?".

Standard library only (the agent imports it inside the user's job).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["NA", "UNITS", "fmt_bytes", "fmt_bytes_pair", "fmt_count_rate", "is_missing", "na", "sig3"]

#: What an unmeasured value reads.
NA = "n/a"
#: Binary units, from bytes up.
UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def is_missing(x: Any) -> bool:
    """True for None, NaN and infinities: values shown as n/a. An integer
    too large for a float (``10**4000`` in a hostile recording) is not
    missing: it is a number, shown as one (see :func:`fmt_bytes`)."""
    if x is None:
        return True
    if x.__class__ is int:
        return False
    try:
        return not math.isfinite(x)
    except (TypeError, OverflowError):
        return False


def na(reason: str | None = None) -> str:
    """"n/a", with its reason in parentheses when there is one."""
    return f"{NA} ({reason})" if reason else NA


def sig3(v: float) -> str:
    """A non-negative number below 999.5 with 3 significant digits, zeros kept."""
    if v < 1:
        # Only reached for 1000..1023 of the unit below, e.g. 0.977 MiB.
        text = f"{v:.3f}"
        return "1.00" if text == "1.000" else text
    if v < 9.995:
        return f"{v:.2f}"
    if v < 99.95:
        return f"{v:.1f}"
    return f"{v:.0f}"


def _as_float(n: Any) -> float:
    try:
        return float(n)
    except OverflowError:  # an int beyond a float: as large as a float goes
        return math.inf if n > 0 else -math.inf


def fmt_bytes(n: Any) -> str:
    """Bytes in binary units with 3 significant digits.

    Args:
        n: a byte count; None, NaN or infinity means "not measured".

    Returns:
        e.g. "0 B", "512 B", "1.50 KiB", "12.3 MiB", "1.02 GiB", "n/a";
        a count beyond the largest unit reads ">999 EiB".
    """
    if is_missing(n):
        return NA
    value = _as_float(n)
    sign = "-" if value < 0 else ""
    value = abs(value)
    if value < 1023.5:
        return f"{sign}{value:.0f} B"
    unit = UNITS[0]
    for unit in UNITS[1:]:
        value /= 1024
        if value < 999.5:
            break
    if not math.isfinite(value) or value >= 999.5:
        return f"{sign}>999 {UNITS[-1]}"
    return f"{sign}{sig3(value)} {unit}"


def fmt_bytes_pair(used: Any, total: Any) -> str:
    """"used of total" in one unit, the larger's ("78.2 of 79.1 GiB"); a
    side not measured reads n/a ("n/a of 79.1 GiB")."""
    if is_missing(used) or is_missing(total):
        return f"{fmt_bytes(used)} of {fmt_bytes(total)}"
    big = max(abs(_as_float(used)), abs(_as_float(total)))
    if big < 1023.5:
        return f"{fmt_bytes(used)[:-2]} of {fmt_bytes(total)}"
    text_total = fmt_bytes(total if abs(_as_float(total)) >= abs(_as_float(used)) else used)
    unit = text_total.rsplit(" ", 1)[1]
    if unit not in UNITS:
        return f"{fmt_bytes(used)} of {fmt_bytes(total)}"
    factor = 1024 ** UNITS.index(unit)
    return f"{sig3(min(abs(_as_float(used)) / factor, 999.0))} of {sig3(min(abs(_as_float(total)) / factor, 999.0))} {unit}"


def fmt_count_rate(rate: float) -> str:
    """A signed rate of counts: ``+1,200``, ``+64``, ``+0.5`` (whole numbers from 10 on)."""
    return f"{rate:+,.0f}" if abs(rate) >= 10 else f"{rate:+.2g}"
