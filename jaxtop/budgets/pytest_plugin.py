"""pytest plugin: memory, transfer and compile budgets per test.

Installed with jaxtop (entry point ``pytest11``) and off unless a test uses
it: a session without the marker or the fixture imports nothing beyond this
module (the package's ``__init__`` loads its modules only when asked),
starts no agent and touches neither fd 2 nor the transfer guard.

* ``@pytest.mark.jaxtop_budget("h2d=0,recompiles=0")`` (or keyword limits,
  ``jaxtop_budget(h2d=0, peak="2GiB")``; no arguments: the
  ``[tool.jaxtop.budget]`` table of the project's ``pyproject.toml``)
  measures the test's body (its call phase, not its fixtures) and fails the
  test with the report when a limit is exceeded.
* The ``jaxtop_budget`` fixture measures a block::

      def test_step(jaxtop_budget, state, batch):
          step(state, batch)  # warm-up: compiles, not measured
          with jaxtop_budget("h2d=0,compiles=0"):
              step(state, batch)

  and ``jaxtop_budget.measure()`` gives every value without limits.
* ``pytest --jaxtop-budget SPEC`` puts every test under SPEC (a test's own
  marker replaces it), as ``pytest --memray`` does for memory; the session
  ends with a table of the worst tests by implicit transfers, recompiles
  and peak memory (``--jaxtop-summary N`` rows each; 0: none).

One agent (``jaxtop.instrument()``) serves the whole session: it starts at
the first test that uses a budget and stops after the last one, so the
tests after it run as without jaxtop. Counts per test are exact: at both
edges of a window the agent first counts every transfer-guard line written
so far, so nothing leaks into the next test. docs/budgets.md says how each
value is measured, and which cannot be isolated per test.

pytest's own output capture points fd 2 at a file of its own during each
test, where jaxlib's guard lines would go uncounted: during the phases of a
test that uses a budget the plugin points fd 2 at the agent's stderr relay
instead (which forwards everything else to where pytest captures it).

A test that captures fd 2 itself (the ``capfd``/``capfdbinary`` fixtures)
reads what reaches fd 2 while it runs: the relay forwards to pytest's file,
not the test's, so its fd 2 is left alone, and the guard lines only jaxtop
causes are kept out of it by setting the guard back to the program's own
levels on the test's thread. Its transfers are then not counted (n/a, with
the reason); every other limit is checked as usual.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import warnings
from typing import Any, Iterator

import pytest

MARKER = "jaxtop_budget"
FIXTURE = "jaxtop_budget"

#: The plugin's agent samples this often (and scans live arrays as often):
#: the edges of each window wait for one sample, and CPU peaks are sampled.
AGENT_INTERVAL_S = 0.05
#: How long a phase's end waits for the relay to pass on what the phase wrote.
FLUSH_TIMEOUT_S = 2.0


class JaxtopBudgetWarning(UserWarning):
    """A limit of a test's budget could not be checked (``n/a``)."""


_EARLY: dict[str, int] = {}  # "fd": a write end of a running agent's stderr pipe


def _state(config: pytest.Config) -> "_Session | None":
    return config.stash.get(_KEY, None)


def _uses_budget(item: pytest.Item) -> bool:
    return (item.get_closest_marker(MARKER) is not None or FIXTURE in getattr(item, "fixturenames", ())
            or bool(item.config.getoption(OPTION_DEST, None)))


OPTION_DEST = "jaxtop_budget_spec"
#: Rows per metric in the session summary (``--jaxtop-summary``).
SUMMARY_ROWS = 5
#: The metrics the session summary ranks tests by.
SUMMARY_METRICS = ("h2d", "recompiles", "peak")


