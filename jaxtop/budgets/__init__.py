"""Budgets: limits on what a program or a test may cost, checked by jaxtop.

A budget is a list of limits such as ``h2d=0,recompiles=0,peak=2GiB``
(docs/budgets.md has the grammar, every name, the units and what each
measures). ``jaxtop run --budget SPEC`` checks one against the whole run
(:mod:`.run`); the pytest plugin (:mod:`.pytest_plugin`) against one test.

One module per step, the pure ones standard library only:

* :mod:`.spec`: the names and the grammar (:func:`parse_spec`,
  :func:`from_mapping`, :func:`load_pyproject`, :func:`resolve`).
* :mod:`.reading` and :mod:`.fold`: the agent's samples read
  (:class:`Reading`) and folded over a window into measured values
  (:class:`WindowState`).
* :mod:`.report`: the check (:func:`check`) and its report as text or JSON
  (:class:`Report`).
* :mod:`.meter` and :mod:`.compile_log`: in-process measurement
  (:class:`Meter`, :class:`Window`) through the running agent, and the
  compiles per call site. :mod:`.run`: :class:`RunBudget`.

A value that was not measured is never reported as 0: it is ``n/a`` with
the reason, and an ``n/a`` limit neither passes nor fails (the report lists
it as not checked).

Every name below is loaded from its module when first asked for: the pytest
plugin lives in this package and must not load the rest at pytest start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jaxtop.budgets.compile_log import CompileLog
    from jaxtop.budgets.fold import CompileSite, WindowState
    from jaxtop.budgets.meter import SYNC_TIMEOUT_S, Meter, Window, guard_levels
    from jaxtop.budgets.reading import TOP_SHAPES_SENT, WIRE_FIELDS, DeviceReading, Reading
    from jaxtop.budgets.report import (
        NOT_MEASURED, REPORT_VERSION, BudgetExceeded, LimitResult, Measured, Report, check, fmt_value,
        not_measured, write_json,
    )
    from jaxtop.budgets.run import EXIT_BUDGET, RunBudget
    from jaxtop.budgets.spec import (
        BYTE_UNITS, METRICS, TRANSFER_NAMES, Budget, BudgetError, Limit, MetricDef, from_mapping,
        load_pyproject, parse_spec, parse_value, resolve,
    )
    from jaxtop.wire.units import fmt_bytes

_MODULES: dict[str, tuple[str, ...]] = {
    "jaxtop.budgets.spec": ("BYTE_UNITS", "METRICS", "TRANSFER_NAMES", "Budget", "BudgetError", "Limit",
                            "MetricDef", "from_mapping", "load_pyproject", "parse_spec", "parse_value",
                            "resolve"),
    "jaxtop.budgets.report": ("NOT_MEASURED", "REPORT_VERSION", "BudgetExceeded", "LimitResult", "Measured",
                              "Report", "check", "fmt_value", "not_measured", "write_json"),
    "jaxtop.budgets.reading": ("TOP_SHAPES_SENT", "WIRE_FIELDS", "DeviceReading", "Reading"),
    "jaxtop.budgets.fold": ("CompileSite", "WindowState"),
    "jaxtop.budgets.compile_log": ("CompileLog",),
    "jaxtop.budgets.meter": ("SYNC_TIMEOUT_S", "Meter", "Window", "guard_levels"),
    "jaxtop.budgets.run": ("EXIT_BUDGET", "RunBudget"),
    # The one byte formatter, as budgets have always offered it.
    "jaxtop.wire.units": ("fmt_bytes",),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
