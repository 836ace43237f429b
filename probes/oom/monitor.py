"""The OOM monitor: sees the program run out of memory and takes a census.

Three ways in (see the package's docstring): jax's runtime error class
patched so that every RESOURCE_EXHAUSTED is seen when it is made, the
process's exception hooks for an uncaught one, and the GPU allocator's
stderr lines passed on by the relay. Each census is rate limited, written to
a file and queued for the agent's stream.

Stdlib only at import time; nothing here raises into the program.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref

from .census import DEFAULT_BUDGET_S, OOM_CENSUS, build_census
from .exceptions import error_classes, exception_text, find_oom_exception, jax_imported, type_name
from .lines import ALLOCATOR_MATCH_S, MESSAGE_CHARS, AllocatorLog, is_oom_text
from .parts import TIMELINE_POINTS, TIMELINE_SPAN_S
from .sites import user_frame_of_stack, user_frame_of_traceback
from .write import write_census
try:
    from ..forksafe import ForkLock
except ImportError:  # the stderr relay imports this package as top-level `oom` (python -S, probes/ first on sys.path)
    from forksafe import ForkLock  # type: ignore[no-redef]

# The stderr relay imports this package without ``site``: no ``typing`` at
# run time. Type checkers read the import; Python skips it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["GRACE_S", "MAX_CENSUSES", "MIN_INTERVAL_S", "SYNC_S", "OomMonitor", "OomProbe", "current", "install", "uninstall"]

#: Censuses one process writes at most: a program that catches the OOM and
#: retries smaller batches must not fill the disk.
MAX_CENSUSES = 5
#: Least seconds between two censuses; the OOMs in between are counted in
#: the next census (``suppressed_before``).
MIN_INTERVAL_S = 10.0
#: After an allocator line that says an allocation failed, how long the
#: agent waits for the exception (which brings a better census) before it
#: takes one itself.
GRACE_S = 1.0
#: On GPU, how long a census first waits for the allocator's lines to come
#: through the stderr relay (they are written just before the error).
SYNC_S = 0.3

# Every monitor made in this process, for the fork handler below.
_monitors: "weakref.WeakSet[OomMonitor]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """In a child made by ``os.fork()``: no census is under way.

    One census at a time is marked under the lock (``_running``); the
    thread that was taking one at the fork is not in the child, so its mark
    would never be cleared and the child refused every census of its own.
    The forking thread itself is never inside one (a census does not fork).
    """
    for monitor in list(_monitors):
        monitor._running = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class OomMonitor:
    """Takes censuses when the program runs out of memory.

    Build it with :func:`install`. It keeps the censuses' records until the
    agent takes them (:meth:`take_records`), writes each to a file, and
    posts a one-line ``oom`` event to the agent.

    Args:
        agent: the running :class:`jaxtop.agent.Agent` (None: files only).
        directory: where census files go (default :func:`census_directory`,
            read at each census).
        budget_s: seconds one census may take.
        note: print one line naming the file on stderr after the traceback
            of an uncaught OOM.
        profile: take the device memory profile for the allocation sites.
    """

    def __init__(self, agent: Any = None, directory: str | None = None, budget_s: float = DEFAULT_BUDGET_S,
                 note: bool = True, profile: bool = True) -> None:
        self.agent = agent
        self.directory = directory
        self.budget_s = budget_s
        self.note = note
        self.profile = profile
        self.allocator = AllocatorLog()
        self.censuses: list[dict[str, Any]] = []  # every census taken, oldest first
        self.suppressed = 0  # OOMs seen while censuses were rate limited or at their maximum
        self._lock = ForkLock()
        self._busy = threading.local()  # a census in progress on this thread
        self._running = False  # a census in progress on any thread
        self._last_t = 0.0  # monotonic time of the last census
        self._by_exc: dict[int, dict[str, Any]] = {}  # id(exception) -> census taken when it was made
        self._pending: list[dict[str, Any]] = []  # records for the agent's stream
        self._pending_line_t: float | None = None  # a failure line awaiting its exception
        self._prev_excepthook: Any = None
        self._prev_threading_hook: Any = None
        self._patched: list[tuple[type, Any]] = []  # (class, its own __init__ or None)
        self._seq = 0
        self.installed = False
        _monitors.add(self)

    # -- installing ------------------------------------------------------------
    def _install(self) -> None:
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        self._prev_threading_hook = threading.excepthook
        threading.excepthook = self._threading_excepthook
        self.installed = True
        self.on_jax_imported()

    def on_jax_imported(self, _module: Any = None) -> None:
        """Patch jax's runtime error class once jax is imported (idempotent;
        the agent calls this from its import hook)."""
        if not self.installed or self._patched or not jax_imported():
            return
        found = error_classes()
        # A subclass of a patched class goes through the patched __init__
        # already: patching it too would see each error twice.
        roots = [c for c in found if not any(o is not c and issubclass(c, o) for o in found)]
        monitor = self
        for cls in roots:
            own = cls.__dict__.get("__init__")
            original = cls.__init__

            def __init__(exc: BaseException, *args: Any, _original: Any = original, **kwargs: Any) -> None:
                _original(exc, *args, **kwargs)
                monitor._on_error_created(exc)

            __init__.__qualname__ = f"{cls.__qualname__}.__init__"
            __init__.__wrapped__ = original  # type: ignore[attr-defined]
            try:
                cls.__init__ = __init__  # type: ignore[misc]
            except (TypeError, AttributeError):
                continue  # an immutable type: the excepthook still sees uncaught ones
            self._patched.append((cls, own))

    def uninstall(self) -> None:
        """Put back every hook this monitor replaced (those replaced again by
        someone else since are left alone: they chain to ours, which then
        only passes on)."""
        if not self.installed:
            return
        self.installed = False
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_excepthook
        if threading.excepthook == self._threading_excepthook:
            threading.excepthook = self._prev_threading_hook
        for cls, own in self._patched:
            try:
                if own is None:
                    del cls.__init__
                else:
                    cls.__init__ = own  # type: ignore[misc]
            except (TypeError, AttributeError):
                pass
        self._patched = []

    # -- the hooks ---------------------------------------------------------------
    def _on_error_created(self, exc: BaseException) -> None:
        """Every jax runtime error passes here when it is made: cheap unless
        its text says RESOURCE_EXHAUSTED."""
        if not self.installed or getattr(self._busy, "on", False):
            return
        try:
            text = exception_text(exc)
            if not is_oom_text(text):
                return
            thread = threading.current_thread().name
            trigger = {"how": "raised", "exception": type_name(exc), "message": text[:MESSAGE_CHARS],
                       "thread": thread, "uncaught": False}
            if thread.startswith("jaxtop"):
                # Made by jaxtop's own look at an array (its scan asking whether
                # it is ready): a computation that failed asynchronously, which
                # the program has not read (yet). Its read raises the same error.
                trigger["how"] = "failed_array"
            else:
                where = user_frame_of_stack(sys._getframe(1))
                if where is not None:
                    trigger["raised_at"] = where
            census = self.census(text, trigger)
            if census is not None:
                with self._lock:
                    self._by_exc[id(exc)] = census
                    while len(self._by_exc) > 16:
                        self._by_exc.pop(next(iter(self._by_exc)))
        except Exception:
            pass  # the program's own error must go on as it was

    def _on_uncaught(self, value: BaseException | None, tb: Any, thread: str) -> dict[str, Any] | None:
        if not self.installed or value is None:
            return None
        oom = find_oom_exception(value)
        if oom is None:
            return None
        text = exception_text(oom)
        with self._lock:
            census = self._by_exc.get(id(oom))
        if census is not None and census.get("trigger", {}).get("message") != text[:MESSAGE_CHARS]:
            census = None  # another exception that got the same id
        where = user_frame_of_traceback(tb) or user_frame_of_traceback(getattr(oom, "__traceback__", None))
        if census is not None:
            census["trigger"]["uncaught"] = True
            census["trigger"]["thread"] = thread
            if where is not None:
                census["trigger"]["raised_at"] = where
            self._publish(census, update=True)
            return census
        trigger = {"how": "uncaught", "exception": type_name(oom), "message": text[:MESSAGE_CHARS],
                   "thread": thread, "uncaught": True}
        if oom is not value:
            trigger["reported_as"] = type_name(value)
        if where is not None:
            trigger["raised_at"] = where
        return self.census(text, trigger, force=True)

    def _excepthook(self, etype: Any, value: Any, tb: Any) -> None:
        census = None
        try:
            census = self._on_uncaught(value, tb, threading.current_thread().name)
        except Exception:
            pass
        prev = self._prev_excepthook or sys.__excepthook__
        try:
            tb = _without_hooks(tb)
            if value is not None and tb is not value.__traceback__:
                value = value.with_traceback(tb)
        except Exception:
            pass
        try:
            prev(etype, value, tb)
        finally:
            self._say_where(census)

    def _threading_excepthook(self, args: Any) -> None:
        census = None
        try:
            name = args.thread.name if args.thread is not None else "?"
            census = self._on_uncaught(args.exc_value, args.exc_traceback, name)
        except Exception:
            pass
        prev = self._prev_threading_hook or threading.__excepthook__
        try:
            tb = _without_hooks(args.exc_traceback)
            if tb is not args.exc_traceback:
                args = threading.ExceptHookArgs((args.exc_type, args.exc_value.with_traceback(tb)
                                                 if args.exc_value is not None else None, tb, args.thread))
        except Exception:
            pass
        try:
            prev(args)
        finally:
            self._say_where(census)

    def _say_where(self, census: dict[str, Any] | None) -> None:
        """The one line after the program's traceback: where the census is."""
        if census is None or not self.note:
            return
        path = census.get("path")
        if path:
            text = f"jaxtop: out of memory: census written to {path} (read it with: jaxtop oom {path})\n"
        else:
            text = f"jaxtop: out of memory: the census could not be written: {census.get('file_error')}\n"
        try:
            stream = sys.stderr
            if stream is not None:
                stream.write(text)
                stream.flush()
        except Exception:
            pass

    # -- the allocator's lines (agent thread) --------------------------------------
    def on_allocator_line(self, text: str) -> None:
        """One ``O`` report from the stderr relay: an allocator or runtime
        line about memory running out. Called on whichever thread reads the
        relay's reports; never raises."""
        try:
            parsed = self.allocator.add(text)
            if parsed is not None and parsed["kind"] == "failure":
                with self._lock:
                    self._pending_line_t = time.monotonic()
        except Exception:
            pass

    def _maybe_census_from_line(self) -> None:
        """A failure line with no exception after :data:`GRACE_S`: the program
        may handle the failure out of Python's sight; take the census here."""
        with self._lock:
            pending = self._pending_line_t
            if pending is None or time.monotonic() - pending < GRACE_S:
                return
            self._pending_line_t = None
            recent = self._last_t and self._last_t >= pending - 5.0
        if recent:
            return
        event = self.allocator.latest()
        message = (event or {}).get("request", {}).get("text")
        self.census(message, {"how": "allocator_log", "thread": threading.current_thread().name, "uncaught": False},
                    sync=False)

    # -- taking a census -----------------------------------------------------------
    def _begin(self, force: bool) -> bool:
        with self._lock:
            if self._running:
                self.suppressed += 1
                return False
            now = time.monotonic()
            limited = len(self.censuses) >= MAX_CENSUSES or (self._last_t and now - self._last_t < MIN_INTERVAL_S)
            if limited and not (force and len(self.censuses) < MAX_CENSUSES + 1):
                self.suppressed += 1
                return False
            self._running = True
            self._last_t = now
            self._seq += 1
            return True

    def _sync_relay(self) -> None:
        """On GPU the allocator logged its failure just before the error:
        let the relay pass that line on before the census reads it."""
        agent = self.agent
        if agent is None or not getattr(agent, "running", False):
            return
        memory = getattr(agent, "memory", None)
        if memory is None or getattr(memory, "backend", "cpu") == "cpu":
            return
        try:
            agent.transfer_totals(sync_timeout_s=SYNC_S)
        except Exception:
            pass

    def _recent_records(self) -> list[dict[str, Any]]:
        """The agent's samples of the last :data:`TIMELINE_SPAN_S` seconds,
        thinned before decoding: a sample with a buffer map is tens of KB."""
        agent = self.agent
        if agent is None:
            return []
        import json

        lines: list[bytes] = []
        recent = getattr(agent, "recent_lines", None)
        if callable(recent):
            lines = list(recent(int(TIMELINE_SPAN_S / max(getattr(agent, "interval_s", 0.1), 0.01)) + 1))
        else:
            ring = getattr(agent, "_backfill", None)
            if ring is not None:
                first = ring.since(time.time() - TIMELINE_SPAN_S)
                lines = list(ring.lines(first, ring.end))
        lines = [line for line in lines if b'"type":"sample"' in line[:64]]
        if len(lines) > TIMELINE_POINTS:
            step = len(lines) / TIMELINE_POINTS
            lines = [lines[int(i * step)] for i in range(TIMELINE_POINTS - 1)] + [lines[-1]]
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def census(self, message: str | None, trigger: dict[str, Any], force: bool = False,
               sync: bool = True) -> dict[str, Any] | None:
        """Take, write and publish one census (rate limited, see
        :data:`MAX_CENSUSES` and :data:`MIN_INTERVAL_S`).

        Args:
            message: the error's text.
            trigger: how the OOM was seen (stored in the census).
            force: an uncaught OOM: taken even within :data:`MIN_INTERVAL_S`
                of the last census (the program is about to end).
            sync: first let the stderr relay pass on pending allocator lines.

        Returns:
            The census, or None when rate limited or already in progress.
        """
        if not self._begin(force):
            return None
        self._busy.on = True
        try:
            if sync:
                self._sync_relay()
            with self._lock:
                seq, suppressed = self._seq, self.suppressed
            census = build_census(
                message=message,
                trigger=trigger,
                allocator=self.allocator.latest(since=time.time() - ALLOCATOR_MATCH_S),
                records=self._recent_records if self.agent is not None else None,
                budget_s=self.budget_s,
                profile=self.profile,
                census_id=f"{os.getpid()}-{seq}",
            )
            if suppressed:
                census["suppressed_before"] = suppressed
            try:
                census["path"] = write_census(census, self.directory)
            except Exception as exc:
                census["path"] = None
                census["file_error"] = f"{type(exc).__name__}: {exc}"
            with self._lock:
                self.censuses.append(census)
            self._publish(census)
            return census
        finally:
            self._busy.on = False
            with self._lock:
                self._running = False

    def _publish(self, census: dict[str, Any], update: bool = False) -> None:
        """Queue the census for the stream; on an update, write its file again."""
        if update and census.get("path"):
            try:
                write_census(census, path=census["path"])
            except Exception:
                pass
        with self._lock:
            if not any(c is census for c in self._pending):
                self._pending.append(census)
        agent = self.agent
        if agent is not None and not update:
            try:
                where = census.get("path") or census.get("file_error")
                agent.post_event("oom", text=f"out of memory: {census.get('verdict')} (census: {where})",
                                 census_id=census.get("id"))
            except Exception:
                pass

    # -- the stream (agent thread) ---------------------------------------------------
    def take_records(self) -> list[dict[str, Any]]:
        """The census records not yet sent, for the agent to emit; called on
        the agent's thread once per tick. Also does the monitor's deferred
        work: the patch once jax is imported, the census of an allocator
        failure no exception followed."""
        if not self._patched and self.installed and jax_imported():
            self.on_jax_imported()
        if self._pending_line_t is not None:
            self._maybe_census_from_line()
        if not self._pending:
            return []
        with self._lock:
            out, self._pending = self._pending, []
        return [dict(c) for c in out]