class _Session:
    """The session's agent, its meter, and the route of fd 2 to its relay."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.handle: Any = None
        self.owned = False
        self.meter: Any = None
        self.pipe_w: int | None = None  # a write end of the agent's stderr pipe
        self.error: str | None = None
        self.last_item: str | None = None
        self._pyproject: Any = ...
        self.measured: dict[str, dict[str, float]] = {}  # test id -> metric -> value (the session summary)
        self.worst_site: dict[tuple[str, str], str] = {}  # (test id, metric) -> the line that made most

    # -- the agent --------------------------------------------------------------------
    def ensure(self) -> Any:
        """The session's :class:`jaxtop.budgets.meter.Meter`, starting the agent at first use.

        Raises:
            pytest.fail.Exception: the agent cannot start.
        """
        if self.meter is not None and self.meter.running:
            return self.meter
        if self.meter is not None:
            self.stop()  # stopped by someone else (a test, `jaxtop detach`): start anew
        try:
            self._start()
        except Exception as exc:
            self.error = f"cannot start the jaxtop agent: {exc}"
        if self.meter is None:
            pytest.fail(f"jaxtop_budget: {self.error}", pytrace=False)
        return self.meter

    def _start(self) -> None:
        import jaxtop
        from jaxtop.agent.handle import current
        from jaxtop.budgets.meter import Meter

        existing = current()
        transfers_na = None
        before = os.dup(2)
        try:
            if existing is None:
                # fd 2 is pytest's capture file now: the relay forwards there.
                handle = jaxtop.instrument(interval_s=AGENT_INTERVAL_S, slow_interval_s=AGENT_INTERVAL_S)
                capture = getattr(handle.agent, "capture", None)
                # instrument() pointed fd 2 at the relay's pipe. Keep a write end
                # of it: pytest's capture replaces fd 2 at each phase, and the
                # pipe must outlive that (the relay ends when no writer is left).
                self.pipe_w = os.dup(2) if capture is not None and capture.active else None
                self.owned = True
            else:
                # Started before pytest (`jaxtop run -m pytest`): the pipe was on
                # fd 2 when pytest started (see pytest_load_initial_conftests).
                handle = existing
                self.pipe_w = _EARLY.pop("fd", None)
                self.owned = False
                capture = getattr(handle.agent, "capture", None)
                fd_captured = self.config.getoption("capture", "fd") == "fd"
                if self.pipe_w is None and fd_captured and capture is not None and capture.active:
                    # Started inside the session (a conftest), after pytest
                    # took fd 2: where its relay reads is unknown.
                    transfers_na = ("the jaxtop agent was started inside this pytest session, after pytest "
                                    "captured stderr; start it before pytest (jaxtop run -m pytest) or let "
                                    "the plugin start it")
        finally:
            os.dup2(before, 2)  # give pytest its fd 2 back
            os.close(before)
        self.handle = handle
        self.error = None
        self.meter = Meter(handle.agent, transfers_na=transfers_na)

    def stop(self) -> None:
        """Stop the meter and, if the plugin started it, the agent; restore fd 2."""
        meter, self.meter = self.meter, None
        if meter is not None:
            meter.close()
        pipe_w, self.pipe_w = self.pipe_w, None
        handle, self.handle = self.handle, None
        if handle is not None and self.owned and handle.running:
            saved = os.dup(2)
            try:
                if pipe_w is not None:
                    # The agent's last sync marker must go into its pipe, not
                    # into pytest's capture; fd 2 then holds the pipe's last
                    # write end, which stop() replaces: the relay sees EOF.
                    os.dup2(pipe_w, 2)
                    os.close(pipe_w)
                    pipe_w = None
                handle.stop()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
        if pipe_w is not None:
            os.close(pipe_w)

    @contextlib.contextmanager
    def routed(self, item: pytest.Item) -> Iterator[None]:
        """Point fd 2 at the agent's relay for the duration of a phase
        (a test that captures fd 2 itself: its own capture, and the program's
        guard levels instead)."""
        if self.pipe_w is None or self.meter is None:
            yield
            return
        if _captures_fd2(item):
            with _program_guard(self.meter.agent):
                yield
            return
        _flush_stderr()
        saved = os.dup(2)
        os.dup2(self.pipe_w, 2)
        try:
            yield
        finally:
            try:
                _flush_stderr()
                if not _same_file(2, self.pipe_w):
                    # Something in the phase pointed fd 2 elsewhere (a fixture
                    # asked for with request.getfixturevalue("capfd")): it
                    # is theirs now; no marker into it, and no restoring over it.
                    pass
                elif self.meter is not None and self.meter.running:
                    # So that what the phase wrote reaches pytest's capture
                    # before pytest reads it.
                    self.meter.agent.transfer_totals(sync_timeout_s=FLUSH_TIMEOUT_S)
                    os.dup2(saved, 2)
                else:
                    os.dup2(saved, 2)
            finally:
                os.close(saved)

    # -- budgets ------------------------------------------------------------------------
    def pyproject_budget(self) -> Any:
        """The project's ``[tool.jaxtop.budget]``, or None."""
        if self._pyproject is ...:
            from jaxtop.budgets.spec import load_pyproject

            self._pyproject = None
            candidates = [self.config.inipath] if self.config.inipath else []
            candidates.append(self.config.rootpath / "pyproject.toml")
            for path in candidates:
                if path is not None and path.name == "pyproject.toml" and path.is_file():
                    self._pyproject = load_pyproject(path)  # BudgetError: reported by the caller
                    break
        return self._pyproject

    def budget_for(self, args: tuple[Any, ...], kwargs: dict[str, Any], what: str) -> Any:
        """The budget of a marker or a fixture call.

        Raises:
            jaxtop.budgets.spec.BudgetError: bad limits, or none anywhere.
        """
        from jaxtop.budgets.spec import BudgetError, from_mapping, parse_spec

        if len(args) > 1:
            raise BudgetError(f"{what}: takes one spec string (and keyword limits), got {len(args)} arguments")
        budget = None
        if args and args[0] is not None:
            if not isinstance(args[0], str):
                raise BudgetError(f"{what}: the spec must be a string like 'h2d=0,peak=2GiB', not {args[0]!r}")
            budget = parse_spec(args[0], what)
        if kwargs:
            extra = from_mapping(kwargs, what)
            budget = budget.merged(extra) if budget is not None else extra
        if budget is None:
            budget = self.pyproject_budget()
            if budget is None:
                raise BudgetError(f"{what}: no limits given, and no [tool.jaxtop.budget] table in "
                                  f"{self.config.rootpath / 'pyproject.toml'}")
        return budget


