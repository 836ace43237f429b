"""The transfer-sites probe with jax's own hooks in this process: the post
hook on real jitted calls, the slow path's handlers, jax_debug_nans still
raising through the chain, thread-local hooks; the hook's life in a program
that stops transferring (out, back at the relay's first report), and what it
keeps bounded (code objects, file names, worked-out lines) against generated
code. The pure matching is in tests/test_transfer_sites.py."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

from jaxtop.probes.base import Tick
from jaxtop.probes.transfer_sites import NUMPY, PY_SCALAR
from test_transfer_sites import NEW_JAX, _probe, _stamp

# -- the probe in this process ------------------------------------------------------------------

@pytest.fixture
def installed():
    pytest.importorskip("jax")
    probe = _probe()
    probe.start()
    assert probe.reason is None, probe.reason
    yield probe
    probe.stop()


def test_the_hook_notes_each_fast_path_call_with_the_users_line(installed):
    import jax
    import jax.numpy as jnp

    f = jax.jit(lambda x, y: x * y)
    x = jnp.ones(3)
    f(x, 2.0)  # compiles: the slow path
    installed._calls.clear()
    for _ in range(5):
        f(x, 2.0)
    line = sys._getframe().f_lineno - 1
    calls = list(installed._calls)
    assert len(calls) == 5
    assert {(r[3].co_filename, installed._keys.line_of(r[3], r[4])) for r in calls} == {(__file__, line)}


def test_the_slow_path_notes_what_it_copied(installed):
    import jax

    g = jax.jit(lambda x, n: x + n)
    installed._slow.clear()
    g(np.ones((2, 3), np.float32), 1.5)  # first call: arguments sharded in Python
    described = {(a.name, a.kind, a.shape) for r in installed._slow for a in r[4]}
    if not NEW_JAX:  # jax before 0.5: cache_miss holds no function to name the parameters by
        described = {(("x", "n")[int(name[3:])], kind, shape) for name, kind, shape in described}
    assert described == {("x", NUMPY, "float32[2,3]"), ("n", PY_SCALAR, "float[]")}


def test_an_explicit_put_is_noted_only_where_the_guard_logs_it(installed):
    """``jax.device_put`` goes through the same shard-argument handlers as a
    jitted call's slow path; the guard logs it only at ``log_explicit``. A
    note for a put no line ties to cost ~30 µs (65-90 % of a small put):
    it is noted only where its line will come, and the implicit copy of a
    jitted call's first call still is."""
    import jax

    if installed._explicit_unlogged is None:
        pytest.skip("this jax keeps no explicit-put state on the thread")
    installed._slow.clear()
    jax.device_put(np.ones((2, 3), np.float32))
    assert not installed._slow
    with jax.transfer_guard_host_to_device("log_explicit"):
        jax.device_put(np.ones((2, 3), np.float32))
    assert len(installed._slow) == 1 and installed._slow[0][4]
    installed._slow.clear()
    jax.jit(lambda x: x * 2)(np.ones((2, 4), np.float32))  # first call: arguments sharded in Python
    assert installed._slow


def _in_a_fresh_thread(fn):
    """``fn()`` on a new thread: one with no thread-local jax settings (jax
    leaves a thread's own post hook None after any debug_nans(False) block,
    and earlier tests in this process ran some on the main thread)."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    if "error" in out:
        raise out["error"]
    return out.get("value")


def test_debug_nans_still_raises_through_the_chained_hook(installed):
    """jax_debug_nans uses the same hook: switched on after jaxtop's, jaxtop
    puts its own back in front and calls jax's after it, whose error is the
    program's."""
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_debug_nans", True)
    try:
        installed.on_tick(Tick(now=time.time(), slow=True))
        h = jax.jit(lambda x: jnp.sqrt(x) + 0.0)

        def body():
            h(jnp.ones(2))
            before = len(installed._calls)
            with pytest.raises(FloatingPointError):
                h(-jnp.ones(2)).block_until_ready()
            return len(installed._calls) > before

        assert _in_a_fresh_thread(body)  # raised, and jaxtop noted the call
    finally:
        jax.config.update("jax_debug_nans", False)
    installed.on_tick(Tick(now=time.time(), slow=True))
    f, x = jax.jit(lambda x: jnp.log(x)), jnp.ones(2)
    f(x)
    before = len(installed._calls)
    f(x)
    assert len(installed._calls) == before + 1  # still noting calls with debug_nans off again


