"""The TPU runtime's own monitoring, read in-process (sample field ``accelerator``).

libtpu ships a monitoring SDK, ``from libtpu.sdk import tpumonitoring``:
``list_supported_metrics()`` names the metrics this libtpu offers (18 in
libtpu 0.0.42.1), and ``get_metric(name)`` returns an object whose
``description()`` says what its values mean and whose ``data()`` is a list
of strings. The formats read here are the documented ones (the Cloud TPU
monitoring library's pages, the ``tpu-info`` CLI, which reads
``tensorcore_util`` through the SDK, and other readers of the SDK):

* ``duty_cycle_pct``, ``tensorcore_util``: one percent per accelerator
  (chip, or TensorCore on chips with two), e.g. ``["45.32", "47.11"]``;
  ``duty_cycle_pct`` is averaged over the runtime's 5 s window.
* ``hbm_capacity_usage``, ``hbm_capacity_total``: bytes per accelerator,
  e.g. ``["100", "200"]`` and ``["30000000000", ...]``.
* ``hlo_queue_size``: programs waiting to execute, one ``"label: count"``
  per TensorCore, e.g. ``["tensorcore-0: 1", "tensorcore-1: 2"]``.
* ``hlo_execution_timing`` (``hlo_exec_timing`` in older libtpu) and the
  transfer latencies: one comma-separated row per core or buffer-size
  bucket, a label then statistics in microseconds, e.g.
  ``"'tensorcore-0', '10.00', '10.00', ..."`` (label, mean, p50, p90, p95,
  p999); the description names the statistics where they differ (p99).

On the TPU v5e where jaxtop was first run (libtpu 0.0.42.1) every metric
answered ``[]``, even while the chip computed: such a metric is reported
once as unavailable with that reason, never as 0, and the field is sent
again only when something in it changes.

Nothing of libtpu is imported before the program has a TPU backend and
jax has imported libtpu's Python package itself (jax does, to find the
library): importing it earlier could load and set up the runtime before the
program chose its platform and flags. The readings run on a thread of
their own, so that a slow or stuck runtime call never holds the agent's
samples back, and at most one share of a core (:data:`MAX_SHARE`).

Standard library only (the agent imports it inside the user's job).
"""

from __future__ import annotations

import math
import re
import sys
import threading
import time
from typing import Any, Callable

from jaxtop.probes import jaxstate
from jaxtop.probes.base import HandBack, Tick
from jaxtop.probes.forksafe import ForkLock

__all__ = ["EMPTY_REASON", "METRICS", "MAX_SHARE", "READ_INTERVAL_S", "SLOW_READS", "TpuMonitoringProbe", "parse"]

#: Least seconds between two readings (the runtime's own windows are 1-5 s).
READ_INTERVAL_S = 1.0
#: Most seconds between two readings while the runtime answers nothing: it
#: may start answering once the program runs (picked up this late at most).
IDLE_INTERVAL_S = 30.0
#: The share of one core the readings may take: a reading that took 20 ms
#: is followed by the next one 2 s later, not 1 s.
MAX_SHARE = 0.01
#: Why a metric whose ``data()`` is ``[]`` reads n/a.
EMPTY_REASON = "the runtime reports nothing (data() is [])"
#: Longest reason kept (an exception's message can be a whole traceback).
MAX_REASON = 160
#: What of one answer is read: its first MAX_VALUES values (a chip has a few
#: cores; a distribution a few dozen rows), each up to MAX_VALUE_CHARS. A
#: runtime answering with millions of values, or megabytes per value, costs
#: the program that much less (one that did halved its speed and added
#: 460 MB, most of it in quoting the answer whole).
MAX_VALUES = 256
MAX_VALUE_CHARS = 4096
#: A metric whose call into libtpu took longer than the pause limit this
#: many reads in a row is read no more (a first call may set things up).
SLOW_READS = 3
#: A reading that has not returned in this long is said on the wire (n/a,
#: the metric named), and stays so until it returns: the runtime's call
#: cannot be interrupted, and runs on jaxtop's own thread.
STUCK_S = 10.0

