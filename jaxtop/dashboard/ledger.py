"""The jit ledger on the dashboard's side: one table per process, UI-free.

The agent sends the ledger as the sample field ``jit``: a whole table now and
then (``full: true``) and, in between, only what changed; the command
``jit_ledger`` answers with the whole table at once. :class:`LedgerStore`
folds both (:class:`~jaxtop.wire.records.jit.Jit`, decoded once) into one
table per process and hands out frozen :class:`LedgerView` s. A stream
joined in the middle (or a recording read from the middle) holds changes
only until its next whole table: ``LedgerView.complete`` says so.

Thread-safe (its own lock): the model feeds it on the reader thread, the Jit
screen reads it on the UI thread.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from jaxtop.wire.records.base import Num
from jaxtop.wire.records.decoder import reply_result
from jaxtop.wire.records.jit import (
    Jit, JitExecutable, JitExplain, JitFunctionRow, JitLeak, JitLedgerResult, JitReason, JitStorm,
)

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


def _count(v: Num) -> int | None:
    """A count or a size as an int (a figure may come as a float)."""
    return None if v is None else int(v)


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
    reasons: tuple[JitReason, ...] = ()  # latest first
    reasons_total: int = 0
    eager_compiles: int = 0  # compiles of an op run outside jit: none is a recompile
    #: The arguments its outputs could be written into (donate_argnames);
    #: empty where unknown (an older agent, outputs aliased already).
    donatable: tuple[str, ...] = ()
    donatable_nnx: bool = False

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
    def from_row(cls, row: JitFunctionRow, name: str) -> JitFunction:
        """The function of a row of the wire's ``functions`` (named ``name``:
        the row's own, which its caller has)."""
        reasons = tuple(reversed(row.reasons or ()))
        return cls(
            name=name,
            compiles=_count(row.compiles),
            compiles_source=row.compiles_source,
            compile_s=row.compile_s,
            live=_count(row.live) or 0,
            argument_bytes=_count(row.argument_bytes),
            output_bytes=_count(row.output_bytes),
            alias_bytes=_count(row.alias_bytes),
            temp_bytes=_count(row.temp_bytes),
            peak_bytes=_count(row.peak_bytes),
            code_bytes=_count(row.code_bytes),
            flops=row.flops,
            bytes_accessed=row.bytes_accessed,
            call_site=row.call_site,
            defined_at=row.defined_at,
            first_t=row.first_t,
            last_t=row.last_t,
            reasons=reasons,
            reasons_total=_count(row.reasons_total) or len(reasons),
            eager_compiles=max(0, _count(row.eager_compiles) or 0),
            donatable=tuple(row.donatable or ()),
            donatable_nnx=row.donatable_nnx is True,
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
    executables: tuple[JitExecutable, ...] = ()
    gone: tuple[JitExecutable, ...] = ()  # each with the ``last_t`` it was found freed
    trend: tuple[tuple[float, int], ...] = ()
    leak: JitLeak | None = None
    storm: JitStorm | None = None  # one function compiling again and again, and why
    explain: JitExplain | None = None  # None: the agent said nothing of recompile reasons
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


#: The totals of a table before its first field that the ledger could read.
_NO_FIELD = Jit()


class _Table:
    """One process's ledger as folded so far."""

    def __init__(self) -> None:
        self.fields = 0
        self.complete = False
        self.last = _NO_FIELD  # the last field read: its totals, flags and notes
        self.t: float | None = None  # its time (the sample's where it has none)
        self.storm: JitStorm | None = None
        self.functions: dict[str, JitFunction] = {}
        self.executables: dict[int, JitExecutable] = {}
        self.gone: list[JitExecutable] = []
        self.trend: list[tuple[float, int]] = []
        self.available = True
        self.reason: str | None = None
        self.error: str | None = None  # the probe raised on the last sample: why
        self.joined_t: float | None = None
        self.reason_t: dict[str, float] = {}  # newest reason already turned into an event
        # Per function: [window start, events in it, reasons folded, newest folded reason]
        self.reason_window: dict[str, list[Any]] = {}
        self.leak_since: float | None = None
        self.storm_since: float | None = None

    def fold(self, data: Jit, sample_t: float | None) -> list[tuple[str, str, float]]:
        t = data.t or sample_t or 0.0
        if self.joined_t is None:
            self.joined_t = t
        self.fields += 1
        if data.available is False:
            self.available = False
            self.reason = data.reason or "unavailable"
            return []
        if data.error is not None:
            # The probe raised on this sample: the table stays as it was
            # (its changes come with the next field), and the screen says why.
            self.error = data.error
            return []
        self.available, self.reason, self.error = True, None, None
        # Every field the agent sends carries all the totals and both flags:
        # the last one's are the table's.
        self.last, self.t = data, t
        self.storm = data.storm_flag
        rows = [(r.name, r) for r in data.functions or () if r.name is not None]
        exes = [(r.id, r) for r in data.executables or () if r.id is not None]
        if data.full:
            self.complete = True
            self.functions = {name: JitFunction.from_row(r, name) for name, r in rows}
            self.executables = dict(exes)
            # Agents before the storm flag kept their trend without ops while
            # their fields' live_count held all executables: two series that
            # zig-zag when interleaved. Theirs only fills in what came before
            # this reader's first point.
            self._merge_trend(data.trend, before=None if data.storm_sent else self._first_point_t())
        else:
            for name, r in rows:
                self.functions[name] = JitFunction.from_row(r, name)
            self.executables.update(exes)
            for ident in data.gone or ():
                row = self.executables.pop(ident, None)
                if row is not None:
                    self.gone.append(msgspec.structs.replace(row, last_t=t))
            del self.gone[:-MAX_GONE]
        if data.gone_recent is not None:
            self.gone = data.gone_recent[-MAX_GONE:]
        count = _count(data.live_count)
        if count is not None and (not self.trend or t > self.trend[-1][0]):
            self.trend.append((t, count))
            del self.trend[:-MAX_TREND]
        return self._events(rows, data, t)

    def _first_point_t(self) -> float | None:
        return self.trend[0][0] if self.trend else None

    def _merge_trend(self, points: list[tuple[float | None, Num]] | None, before: float | None = None) -> None:
        """Points of a whole table's ``trend`` this reader has not seen
        (passes that changed nothing send no field; a reader that joined
        late), only those before ``before`` when given."""
        # Agents before the storm flag rounded a trend point's time to the
        # millisecond and the field's own to the microsecond: one pass, two
        # points. A point within the same millisecond is the same pass.
        known = {round(t, 3) for t, _ in self.trend}
        for t, n in points or ():
            if t is None or n is None or round(t, 3) in known or (before is not None and t >= before):
                continue
            bisect.insort(self.trend, (t, int(n)))
            known.add(round(t, 3))
        del self.trend[:-MAX_TREND]

    def _events(self, rows: list[tuple[str, JitFunctionRow]], data: Jit, t: float) -> list[tuple[str, str, float]]:
        """New recompile reasons, a new leak flag and a new compile storm, as
        events for the event list.

        Reasons from before this reader joined are history, not news. Each
        function gives at most :data:`MAX_EVENTS_PER_FUNCTION` recompile
        events per :data:`EVENTS_WINDOW_S`; the rest are folded into one
        event when its window ends, and none while the agent flags that
        function's compile storm (the storm is its one event).
        """
        events: list[tuple[str, str, float]] = []
        storm = self.storm
        storming = storm.function if storm is not None else None
        if storm is not None:
            if storm.since_t != self.storm_since:
                self.storm_since = storm.since_t
                events.append(("jit", storm_message(storm), t))
                window = self.reason_window.get(storming) if storming is not None else None
                if window is not None:
                    window[2], window[3] = 0, None  # its recompiles folded so far: the storm's event says them
        else:
            self.storm_since = None
        for name, window in list(self.reason_window.items()):
            if t - window[0] >= EVENTS_WINDOW_S:
                events.extend(self._folded(name, window, storming))
                del self.reason_window[name]
        for name, row in rows:
            newest = self.reason_t.get(name, self.joined_t or 0.0)
            fresh = [r for r in row.reasons or () if (r.t or 0.0) > newest]
            if not fresh:
                continue
            self.reason_t[name] = max(r.t or 0.0 for r in fresh)
            window = self.reason_window.setdefault(name, [t, 0, 0, None])
            for r in fresh:
                if name == storming:
                    continue  # the storm's event says it
                if window[1] < MAX_EVENTS_PER_FUNCTION:
                    window[1] += 1
                    events.append(("jit", f"recompile {name}: {describe_reason(r)}", r.t or t))
                else:
                    window[2] += 1
                    window[3] = r
        leak = data.leak
        if leak is not None:
            if leak.since_t != self.leak_since:
                self.leak_since = leak.since_t
                # A function's storm that keeps its executables is one event:
                # the storm's (the screen shows both flags).
                if storming is None or leak.function != storming:
                    events.append(("jit", f"leak? {leak_message(leak)}", t))
        else:
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
        if latest is not None:
            text += f", the latest {describe_reason(latest)}"
        return [("jit", text, (latest.t if latest is not None else None) or start)]

    def view(self, pid: int) -> LedgerView:
        last = self.last
        notes = tuple(n for n in (last.executables_reason, last.compiles_reason) if n)
        if self.error is not None:
            notes += (f"the ledger's last sample failed: {self.error}",)
        return LedgerView(
            pid=pid,
            t=self.t,
            available=self.available,
            reason=self.reason,
            live_count=_count(last.live_count),
            code_bytes=_count(last.code_bytes),
            pending=_count(last.pending) or 0,
            compiles_total=_count(last.compiles_total),
            functions=tuple(self.functions.values()),
            executables=tuple(self.executables.values()),
            gone=tuple(self.gone),
            trend=tuple(self.trend),
            leak=last.leak,
            storm=self.storm,
            explain=last.explain,
            complete=self.complete,
            notes=notes,
        )


def largest_call(functions: Iterable[JitFunction]) -> JitFunction | None:
    """See :meth:`LedgerView.largest_call`."""
    best, most = None, 0
    for fn in functions:
        if fn.eager or not fn.live:
            continue
        if fn.call_held_bytes > most:
            best, most = fn, fn.call_held_bytes
    return best


def leak_message(leak: JitLeak) -> str:
    """What a leak flag says: the agent words its cause."""
    return leak.message or "live executables keep growing (the agent gave no cause)"


def storm_message(storm: JitStorm) -> str:
    """What a compile-storm flag says: the agent words its cause."""
    return storm.message or f"compile storm: {storm.name or storm.function or '?'} (the agent gave no cause)"


def describe_reason(reason: JitReason, site: bool = True) -> str:
    """One line for a recompile reason: what changed (and where it was called)."""
    where = short_site(reason.call_site) if site else None
    kind = reason.kind
    if kind == "static":
        what = f"static argument {reason.arg}: {reason.old} → {reason.new}"
        if reason.same_repr:
            what += (" (both print alike: a __repr__ would show what changed; __hash__ and __eq__ by value, "
                     "if equal settings should not recompile)")
    elif reason.arg is not None:
        what = f"{reason.arg} {reason.old} → {reason.new}"
        more = len(reason.diffs or ()) - 1
        if more > 0:
            what += f" (+{more} more)"
    elif kind == "redefined":
        what = "a new function object on a line traced before (re-defined in a loop?)"
    else:
        what = _what_changed(reason.text or "") or kind or "?"
    return f"{what} at {where}" if where else what


#: The lines of JAX's cache-miss explanation that say where and what was
#: traced, not what changed (the table and the call site say those).
_BOILERPLATE = ("TRACING CACHE MISS", "for ", "defined at ")


def _what_changed(text: str) -> str:
    """An explanation jaxtop could not parse, on one line, without JAX's
    preamble (``TRACING CACHE MISS at … because:``, ``for step defined at
    …``): what is left says what changed, and is what a narrow screen keeps."""
    lines = [" ".join(line.split()) for line in text.splitlines()]
    kept = [line for line in lines if line and not line.startswith(_BOILERPLATE)]
    if not kept:
        return " ".join(lines).strip()
    return " ".join(kept)


def short_site(site: str | None) -> str | None:
    """``/long/path/train.py:31`` → ``train.py:31``."""
    if not site:
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
        with self._lock:
            table = self._tables.setdefault(pid, _Table())
            return table.fold(data, sample.t)

    def feed_reply(self, pid: int, reply: Reply) -> bool:
        """Fold a ``jit_ledger`` command's reply (a whole table); False when
        the reply is another command's. Its parts of the wrong type read
        n/a, as a sample's do."""
        result = reply_result(reply, JitLedgerResult)
        if result is None or result.jit_ledger is None:
            return False
        data = msgspec.structs.replace(result.jit_ledger, full=True)
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
            functions = list(table.functions.values()) if table is not None else []
        return largest_call(functions)

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