def test_calls_are_noted_after_jax_sets_a_threads_own_hook(installed):
    """jax evaluates some ops under ``debug_nans(False)`` (core.jaxpr_as_fun),
    which leaves the thread's own post hook None: the global one was then
    never called on that thread again (flax's nnx.jit train steps on the main
    thread went unnoticed)."""
    import jax
    from jax._src import config

    f, x = jax.jit(lambda x: x + 1), jax.numpy.ones(2)
    f(x)
    with config.debug_nans(False):
        pass
    before = len(installed._calls)
    f(x)
    assert len(installed._calls) == before + 1
    if not NEW_JAX:
        return  # jax before 0.5: a thread's own hook (debug_nans) replaces the global one: no note there
    with jax.debug_nans(True):  # the user's own setting for the thread: jax's check still runs, after jaxtop's note
        g = jax.jit(lambda x: jax.numpy.log(x) + 0.0)
        g(x)
        before = len(installed._calls)
        with pytest.raises(FloatingPointError):
            g(-x).block_until_ready()
        assert len(installed._calls) > before


def test_stop_gives_jax_its_hook_and_handlers_back():
    pytest.importorskip("jax")
    from jax._src import api
    from jax._src.interpreters import pxla

    from jaxtop.probes.transfer_sites import _hook_slot

    handlers = dict(pxla.shard_arg_handlers)
    probe = _probe()
    probe.start()
    slot = _hook_slot(api)
    assert slot.get_global() is probe._our_hook
    probe.stop()
    assert slot.get_global() is None
    assert pxla.shard_arg_handlers == handlers



def test_notes_set_aside_while_nothing_transfers_still_tie_a_late_line():
    """A quiet tick reads no note (a program that transfers nothing costs the
    agent nothing per call), but keeps them a few ticks for a line the relay
    reports late; one reported later than that is unattributed, never tied
    to a later call."""
    from jaxtop.probes.transfer_sites import HELD_TICKS

    probe, me = _probe(), threading.get_native_id()
    t0 = time.time() - 5
    probe._calls.append((threading.get_ident(), t0 + 0.001, "step", None, -1))
    probe.on_tick(Tick(now=time.time()))  # quiet: set aside, unread
    assert not probe._by_thread and len(probe._held) == 1
    probe.take_stamps(_stamp("h2d", me, t0))
    field = probe.on_tick(Tick(now=time.time()))
    assert field["unattributed"] == {} and sum(s["count_total"] for s in field["sites"]) == 1
    # Too late: the note went with the quiet ticks, and a later call must not take its line.
    probe._calls.append((threading.get_ident(), t0 + 1.001, "step", None, -1))
    for _ in range(HELD_TICKS + 1):
        probe.on_tick(Tick(now=time.time()))
    probe._calls.append((threading.get_ident(), t0 + 2.0, "step", None, -1))  # a later call
    probe.take_stamps(_stamp("h2d", me, t0 + 1.0))
    field = probe.on_tick(Tick(now=time.time()))
    assert field["unattributed"] == {"h2d": 1} and "relay was more than" in " ".join(field["unattributed_reasons"])


def test_the_hook_leaves_a_program_that_stopped_transferring_and_comes_back(installed):
    import jax

    from jaxtop.probes.transfer_notes import _hook_slot
    from jax._src import api

    installed.quiet_s = 0.0  # leaves at the first slow tick
    f, x = jax.jit(lambda x: x + 1), jax.numpy.ones(2)
    slot = _hook_slot(api)
    installed.on_tick(Tick(now=time.time(), slow=True))  # the rate's first mark
    for _ in range(2000):
        f(x)
    time.sleep(0.05)
    installed.on_tick(Tick(now=time.time(), slow=True))
    assert slot.get_global() is not installed._our_hook and not installed._active  # out: calls run nothing of ours
    before = len(installed._calls)
    f(x)
    assert len(installed._calls) == before
    installed.take_stamps(_stamp("h2d", threading.get_native_id(), time.time()))
    field = installed.on_tick(Tick(now=time.time()))
    assert slot.get_global() is installed._our_hook and installed._active  # a transfer: back in
    assert "hook was out" in " ".join(field["unattributed_reasons"])