class OomProbe:
    """The monitor as one of the agent's probes: installed when the agent
    starts (the hooks must be in before the program can run out of memory,
    jax imported or not), its census records sent on the agent's ticks,
    every hook taken out when the agent stops. It fills no sample field:
    a census is a record of its own (``oom_census``).

    Args:
        agent: the agent the censuses are posted to.
    """

    name = OOM_CENSUS
    needs_jax = False

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.monitor: OomMonitor | None = None
        self.reason: str | None = None

    def start(self) -> None:
        self.monitor = install(self.agent)

    def on_jax_imported(self) -> None:
        if self.monitor is not None:
            self.monitor.on_jax_imported()

    def on_allocator_line(self, text: str) -> None:
        monitor = self.monitor
        if monitor is not None:
            monitor.on_allocator_line(text)

    def on_tick(self, tick: Any) -> None:
        if self.monitor is not None:
            for census in self.monitor.take_records():
                tick.emit(census)
        return None

    def stop(self) -> None:
        monitor, self.monitor = self.monitor, None
        if monitor is not None and current() is monitor:
            uninstall()


_monitor: OomMonitor | None = None
_install_lock = ForkLock()


def install(agent: Any = None, *, directory: str | None = None, budget_s: float = DEFAULT_BUDGET_S,
            note: bool | None = None, profile: bool = True) -> OomMonitor:
    """Start taking OOM censuses in this process (idempotent).

    Installs the exception hooks (chained to the ones in place), patches
    jax's runtime error class now or, if jax is not imported yet, on
    :meth:`OomMonitor.on_jax_imported` / the agent's next tick, and, with
    an agent, posts an ``oom`` event to it for each census (the agent's
:class:`OomProbe` sends the census records).

    Args:
        agent: the running agent (``jaxtop.instrument().agent``), or None to
            write census files only.
        directory: where census files go (default ``$JAXTOP_OOM_DIR`` or the
            working directory, read at each census).
        budget_s: seconds one census may take.
        note: the one-line note on stderr after an uncaught OOM's traceback;
            default: on with an agent (under ``jaxtop run``/``instrument()``),
            off without.
        profile: take the device memory profile for allocation sites.

    Returns:
        The process's monitor (the one already installed, if any: its agent
        is set when it had none).
    """
    global _monitor
    with _install_lock:
        if _monitor is not None and _monitor.installed:
            if _monitor.agent is None and agent is not None:
                _monitor.agent = agent
                if note is None:
                    _monitor.note = True
            return _monitor
        monitor = OomMonitor(agent, directory=directory, budget_s=budget_s,
                             note=(agent is not None) if note is None else note, profile=profile)
        monitor._install()
        _monitor = monitor
        return monitor


def uninstall() -> None:
    """Undo :func:`install` (hooks and the patch)."""
    global _monitor
    with _install_lock:
        if _monitor is not None:
            _monitor.uninstall()
            _monitor = None


def current() -> OomMonitor | None:
    """The installed monitor, or None."""
    return _monitor if _monitor is not None and _monitor.installed else None


def _without_hooks(tb: Any) -> Any:
    """jaxtop's hook frames out of a traceback (``jaxtop.probes.frames.without_hooks``).

    Imported when used: the stderr relay imports this package without jaxtop."""
    from jaxtop.probes.frames import without_hooks

    return without_hooks(tb)