#: The metrics read: the name on the wire -> (the names libtpu versions give
#: it, the shape of its values). The others libtpu lists (ICI link health,
#: throttle score, idle duration, collective and TCP latencies of
#: multislice traffic) say nothing about one process's memory or progress.
METRICS: dict[str, tuple[tuple[str, ...], str]] = {
    "duty_cycle_pct": (("duty_cycle_pct",), "percent"),
    "tensorcore_util": (("tensorcore_util", "tensorcore_utilization"), "percent"),
    "hbm_capacity_usage": (("hbm_capacity_usage",), "bytes"),
    "hbm_capacity_total": (("hbm_capacity_total",), "bytes"),
    "hlo_queue_size": (("hlo_queue_size",), "keyed"),
    "hlo_execution_timing": (("hlo_execution_timing", "hlo_exec_timing"), "distribution"),
    "host_to_device_transfer_latency": (("host_to_device_transfer_latency",), "distribution"),
    "device_to_host_transfer_latency": (("device_to_host_transfer_latency",), "distribution"),
}

#: Statistics of a distribution row, by how many numbers follow its label,
#: where the description does not name them (the documented layouts).
_DEFAULT_STATS = {5: ("mean", "p50", "p90", "p95", "p999"), 4: ("p50", "p90", "p95", "p999")}
_STAT_RE = re.compile(r"\b(mean|avg|average|p\d+(?:\.\d+)?)\b")


class Unreadable(ValueError):
    """A metric answered, but in no format this module knows."""


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


def _shown(values: Any) -> str:
    """An unreadable answer as quoted in its reason (short): its first
    values alone, each cut, never the whole answer turned into text."""
    if isinstance(values, (list, tuple)):
        head = ", ".join(repr(v)[:40] if isinstance(v, (str, bytes, int, float)) else f"<{type(v).__name__}>"
                         for v in values[:3])
        more = f", … {len(values) - 3} more" if len(values) > 3 else ""
        return _short(f"[{head}{more}]")
    return _short(f"<{type(values).__name__}>")


def _bounded(values: list[Any] | tuple[Any, ...]) -> list[Any]:
    """The first MAX_VALUES of an answer, a value longer than
    MAX_VALUE_CHARS left out (unreadable, as one of the wrong form)."""
    out = []
    for v in values[:MAX_VALUES]:
        if isinstance(v, (str, bytes)) and len(v) > MAX_VALUE_CHARS:
            continue
        out.append(v)
    return out


def _number(text: Any) -> float | None:
    """One value of a metric: a finite number, or None. Strings may carry
    quotes, brackets, a unit sign or spaces (``"'45.3'"``, ``"45.3%"``)."""
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        try:
            value = float(str(text).strip().strip("[]'\" ").rstrip("%").strip())
        except ValueError:
            return None
    return value if math.isfinite(value) else None


def _per_chip(values: list[Any], kind: str) -> list[float | int | None]:
    out: list[float | int | None] = []
    for raw in values:
        v = _number(raw)
        if v is None or v < 0 or (kind == "percent" and v > 100.5):
            out.append(None)  # one chip's value unreadable: n/a for that chip only
        elif kind == "bytes":
            out.append(int(v))
        else:
            out.append(round(v, 3))
    if all(v is None for v in out):
        raise Unreadable(f"unreadable answer {_shown(values)}")
    return out


def _keyed(values: list[Any]) -> dict[str, int]:
    """``["tensorcore-0: 1", ...]`` -> ``{"tensorcore-0": 1}``; a bare number
    is keyed by its position."""
    out: dict[str, int] = {}
    for i, raw in enumerate(values):
        label, sep, count = str(raw).rpartition(":")
        v = _number(count)
        if v is None or v < 0 or v != int(v):
            continue
        out[label.strip().strip("'\"") if sep else str(i)] = int(v)
    if not out:
        raise Unreadable(f"unreadable answer {_shown(values)}")
    return out


