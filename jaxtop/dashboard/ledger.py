"""The jit ledger on the dashboard's side: one table per process, UI-free.

The agent sends the ledger as the sample field ``jit``: a whole table now and
then (``full: true``) and, in between, only what changed; the command
``jit_ledger`` answers with the whole table at once. :class:`LedgerStore`
folds both into one table per process and hands out frozen
:class:`LedgerView` s. A stream joined in the middle (or a recording read
from the middle) holds changes only until its next whole table:
``LedgerView.complete`` says so.

Thread-safe (its own lock): the model feeds it on the reader thread, the Jit
screen reads it on the UI thread.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jaxtop.wire import protocol

if TYPE_CHECKING:
    from jaxtop.wire.records import Reply, Sample

#: Points of the live-executable count kept per process (one per pass).
MAX_TREND = 3600
#: Recompile reasons of one function turned into events per
#: :data:`EVENTS_WINDOW_S`: a function recompiling on every call must not
#: flood the event list (the rest are folded into one event when the window
#: ends, and a compile storm the agent flags is one event of its own).
MAX_EVENTS_PER_FUNCTION = 3
EVENTS_WINDOW_S = 60.0
#: Recently freed executables kept for the screen.
MAX_GONE = 64

_SIZES = ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "peak_bytes", "code_bytes")


def _int(v: Any) -> int | None:
    v = protocol.number(v)
    return None if v is None else int(v)


_num = protocol.finite


def _name(v: Any) -> str:
    """A function's name (a key and a label) or a part of a recompile reason:
    a string as it is, anything else as a short repr (``str()`` of a deeply
    nested value raises)."""
    return v if isinstance(v, str) else protocol.shown(v)


def _key(v: Any) -> bool:
    """Whether an executable's id can be a key: hashable and plain."""
    return v.__class__ in (int, str)


@dataclass(frozen=True)
class JitFunction:
    """One function name of the ledger. Sizes are its largest live executable's
    (``None`` when none is live); ``code_bytes`` adds up all of them."""

    name: str
    compiles: int | None = None
    compiles_source: str | None = None  # "monitoring" (exact) | "executables" (a lower bound)
    compile_s: float | None = None
    live: int = 0
    argument_bytes: int | None = None
    output_bytes: int | None = None
    alias_bytes: int | None = None
    temp_bytes: int | None = None
    peak_bytes: int | None = None
    code_bytes: int | None = None
    flops: float | None = None
    bytes_accessed: float | None = None
    call_site: str | None = None
    defined_at: str | None = None
    first_t: float | None = None
    last_t: float | None = None
    reasons: tuple[dict[str, Any], ...] = ()  # latest first
    reasons_total: int = 0
    eager_compiles: int = 0  # compiles of an op run outside jit: none is a recompile

    @property
    def total_bytes(self) -> int | None:
        """What one run needs on the device: arguments, outputs not aliased
        to an argument, and XLA's temporaries."""
        parts = (self.argument_bytes, self.output_bytes, self.temp_bytes)
        if all(p is None for p in parts):
            return None
        return sum(p or 0 for p in parts) - (self.alias_bytes or 0)

    @property
    def call_held_bytes(self) -> int:
        """What one call leaves on the device while it is queued or running:
        its new outputs (those not aliased to a donated argument) and XLA's
        temporaries (0 where the ledger has no sizes)."""
        return (self.output_bytes or 0) - (self.alias_bytes or 0) + (self.temp_bytes or 0)

    @property
    def eager(self) -> bool:
        """Every compile was of jax's own op run outside jit (``jnp.ones(n)``
        at top level, a model's initialisers): one per shape and dtype."""
        return bool(self.compiles) and self.eager_compiles >= (self.compiles or 0)

    @property
    def recompiles(self) -> int | None:
        if self.compiles is None:
            return None
        return max(0, self.compiles - 1 - self.eager_compiles) if not self.eager else 0

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> JitFunction:
        # A reason's time is one a clock can show (the screen prints it).
        reasons = [dict(r, t=protocol.timestamp(r.get("t"))) if "t" in r else r
                   for r in protocol.list_of(row.get("reasons")) if isinstance(r, dict)]
        return cls(
            name=_name(row.get("name")),
            compiles=_int(row.get("compiles")),
            compiles_source=row.get("compiles_source") if isinstance(row.get("compiles_source"), str) else None,
            compile_s=_num(row.get("compile_s")),
            live=_int(row.get("live")) or 0,
            **{k: _int(row.get(k)) for k in _SIZES},
            flops=_num(row.get("flops")),
            bytes_accessed=_num(row.get("bytes_accessed")),
            call_site=row.get("call_site") if isinstance(row.get("call_site"), str) else None,
            defined_at=row.get("defined_at") if isinstance(row.get("defined_at"), str) else None,
            first_t=protocol.timestamp(row.get("first_t")),
            last_t=protocol.timestamp(row.get("last_t")),
            reasons=tuple(reversed(reasons)),
            reasons_total=_int(row.get("reasons_total")) or len(reasons),
            eager_compiles=max(0, _int(row.get("eager_compiles")) or 0),
        )