#: Fixtures that point fd 2 at a file the test reads.
FD_CAPTURING_FIXTURES = frozenset({"capfd", "capfdbinary"})
#: Why such a test's transfers are not counted.
FD_CAPTURED_NA = ("the test captures fd 2 itself (capfd), where jaxlib writes the transfer-guard lines "
                  "jaxtop counts")


def _captures_fd2(item: pytest.Item) -> bool:
    return bool(FD_CAPTURING_FIXTURES & set(getattr(item, "fixturenames", ())))


def _same_file(fd_a: int, fd_b: int) -> bool:
    """True when two descriptors are the same open file (pipe or file)."""
    try:
        a, b = os.fstat(fd_a), os.fstat(fd_b)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


@contextlib.contextmanager
def _program_guard(agent: Any) -> Iterator[None]:
    """The transfer guard at the program's own levels on this thread (jax's
    thread-local context managers win over the global ``log`` that jaxtop
    set), so that no line jaxtop alone caused reaches the test's fd 2."""
    jax = sys.modules.get("jax")
    guard = getattr(agent, "guard", None)
    if jax is None or guard is None or not getattr(guard, "active", False):
        yield
        return
    levels = guard.user_levels()
    with contextlib.ExitStack() as stack:
        for name, direction in (("transfer_guard_host_to_device", "h2d"), ("transfer_guard_device_to_host", "d2h"),
                                ("transfer_guard_device_to_device", "d2d")):
            manager = getattr(jax, name, None)
            if manager is not None:
                stack.enter_context(manager(levels.get(direction, "allow")))
        yield


def _flush_stderr() -> None:
    try:
        sys.stderr.flush()
    except Exception:
        pass


def _warn_unchecked(report: Any) -> None:
    if report.unchecked:
        what = "; ".join(f"{r.limit.name} (n/a: {r.measured.na})" for r in report.unchecked)
        warnings.warn(JaxtopBudgetWarning(f"jaxtop_budget: not checked: {what}"), stacklevel=2)


class BudgetBlock:
    """``with jaxtop_budget(...):`` — one measured block.

    Attributes:
        report: the :class:`jaxtop.budgets.report.Report`, once the block is done.
    """

    def __init__(self, session: _Session, item: pytest.Item, budget: Any, raise_on_exceed: bool) -> None:
        self._session = session
        self._item = item
        self._budget = budget
        self._raise = raise_on_exceed
        self._window: Any = None
        self.report: Any = None

    def __enter__(self) -> "BudgetBlock":
        __tracebackhide__ = True
        meter = self._session.ensure()
        self._window = meter.window(self._budget, f"a block of {self._item.nodeid}").begin()
        return self

    def __exit__(self, etype: Any, exc: Any, tb: Any) -> None:
        __tracebackhide__ = True  # a budget failure points at the test's block, not at this method
        from jaxtop.budgets.report import BudgetExceeded

        self.report = self._window.end()
        _note(self._session, self._item.nodeid, self.report)
        if not self._raise:
            return
        if etype is None and self.report.exceeded:
            raise BudgetExceeded(self.report)
        # The block's own failure, if any, wins; the report goes along.
        self._item.add_report_section("call", "jaxtop budget (block)", self.report.text())
        if etype is None:
            _warn_unchecked(self.report)

    def __getitem__(self, name: str) -> float | None:
        """The measured value of ``name`` (None when n/a), once done."""
        if self.report is None:
            raise RuntimeError("the block is still being measured")
        for r in self.report.results:
            if r.limit.name == name:
                return r.measured.value
        raise KeyError(name)


