"""How a strategy's metric is judged and written: shared by the headless
table and the Strategies panel. Pure: no jax, no Textual."""

from __future__ import annotations

from typing import Any

from jaxtop.widgets.render import fmt_bytes


#: The outcomes of :func:`outcome`.
YES, NO, WITHIN, NOTHING, INFO = "yes", "NO", "within", "nothing", ""


def outcome(expect: str, off: float, on: float, spread: float | None = None, can_be_zero: bool = True) -> str:
    """How a metric moved from ``off`` to ``on``, against what was expected.

    Args:
        expect: "down", "up", "zero", or anything else for nothing expected.
        off: the value in the first variant.
        on: the value in the second.
        spread: how much the metric varies by itself (the largest
            difference between repeated readings of one variant); None for
            an exact metric (a count, a size from XLA), which repeats to the
            unit.
        can_be_zero: whether "nothing to lower" can be the verdict: a
            fraction, a count or a size can be 0 on a backend; a time never
            is (a step time whose spread took in a stall read "nothing to
            lower" beside -84 %): it is then within the spread, or not.

    Returns:
        :data:`YES` when it moved the expected way by more than ``spread``;
        :data:`WITHIN` when it moved no more than ``spread`` either way (a
        noisy metric that did not measurably change); :data:`NOTHING` when
        a measured metric expected lower was already no more than its spread above
        0 without the strategy (nothing to lower on this backend: on a TPU
        v5e the mixed-size pattern of the fragmentation strategy left 0.0 %
        holes, as its runtime reused each freed slot for a buffer of its
        size); :data:`NO` otherwise; :data:`INFO` when nothing is expected.
    """
    if expect not in ("down", "up", "zero"):
        return INFO
    if expect == "down" and can_be_zero and spread is not None and off <= spread:
        # Only a measured figure: an exact count of 0 that should fall is a
        # measurement that failed (below), not a backend with nothing to do.
        return NOTHING
    if spread is not None and abs(on - off) <= spread:
        return WITHIN
    if expect == "down":
        ok = on < off
    elif expect == "up":
        ok = on > off
    else:
        ok = off > 0 and on == 0
    return YES if ok else NO


def spread_of(*spreads: float | None) -> float | None:
    """The largest of the spreads measured; None when none was (an exact metric)."""
    known = [s for s in spreads if s is not None]
    return max(known) if known else None


def fmt_spread(spread: float | None, unit: str, precise: bool = False) -> str:
    """``±x`` in the metric's unit, or "" for an exact metric."""
    return "" if spread is None else "±" + fmt_metric(spread, unit, precise=precise)


def within_text(spread: float | None, unit: str, precise: bool = False) -> str:
    """What a change within the spread reads as."""
    return f"no change beyond the spread ({fmt_spread(spread, unit, precise)})"


#: How each expectation reads after a ✗ or a NO.
EXPECTED = {"down": "expected lower", "up": "expected higher", "zero": "expected 0"}


def nothing_text(off: Any, spread: float | None, unit: str, precise: bool = False) -> str:
    """What a metric with nothing to lower reads as."""
    within = f", within the spread {fmt_spread(spread, unit, precise)}" if spread else ""
    return f"nothing to lower here: {fmt_metric(off, unit, precise=precise)} without it{within}"


def why_not(expect: str, caveat: str = "") -> str:
    """The short reason beside a metric that moved the wrong way."""
    text = EXPECTED.get(expect, f"expected {expect}")
    return f"{text}; maybe {caveat}" if caveat else text


def fmt_metric(value: Any, unit: str, missing: str = "…", precise: bool = False) -> str:
    """A metric value in its unit; ``precise`` keeps more digits (tables)."""
    if value is None:
        return missing
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "s":
        return f"{value * 1e3:.3f} ms" if precise else f"{value * 1e3:.2f}ms"
    if unit == "ratio":
        return f"{value:.1%}" if precise else f"{value:.0%}"
    if isinstance(value, float):
        return f"{value:g}" if precise else f"{value:.3g}"
    return str(value)
