"""Noting, on the program's own threads, the moments an implicit transfer can end.

Nothing in Python runs around a transfer jaxlib makes, but three things run
on the thread that made it, right after it, and each leaves a note here
(the thread, the time, the user's frame, the function called):

* jax's *post hook* (the hook ``jax_debug_nans`` uses), which jaxlib calls
  after every fast-path call of a jitted function or an eager op;
* the *slow path*: a call that goes through Python shards each argument with
  ``pxla.shard_arg_handlers[type(arg)]``, a dict looked up on every call;
* a *host read*, through the host-sync probe's hook.

The notes are read on the agent's thread (:mod:`jaxtop.probes.transfer_sites`).
Cost in the program's thread: one hook call per jitted call, transfer or not
(``benchmarks/transfer_sites.py``); the hook is taken out while no implicit
transfer comes. ``JAXTOP_TRANSFER_SITES=0`` installs nothing.

Standard library only, and jax once it is imported.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable

from jaxtop.probes.forksafe import ForkLock
from jaxtop.probes.frames import HOOK_CODES, LIBRARY, MAX_FILES_CACHED, LibraryFilter, jitted_name, made_at_run_time
from jaxtop.probes.guard_levels import explicit_put_unlogged
from jaxtop.probes.callee_names import callee_of
from jaxtop.probes.transfer_values import MAX_ARGS, ArgInfo, describe_value, literal_kind

__all__ = ["CallNotes", "MAX_WALK", "RING", "SEALED"]

#: Notes the program's threads can leave between two of the agent's ticks
#: (100 ms apart): 650,000 jitted calls a second before any is lost; 325,000
#: while the agent, at its CPU ceiling, ticks 200 ms apart (the most it
#: stretches). A loss is counted, never guessed (transfer_sites).
RING = 1 << 16
#: File names the hook remembers as the user's or not (then forgotten all
#: at once: generated code can make a file name per function); the library
#: filter's own cache has the same bound.
MAX_FILES = MAX_FILES_CACHED
#: How often the thread that waits for a transfer while the hook is out
#: looks whether its spell ended otherwise (seconds).
WAKE_POLL_S = 1.0
#: Frames walked from the hook to the user's code at most.
MAX_WALK = 48
#: The instruction offset of a note made once no more lines are kept apart
#: (no function, no code object: its line can only be one of "the rest").
SEALED = -2


class _GlobalStateSlot:
    """jax before 0.5 keeps the post hook on jaxlib's global jit state."""

    def __init__(self, state: Any) -> None:
        self._state = state

    def get_global(self) -> Any:
        return self._state.post_hook

    def set_global(self, hook: Any) -> None:
        self._state.post_hook = hook


def _hook_slot(api: Any) -> Any:
    """Where this jax keeps the post hook it calls after every fast-path
    call: a config state (``api._post_hook_state``, jax 0.5 and later) or
    jaxlib's global jit state (``jax_jit.global_state().post_hook``)."""
    state = getattr(api, "_post_hook_state", None)
    if state is not None and hasattr(state, "get_global") and hasattr(state, "set_global"):
        return state
    jax_jit = getattr(api, "jax_jit", None)
    try:
        global_state = jax_jit.global_state() if jax_jit is not None else None
    except Exception:
        global_state = None
    if global_state is not None and hasattr(global_state, "post_hook"):
        return _GlobalStateSlot(global_state)
    return None