def test_code_objects_no_note_needs_are_let_go(monkeypatch):
    """A program that makes code at run time (exec in a loop) must not grow
    the table of code objects the notes' keys name without end."""
    from jaxtop.probes import transfer_keys

    monkeypatch.setattr(transfer_keys, "MAX_CODES", 20)
    probe, me = _probe(), threading.get_native_id()
    t0 = time.time() - 60
    for k in range(60):  # each call from a code object of its own, half a second apart, the line tied
        code = compile("pass", f"/w/gen{k}.py", "exec")
        probe._calls.append((threading.get_ident(), t0 + k * 0.5 + 0.01, "step", code, 0))
        probe.take_stamps(_stamp("h2d", me, t0 + k * 0.5))
        field = probe.on_tick(Tick(now=t0 + k * 0.5 + 0.05))
    assert len(probe._keys.codes) <= 2 * transfer_keys.MAX_CODES
    listed = sum(s["count_total"] for s in field["sites"]) + (field["other"] or {}).get("count_total", 0)
    assert field["sites_total"] == 60 and listed == 60 and field["unattributed"] == {}


def test_notes_of_more_code_objects_than_kept_settle_their_lines_and_let_go(monkeypatch):
    """Within the notes' seconds alone, more code objects than MAX_CODES
    (generated code at thousands of functions a second): their lines are
    worked out while the code is held, the code objects let go, and each
    line still goes to its own file and line when its transfer comes later."""
    import gc
    import weakref

    from jaxtop.probes import transfer_keys

    monkeypatch.setattr(transfer_keys, "MAX_CODES", 20)
    probe, me = _probe(), threading.get_native_id()
    t0 = time.time() - 10
    refs = []

    def note(k: int) -> None:  # the call of line k, from a code object of its own (line 3 at offset 4)
        code = compile("\n\nx = 1\n", f"/w/gen{k}.py", "exec")
        refs.append(weakref.ref(code))
        probe._calls.append((threading.get_ident(), t0 + k * 0.01 + 0.001, "step", code, 4))

    for k in range(30):
        note(k)
    probe.take_stamps(_stamp("h2d", me, t0))  # line 0 now: the 30 notes are filed
    probe.on_tick(Tick(now=t0 + 0.35))
    for k in range(30, 40):
        note(k)
    probe.take_stamps(_stamp("h2d", me, t0 + 0.01))  # line 1: 30 code objects > 20, the notes settle
    probe.on_tick(Tick(now=t0 + 0.45))
    keys = probe._keys.table.keys
    assert keys and all(key[0] == "w" for key in keys[:30] if key is not None)
    probe.take_stamps(_stamp("h2d", me, *(t0 + k * 0.01 for k in range(2, 40))))  # the rest, late
    field = probe.on_tick(Tick(now=t0 + 0.5))
    got = {(s["file"], s["line"], s["count_total"]) for s in field["sites"]}
    assert field["sites_total"] == 40 and field["unattributed"] == {}, field
    assert len(field["sites"]) < 40 or got == {(f"/w/gen{k}.py", 3, 1) for k in range(40)}, got
    gc.collect()
    assert all(ref() is None for ref in refs[:30]), "settled notes still hold their code objects"


def _make_it_leave(probe, f, x) -> None:
    """2,000 jitted calls without a transfer between two slow ticks, its
    quiet spell already over: the hook leaves at the second."""
    probe.on_tick(Tick(now=time.time(), slow=True))
    for _ in range(2000):
        f(x)
    time.sleep(0.05)
    probe.on_tick(Tick(now=time.time(), slow=True))
    assert not probe._active and probe._out_since is not None


def test_a_report_while_the_hook_is_out_puts_it_back_before_the_next_tick(installed):
    """The waker: the relay has something to report (a transfer was logged),
    and the hook goes back at once, from that moment; the next tick closes
    the spell there, and a report that carried no transfer closes it too
    (the hook then leaves again by the quiet rule)."""
    import jax

    from jaxtop.probes.transfer_notes import _hook_slot
    from jax._src import api

    installed.quiet_s = 0.0  # leaves at the first slow tick
    reported = threading.Event()
    installed.wait_report = lambda timeout_s: reported.wait(timeout_s)
    f, x = jax.jit(lambda x: x + 1), jax.numpy.ones(2)
    slot = _hook_slot(api)
    _make_it_leave(installed, f, x)
    before = time.time()
    reported.set()
    wait_for = time.monotonic() + 5
    while not installed._active and time.monotonic() < wait_for:
        time.sleep(0.01)
    assert installed._active and slot.get_global() is installed._our_hook  # back, no tick needed
    back = installed._back_at
    assert back is not None and back >= before
    installed.on_tick(Tick(now=time.time() + 5))  # no stamps came: the spell still ends where the hook came back
    assert installed._out_since is None and installed._back_at is None
    assert installed._hook_out[-1][1] == back