@dataclass(frozen=True)
class LedgerView:
    """The ledger of one process at one moment, for the Jit screen."""

    pid: int
    t: float | None = None  # the agent's pass that the numbers come from
    available: bool = True
    reason: str | None = None
    live_count: int | None = None
    code_bytes: int | None = None
    pending: int = 0  # live executables the agent has not analysed yet
    compiles_total: int | None = None
    functions: tuple[JitFunction, ...] = ()
    executables: tuple[dict[str, Any], ...] = ()
    gone: tuple[dict[str, Any], ...] = ()
    trend: tuple[tuple[float, int], ...] = ()
    leak: dict[str, Any] | None = None
    storm: dict[str, Any] | None = None  # one function compiling again and again, and why
    explain: dict[str, Any] = field(default_factory=dict)
    complete: bool = False  # a whole table was folded
    notes: tuple[str, ...] = ()

    def largest_call(self) -> JitFunction | None:
        """The jitted function (not an op run eagerly) whose one call leaves
        the most on the device while it is queued or running
        (:attr:`JitFunction.call_held_bytes`). Each step dispatched ahead of
        the device holds about that much; None without sizes."""
        return largest_call(self.functions)

    def trend_delta(self, window_s: float = 60.0) -> int | None:
        """Change of the live-executable count over the last ``window_s`` seconds."""
        if not self.trend:
            return None
        t_end, n_end = self.trend[-1]
        start = next((n for t, n in self.trend if t >= t_end - window_s), n_end)
        return n_end - start