def _stat_names(description: str, count: int) -> tuple[str, ...] | None:
    named = []
    for token in _STAT_RE.findall(description.lower()):
        name = "mean" if token in ("avg", "average") else token.replace(".", "")
        if name not in named:
            named.append(name)
    if len(named) == count:
        return tuple(named)
    return _DEFAULT_STATS.get(count)


def _distribution(values: list[Any], description: str) -> list[dict[str, Any]]:
    """Rows of ``label, stat, stat...`` (microseconds) -> ``[{label, mean, p50...}]``."""
    rows = []
    for raw in values:
        parts = [p.strip().strip("'\" ") for p in str(raw).strip().strip("[]").split(",")]
        parts = [p for p in parts if p]
        label = None
        if parts and _number(parts[0]) is None:
            label = parts.pop(0)
        numbers = [_number(p) for p in parts]
        names = _stat_names(description, len(numbers))
        if not numbers or names is None or any(n is None for n in numbers):
            continue  # a row of an unknown layout: left out rather than misnamed
        row: dict[str, Any] = {"label": label}
        row.update((name, round(n, 3)) for name, n in zip(names, numbers))  # type: ignore[arg-type]
        rows.append(row)
    if not rows:
        raise Unreadable(f"unreadable answer {_shown(values)}")
    return rows


def parse(shape: str, values: Any, description: str = "") -> Any:
    """One metric's ``data()`` as sent on the wire.

    Args:
        shape: ``percent`` or ``bytes`` (one value per accelerator),
            ``keyed`` (``label: count``) or ``distribution`` (rows).
        values: what ``data()`` returned: a list of strings.
        description: what ``description()`` returned (names the statistics).

    Raises:
        Unreadable: no value of the answer could be read.
    """
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise Unreadable(f"data() gave {type(values).__name__}, not a list")
    values = _bounded(values)
    if shape in ("percent", "bytes"):
        return _per_chip(values, shape)
    if shape == "keyed":
        return _keyed(values)
    return _distribution(values, description)


def _backend_platforms() -> set[str] | None:
    """The platforms of the backends the program created, None before it
    created any (never creates one)."""
    if not jaxstate.backend_ready():
        return None
    return {str(getattr(c, "platform", "")).lower() for c in jaxstate.clients()}


def _import_tpumonitoring() -> Any:
    from libtpu.sdk import tpumonitoring  # type: ignore[import-not-found]

    return tpumonitoring