def test_transfers_that_come_back_soon_keep_the_hook_in_longer(installed):
    """The hook leaves after a short quiet spell (it costs every jitted call
    ~1 us while in); a program whose transfers come back soon after it left
    (an evaluation every few seconds) doubles the wait each time, and one
    whose spell was long (training, then evaluation) does not."""
    import jax

    f, x = jax.jit(lambda x: x + 1), jax.numpy.ones(2)

    def leave_and_return(spell_s: float) -> None:
        _make_it_leave(installed, f, x)
        installed._out_since -= spell_s - 0.05  # as if it had been out that long
        installed.take_stamps(_stamp("h2d", threading.get_native_id(), time.time()))
        installed.on_tick(Tick(now=time.time()))
        assert installed._active

    installed.quiet_s = 0.01
    leave_and_return(0.05)
    assert installed.quiet_s == 0.02
    leave_and_return(0.05)
    assert installed.quiet_s == 0.04
    leave_and_return(120.0)
    assert installed.quiet_s == 0.04


def _sealed_seconds(probe, t: float, seconds: int, kept: int, beyond: int) -> float:
    """``seconds`` slow ticks, each after ``kept`` lines tied to kept lines
    and ``beyond`` given up as beyond them (the table of lines full)."""
    from jaxtop.probes.transfer_sites import TOO_MANY_LINES

    for _ in range(seconds):
        probe._give_up("h2d", TOO_MANY_LINES, beyond)
        probe.lines_kept += kept
        t += 1.0
        probe.on_tick(Tick(now=t, slow=True))
    return t


def test_the_hook_leaves_while_nearly_every_line_is_beyond_the_kept_ones(installed):
    """Generated code past the table of lines: every call's line is given up
    as "not kept apart", and the hook cost each call more than JAX's own
    logging did. After SEALED_AFTER_TICKS seconds of that the hook leaves
    for a spell that a transfer does not end (transfers are what go on), the
    lines made meanwhile are given up with the spell's reason, and it comes
    back when the spell is over, to look again; a program whose lines are
    mostly kept ones keeps it in."""
    from jaxtop.probes.transfer_sites import MAX_SITES
    from jaxtop.probes.transfer_spells import SEALED_AFTER_TICKS, SEALED_SPELL_S, spell_reason

    installed.kept_files = frozenset({"kept.py"})  # the table of lines full
    t = time.time()
    installed.on_tick(Tick(now=t, slow=True))
    t = _sealed_seconds(installed, t, SEALED_AFTER_TICKS + 3, kept=400, beyond=500)
    assert installed._active, "kept lines made 44 % of the lines: the hook stays"
    t = _sealed_seconds(installed, t, SEALED_AFTER_TICKS, kept=10, beyond=500)
    assert not installed._active and installed._out_since is not None

    installed.take_stamps(_stamp("h2d", threading.get_native_id(), t + 0.5))
    installed.tie_soon()
    installed.on_tick(Tick(now=t + 1.0, slow=True))
    assert not installed._active, "a transfer does not end a sealed spell"
    reasons = installed.field()["unattributed_reasons"]
    assert reasons.get(spell_reason("sealed", MAX_SITES)) == 1, reasons

    installed.on_tick(Tick(now=t + SEALED_SPELL_S + 0.5, slow=True))
    assert installed._active
    # Still sealed when it looks again: the next spell is twice as long.
    t = _sealed_seconds(installed, t + SEALED_SPELL_S + 0.5, SEALED_AFTER_TICKS + 1, kept=0, beyond=500)
    assert not installed._active and installed.sealed_spell_s == 2 * SEALED_SPELL_S


def test_generated_code_does_not_grow_what_the_probe_keeps(installed):
    """A program that makes a function per call with exec, each with a file
    of its own: the hook's file names, the library filter's answers and the
    lines worked out stay within their caps (they grew without end: 400,000
    generated functions took the program from 222 to 482 MB)."""
    import jax

    from jaxtop.probes import transfer_keys, transfer_notes
    from jaxtop.probes.frames import LIBRARY, MAX_FILES_CACHED

    step = jax.jit(lambda x: x + 1)
    value = jax.numpy.ones(2)
    step(value)
    n = transfer_notes.MAX_FILES + 500
    codes = []
    for i in range(n):
        namespace = {"step": step, "value": value}
        exec(compile("def gen():\n    return step(value)\n", f"<generated {i}>", "exec"), namespace)
        namespace["gen"]()
        codes.append(namespace["gen"].__code__)
    assert len(installed._user) <= transfer_notes.MAX_FILES
    assert len(LIBRARY._cache) <= MAX_FILES_CACHED and len(LIBRARY._core_cache) <= MAX_FILES_CACHED
    for code in codes:
        installed._keys.line_of(code, 0)
    assert len(installed._keys._lines) <= transfer_keys.MAX_LINES_CACHED + 1