class _Table:
    """One process's ledger as folded so far."""

    def __init__(self) -> None:
        self.fields = 0
        self.complete = False
        self.totals: dict[str, Any] = {}
        self.functions: dict[str, dict[str, Any]] = {}
        self.executables: dict[Any, dict[str, Any]] = {}
        self.gone: list[dict[str, Any]] = []
        self.trend: list[tuple[float, int]] = []
        self.available = True
        self.reason: str | None = None
        self.joined_t: float | None = None
        self.reason_t: dict[str, float] = {}  # newest reason already turned into an event
        # Per function: [window start, events in it, reasons folded, newest folded reason]
        self.reason_window: dict[str, list[Any]] = {}
        self.leak_since: Any = None
        self.storm_since: Any = None

    def fold(self, data: dict[str, Any], sample_t: float | None) -> list[tuple[str, str, float]]:
        t = _num(data.get("t")) or sample_t or 0.0
        if self.joined_t is None:
            self.joined_t = t
        self.fields += 1
        if data.get("available") is False:
            self.available = False
            self.reason = protocol.shown(data.get("reason") or "unavailable")
            return []
        self.available, self.reason = True, None
        for key in ("live_count", "code_bytes", "pending", "compiles_total", "compiles_unattributed", "explain",
                    "leak", "storm", "executables_reason", "compiles_reason", "pass_s"):
            if key in data:
                self.totals[key] = data[key]
        for key in ("executables_reason", "compiles_reason"):
            if key not in data:
                self.totals.pop(key, None)
        self.totals["t"] = t
        rows = [r for r in protocol.list_of(data.get("functions")) if isinstance(r, dict) and "name" in r]
        exes = [r for r in protocol.list_of(data.get("executables")) if isinstance(r, dict) and _key(r.get("id"))]
        if data.get("full"):
            self.complete = True
            self.functions = {_name(r["name"]): r for r in rows}
            self.executables = {r["id"]: r for r in exes}
            # Agents before the storm flag kept their trend without ops while
            # their fields' live_count held all executables: two series that
            # zig-zag when interleaved. Theirs only fills in what came before
            # this reader's first point.
            self._merge_trend(data.get("trend"), before=None if "storm" in data else self._first_point_t())
        else:
            for r in rows:
                self.functions[_name(r["name"])] = r
            for r in exes:
                self.executables[r["id"]] = r
            for ident in protocol.list_of(data.get("gone")):
                row = self.executables.pop(ident, None) if _key(ident) else None
                if row is not None:
                    self.gone.append(dict(row, last_t=t))
            del self.gone[:-MAX_GONE]
        if "gone_recent" in data:
            self.gone = [r for r in protocol.list_of(data["gone_recent"]) if isinstance(r, dict)][-MAX_GONE:]
        count = _int(data.get("live_count"))
        if count is not None and (not self.trend or t > self.trend[-1][0]):
            self.trend.append((t, count))
            del self.trend[:-MAX_TREND]
        return self._events(rows, data, t)

    def _first_point_t(self) -> float | None:
        return self.trend[0][0] if self.trend else None

    def _merge_trend(self, points: Any, before: float | None = None) -> None:
        """Points of a whole table's ``trend`` this reader has not seen
        (passes that changed nothing send no field; a reader that joined
        late), only those before ``before`` when given."""
        if not isinstance(points, list):
            return
        # Agents before the storm flag rounded a trend point's time to the
        # millisecond and the field's own to the microsecond: one pass, two
        # points. A point within the same millisecond is the same pass.
        known = {round(t, 3) for t, _ in self.trend}
        for p in points:
            if isinstance(p, (list, tuple)) and len(p) == 2:
                t, n = _num(p[0]), _int(p[1])
                if t is None or n is None or round(t, 3) in known or (before is not None and t >= before):
                    continue
                bisect.insort(self.trend, (t, n))
                known.add(round(t, 3))
        del self.trend[:-MAX_TREND]

    def _events(self, rows: list[dict[str, Any]], data: dict[str, Any], t: float) -> list[tuple[str, str, float]]:
        """New recompile reasons, a new leak flag and a new compile storm, as
        events for the event list.

        Reasons from before this reader joined are history, not news. Each
        function gives at most :data:`MAX_EVENTS_PER_FUNCTION` recompile
        events per :data:`EVENTS_WINDOW_S`; the rest are folded into one
        event when its window ends, and none while the agent flags that
        function's compile storm (the storm is its one event).
        """
        events: list[tuple[str, str, float]] = []
        storm = self.totals.get("storm")  # this field's, or the last one sent
        storming = _name(storm.get("function")) if isinstance(storm, dict) else None
        if isinstance(storm, dict):
            if storm.get("since_t") != self.storm_since:
                self.storm_since = storm.get("since_t")
                events.append(("jit", protocol.shown(storm.get("message")), t))
                window = self.reason_window.get(storming) if storming is not None else None
                if window is not None:
                    window[2], window[3] = 0, None  # its recompiles folded so far: the storm's event says them
        elif "storm" in data:
            self.storm_since = None
        for name, window in list(self.reason_window.items()):
            if t - window[0] >= EVENTS_WINDOW_S:
                events.extend(self._folded(name, window, storming))
                del self.reason_window[name]
        for row in rows:
            name = _name(row["name"])
            newest = self.reason_t.get(name, self.joined_t or 0.0)
            fresh = [r for r in protocol.list_of(row.get("reasons"))
                     if isinstance(r, dict) and (_num(r.get("t")) or 0.0) > newest]
            if not fresh:
                continue
            self.reason_t[name] = max(_num(r.get("t")) or 0.0 for r in fresh)
            window = self.reason_window.setdefault(name, [t, 0, 0, None])
            for r in fresh:
                if name == storming:
                    continue  # the storm's event says it
                if window[1] < MAX_EVENTS_PER_FUNCTION:
                    window[1] += 1
                    events.append(("jit", f"recompile {name}: {describe_reason(r)}", _num(r.get("t")) or t))
                else:
                    window[2] += 1
                    window[3] = r
        leak = data.get("leak")
        if isinstance(leak, dict):
            if leak.get("since_t") != self.leak_since:
                self.leak_since = leak.get("since_t")
                # A function's storm that keeps its executables is one event:
                # the storm's (the screen shows both flags).
                if storming is None or _name(leak.get("function")) != storming:
                    events.append(("jit", f"leak? {protocol.shown(leak.get('message'))}", t))
        elif "leak" in data:
            self.leak_since = None
        return events

    @staticmethod
    def _folded(name: str, window: list[Any], storming: str | None) -> list[tuple[str, str, float]]:
        """The one event for a function's recompiles left out of its window
        (those of its storm are not counted: the storm event says them)."""
        start, _, folded, latest = window
        if not folded or name == storming:
            return []
        text = f"recompile {name}: {folded} more in {EVENTS_WINDOW_S:.0f} s"
        if isinstance(latest, dict):
            text += f", the latest {describe_reason(latest)}"
        return [("jit", text, (_num(latest.get("t")) if isinstance(latest, dict) else None) or start)]

    def view(self, pid: int) -> LedgerView:
        tot = self.totals
        notes = tuple(protocol.shown(tot[k]) for k in ("executables_reason", "compiles_reason") if tot.get(k))
        leak = tot.get("leak") if isinstance(tot.get("leak"), dict) else None
        storm = tot.get("storm") if isinstance(tot.get("storm"), dict) else None
        return LedgerView(
            pid=pid,
            t=protocol.timestamp(tot.get("t")),
            available=self.available,
            reason=self.reason,
            live_count=_int(tot.get("live_count")),
            code_bytes=_int(tot.get("code_bytes")),
            pending=_int(tot.get("pending")) or 0,
            compiles_total=_int(tot.get("compiles_total")),
            functions=tuple(JitFunction.from_row(r) for r in self.functions.values()),
            executables=tuple(dict(r) for r in self.executables.values()),
            gone=tuple(dict(r) for r in self.gone),
            trend=tuple(self.trend),
            leak=dict(leak) if leak else None,
            storm=dict(storm) if storm else None,
            explain=dict(protocol.obj_of(tot.get("explain"))),
            complete=self.complete,
            notes=notes,
        )


