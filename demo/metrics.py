"""How a strategy's metric is judged and written: shared by the headless
table and the Strategies panel. Pure: no jax, no Textual."""

from __future__ import annotations

from typing import Any

from jaxtop.widgets.render import fmt_bytes


def verdict(expect: str, off: float, on: float) -> bool | None:
    """Did the metric move the expected way? None when nothing is expected."""
    if expect == "down":
        return on < off
    if expect == "up":
        return on > off
    if expect == "zero":
        return off > 0 and on == 0
    return None


#: How each expectation reads after a ✗ or a NO.
EXPECTED = {"down": "expected lower", "up": "expected higher", "zero": "expected 0"}


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