class CallNotes:
    """The hooks, and the notes they leave (``_calls``, ``_slow``, ``_reads_in``).

    Args:
        filt: what counts as library code (the user's line is the innermost
            frame outside it).
        enabled: False: nothing is installed (no transfers are captured).
    """

    def __init__(self, filt: LibraryFilter = LIBRARY, enabled: bool = True) -> None:
        self._filt = filt
        self.enabled = enabled
        # Noted on the program's threads, read on the agent's (perf_counter times):
        self._calls: deque = deque(maxlen=RING)  # after a fast-path call: (ident, t, fun, code, lasti[, args])
        self._slow: deque = deque(maxlen=RING)  # after a slow-path shard: (ident, t, callee, (code, line), args)
        self._reads_in: deque = deque(maxlen=RING)  # after a host read: (ident, t, site, kind)
        self._hook_in_t: float | None = None
        self._out_since: float | None = None
        # While the hook is out, a thread of jaxtop's waits on the relay's
        # reports and puts the hook back the moment one comes (a transfer
        # was logged), not at the agent's next tick: a program back from a
        # quiet spell (training, then evaluation) has its calls after the
        # first noted. ``_back_at``: when it did (read by the next tick).
        self.wait_report: Callable[[float], bool] | None = None
        self._back_at: float | None = None
        self._hook_lock = ForkLock()
        self._user: dict[str, bool] = {}  # file name -> is it the user's
        # The files of the kept lines once no more lines are kept apart (the
        # agent sets it when its table of lines is full; None before). A call
        # from a user file outside it is then noted as SEALED: it can only be
        # counted as one of "the rest", and nothing of it (its code object)
        # is held for the agent to work out.
        self.kept_files: frozenset[str] | None = None
        # id(function) -> calls of it still to describe. Keyed by id: a jitted
        # function may be unhashable (flax's nnx.jit wraps objects that define __eq__).
        self._want: dict[int, int] = {}
        self.described_notes = 0  # notes whose arguments were read, ever (the program's threads count them)
        self._prev_hook: Any = None
        self._our_hook: Any = None
        self._active = False  # the hook notes calls (False: taken out, or stopped)
        self._running = False  # started, with something to note calls by
        self._local_hooks: dict[int, Any] = {}  # id(jax's hook) -> ours chained to it, for thread-local settings
        self._debug_states: list[tuple[Any, Any]] = []  # (jax's debug_nans/infs state, its thread-local hook)
        self._hook_state: Any = None
        self._handlers: dict[Any, Any] = {}  # type -> the handler we replaced
        self._handler_table: Any = None
        # Whether a shard-argument call is an explicit put the guard will not log.
        self._explicit_unlogged: Callable[[], bool] | None = None
        self._np: Any = None
        self._array_type: Any = None
        self._tls = threading.local()
        self._names: dict[int, tuple[Any, tuple[str, bool, tuple[str, ...]]]] = {}
        self.reason: str | None = None

    def start(self) -> None:
        """Install the post hook and wrap the slow path's handlers (after ``import jax``)."""
        if not self.enabled:
            self.reason = "transfers are not captured (stderr capture is off): nothing to attribute"
            return
        if os.environ.get("JAXTOP_TRANSFER_SITES", "").strip().lower() in ("0", "off", "no", "false"):
            # The program's own threads then run no hook of jaxtop's.
            self.reason = "switched off ($JAXTOP_TRANSFER_SITES=0): transfers are counted, not tied to lines"
            return
        try:
            from jax._src import api
            from jax._src.interpreters import pxla
        except Exception as exc:  # a jax without them: say so
            self.reason = f"no jax post hook to attribute transfers with: {type(exc).__name__}: {exc}"
            return
        import numpy

        self._np = numpy
        try:
            import jax

            self._array_type = jax.Array
        except Exception:
            self._array_type = None
        state = _hook_slot(api)
        if state is None:
            self.reason = "this jax has no post hook for jitted calls: transfers are not attributed to lines"
        else:
            self._hook_state = state
            self._our_hook = self._make_hook()
            self._install_hook()
            self._keep_thread_local_hooks()
        table = getattr(pxla, "shard_arg_handlers", None)
        if isinstance(table, dict):
            self._explicit_unlogged = explicit_put_unlogged()
            self._handler_table = table
            self._wrap_handlers()
        self._running = self._hook_state is not None or self._handler_table is not None

    def _keep_thread_local_hooks(self) -> None:
        """jax sets the post hook per thread too, whenever ``debug_nans`` or
        ``debug_infs`` is set for a thread, and jax does so itself: an op
        evaluated through ``core.jaxpr_as_fun`` runs under
        ``debug_nans(False)``, after which the thread's own hook is None and
        the global one (jaxtop's) is never called on it again (flax's
        ``nnx.jit`` train steps on the main thread went unnoticed). After each
        such setting, jaxtop's hook goes in front of what jax set there."""
        from jax._src import config

        state = self._hook_state
        if not hasattr(state, "get_local") or not hasattr(state, "set_local"):
            return  # jax before 0.5: a thread's None falls back to the global hook
        for name in ("debug_nans", "debug_infs"):
            debug = getattr(config, name, None)
            original = getattr(debug, "_update_thread_local_hook", None)
            if original is None or getattr(original, "_jaxtop_original", None) is not None:
                continue

            def update(value: Any, original: Any = original) -> None:
                original(value)
                self._fix_thread_local()

            update._jaxtop_original = original  # type: ignore[attr-defined]
            try:
                debug._update_thread_local_hook = update
            except Exception:
                continue
            self._debug_states.append((debug, original))
        self._fix_thread_local()

    def _fix_thread_local(self) -> None:
        """This thread's post hook, as jax just set it, with jaxtop's in front."""
        state = self._hook_state
        try:
            local = state.get_local()
            owner = getattr(local, "_jaxtop_notes", None)
            if owner is not None and owner is not self:
                # A stopped agent's hook, left on this thread: ours, calling what it called.
                chained = getattr(local, "_jaxtop_chained", None)
                local = self._prev_hook if chained == "global" else chained
            elif owner is self:
                return
            if local is None:
                state.set_local(self._local_hooks.setdefault(0, self._make_hook(chained=None)))
            elif callable(local) and getattr(local, "__code__", None) not in HOOK_CODES:
                hook = self._local_hooks.get(id(local))
                if hook is None:
                    hook = self._local_hooks[id(local)] = self._make_hook(chained=local)
                state.set_local(hook)
        except Exception:
            pass

    def stop(self) -> None:
        self._active = self._running = False
        for debug, original in self._debug_states:
            try:
                debug._update_thread_local_hook = original
            except Exception:
                pass
        self._debug_states.clear()
        state, ours = self._hook_state, self._our_hook
        if state is not None and ours is not None:
            try:
                if state.get_global() is ours:
                    state.set_global(self._prev_hook)
            except Exception:
                pass
        table = self._handler_table
        if table is not None:
            for t, original in self._handlers.items():
                if getattr(table.get(t), "_jaxtop_original", None) is original:
                    table[t] = original
            self._handlers.clear()

    def on_read(self, site: tuple[str, int, str], kind: str, t: float) -> None:
        """A host read the host-sync probe counted (on the reading thread)."""
        self._reads_in.append((threading.get_ident(), time.perf_counter(), site, kind))

    def _make_hook(self, chained: Any = "global") -> Callable[..., None]:
        """The hook; after its note it calls jax's own hook: the global one
        (``chained="global"``), the given one, or none (None)."""
        user = self._user
        want = self._want
        getframe, ident, clock = sys._getframe, threading.get_ident, time.perf_counter
        probe = self
        to_global = chained == "global"

        # Every jitted call of the program runs this, transfer or not: each
        # step was timed (benchmarks/transfer_sites.py; about 0.3 us of
        # Python on a 2020s x86 core). The common case is straight-line code:
        # a caller in a file already known to be the user's, nothing asked.
        # The deque is looked up on each call: the agent swaps in a fresh one
        # while nothing transfers. The record is the least that identifies
        # the call: the line is worked out on the agent's thread from the
        # code object and the instruction offset (a frame's f_lineno decodes
        # the line table), the wall time from perf_counter, and the dict is
        # keyed by file name (a code object's hash reads its whole bytecode).
        def jaxtop_transfer_sites_hook(fun: Any, args: Any, kwargs: Any, out: Any) -> None:
            if probe._active:  # False: taken out (a thread kept it locally): only jax's own below
                try:
                    frame = getframe(1)
                    code = frame.f_code
                    if user.get(code.co_filename) and not want:
                        # The common case: called from the user's own line, no arguments asked for.
                        probe._calls.append((ident(), clock(), fun, code, frame.f_lasti))
                    else:
                        probe._note_call(fun, args, kwargs, frame)
                except Exception:
                    pass
            prev = probe._prev_hook if to_global else chained
            if prev is not None:
                prev(fun, args, kwargs, out)  # the user's (jax_debug_nans): its errors are theirs

        HOOK_CODES.add(jaxtop_transfer_sites_hook.__code__)
        # Which notes it feeds and what it calls after, for a later agent in
        # this process to put its own in place of a stopped one's.
        jaxtop_transfer_sites_hook._jaxtop_notes = self  # type: ignore[attr-defined]
        jaxtop_transfer_sites_hook._jaxtop_chained = chained  # type: ignore[attr-defined]
        return jaxtop_transfer_sites_hook

    def _note_call(self, fun: Any, args: Any, kwargs: Any, frame: Any) -> None:
        """The hook's note where the caller is not (yet) known to be the
        user's, or the function's arguments were asked for: the user's frame
        is walked to (innermost outside library code), the arguments read."""
        kept = self.kept_files
        if kept is not None:
            filename = frame.f_code.co_filename
            if filename not in kept and made_at_run_time(filename):
                # Generated code once no more lines are kept apart: the
                # caller is the user's and in no kept file. Noted as such
                # without the walk, which would file its name in the caches
                # (a name a function, without end).
                self._note_sealed()
                return
        frame = self._user_frame(frame)
        if kept is not None and frame is not None and frame.f_code.co_filename not in kept:
            self._note_sealed()
            return
        site = (frame.f_code, frame.f_lasti) if frame is not None else (None, -1)
        if self._want and id(fun) in self._want:
            described = self._describe_call(fun, args, kwargs)
            self.described_notes += 1  # before the note: the agent looks for it when this moved
            self._calls.append((threading.get_ident(), time.perf_counter(), fun, *site, described))
        else:
            self._calls.append((threading.get_ident(), time.perf_counter(), fun, *site))

    def _note_sealed(self) -> None:
        """Note a SEALED call. Calls of one thread noted SEALED one after
        the other are one note, moved to the newest's time: a line ties to
        the first note after it on its thread, so every line of those calls
        ties to a SEALED note either way, and generated code (a file a
        function) costs no allocation a call. The note is a list whose time
        is set in place: set first, then looked for at the end of the
        notes; where the agent took it meanwhile, a new note is added (the
        agent read the new time, or reads it in the new note)."""
        ident = threading.get_ident()
        calls = self._calls
        now = time.perf_counter()
        try:
            last = calls[-1]
        except IndexError:
            last = None
        if last.__class__ is list and last[0] == ident:
            last[1] = now
            try:
                if calls[-1] is last:
                    return
            except IndexError:
                pass
        calls.append([ident, now, None, None, SEALED])

    def _describe_call(self, fun: Any, args: Any, kwargs: Any) -> tuple[ArgInfo, ...] | None:
        left = self._want.get(id(fun), 0) - 1
        if left <= 0:
            self._want.pop(id(fun), None)
        else:
            self._want[id(fun)] = left
        try:
            return self._describe_args(fun, args, kwargs)
        except Exception:
            return None

    def _describe_args(self, fun: Any, args: Any, kwargs: Any) -> tuple[ArgInfo, ...]:
        _, _, params = self._name_of(fun)
        info = getattr(fun, "_jit_info", None)
        static = set(getattr(info, "static_argnums", ()) or ())
        static_names = set(getattr(info, "static_argnames", ()) or ())
        out: list[ArgInfo] = []
        for i, value in enumerate(args):
            if i not in static:
                describe_value(params[i] if i < len(params) else f"arg{i}", value, self._np, self._array_type, out)
        for key, value in (kwargs or {}).items():
            if key not in static_names:
                describe_value(key, value, self._np, self._array_type, out)
        return tuple(out)

    def _wrap_handlers(self) -> None:
        table = self._handler_table
        if table is None:
            return
        for t, handler in list(table.items()):
            if getattr(handler, "_jaxtop_original", None) is not None or t in self._handlers:
                continue
            wrapped = self._wrap(handler)
            self._handlers[t] = handler
            table[t] = wrapped

    def _wrap(self, handler: Callable[..., Any]) -> Callable[..., Any]:
        tls = self._tls
        append = self._slow.append
        probe = self
        unlogged = self._explicit_unlogged

        def jaxtop_shard_arg(xs: Any, *rest: Any, **kw: Any) -> Any:
            if getattr(tls, "inside", False):  # a handler calling shard_args again: the outer one records
                return handler(xs, *rest, **kw)
            tls.inside = True
            try:
                result = handler(xs, *rest, **kw)
            finally:
                tls.inside = False
            try:
                if unlogged is not None and unlogged():
                    return result  # jax.device_put: no guard line to tie (see probes/guard_levels.py)
                frame = sys._getframe(1)
                site, callee = probe._user_site(frame)
                described, named = probe._slow_call_args(frame)
                callee = named or callee
                if not described:
                    described = tuple(ArgInfo("", *literal_kind(x)) for x in list(xs)[:MAX_ARGS])
                append((threading.get_ident(), time.perf_counter(), callee, site, described))
            except Exception:
                pass
            return result

        jaxtop_shard_arg._jaxtop_original = handler  # type: ignore[attr-defined]
        HOOK_CODES.add(jaxtop_shard_arg.__code__)
        return jaxtop_shard_arg

    def _slow_call_args(self, frame: Any) -> tuple[tuple[ArgInfo, ...], str | None]:
        """The call's host values, named, read from jax's ``cache_miss``
        frame above a slow-path shard (its ``args``, ``kwargs`` and the
        jitted Python function), and the function's name as the hook names
        it (a pmapped function's, not pmap's inner ``_fun``); ``((), None)``
        where there is none (an eager op's internals, another jax)."""
        depth = 0
        while frame is not None and depth < MAX_WALK:
            code = frame.f_code
            if code.co_name == "cache_miss" and code.co_filename.endswith("pjit.py"):
                local = frame.f_locals
                fun, info = local.get("fun"), local.get("jit_info")
                args, kwargs = local.get("args") or (), local.get("kwargs") or {}
                name, _, params = self._name_of(fun)
                static = set(getattr(info, "static_argnums", ()) or ())
                static_names = set(getattr(info, "static_argnames", ()) or ())
                out: list[ArgInfo] = []
                for i, value in enumerate(args):
                    if i not in static:
                        describe_value(params[i] if i < len(params) else f"arg{i}", value, self._np,
                                       self._array_type, out)
                for key, value in kwargs.items():
                    if key not in static_names:
                        describe_value(key, value, self._np, self._array_type, out)
                return tuple(out), (name if fun is not None and name != "?" else None)
            frame = frame.f_back
            depth += 1
        return (), None

    def _user_site(self, frame: Any) -> tuple[Any, str | None]:
        """(the user's (code, line), the jitted function's name) above a slow-path frame."""
        callee = jitted_name(frame)
        frame = self._user_frame(frame)
        return ((frame.f_code, frame.f_lineno) if frame is not None else None), callee

    def _user_frame(self, frame: Any) -> Any:
        """The innermost frame from ``frame`` out that is the user's (outside
        library code), within :data:`MAX_WALK` frames; None if there is none."""
        user = self._user
        depth = 0
        while frame is not None and depth < MAX_WALK:
            filename = frame.f_code.co_filename
            mine = user.get(filename)
            if mine is None:
                if len(user) >= MAX_FILES:
                    user.clear()  # exec'd code names files without end: bounded, asked again
                mine = user[filename] = not self._filt.is_library(filename)
            if mine:
                return frame
            frame = frame.f_back
            depth += 1
        return None

    def _install_hook(self) -> None:
        with self._hook_lock:
            self._install_hook_locked()

    def _install_hook_locked(self) -> None:
        state, ours = self._hook_state, self._our_hook
        if state is None or ours is None:
            return
        try:
            current = state.get_global()
            if current is not ours:
                self._prev_hook = current  # jax's own (debug_nans) or None: called after ours
                state.set_global(ours)
                self._hook_in_t = time.time()
            self._active = True
        except Exception as exc:
            self.reason = f"jax's post hook could not be set: {type(exc).__name__}: {exc}"

    def _take_hook_out(self, now: float, wake: bool = True) -> None:
        """The program's jitted calls run nothing of jaxtop's until the hook
        is back: with the next transfer (``wake``: a thread waits on the
        relay's reports for it), else when the agent's tick puts it back."""
        with self._hook_lock:
            state, ours = self._hook_state, self._our_hook
            try:
                if state is not None and state.get_global() is ours:
                    state.set_global(self._prev_hook)
            except Exception:
                return
            self._out_since = now
            self._back_at = None
            self._hook_in_t = None
            self._active = False
        wait = self.wait_report if wake else None
        if wait is not None:
            try:
                threading.Thread(target=self._wake_on_report, args=(wait, now), name="jaxtop-hook-waker",
                                 daemon=True).start()
            except Exception:
                pass  # no thread: the next tick that sees a transfer puts the hook back

    def _wake_on_report(self, wait: Callable[[float], bool], since: float) -> None:
        """Wait for the relay's next report while the hook is out (the spell
        that began at ``since``), then put the hook back at once. Ends when
        the spell does, or the probe stops."""
        try:
            while self._running and self._out_since == since:
                if not wait(WAKE_POLL_S):
                    continue
                with self._hook_lock:
                    if self._running and self._out_since == since and self._back_at is None:
                        self._install_hook_locked()
                        self._back_at = time.time()
                return
        except Exception:
            return  # never into the program: the tick's own path still brings the hook back

    def _name_of(self, fun: Any) -> tuple[str, bool, tuple[str, ...]]:
        """(name, is it one of jax's own ops, parameter names) of a jitted function."""
        if isinstance(fun, str) or fun is None:
            return (fun or "?", False, ())
        kept = self._names.get(id(fun))
        if kept is not None and kept[0]() is fun:
            return kept[1]
        known = callee_of(fun)
        try:
            ref = weakref.ref(fun)
        except TypeError:
            return known
        if len(self._names) >= 10000:
            self._names.clear()
        self._names[id(fun)] = (ref, known)
        return known