class BudgetFixture:
    """The ``jaxtop_budget`` fixture."""

    def __init__(self, session: _Session, item: pytest.Item) -> None:
        self._session = session
        self._item = item

    def __call__(self, spec: str | None = None, **limits: Any) -> BudgetBlock:
        """A block measured against a budget; over it, the block raises
        :class:`jaxtop.budgets.report.BudgetExceeded` (a failed assertion) with the
        report. Arguments as the marker's."""
        __tracebackhide__ = True
        from jaxtop.budgets.spec import BudgetError

        error = None
        try:
            budget = self._session.budget_for((spec,) if spec is not None else (), limits, "jaxtop_budget()")
        except BudgetError as exc:
            error = str(exc)
        if error is not None:
            pytest.fail(error, pytrace=False)
        return BudgetBlock(self._session, self._item, budget, raise_on_exceed=True)

    def measure(self) -> BudgetBlock:
        """A block measured without limits: ``block["h2d"]`` afterwards."""
        from jaxtop.budgets.spec import METRICS, Budget, Limit

        everything = Budget(tuple(Limit(name, math.inf, "inf") for name in METRICS), "measure()")
        return BudgetBlock(self._session, self._item, everything, raise_on_exceed=False)


# -- hooks ---------------------------------------------------------------------------

_KEY = pytest.StashKey[_Session]()
_BUDGET_KEY = pytest.StashKey[Any]()
_OPTION_BUDGET_KEY = pytest.StashKey[Any]()


def _note(state: _Session, nodeid: str, report: Any) -> None:
    """Keep what a window measured for the session summary (largest per test)."""
    got = state.measured.setdefault(nodeid, {})
    for r in report.results:
        value = r.measured.value
        if r.limit.name in SUMMARY_METRICS and value is not None:
            if value >= got.get(r.limit.name, value):
                sites = r.measured.data.get("sites") if isinstance(r.measured.data, dict) else None
                if sites:  # the line that made most of them, for the summary
                    state.worst_site[(nodeid, r.limit.name)] = f"{sites[0]['site']} x{sites[0]['count']}"
            got[r.limit.name] = max(value, got.get(r.limit.name, value))


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("jaxtop", "jaxtop: memory, transfer and compile budgets")
    group.addoption("--jaxtop-budget", dest=OPTION_DEST, metavar="SPEC", default=None,
                    help="check every test against SPEC, e.g. h2d=0,recompiles=0,peak=2GiB (or a pyproject.toml "
                         "with [tool.jaxtop.budget]); a test's own jaxtop_budget marker replaces it")
    group.addoption("--jaxtop-summary", dest="jaxtop_summary", type=int, metavar="N", default=SUMMARY_ROWS,
                    help=f"the session summary's rows per metric: the worst tests by h2d, recompiles and peak "
                         f"(default {SUMMARY_ROWS}; 0: no summary)")


def pytest_configure(config: pytest.Config) -> None:
    spec = config.getoption(OPTION_DEST, None)
    if spec:
        from jaxtop.budgets import BudgetError, resolve

        try:
            config.stash[_OPTION_BUDGET_KEY] = resolve(spec)
        except BudgetError as exc:
            raise pytest.UsageError(f"--jaxtop-budget: {exc}") from None
    config.addinivalue_line(
        "markers",
        f"{MARKER}(spec=None, **limits): fail the test when its body goes over the budget, e.g. "
        f"{MARKER}('h2d=0,recompiles=0,peak=2GiB'); no arguments: [tool.jaxtop.budget] of pyproject.toml",
    )


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: Any, args: Any) -> Iterator[None]:
    # Runs before pytest's own capture takes fd 2. An agent already running
    # here (`jaxtop run -m pytest`) has its relay's pipe on fd 2 now; keep a
    # write end of it in case a test uses a budget. Without jaxtop imported
    # there is no agent: nothing to do, nothing imported.
    handle_module = sys.modules.get("jaxtop.agent.handle")
    if handle_module is not None:
        try:
            handle = handle_module.current()
            capture = getattr(handle.agent, "capture", None) if handle is not None else None
            if capture is not None and capture.active and "fd" not in _EARLY:
                _EARLY["fd"] = os.dup(2)
        except Exception:
            pass
    return (yield)