def largest_call(functions: Any) -> JitFunction | None:
    """See :meth:`LedgerView.largest_call`."""
    best, most = None, 0
    for fn in functions:
        if fn.eager or not fn.live:
            continue
        if fn.call_held_bytes > most:
            best, most = fn, fn.call_held_bytes
    return best


def describe_reason(reason: dict[str, Any], site: bool = True) -> str:
    """One line for a recompile reason: what changed (and where it was called)."""
    where = short_site(reason.get("call_site")) if site else None
    kind = reason.get("kind")
    if kind == "static":
        what = f"static argument {_name(reason.get('arg'))}: {_name(reason.get('old'))} → {_name(reason.get('new'))}"
        if reason.get("same_repr"):
            what += (" (both print alike: a __repr__ would show what changed; __hash__ and __eq__ by value, "
                     "if equal settings should not recompile)")
    elif reason.get("arg") is not None:
        what = f"{_name(reason.get('arg'))} {_name(reason.get('old'))} → {_name(reason.get('new'))}"
        more = len(protocol.list_of(reason.get("diffs"))) - 1
        if more > 0:
            what += f" (+{more} more)"
    elif kind == "redefined":
        what = "a new function object on a line traced before (re-defined in a loop?)"
    else:
        text = " ".join(_name(reason.get("text") or "").split())
        what = text or _name(kind or "?")
    return f"{what} at {where}" if where else what


def short_site(site: Any) -> str | None:
    """``/long/path/train.py:31`` → ``train.py:31``."""
    if not isinstance(site, str) or not site:
        return None
    path, sep, line = site.rpartition(":")
    if not sep or not line.isdigit():
        return site.rsplit("/", 1)[-1]
    return f"{path.rsplit('/', 1)[-1]}:{line}"


class LedgerStore:
    """Every watched process's ledger (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[int, _Table] = {}

    def feed_sample(self, pid: int, sample: Sample) -> list[tuple[str, str, float]]:
        """Fold the ``jit`` field of a sample, if it has one.

        Returns:
            Events for the model's event list: ``(kind, text, t)``.
        """
        data = sample.jit
        if data is None:
            return []
        t = sample.t
        with self._lock:
            table = self._tables.setdefault(pid, _Table())
            return table.fold(data, t)

    def feed_reply(self, pid: int, reply: Reply) -> bool:
        """Fold a ``jit_ledger`` command's reply; False when the reply is another command's."""
        result = reply.result
        if not isinstance(result, dict) or not isinstance(result.get("jit_ledger"), dict):
            return False
        data = dict(result["jit_ledger"], full=True)
        with self._lock:
            self._tables.setdefault(pid, _Table()).fold(data, reply.t)
        return True

    def view(self, pid: int | None = None) -> LedgerView | None:
        """The ledger of ``pid`` (None: the first process that has one)."""
        with self._lock:
            if pid is None:
                pid = next(iter(self._tables), None)
            table = self._tables.get(pid) if pid is not None else None
            return table.view(pid) if table is not None else None

    def largest_call(self, pid: int) -> JitFunction | None:
        """:meth:`LedgerView.largest_call` of ``pid``'s ledger, without
        copying the whole table (the main screen asks it every frame)."""
        with self._lock:
            table = self._tables.get(pid)
            rows = list(table.functions.values()) if table is not None else []
        return largest_call(JitFunction.from_row(r) for r in rows if _int(r.get("live")))

    def pids(self) -> list[int]:
        with self._lock:
            return list(self._tables)

    def forget(self, pid: int) -> None:
        """Drop a process (a replay seeking backwards rebuilds it)."""
        with self._lock:
            self._tables.pop(pid, None)

    def table(self, pid: int) -> _Table | None:
        """``pid``'s table itself (a replay index keeps it at its checkpoints)."""
        with self._lock:
            return self._tables.get(pid)

    def put_table(self, pid: int, table: _Table | None) -> None:
        with self._lock:
            if table is None:
                self._tables.pop(pid, None)
            else:
                self._tables[pid] = table

    def adopt(self, pid: int, other: LedgerStore) -> None:
        """Take ``pid``'s table from another store (the model's ``adopt``)."""
        with self._lock, other._lock:
            table = other._tables.get(pid)
            if table is None:
                self._tables.pop(pid, None)
            else:
                self._tables[pid] = table
