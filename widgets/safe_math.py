"""Arithmetic on recorded numbers of any size, for drawing.

A recording comes from outside: a byte count in it may be an integer too large
for a float (``10**4000``), which ``float()`` rejects with OverflowError. The
renderables convert through here, so that such a value draws as the largest
number a float holds instead of stopping the dashboard. Infinities and NaN are
left as they are: they mean "not measured" (:func:`jaxtop.wire.units.is_missing`).
"""

from __future__ import annotations

import math
import sys
from typing import Any

__all__ = ["FLOAT_MAX", "float_of", "percent"]

#: The largest finite float: where an integer beyond a float's range is drawn.
FLOAT_MAX = sys.float_info.max


def float_of(x: Any) -> float:
    """``x`` as a float, for any size of integer.

    Args:
        x: a number (int of any size, float, numpy scalar), or None.

    Returns:
        ``float(x)``; an integer beyond a float's range gives the largest
        finite float of its sign, since it is a number, unlike an infinity;
        None (not measured) gives NaN.
    """
    if x is None:
        return math.nan
    try:
        return float(x)
    except OverflowError:
        return FLOAT_MAX if x > 0 else -FLOAT_MAX


def percent(part: float, whole: float) -> float:
    """``100 * part / whole``, in that order (as the figures have always been
    rounded); where ``100 * part`` overflows to infinity, the ratio is taken
    first so that a huge part of a huge whole still reads 100.

    Args:
        part: a float, or an int whose ratio to ``whole`` fits a float.
        whole: non-zero.
    """
    p = 100 * part / whole
    return p if math.isfinite(p) else 100 * (part / whole)
