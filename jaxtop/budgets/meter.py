"""In-process measurement: a :class:`Meter` on this process's running agent,
and the :class:`Window` it measures (begin, the work, end).

The meter reads the agent's own stream through its socket, asks the agent
for exact transfer and compile totals at the edges of a window, and keeps a
log of backend compiles with their call sites (for ``recompiles``). It
touches jax only through ``jax.monitoring`` once the program has imported
jax.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from typing import Any

from jaxtop.budgets.compile_log import CompileLog
from jaxtop.budgets.fold import CompileSite, WindowState
from jaxtop.budgets.reading import KeptParts, Reading
from jaxtop.budgets.report import Measured, Report, check
from jaxtop.budgets.spec import METRICS, Budget
from jaxtop.probes.forksafe import ForkLock
from jaxtop.wire.protocol import DIRECTIONS
from jaxtop.wire.records import Hello, Sample, decode


class _Stream:
    """The agent's own stream, read in this process on a thread of its own.

    Each line is decoded once (:func:`jaxtop.wire.records.decode`); each
    sample becomes a :class:`Reading`; the open windows observe it.
    """

    def __init__(self, agent: Any) -> None:
        from jaxtop.wire.client import AgentConnection

        self.conn = AgentConnection.open(agent.pid)
        # Taken by the reader thread for every sample and by the program's
        # thread at each window's edge: on a ForkLock, so that a child forked
        # while the reader held it does not wait forever. A plain lock under
        # the condition, not a re-entrant one: nothing here takes it twice.
        self.cond = threading.Condition(ForkLock())
        self.latest: Reading | None = None
        self.fields = KeptParts()
        self.hello: Hello | None = None
        self.windows: list[WindowState] = []
        self.closed = False
        self.error: str | None = None
        self.thread = threading.Thread(target=self._read, name="jaxtop-budget", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for line in self.conn.lines(should_stop=lambda: self.closed, poll_s=0.2):
                try:
                    rec = decode(line)
                except Exception:
                    continue
                if isinstance(rec, Hello):
                    self.hello = rec
                    continue
                # Samples only: a backfill (a Sample's subclass) is history
                # from before the connection, never a window's.
                if type(rec) is not Sample:
                    continue
                reading = Reading.from_sample(rec, self.fields)
                self.fields = reading.fields
                with self.cond:
                    self.latest = reading
                    for w in self.windows:
                        w.observe(reading)
                    self.cond.notify_all()
        except Exception as exc:  # the stream, never the program
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            with self.cond:
                if not self.closed and self.error is None:
                    self.error = "the agent closed its stream"
                self.cond.notify_all()

    def wait(self, after_t: float, timeout_s: float, scanned_after: float | None = None) -> Reading | None:
        """The first reading taken at or after ``after_t`` (and, given
        ``scanned_after``, whose live arrays were scanned after it), or the
        latest one when none comes in time (None when there is none)."""

        def ready() -> bool:
            r = self.latest
            if r is None or r.t < after_t:
                return self.error is not None
            if scanned_after is not None:
                scans = [d.scanned_t for d in r.devices.values() if d.source == "live_arrays"]
                if scans and any(s is None or s < scanned_after for s in scans):
                    return self.error is not None
            return True

        with self.cond:
            self.cond.wait_for(ready, timeout=timeout_s)
            return self.latest

    def add(self, w: WindowState) -> None:
        with self.cond:
            self.windows.append(w)

    def remove(self, w: WindowState) -> None:
        with self.cond:
            if w in self.windows:
                self.windows.remove(w)

    def close(self) -> None:
        self.closed = True
        self.conn.shutdown()
        self.thread.join(timeout=2.0)
        self.conn.close()


#: Longest wait for the agent: the relay's acknowledgement, the next sample.
SYNC_TIMEOUT_S = 5.0


#: Budget names that count host reads (they need numpy's wrappers on CPU).
HOST_SYNC_NAMES = frozenset({"host_syncs", "host_syncs_per_step"})


class Meter:
    """Measures windows of this process with its running agent.

    Args:
        agent: the running :class:`jaxtop.agent.Agent` (``handle.agent``).
        transfers_na: why this meter cannot count transfers although the
            agent may (its stderr pipe is not where the measured code writes);
            None when it can.
    """

    def __init__(self, agent: Any, transfers_na: str | None = None) -> None:
        self.agent = agent
        self.transfers_na = transfers_na
        self.compiles = CompileLog.get()
        self.stream: _Stream | None = None
        self.stream_na: str | None = None
        try:
            self.stream = _Stream(agent)
        except Exception as exc:
            self.stream_na = f"the agent's stream could not be read: {exc}"

    @property
    def running(self) -> bool:
        return bool(getattr(self.agent, "running", False))

    def window(self, budget: Budget, what: str, from_start: bool = False,
               transfers_na: str | None = None) -> "Window":
        """A window to measure against ``budget`` (not started yet).

        Args:
            transfers_na: why this window's transfers are not counted
                although the meter's are (the measured code holds fd 2).
        """
        return Window(self, budget, what, from_start, transfers_na)

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None

    def tick_now(self) -> None:
        """Ask the agent for a sample now (an edge of a window waits for one)."""
        request = getattr(self.agent, "request_tick", None)
        if request is not None:
            request()

    # -- exact totals from the agent ----------------------------------------------------
    def totals(self, sync: bool = True) -> dict[str, Any]:
        """Exact totals now: every guard line written so far counted (with
        ``sync`` False: those the relay has passed on so far)."""
        out: dict[str, Any] = {}
        # A sync marker written where the relay does not read would only wait
        # (and would land in the file of whoever holds fd 2).
        sync_s = SYNC_TIMEOUT_S if self.transfers_na is None and sync else 0.0
        detail = getattr(self.agent, "transfer_detail", None)
        if callable(detail):
            try:
                d = detail(sync_timeout_s=sync_s)
                out.update({k: int(d[k]["count"]) for k in DIRECTIONS})
                out["shapes"] = {(s["direction"], s["shape"]): int(s["count"]) for s in d.get("shapes", [])}
                out["synced"] = d.get("synced", True)
            except Exception:
                out = {}
        if not out:
            out.update(self.agent.transfer_totals(sync_timeout_s=sync_s))
        out["compiles"] = self.agent.compile_count()
        # Host reads counted so far, read from the probe itself: the stream
        # sends them at most once a second, and reads just before the window
        # ends (the program's last ones, before exit) must count too.
        probe = getattr(self.agent, "host_sync", None)
        if probe is not None and getattr(probe, "started", False):
            out["host_syncs"] = int(probe.total)
        out["t"] = time.time()
        return out

    def transfer_problems(self) -> dict[str, str]:
        """Directions whose implicit transfers are not being counted, and why."""
        agent = self.agent
        if self.transfers_na is not None:
            return {d: f"transfers not counted: {self.transfers_na}" for d in DIRECTIONS}
        capture = getattr(agent, "capture", None)
        if capture is None or not getattr(capture, "active", False):
            hello = self.stream.hello if self.stream is not None else None
            reason = hello.transfer_capture.reason if hello is not None and hello.transfer_capture is not None else None
            reason = reason or getattr(capture, "reason", None) or "stderr capture is off"
            return {d: f"transfers not counted: {reason}" for d in DIRECTIONS}
        if "jax" not in sys.modules:
            return {}  # no jax, no transfer
        guard = getattr(agent, "guard", None)
        if guard is None or not getattr(guard, "active", False):
            return {d: "transfers not counted: the transfer guard is not armed" for d in DIRECTIONS}
        out = {}
        for d, level in guard_levels().items():
            if level in (None, "allow"):
                out[d] = (f"transfers not counted: the {d} transfer guard was set back to 'allow' "
                          "(jaxtop re-arms it within a second)")
        return out


def guard_levels() -> dict[str, str | None]:
    """The transfer guard's level per direction as jax has it now (global
    setting where a direction has none); {} before jax is imported."""
    jax = sys.modules.get("jax")
    if jax is None:
        return {}
    try:
        config = jax.config
        glob = config.jax_transfer_guard
        return {
            "h2d": config.jax_transfer_guard_host_to_device or glob,
            "d2h": config.jax_transfer_guard_device_to_host or glob,
            "d2d": config.jax_transfer_guard_device_to_device or glob,
        }
    except Exception:
        return {}


class Window:
    """One measured stretch of this process: :meth:`begin`, the work, :meth:`end`.

    Totals (transfers, compiles) are exact: at both edges the agent first
    counts every guard line written so far. Samples taken in between give
    when a limit was first exceeded, memory peaks and the shapes.
    """

    def __init__(self, meter: Meter, budget: Budget, what: str, from_start: bool,
                 transfers_na: str | None = None) -> None:
        self.meter = meter
        self.transfers_na = transfers_na
        self.budget = budget
        self.what = what
        self.from_start = from_start
        self.state: WindowState | None = None
        self._start_totals: dict[str, Any] = {}
        self._start_na: dict[str, str] = {}
        self._sites: dict[tuple[str, str], CompileSite] | None = None
        self._no_start: str | None = None
        self.report: Report | None = None

    def _needs_scan(self) -> bool:
        return bool(self.budget.names() & {"peak", "in_use"})

    def _host_sync_probe(self) -> Any:
        if not self.budget.names() & HOST_SYNC_NAMES:
            return None
        return getattr(self.meter.agent, "host_sync", None)

    def begin(self) -> "Window":
        meter = self.meter
        probe = self._host_sync_probe()
        if probe is not None:
            # A CPU program's np.asarray(x) reaches no jax hook: a limit on
            # host syncs needs numpy's wrappers (their ~120 ns a numpy call
            # is the measured program's price only while a budget asks).
            try:
                probe.count_numpy_reads()
            except Exception:
                pass
        if self.from_start:
            start, start_t = None, time.time()
            self._start_totals = {d: 0 for d in DIRECTIONS}
            self._start_totals["compiles"] = 0
            self._start_totals["host_syncs"] = 0  # the probe counts from its start, after the window's
        else:
            self._start_totals = meter.totals(sync=self.transfers_na is None)
            start_t = self._start_totals["t"]
            start = None
            if meter.stream is not None:
                meter.tick_now()
                start = meter.stream.wait(start_t, SYNC_TIMEOUT_S)
                if start is not None and start.t < start_t:
                    start = None  # the agent is stuck: totals only
        self._start_na = meter.transfer_problems()
        if self.transfers_na is not None:
            self._start_na = {d: f"transfers not counted: {self.transfers_na}" for d in DIRECTIONS}
        self.state = WindowState(self.budget, start, start_t)
        self._no_start = None
        if not self.from_start and start is None:
            # Without a reading at the start, the stream's totals and maxima
            # cannot be told apart from what came before: exact totals only.
            self._no_start = meter.stream_na or "the agent sent no sample at the window's start"
        elif meter.stream is not None:
            meter.stream.add(self.state)
        self._sites = meter.compiles.open()
        return self

    def end(self, extra: dict[str, Any] | None = None) -> Report:
        """Stop measuring; returns (and keeps in :attr:`report`) the check."""
        if self.state is None:
            raise RuntimeError("Window.end() before begin()")
        meter, state = self.meter, self.state
        sites, compile_na = meter.compiles.close(self._sites or {})
        if not meter.running:
            # Stopped mid-window (``jaxtop detach``): nothing after is counted.
            na = "the jaxtop agent stopped during the window"
            measured: dict[str, Measured] = {name: Measured(na=na) for name in METRICS}
            end_t = time.time()
        else:
            totals = meter.totals(sync=self.transfers_na is None)
            end_t = totals["t"]
            end = None
            stream_na = self._no_start or meter.stream_na
            if meter.stream is not None and self._no_start is None:
                scan = end_t if self._needs_scan() and self._live_arrays() else None
                if scan:
                    # The agent scans on a cadence its cost sets (seconds apart
                    # with many arrays): the window asks for one now.
                    request = getattr(meter.agent, "request_scan", None)
                    if request is not None:
                        request()
                meter.tick_now()
                wait = SYNC_TIMEOUT_S + (float(getattr(meter.agent, "slow_interval_s", 1.0)) if scan else 0.0)
                end = meter.stream.wait(end_t, wait, scanned_after=scan)
                if end is not None and end.t < end_t:
                    stream_na = "the agent sent no sample after the window ended"
                    end = None
                elif end is None:
                    stream_na = meter.stream.error or "the agent sent no sample"
                meter.stream.remove(state)
            problems = dict(self._start_na)
            if self.transfers_na is None:
                problems.update(meter.transfer_problems())
            if totals.get("synced") is False or self._start_totals.get("synced") is False:
                for d in DIRECTIONS:
                    problems.setdefault(d, "transfers not all counted: the stderr relay did not acknowledge "
                                           f"within {SYNC_TIMEOUT_S:g} s (a loaded machine)")
            exact = {k: totals[k] - self._start_totals.get(k, 0) for k in (*DIRECTIONS, "compiles", "host_syncs")
                     if k in totals and k in self._start_totals}
            shapes = None
            if "shapes" in totals:
                before = self._start_totals.get("shapes", {})
                shapes = {k: n - before.get(k, 0) for k, n in totals["shapes"].items()}
            scanned = end is not None and all(
                d.scanned_t is not None and d.scanned_t >= end_t for d in end.devices.values()
                if d.source == "live_arrays")
            measured = state.finish(end, end_t, exact=exact, transfer_na=problems, compile_sites=sites,
                                    compile_na=compile_na, stream_na=stream_na, shapes=shapes,
                                    shapes_complete=True if shapes is not None else None, end_scanned=scanned)
        probe = self._host_sync_probe()
        uncounted = getattr(probe, "uncounted", None)
        m = measured.get("host_syncs")
        if callable(uncounted) and m is not None and m.value is not None:
            try:
                why = uncounted()
            except Exception:
                why = None
            if why:
                measured["host_syncs"] = dataclasses.replace(m, note=why, lower_bound=True)
        window = {"what": self.what, "seconds": round(max(0.0, end_t - state.start_t), 6),
                  "start_t": state.start_t, "end_t": end_t, "samples": state.readings}
        self.report = check(self.budget, measured, window, extra)
        return self.report

    def _live_arrays(self) -> bool:
        stream = self.meter.stream
        latest = stream.latest if stream is not None else None
        if latest is None:
            return True
        return any(d.source == "live_arrays" for d in latest.devices.values())

    def cancel(self) -> None:
        """Stop measuring without a report (the measured code failed)."""
        if self._sites is not None:
            self.meter.compiles.close(self._sites)
            self._sites = None
        if self.meter.stream is not None and self.state is not None:
            self.meter.stream.remove(self.state)