def test_sealed_calls_one_after_another_on_a_thread_are_one_note_at_the_newest_time():
    """Past the lines kept apart, calls from other files are noted SEALED;
    a run of them on one thread is one note whose time moves to the newest
    call (every line before it ties to a SEALED note either way), and a new
    note starts where another note came between or the agent took it."""
    from jaxtop.probes.transfer_notes import SEALED, CallNotes

    notes = CallNotes(enabled=False)
    notes._note_sealed()
    first = notes._calls[-1]
    notes._note_sealed()
    notes._note_sealed()
    assert len(notes._calls) == 1 and notes._calls[0] is first and first[4] == SEALED
    t_moved = first[1]
    notes._calls.append((threading.get_ident(), time.perf_counter(), object(), None, 0))  # another note between
    notes._note_sealed()
    assert len(notes._calls) == 3 and notes._calls[-1] is not first and first[1] == t_moved

    taken = notes._calls.pop()  # the agent took the newest note
    notes._note_sealed()
    assert len(notes._calls) == 3 and notes._calls[-1] is not taken  # a note of its own, not lost

    other: list = []
    thread = threading.Thread(target=lambda: (notes._note_sealed(), other.append(notes._calls[-1])))
    thread.start()
    thread.join()
    assert len(notes._calls) == 4 and other[0][0] != threading.get_ident()  # another thread's run: its own note


# -- naming what a jitted callable runs, without running the program's code ----------------------

def test_wrappers_are_followed_to_the_function_whose_parameters_name_the_arguments():
    """Flax NNX's ``nnx.jit`` hands jax a ``JitFn`` object whose own
    ``__wrapped__`` is the user's step: one level down, the step's arguments
    were named ``arg2``, ``arg3['image']`` (Flax's MNIST example under
    jaxtop) instead of ``batch['image']``. Every level is read from the
    wrappers' own ``__dict__``: a property named ``__wrapped__`` is not run,
    and a cycle of wrappers ends."""
    jax = pytest.importorskip("jax")
    from jaxtop.probes.callee_names import _unwrapped
    from jaxtop.probes.transfer_notes import CallNotes

    def train_step(model, optimizer, batch):
        return batch

    class JitFnLike:  # a callable object, as NNX's JitFn is
        def __init__(self, f):
            self.__wrapped__ = f

        def __call__(self, *args):
            return self.__wrapped__(*args)

    class Hostile:
        @property
        def __wrapped__(self):
            raise RuntimeError("ran the program's property")

        def __call__(self, *args):
            return 0

    notes = CallNotes(enabled=False)
    assert notes._name_of(jax.jit(JitFnLike(train_step))) == ("train_step", False, ("model", "optimizer", "batch"))
    # (jax.jit itself refuses these two: the wrappers are read alone.)
    a, b = JitFnLike(None), JitFnLike(None)
    a.__wrapped__, b.__wrapped__ = b, a
    assert _unwrapped(a) in (a, b)
    hostile = Hostile()
    assert _unwrapped(hostile) is None and _unwrapped(JitFnLike(hostile)) is hostile


def test_a_flax_nnx_step_s_arguments_are_named_by_the_step():
    pytest.importorskip("jax")
    nnx = pytest.importorskip("flax.nnx")
    from jax._src import api

    from jaxtop.probes.transfer_notes import CallNotes

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(4, 4, rngs=rngs)

    @nnx.jit
    def train_step(model, batch):
        return model.linear(batch["image"])

    model, batch = Model(nnx.Rngs(0)), {"image": np.ones((2, 4), np.float32)}
    train_step(model, batch)
    seen = []
    # This thread's own hook (an earlier test may have left one that would
    # hide a global one), put back after.
    before = api._post_hook_state.swap_local(lambda fun, args, kwargs, out: seen.append(fun))
    try:
        train_step(model, batch)
    finally:
        api._post_hook_state.swap_local(before)
    assert [CallNotes(enabled=False)._name_of(f) for f in seen] == [("train_step", False, ("model", "batch"))]
