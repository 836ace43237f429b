"""Which line of the program makes each implicit transfer (sample field ``transfer_sites``).

JAX's transfer guard logs one line per implicit transfer, and a jitted call
served by jaxlib's C++ fast path logs ``host-to-device transfer:`` with
nothing else: no function, no argument, no line. Nothing in Python runs
around the transfer itself. What does run, on the thread that made the call:

* jax's *post hook* (``jax._src.api._post_hook_state``, the hook
  ``jax_debug_nans`` uses): jaxlib calls it after every fast-path call of a
  jitted function or an eager op, with the function and its arguments;
* the *slow path*: a call that goes through Python (the first call of each
  signature, a function whose fast path is off) shards each argument with
  ``pxla.shard_arg_handlers[type(arg)]``, a dict looked up on every call;
* a *host read* (``float(x)``, ``np.asarray(x)``): the host-sync probe's hook.

Each of those notes, after the transfers it may have made, a *record*:
thread, time, the user's innermost frame (:mod:`jaxtop.probes.frames`), the
function called. The stderr relay notes each guard line's *stamp*: the
thread id and the time (to the microsecond) from its log header. On the
agent's thread a line goes to the first record after it on its thread, of
its kind (a call for host-to-device and device-to-device, a read for
device-to-host): every line a call logs is written before jaxlib returns
and calls the hook. A line with no such record within
:data:`MATCH_WINDOW_S` is *unattributed*, counted apart with the reason,
never guessed.

What the argument was (kind, shape, dtype) is observed on the slow path
(the values pass through the handler) and, for a fast-path call, read from
the hook's arguments on the first calls of a site and again every
:data:`DESCRIBE_EVERY_S` (said so: "inferred").

Cost in the program's thread: one hook call per jitted call (a frame walk
cached per code object, one tuple appended to a deque), whether or not it
transferred; ``benchmarks/transfer_sites.py`` measures it beside JAX's own
logging. ``JAXTOP_TRANSFER_SITES=0`` installs nothing (transfers are then
counted, not tied to lines).

Standard library only, and jax (with NumPy, its own dependency) once it is
imported (this runs inside the user's job).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from itertools import repeat, starmap
from typing import Any

import numpy as np

from jaxtop.probes.base import Tick
from jaxtop.probes.forksafe import ForkLock
from jaxtop.probes.frames import LIBRARY, LibraryFilter
from jaxtop.probes.transfer_notes import RING, SEALED, _hook_slot
from jaxtop.probes.transfer_site import Site, same_callee
from jaxtop.probes.transfer_spells import HookSpells
from jaxtop.probes.transfer_keys import NoteKeys
from jaxtop.probes.transfer_timeline import Timeline, file_calls, parse_stamps, tie
from jaxtop.probes.transfer_values import MAX_ARGS, NUMPY, PY_SCALAR, ArgInfo, cut, describe_value

__all__ = ["ArgInfo", "MAX_ARGS", "NUMPY", "PY_SCALAR", "RING", "TransferSitesProbe", "describe_value", "parse_stamps",
           "_hook_slot"]

#: A line waits this long for its record (the call it belongs to returns
#: after it), then counts as unattributed.
MATCH_WINDOW_S = 3.0
#: Records are kept this long after they are read from the program's threads.
RETAIN_S = 6.0
#: The longest file path the wire carries (a real one is far shorter).
MAX_WIRE_PATH = 1024
#: Ticks whose call notes are kept unread while nothing transfers (a line
#: the relay reports up to this many ticks late is still tied).
HELD_TICKS = 3
#: Lines are tied to calls every this many ticks (a second at the agent's
#: 10 Hz), or sooner when the notes pile up or a budget window ends (so a
#: budget counts every line). A batch has a fixed cost of its own, most of
#: it first touches of cold data (~0.4 ms beside a busy program on a 2-core
#: VM): at 1,000 transfers a second, tying added 0.12 % of a core to the
#: agent's thread in batches of five ticks, 0.04-0.11 % in batches of ten
#: (benchmarks/transfer_sites.py, runs of 3 and 5 rounds); the lines'
#: counts reach the screen once a second, as top refreshes.
TIE_EVERY_TICKS = 10
#: A fast-path site's arguments are read again this often (seconds).
DESCRIBE_EVERY_S = 30.0
#: Sites sent, the busiest first; the rest are summed under "other sites".
SITES_SENT = 50
#: Sites kept at most (a program with ever-new lines: the rest counted apart).
MAX_SITES = 2000
#: The reason the lines past MAX_SITES are counted under.
TOO_MANY_LINES = f"more than {MAX_SITES} lines transferred: the rest are not kept apart"

def _foreign_thread_reason(native: int) -> str:
    """Why a line's thread is none of this program's Python threads: a
    thread of this process that runs no Python, or (Linux thread ids are
    the whole machine's) a thread of another process writing to this
    program's stderr: a forked child, a subprocess given the same stderr."""
    if os.path.isdir("/proc/self/task") and not os.path.exists(f"/proc/self/task/{native}"):
        return "made by another process writing to this program's stderr (a forked child, a subprocess)"
    return "made by a thread without Python code"


class TransferSitesProbe(HookSpells):
    """Records in the program's threads; matching and the field on the agent's.

    Args:
        filt: what counts as library code (the user's line is the innermost
            frame outside it).
    """

    name = "transfer_sites"
    needs_jax = True
    MAX_SITES = MAX_SITES
    BEYOND_REASON = TOO_MANY_LINES

    def __init__(self, filt: LibraryFilter = LIBRARY, enabled: bool = True) -> None:
        super().__init__(filt, enabled)
        self._held: deque = deque()  # the last quiet ticks' call notes, unread
        self._dropped_until = -1e18  # call notes up to this moment were dropped unread
        self._site_files: set[str] = set()  # the files of the kept lines
        self._wall_offset = time.time() - time.perf_counter()
        self._offset_fixed: float | None = None  # tests: record times are wall times already
        self._fun_args: dict[str, tuple[ArgInfo, ...]] = {}  # a function's arguments as last seen named, by name
        self._stamps: list[bytes] = []
        self._unparsed: list[bytes] = []  # reports taken, read at the next tie
        self._stamps_lock = ForkLock()
        # Agent thread only, from here on.
        self._by_thread: dict[int, Timeline] = {}  # ident -> its calls' notes
        self._reads: dict[int, Timeline] = {}  # ident -> its host reads' notes
        self._pending: dict[tuple[str, int], np.ndarray] = {}  # (direction, native thread) -> lines waiting
        self._keys = NoteKeys()  # the notes' keys, shared by the timelines, and the code objects they name
        self._described_seen = 0  # described_notes when the notes were last filed
        self._native: dict[int, int] = {}  # native thread id -> ident
        self._sites: dict[tuple, Site] = {}
        self._known: dict[tuple, tuple[Any, Site]] = {}  # (direction, note key) -> (code, site)
        self._lost_before = -1e18  # lines before this moment may have lost their record (ring full)
        self._waited = 0  # ticks with lines waiting since the last tie
        self._history_wait = 0  # ticks since the sites' last history entry
        self._history_t: float | None = None  # when the last entry was made
        self._history_s: float | None = None  # the seconds between the last two
        self.tie_every = TIE_EVERY_TICKS
        self._tie_asked = False
        # id(function) -> (a weak reference to it, (name, op, parameters)).
        self._changed = True

    def take_stamps(self, data: bytes) -> None:
        """The relay's stamps (called from the capture, on the agent's thread)."""
        if not self._running:
            return  # not started, switched off, or no jax to hook: nothing to tie them to
        with self._stamps_lock:
            self._stamps.append(data)

    def tie_soon(self) -> None:
        """Tie the waiting lines at the next tick, not at the batch's end (a
        budget window's edge asks for a sample that counts them all)."""
        self._tie_asked = True

    def on_tick(self, tick: Tick) -> dict[str, Any] | None:
        if not self._running:
            return None
        with self._stamps_lock:
            stamps, self._stamps = self._stamps, []
        self._spell_tick(tick, stamps)
        if tick.slow:
            self._wrap_handlers()  # a handler jax registered since
        self._unparsed += stamps
        if self._pending or self._unparsed or tick.final:
            # Lines to tie: every few ticks, in one batch (the work is per
            # batch, per thread and per site, and a batch of a second
            # finds the agent's caches warm once, not ten times).
            self._waited += 1
            if not (tick.final or self._tie_asked or self._waited >= self.tie_every or len(self._calls) > RING // 4):
                self._history_tick(tick.now)
                return None
            if self._waited >= self.tie_every:  # a batch's regular end: its history entry now
                self._history_wait = self.tie_every - 1
            self._waited = 0
            self._tie_asked = False
            if self._unparsed:  # the batch's reports read at once
                for direction, native, times in parse_stamps(b" ".join(self._unparsed), tick.now):
                    waiting = self._pending.get((direction, native))
                    self._pending[(direction, native)] = times if waiting is None else np.concatenate((waiting, times))
                self._unparsed = []
            self._drain()
            self._match(tick.now, tick.final)
        else:
            # Nothing to tie: the notes of this tick are set aside unread (a
            # line the relay has not reported yet may still need them), the
            # tick's before are dropped whole. A program that transfers
            # nothing costs the agent no Python work per call.
            self._noted += len(self._calls)
            self._held.append(self._calls)
            self._calls = deque(maxlen=RING)
            if len(self._held) > HELD_TICKS:
                old = self._held.popleft()
                if old:  # a line the relay reports later than this cannot be tied: never to a later call
                    self._dropped_until = max(self._dropped_until, old[-1][1] + self._wall_offset)
        self._history_tick(tick.now)
        if not self._changed and not tick.final:
            for site in self._sites.values():
                site.interval = 0
            return None
        self._changed = False
        out = self.field()
        for site in self._sites.values():
            site.interval = 0
        return out

    def _history_tick(self, now: float) -> None:
        """Each site's history gets an entry every batch's span (quiet
        spells and ties asked for early included: the entries stay even).
        The span's seconds are measured: the agent's ticks come less often
        while it is at its CPU ceiling."""
        self._history_wait += 1
        if self._history_wait < self.tie_every:
            return
        self._history_wait = 0
        if self._history_t is not None and now > self._history_t:
            self._history_s = now - self._history_t
        self._history_t = now
        for site in self._sites.values():
            if site.unlogged or site.history:
                site.history.append(site.unlogged)
                site.unlogged = 0

    def _drain(self) -> None:
        """File the program threads' notes into per-thread timelines (in C,
        see :mod:`jaxtop.probes.transfer_timeline`). Most calls transfer
        nothing: a note is only filed here, and worked out (its line, its
        function's name) when a line is tied to it, once per site."""
        offset = self._offset_fixed if self._offset_fixed is not None else time.time() - time.perf_counter()
        self._wall_offset = offset
        # Read before the notes are taken: a note counted after this is looked for next time.
        described = self.described_notes
        look, self._described_seen = described != self._described_seen, described
        lost = -1e18
        batches = list(self._held)
        self._held.clear()
        calls = self._calls
        # The hook appends meanwhile: popleft is safe (called in C, not a Python loop).
        batches.append(list(starmap(calls.popleft, repeat((), len(calls)))))
        self._noted += len(batches[-1])
        for batch in batches:
            if len(batch) >= RING:  # the ring overflowed: lines before its oldest note may have lost theirs
                lost = max(lost, batch[0][1] + offset)
            if self._keys.due():
                self._forget_codes()
            for ident, times, codes, extras, funs, code_objects in file_calls(batch, offset, self._keys.table, look):
                for fun in funs.values():
                    self._name_of(fun)  # the name kept by a weak reference, once per function
                self._keys.add(code_objects)
                self._timeline(self._by_thread, ident).add(times, codes, extras)
        # The slow path's notes and host reads: rarer, filed one by one.
        for queue, table in ((self._slow, self._by_thread), (self._reads_in, self._reads)):
            records = list(starmap(queue.popleft, repeat((), len(queue))))
            if len(records) >= RING:
                lost = max(lost, records[0][1] + offset)
            per_thread: dict[int, tuple[list[float], list[Any], dict[int, tuple]]] = {}
            for record in records:
                times, keys, extras = per_thread.setdefault(record[0], ([], [], {}))
                if queue is self._slow:  # (ident, t, callee, (code, line), arguments)
                    extras[len(keys)] = ("s", record[2], record[3], record[4])
                    keys.append(None)
                else:  # (ident, t, (file, line, function), how)
                    keys.append(("r", record[2], record[3]))
                times.append(record[1] + offset)
            for ident, (times, keys, extras) in per_thread.items():
                self._timeline(table, ident).add_keys(times, keys, extras or None)
        self._lost_before = max(self._lost_before, lost)

    def _timeline(self, table: dict[int, Timeline], ident: int) -> Timeline:
        timeline = table.get(ident)
        if timeline is None:
            timeline = table[ident] = Timeline(self._keys.table)
        return timeline

    def _forget_codes(self) -> None:
        """Let go of the code objects no filed note names (:mod:`jaxtop.probes.
        transfer_keys`). The sites' fast-path cache goes with them: the next
        line of each site works its note out again, once."""
        self._keys.forget([*self._by_thread.values(), *self._reads.values()])
        self._known.clear()

    def _resolve(self, note: tuple) -> tuple[tuple, str, bool, Any, bool, Any]:
        """(site key without direction, callee name, op, arguments, observed, function) of a note."""
        tag = note[0]
        if tag == "r":  # a host read: ("r", (file, line, function), how)
            (_, (filename, line, function), how) = note
            return (filename, line, function), f"host read ({how})", False, None, False, None
        if tag == "s":  # a slow-path call: ("s", callee, (code, line), arguments)
            _, callee, site, described = note
            code, line = site if site is not None else (None, 0)
            where = (code.co_filename, line, code.co_name) if code is not None else ("", 0, "<no user frame>")
            return where, (callee or "?"), False, described, True, None
        if tag == "w":  # a fast-path call settled (its code let go): ("w", id(fun), (file, line, function))
            _, fun_id, where = note
            described = None
        else:
            if tag == "d":  # a fast-path call whose arguments were read: ("d", id(fun), code, offset, arguments)
                _, fun_id, code, lasti, described = note
            else:  # a fast-path call: (id(fun), id(code), offset)
                fun_id, code_id, lasti = note
                code, described = self._keys.codes.get(code_id), None
            line = self._keys.line_of(code, lasti) if code is not None else 0
            where = (code.co_filename, line, code.co_name) if code is not None else ("", 0, "<no user frame>")
        kept = self._names.get(fun_id)
        name, op, _ = kept[1] if kept is not None else ("?", False, ())
        fun = kept[0]() if kept is not None else None
        return where, name, op, described, False, fun

    def _thread(self, native: int) -> int | None:
        ident = self._native.get(native)
        if ident is None:
            self._native = {th.native_id: th.ident for th in threading.enumerate()
                            if th.native_id is not None and th.ident is not None}
            ident = self._native.get(native)
        return ident

    @staticmethod
    def _only_thread(table: dict[int, Timeline], t: float) -> int | None:
        """For a line whose header names no thread (older jaxlib's TSL
        header): the one thread that noted calls around it, or None when
        several did (then which one made it is unknowable)."""
        found = None
        for ident, timeline in table.items():
            times = timeline.times
            i = int(np.searchsorted(times, t - 1.0))
            if i < times.size and times[i] <= t + MATCH_WINDOW_S:
                if found is not None:
                    return None
                found = ident
        return found

    def _match(self, now: float, final: bool) -> None:
        """Tie each waiting line to the first note after it on its thread:
        per (direction, thread), in bulk (:func:`tie`), the lines of one
        site credited together."""
        waiting: dict[tuple[str, int], np.ndarray] = {}
        for (direction, native), lines in self._pending.items():
            lines = np.sort(lines, kind="stable")  # nearly always sorted already
            table = self._reads if direction == "d2h" else self._by_thread
            if self._out_since is not None or self._hook_out:
                lines = self._drop_while_out(direction, lines)
            if native:
                ident = self._thread(native)
                if ident is None:
                    self._give_up(direction, _foreign_thread_reason(native), len(lines))
                    continue
                by_ident = [(ident, lines)]
            else:  # no thread in the header: per line, the one thread calling jax then
                by_ident_map: dict[int | None, list[float]] = {}
                for t in lines.tolist():
                    by_ident_map.setdefault(self._only_thread(table, t), []).append(t)
                unknown = by_ident_map.pop(None, ())
                if unknown:
                    self._give_up(direction, "its log line names no thread (jaxlib before 0.5) and several "
                                  "threads called jax", len(unknown))
                by_ident = [(ident, np.array(times)) for ident, times in by_ident_map.items()]
            for ident, lines in by_ident:
                if direction != "d2h" and lines.size and lines[0] <= self._dropped_until:
                    late = int(np.searchsorted(lines, self._dropped_until, "right"))
                    self._give_up(direction, "reported after its call's note was let go (the relay was more "
                                  f"than {HELD_TICKS} ticks late)", late)
                    lines = lines[late:]
                if lines.size and lines[0] < self._lost_before:
                    lost = int(np.searchsorted(lines, self._lost_before))
                    self._give_up(direction, "calls came faster than jaxtop could note them", lost)
                    lines = lines[lost:]
                silent = ident not in table and self._active  # no note ever came from this thread
                no_call = self._silent_thread(direction) if silent else self._no_call(direction)
                credits, too_far, after = tie(self._timeline(table, ident), lines, MATCH_WINDOW_S)
                if too_far:
                    self._give_up(direction, no_call, too_far)
                for note, t, n, calls in credits:
                    try:
                        self._credit(direction, note, t, n, calls)
                    except Exception as exc:  # one function's oddity stays that function's
                        self._give_up(direction, f"its call could not be read: {type(exc).__name__}", n)
                if after.size:
                    gone = after.size if final else int(np.searchsorted(after, now - MATCH_WINDOW_S))
                    if gone:
                        self._give_up(direction, no_call, gone)
                    if gone < after.size:
                        kept = waiting.get((direction, native))
                        waiting[(direction, native)] = (after[gone:] if kept is None
                                                        else np.concatenate((kept, after[gone:])))
        self._pending = waiting
        horizon = now - RETAIN_S
        if waiting:
            horizon = min(horizon, min(float(lines[0]) for lines in waiting.values()) - 1.0)
        for table in (self._by_thread, self._reads):
            for ident in list(table):
                table[ident].trim(horizon)
                if not table[ident].times.size:
                    del table[ident]

    @staticmethod
    def _no_call(direction: str) -> str:
        return ("no jax call returned after it on its thread" if direction != "d2h"
                else "no host read returned after it on its thread")

    @staticmethod
    def _silent_thread(direction: str) -> str:
        """A thread whose calls never reached jaxtop's hook: most likely it
        set jax's post hook for itself (thread-local), which runs instead."""
        if direction == "d2h":
            return "no host read of its thread was ever seen"
        return ("no call of its thread ever reached jaxtop's hook: the thread set jax's post hook of its own "
                "(thread-local), which runs instead")

    def _credit(self, direction: str, note: tuple, t: float, n: int, calls: int) -> None:
        """``n`` lines of ``direction`` made by ``calls`` calls (or reads) of
        the note's site, the latest at ``t``."""
        fast = type(note[0]) is int  # a fast-path call: (id(function), id(code), offset)
        if fast and note[2] == SEALED:  # noted once no more lines were kept apart, from a file of none of them
            self._give_up(direction, TOO_MANY_LINES, n)
            return
        if fast:
            # The common case, a fast-path call at a line already described: counts only.
            # The code is kept beside the site, so the id is no other code's.
            kept = self._known.get((direction, note))
            site = kept[1] if kept is not None and kept[0] is self._keys.codes.get(note[1]) else None
            if site is not None and site.named and t - site.asked_t <= DESCRIBE_EVERY_S:
                site.add(n, calls)
                self.lines_kept += n
                self._changed = True
                return
            if len(self._sites) >= MAX_SITES:
                # Full: a call from a file no kept line is in has no line
                # to go to (generated code makes a file per function), and
                # its line need not be worked out to know that.
                code = self._keys.codes.get(note[1])
                if code is not None and code.co_filename not in self._site_files:
                    self._give_up(direction, TOO_MANY_LINES, n)
                    return
        where, name, op, described, observed, fun = self._resolve(note)
        key = (direction, *where)
        site = self._sites.get(key)
        if site is None:
            if len(self._sites) >= MAX_SITES:
                self._give_up(direction, TOO_MANY_LINES, n)
                return
            site = self._sites[key] = Site()
            self._site_files.add(where[0])
            if len(self._sites) >= MAX_SITES:
                # Full: the hook notes calls from other files as SEALED from now on.
                self.kept_files = frozenset(self._site_files)
        if fast and len(self._known) < 4 * MAX_SITES:
            self._known[(direction, note)] = (self._keys.codes.get(note[1]), site)
        callee = name if direction == "d2h" else name + (" (op)" if op else "")
        if direction == "d2h":
            site.callee = name
        elif not site.callee or not observed:
            # The fast path knows an op from a function of the user's; the
            # slow path only the name.
            site.callee = callee
        if described is not None:
            site.merge(described, observed, t, callee)
            if direction != "d2h" and any(a.name for a in described):
                if name in self._fun_args or len(self._fun_args) < 10_000:
                    self._fun_args[name] = described
        elif direction != "d2h" and not site.args and name in self._fun_args:
            # This line's calls were not read yet: what the same function
            # was passed elsewhere, marked as read from a call.
            site.merge(self._fun_args[name], False, t, callee)
        if direction != "d2h" and (not site.named or t - site.asked_t > DESCRIBE_EVERY_S) and t > site.asked_t:
            if fun is not None:
                # The next calls' arguments, named, read by the hook; again
                # now and then (what a line passes can change).
                self._want[id(fun)] = 2
                site.asked_t = t + (1.0 if not site.named else 0.0)
        site.add(n, calls)
        self.lines_kept += n
        self._changed = True

    def field(self) -> dict[str, Any]:
        """The wire ``transfer_sites`` object."""
        ranked = sorted(self._sites.items(), key=lambda kv: -kv[1].count)
        sites = []
        for (direction, filename, line, function), s in ranked[:SITES_SENT]:
            kinds = {a.kind for a in s.args}
            sites.append({
                "direction": direction, "file": cut(filename, MAX_WIRE_PATH), "line": line, "function": cut(function),
                "callee": cut(s.callee),
                "count_total": s.count, "count": s.interval, "calls_total": s.calls,
                "bytes_total": s.bytes if not s.bytes_unknown else None,
                "args": [a.wire() for a in s.args],
                # "transfer": the values seen passing to the device (slow path);
                # "call": a call's arguments at this line, read by the hook.
                "args_seen": "transfer" if s.observed else ("call" if s.args else None),
                # The callee whose call the args are, where it is not ``callee``.
                "args_of": cut(s.args_callee) if s.args and not same_callee(s.args_callee, s.callee) else None,
                "scalar": bool(kinds) and all(k.endswith(PY_SCALAR) for k in kinds),
                "history": list(s.history)[-30:],
            })
        rest = ranked[SITES_SENT:]
        return {
            "sites": sites,
            "sites_total": len(self._sites),
            "other": {"count_total": sum(s.count for _, s in rest)} if rest else None,
            "unattributed": dict(self._unattributed),
            "unattributed_reasons": dict(self._reasons),
            "pending": sum(map(len, self._pending.values())),
            "history_ticks": self.tie_every,
            # The seconds one history entry spans (None until two were made).
            "history_s": round(self._history_s, 3) if self._history_s is not None else None,
        }
