"""The agent thread: one selector loop that serves clients and, every
``interval_s``, takes a sample from the probe list and sends it.

:class:`AgentLoop` is the half of :class:`jaxtop.agent.agent.Agent` that runs
on the agent's own thread (the other half starts and stops it, on the
user's threads); the attributes it reads are set by ``Agent.__init__``.
All socket I/O is non-blocking; an exception while serving one client
closes that client, one while sampling becomes an event on the stream,
and only a broken selector ends the loop (quietly, telling the clients).

Standard library only (the agent imports it inside the user's job).
"""

from __future__ import annotations

import os
import platform
import selectors
import sys
import time
import traceback
from typing import Any

from jaxtop.agent import cadence
from jaxtop.probes.base import Tick
from jaxtop.probes.jaxstate import distributed
from jaxtop.wire import protocol

__all__ = ["AgentLoop", "versions"]


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {"jaxtop": protocol.JAXTOP_VERSION, "python": platform.python_version()}
    for name in ("jax", "jaxlib"):
        module = sys.modules.get(name)
        out[name] = getattr(module, "__version__", None) if module else None
    return out


class AgentLoop:
    """The agent thread's loop and its samples (mixed into ``Agent``)."""

    # Set by Agent.__init__ (listed for readers and type checkers).
    interval_s: float
    slow_interval_s: float
    pid: int
    job: str | None
    prometheus_push: str | None
    probes: Any
    stream: Any
    events: list[dict[str, Any]]
    _clients: Any
    _lock: Any
    _tick_requested: bool

    # -- the agent thread --------------------------------------------------------
    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        self._selector = sel
        self._clients.selector = sel
        next_tick = time.monotonic()
        next_slow = next_tick
        try:
            self._clients.listen(self._listener)
            sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
            # The relay's reports are read once per tick, not selected on: waking
            # per guard line cost ~80 us of GIL-holding CPU per implicit transfer.
            self._emit(self._hello(), keep=False)
            while not self._stop_requested:
                wake = self._clients.service(time.monotonic())
                deadline = next_tick if wake is None else min(next_tick, wake)
                for key, mask in sel.select(max(0.0, deadline - time.monotonic())):
                    try:
                        self._on_event(key, mask)
                    except Exception as exc:  # one event, never the loop
                        self._loop_error("serving a connection", exc)
                if self._final_requested and not self._final_done.is_set():
                    self._final_sample()
                    break
                now = time.monotonic()
                asked = self._tick_requested
                if asked or now >= next_tick:
                    self._tick_requested = False
                    if now - next_tick >= cadence.SUSPEND_MIN_S:
                        gap = self._resumed_after(now, now - next_tick)
                        next_slow += gap
                    slow = now >= next_slow
                    if slow:
                        next_slow = now + self.slow_interval_s
                        self._stops.slow_tick(now)
                    try:
                        self._tick(slow=slow)
                    except Exception as exc:  # a probe failed: the next tick may do better
                        self._loop_error("sampling", exc)
                    # Stretched while the thread is over its CPU ceiling (jaxtop.agent.cadence).
                    interval = self.interval_s * self._meter.tick_stretch
                    if not asked or now >= next_tick:
                        next_tick += interval
                    if next_tick < now:  # fell behind (suspended): don't burst
                        next_tick = now + interval
        except Exception:
            # Only the selector itself gets here. The agent dies quietly
            # rather than disturb the program; the reason goes to clients
            # still connected.
            self._clients.broadcast(protocol.encode({
                "type": protocol.ERROR, "t": time.time(), "message": "agent stopped: " + traceback.format_exc(limit=5),
            }))
        finally:
            self._final_done.set()
            self._clients.flush_all(deadline=time.monotonic() + 1.0)

    def _on_event(self, key: selectors.SelectorKey, mask: int) -> None:
        kind, client = key.data
        if kind == "accept":
            self._clients.accept()
        elif kind == "wake":
            try:
                os.read(self._wake_r, 4096)
            except OSError:
                pass
        elif kind == "client":
            self._clients.on_event(client, mask)

    def _on_client_error(self, message: str) -> None:
        self.post_event("error", text=message)

    def _loop_error(self, doing: str, exc: BaseException) -> None:
        """Record an unforeseen failure as an event, once per distinct message
        in a row (a probe that fails every tick says so once)."""
        message = f"agent: error while {doing}: {type(exc).__name__}: {exc}"
        if message != self._last_loop_error:
            self._last_loop_error = message
            self.post_event("error", text=message)

    def _emit(self, record: dict[str, Any], keep: bool = True) -> None:
        self.stream.emit(record, keep)

    def _log_failed(self, message: str) -> None:
        """The recording stopped (a failed write): say so once, never raise."""
        self._notice(message)
        self.post_event("error", text=message)

    def _notice(self, message: str) -> None:
        """One line on the terminal's stderr: the one saved before the capture
        took fd 2 (fd 2 itself without a capture). Never raises."""
        fd = self._stderr_fd if self._stderr_fd is not None else 2
        try:
            os.write(fd, (message + "\n").encode("utf-8", "replace"))
        except OSError:
            pass

    # -- samples ---------------------------------------------------------------
    def _hello(self) -> dict[str, Any]:
        argv = list(sys.argv) if getattr(sys, "argv", None) else []
        return {
            "type": protocol.HELLO,
            "t": time.time(),
            "protocol": protocol.PROTOCOL_VERSION,
            "pid": self.pid,
            "argv": argv,
            "started_t": self.started_t,
            "versions": versions(),
            "backend": self.memory.backend if self.memory else None,
            "devices": self.memory.describe() if self.memory else [],
            "interval_s": self.interval_s,
            "slow_interval_s": self.slow_interval_s,
            "backfill_s": self.backfill_s,
            "transfer_capture": self.capture_probe.status(),
            "nvml": self.nvml.describe() if self.nvml else {"available": False, "reason": "disabled"},
            "prometheus": ({"addr": self.prometheus_addr, "port": self.prometheus_port}
                           if self._prom_server is not None else None),
            "host": platform.node(),
            "job": self.job,  # --job / JAXTOP_JOB; None: the exposition names one (jaxtop.wire.prometheus)
            "distributed": distributed() if self.memory else {},
        }

    def _tick(self, slow: bool, final: bool = False) -> None:
        started_cpu = time.thread_time()
        now = time.time()
        self._seq += 1
        record: dict[str, Any] = {"type": protocol.SAMPLE, "t": now, "seq": self._seq}
        self.probes.tick(Tick(now, slow, final, self._emit_apart), record)
        with self._lock:
            if self.events:
                record["events"], self.events = self.events, []
        if final:
            record["final"] = True
        thread_cpu = time.thread_time()
        self._agent_cpu_s += thread_cpu - started_cpu
        if slow or final or self._seq == 1:
            # Once a second: its totals are cumulative, so nothing is lost,
            # and each tick spared is work not done in the user's process.
            record["agent"] = self._agent_record(thread_cpu)
        self._emit(record)

    def _emit_apart(self, record: dict[str, Any]) -> None:
        """A probe's record of its own (an OOM census, kept in the history;
        the backend's description, sent but not kept: hello carries it)."""
        self._emit(record, keep=record.get("type") != protocol.BACKEND)

    def _resumed_after(self, now: float, late: float) -> float:
        """A tick ``late`` seconds late: if the process was stopped rather
        than busy (:class:`jaxtop.agent.cadence.StopDetector`), every
        deadline moves on by the stop. Returns the seconds moved (0: busy)."""
        gap = self._stops.stopped_for(now, late)
        if gap:
            self._meter.shift(gap)
            self.probes.shift_deadlines(gap)
        return gap

    @property
    def suspended_s(self) -> float:
        """Wall time the process spent stopped, as far as the agent could tell."""
        return self._stops.suspended_s

    def _agent_record(self, thread_cpu: float) -> dict[str, Any]:
        """The sample's ``agent`` field: what the thread spent, its budget,
        and how often the costly details ran."""
        devices = self.devices
        self._meter.update(time.monotonic(), thread_cpu, devices.allowances)
        return {
            "cpu_s_total": round(self._agent_cpu_s, 6),
            # Everything the thread did so far: ticks, encoding and writing
            # samples, clients. A tick runs on the agent thread only.
            "thread_cpu_s_total": round(thread_cpu, 6),
            "budget_share": cadence.CPU_BUDGET,
            "cpu_share": _rounded(self._meter.share),
            # The thread stays under this share: over it the ticks come less
            # often; tick_s is the interval it runs at now (interval_s asked).
            "ceiling_share": self._meter.ceiling,
            "tick_s": _rounded(self.interval_s * self._meter.tick_stretch, 4),
            "scan_interval_s": _rounded(devices.scan_interval_s, 3),
            "scan_cpu_s": _rounded(devices.scan_cpu_s),
            "detail_interval_s": _rounded(devices.detail_interval_s, 3),
            "detail_cpu_s": _rounded(devices.detail_cpu_s),
            "suspended_s": _rounded(self.suspended_s, 3),
        }

    def _final_sample(self) -> None:
        self.capture_probe.sync(timeout_s=1.0)
        self._tick(slow=False, final=True)
        self._emit({"type": protocol.EXIT, "t": time.time(), "pid": self.pid}, keep=False)
        if self.prometheus_push and self.stream.prometheus is not None:
            from jaxtop.wire.prometheus import push, redact

            try:
                push(self.stream.prometheus, self.prometheus_push)  # bounded: 2 s in all
            except Exception as exc:  # (ImportError was checked at start)
                # The URL may carry a password: never echoed.
                self._notice(f"jaxtop: could not push the last metrics to {redact(self.prometheus_push)}: {exc}")
        self._final_done.set()


def _rounded(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)