def pytest_collection_finish(session: pytest.Session) -> None:
    last = None
    for item in session.items:
        if _uses_budget(item):
            last = item
    if last is not None:
        state = _Session(session.config)
        state.last_item = last.nodeid
        session.config.stash[_KEY] = state


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    # trylast: the innermost wrapper, inside pytest's capture of the phase.
    state = _state(item.config)
    if state is None or not _uses_budget(item):
        return (yield)
    marker = item.get_closest_marker(MARKER)
    if marker is not None:
        from jaxtop.budgets.spec import BudgetError

        error = None
        try:
            item.stash[_BUDGET_KEY] = state.budget_for(marker.args, dict(marker.kwargs), f"{MARKER} marker")
        except BudgetError as exc:
            error = str(exc)
        if error is not None:  # outside the except: one message, no chained traceback
            pytest.fail(error, pytrace=False)
    elif _OPTION_BUDGET_KEY in item.config.stash:
        item.stash[_BUDGET_KEY] = item.config.stash[_OPTION_BUDGET_KEY]
    state.ensure()
    with state.routed(item):
        return (yield)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    state = _state(item.config)
    if state is None or not _uses_budget(item):
        return (yield)
    budget = item.stash.get(_BUDGET_KEY, None)
    with state.routed(item):
        if budget is None:
            return (yield)
        window = state.ensure().window(budget, item.nodeid,
                                       transfers_na=FD_CAPTURED_NA if _captures_fd2(item) else None).begin()
        try:
            result = yield
        except BaseException:
            report = window.end()
            _note(state, item.nodeid, report)
            item.add_report_section("call", "jaxtop budget", report.text())
            raise  # the test's own failure wins
        report = window.end()
        _note(state, item.nodeid, report)
        if report.exceeded:
            pytest.fail(report.text("jaxtop_budget"), pytrace=False)
        item.add_report_section("call", "jaxtop budget", report.text())  # shown with -rA
        _warn_unchecked(report)
        return result


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    state = _state(item.config)
    if state is None:
        return (yield)
    try:
        if _uses_budget(item):
            with state.routed(item):
                return (yield)
        return (yield)
    finally:
        if item.nodeid == state.last_item:
            state.stop()  # the rest of the session runs as without jaxtop


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The worst tests by implicit transfers, recompiles and peak memory."""
    state = _state(config)
    rows = config.getoption("jaxtop_summary", SUMMARY_ROWS)
    if state is None or not state.measured or not rows or rows < 0:
        return
    from jaxtop.wire.units import fmt_bytes

    terminalreporter.write_sep("=", "jaxtop budget summary")
    for metric in SUMMARY_METRICS:
        measured = [(values[metric], nodeid) for nodeid, values in state.measured.items() if metric in values]
        ranked = sorted(measured, key=lambda vn: (-vn[0], vn[1]))
        ranked = [(v, n) for v, n in ranked if v > 0][:rows]
        if not measured:
            # No budget checked it: not measured, which is not zero.
            terminalreporter.write_line(f"{metric}: not measured (no budget checks it: add {metric}=… to "
                                        f"--jaxtop-budget to measure it)")
            continue
        if not ranked:
            terminalreporter.write_line(f"{metric}: 0 in each of the {len(measured)} tests that measured it")
            continue
        terminalreporter.write_line(f"{metric}: the worst {len(ranked)} of {len(measured)} tests that measured it")
        for value, nodeid in ranked:
            shown = fmt_bytes(value) if metric == "peak" else f"{value:,.0f}"
            site = state.worst_site.get((nodeid, metric))
            terminalreporter.write_line(f"  {shown:>12}  {nodeid}" + (f"  (most at {site})" if site else ""))


def pytest_unconfigure(config: pytest.Config) -> None:
    state = _state(config)
    if state is not None:
        state.stop()
    fd = _EARLY.pop("fd", None)
    if fd is not None:
        os.close(fd)


@pytest.fixture
def jaxtop_budget(request: pytest.FixtureRequest) -> BudgetFixture:
    """Measure blocks of a test against a budget (see :class:`BudgetFixture`)."""
    state = _state(request.config)
    if state is None:  # requested through getfixturevalue: not seen at collection
        state = _Session(request.config)
        request.config.stash[_KEY] = state
    state.ensure()
    return BudgetFixture(state, request.node)
