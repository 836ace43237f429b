"""A budget checked: each limit beside what was measured for it, and the
report for people (text) and for CI (JSON, docs/budgets.md).

A value that was not measured is never reported as 0: it is ``n/a`` with
the reason, and an ``n/a`` limit neither passes nor fails (the report lists
it as not checked). Pure and standard library only.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

from jaxtop.budgets.spec import Budget, Limit, metric_of
from jaxtop.wire.paths import write_atomic
from jaxtop.wire.units import NA, fmt_bytes, is_missing

#: The report's JSON format, for readers that check it.
REPORT_VERSION = 1

NOT_MEASURED = "not measured by this jaxtop"


class BudgetExceeded(AssertionError):
    """A measured block went over its budget (the message is the report).

    An AssertionError, so that pytest shows it as a test failure.

    Attributes:
        report: the :class:`Report`.
    """

    def __init__(self, report: "Report") -> None:
        super().__init__(report.text())
        self.report = report


# -- formatting ------------------------------------------------------------------

def fmt_value(kind: str, value: float | None) -> str:
    """A value of a name of this kind, for people ("n/a" when not measured)."""
    if is_missing(value):
        return NA
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
        lower_bound: ``value`` may be below the truth (some events could not
            be seen): above a limit it is exceeded, at or under it the limit
            is not checked.
    """

    value: float | None = None
    na: str | None = None
    at_most: float | None = None
    first_exceeded_s: float | None = None
    detail: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    note: str | None = None
    lower_bound: bool = False


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
                "lower_bound": m.lower_bound,
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
    metric = metric_of(r.limit.name)
    about = metric.about if metric is not None else ""
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
        if m.value is not None and m.value > limit.value:
            status = "exceeded"
        elif m.value is not None and m.lower_bound:
            # Under the limit but counted in part: the truth may be over it.
            if m.na is None:
                m.na = f"at least {fmt_value(limit.kind, m.value)}, {m.note or 'a lower bound'}"
            status = "n/a"
        elif m.value is not None:
            status = "ok"
        elif m.at_most is not None and m.at_most <= limit.value:
            status = "ok"
        else:
            if m.na is None:
                m.na = NOT_MEASURED
            status = "n/a"
        results.append(LimitResult(limit, m, status))
    return Report(budget, results, dict(window or {}), dict(extra or {}))


def write_json(report: Report, path: str) -> None:
    """Write ``report`` as JSON to ``path`` (``-`` for stdout), whole or not
    at all (:func:`jaxtop.wire.paths.write_atomic`)."""
    text = json.dumps(report.to_json(), indent=2, sort_keys=False, default=str) + "\n"
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_atomic(path, text.encode("utf-8"))
