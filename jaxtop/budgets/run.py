"""``jaxtop run --budget``: the whole run measured as one window, checked
once the program has returned.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from jaxtop.budgets.meter import Meter, Window
from jaxtop.budgets.report import write_json
from jaxtop.budgets.spec import Budget

#: ``jaxtop run`` exits with this when the program succeeded but its budget
#: was exceeded (listed in ``jaxtop --help``; docs/budgets.md).
EXIT_BUDGET = 3


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
        self._pid = os.getpid()  # the process whose run this is (a forked worker's is not)
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
        if os.getpid() != self._pid:
            # A worker the program forked, ending through `jaxtop run` as the
            # parent would: the window and the meter's connection are the
            # parent's (one socket, shared: closing it here would end the
            # parent's stream). The run is the parent's to check.
            return False
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