class TpuMonitoringProbe:
    """Reads the TPU runtime's metrics on a TPU backend (sample field ``accelerator``).

    Args:
        platforms: the platforms of the program's backends, None while it has
            none (default: asked of jax without creating one).
        loader: imports and returns ``libtpu.sdk.tpumonitoring``.
        thread: read on a thread of its own (False: on the agent's slow
            ticks, for tests).
    """

    name = "accelerator"
    needs_jax = True

    def __init__(self, platforms: Callable[[], set[str] | None] | None = None,
                 loader: Callable[[], Any] | None = None, thread: bool = True,
                 pause_limit_s: float | None = 0.001) -> None:
        self._platforms = platforms or _backend_platforms
        self._loader = loader or _import_tpumonitoring
        self._use_thread = thread
        self.reason: str | None = None
        self._started = False
        self._tpu: bool | None = None  # None until the program has a backend
        self._module: Any = None
        self._names: dict[str, str | None] = {}  # wire name -> libtpu's name, None: not offered
        self._descriptions: dict[str, str] = {}
        self._lock = ForkLock()
        self._latest: dict[str, Any] | None = None  # the last value, with its time
        self._latest_key: Any = None  # its content, to tell a change
        self._version = 0  # bumps on a change
        self._sent = 0  # the version the last sample carried
        self._next_read = 0.0  # monotonic
        self.interval_s = READ_INTERVAL_S
        self.read_s: float | None = None  # seconds the last reading took
        self._reading: tuple[str, float] | None = None  # (metric, monotonic start) of a call in the runtime
        # The longest a call into libtpu may take (None: no limit): such a
        # call keeps the interpreter, so every thread of the program waits.
        self.pause_limit_s = pause_limit_s
        # Hands the interpreter back before each call into libtpu (after any
        # time held: a call's length is the runtime's), counting what it slept.
        self._pause = HandBack(after_s=0.0)
        self._slow: dict[str, int] = {}  # wire name -> reads in a row over the limit
        self._retired: dict[str, str] = {}  # wire name -> why it is read no more
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        """jax is imported: the slow ticks look for a TPU backend from now on."""
        self._started = True

    def stop(self) -> None:
        """End the reading thread (idempotent); libtpu stays as it was."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2)

    def on_tick(self, tick: Tick) -> dict[str, Any] | None:
        """The field: the latest reading when it changed since the last
        sample that carried it, else None (left out)."""
        if self._tpu is None and self._started and (tick.slow or tick.final):
            platforms = self._platforms()
            if platforms is not None:
                self._tpu = "tpu" in platforms
                if self._tpu:
                    self._begin()
        if not self._tpu:
            return None
        if not self._use_thread and (tick.slow or tick.final) and time.monotonic() >= self._next_read:
            self._read_and_schedule()
        reading = self._reading
        if reading is not None and (tick.slow or tick.final) and time.monotonic() - reading[1] >= STUCK_S:
            # The runtime's call has not returned: said, not waited for.
            self._publish({"kind": "tpu", "available": False,
                           "reason": f"libtpu has not answered get_metric({reading[0]!r}).data() for "
                                     f"{time.monotonic() - reading[1]:.0f} s: the reading is stuck in the runtime"})
        with self._lock:
            if self._version == self._sent or self._latest is None:
                return None
            self._sent = self._version
            return self._latest

    def _begin(self) -> None:
        """A TPU backend exists: load the SDK (on the reading thread)."""
        if not self._use_thread:
            self._load()
            return
        self._thread = threading.Thread(target=self._run, name="jaxtop-tpu-monitoring", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            if not self._load():
                return
            while not self._stop.is_set():
                self._read_and_schedule()
                if self._stop.wait(max(0.0, self._next_read - time.monotonic())):
                    return
        except Exception as exc:  # never into the program: said once on the wire
            self.reason = _short(f"reading stopped: {type(exc).__name__}: {exc}")
            self._publish({"kind": "tpu", "available": False, "reason": self.reason})

    # -- reading -------------------------------------------------------------------
    def _load(self) -> bool:
        """Import the SDK if jax imported libtpu; publish why not otherwise."""
        if "libtpu" not in sys.modules:
            # jax imports libtpu's package to find the library; without it (a
            # library named by TPU_LIBRARY_PATH) jaxtop imports nothing either.
            return self._unavailable("jax did not import libtpu's Python package, so jaxtop does not")
        try:
            module = self._loader()
        except Exception as exc:
            return self._unavailable(_short(f"libtpu.sdk.tpumonitoring: {type(exc).__name__}: {exc}"))
        try:
            offered = {str(n) for n in module.list_supported_metrics()}
        except Exception:
            offered = None  # the list is unknown: each metric is asked for by its first name
        for wire, (aliases, _) in METRICS.items():
            if offered is None:
                self._names[wire] = aliases[0]
            else:
                self._names[wire] = next((a for a in aliases if a in offered), None)
        self._module = module
        return True

    def _unavailable(self, reason: str) -> bool:
        self.reason = reason
        self._publish({"kind": "tpu", "available": False, "reason": reason})
        return False

    def _read_and_schedule(self) -> None:
        started = time.perf_counter()
        answered = self.read_once()
        # The hand-backs between calls are sleeps, not the runtime's cost.
        self.read_s = max(0.0, time.perf_counter() - started - self._pause.slept_s)
        if answered:
            self.interval_s = READ_INTERVAL_S
        else:  # nothing answered: ask less often, up to IDLE_INTERVAL_S
            self.interval_s = min(IDLE_INTERVAL_S, self.interval_s * 2)
        self._next_read = time.monotonic() + max(self.interval_s, self.read_s / MAX_SHARE)

    def read_once(self) -> bool:
        """Read every metric once and publish the value if it changed.

        Returns:
            Whether any metric answered with a readable value.
        """
        module = self._module
        if module is None:
            return False
        metrics: dict[str, Any] = {}
        unavailable: dict[str, str] = {}
        self._pause = HandBack(after_s=0.0)
        for wire, (_, shape) in METRICS.items():
            name = self._names.get(wire)
            if name is None:
                unavailable[wire] = "not offered by this libtpu (list_supported_metrics)"
                continue
            if wire in self._retired:
                unavailable[wire] = self._retired[wire]
                continue
            try:
                # The interpreter handed back between metrics: libtpu's calls
                # keep it (pybind11 holds it by default), and several in a row
                # held a waiting thread of the program 6-8 ms on a TPU v5e host.
                self._pause()
                self._reading = (name, time.monotonic())
                started = time.perf_counter()
                metric = module.get_metric(name)
                took = time.perf_counter() - started
                self._pause()  # the two calls apart too
                started = time.perf_counter()
                values = metric.data()
                took = max(took, time.perf_counter() - started)
                self._reading = None
                self._timed(wire, name, took)
                if isinstance(values, (list, tuple)) and not values:
                    unavailable[wire] = EMPTY_REASON
                    continue
                metrics[wire] = parse(shape, values, self._description(name, metric) if shape == "distribution" else "")
            except Exception as exc:  # Unreadable, or whatever the runtime raised
                self._reading = None
                unavailable[wire] = _short(str(exc) if isinstance(exc, Unreadable) else f"{type(exc).__name__}: {exc}")
        value: dict[str, Any] = {"kind": "tpu", "available": True, "source": "libtpu.sdk.tpumonitoring",
                                 "metrics": metrics}
        queue = metrics.get("hlo_queue_size")
        if queue:
            value["hlo_queue_size"] = sum(queue.values())  # all cores: the one number a reader plots
        if unavailable:
            value["unavailable"] = unavailable
        self._publish(value)
        return bool(metrics)

    def _timed(self, wire: str, name: str, took_s: float) -> None:
        """Note how long one metric's longer call took; a metric over the
        pause limit SLOW_READS times in a row is read no more, the reason
        kept (each call is one pause of the program's threads: the reads
        hand the interpreter back between calls)."""
        limit = self.pause_limit_s
        if limit is None or took_s <= limit:
            self._slow.pop(wire, None)
            return
        self._slow[wire] = self._slow.get(wire, 0) + 1
        if self._slow[wire] >= SLOW_READS:
            self._retired[wire] = (f"read no more: a call into libtpu for {name!r} took {took_s * 1e3:.1f} ms, "
                                   f"which the program's threads wait out (over the {limit * 1e3:g} ms pause limit, "
                                   "$JAXTOP_MAX_PAUSE_MS)")

    def _description(self, name: str, metric: Any) -> str:
        """The metric's description, asked once (it names the statistics)."""
        if name not in self._descriptions:
            try:
                self._descriptions[name] = str(metric.description())
            except Exception:
                self._descriptions[name] = ""
        return self._descriptions[name]

    def _publish(self, value: dict[str, Any]) -> None:
        """Keep ``value`` as the latest; a new version only if its content changed."""
        key = repr(value)
        with self._lock:
            if key == self._latest_key:
                return
            self._latest_key = key
            self._latest = {**value, "t": round(time.time(), 3)}
            self._version += 1
