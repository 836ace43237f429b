"""The host-sync probe's numpy wrappers pass every call on as numpy takes it,
can be turned off from the environment, and its locks are new in a forked
child (a lock another thread held at the fork would never be released)."""

from __future__ import annotations

import os
import sys
import threading
import warnings

import pytest


@pytest.fixture
def probe_class(jax_cpu, monkeypatch):
    monkeypatch.delenv("JAXTOP_NUMPY_HOOKS", raising=False)
    from jaxtop.probes.host_sync import HostSyncProbe

    return HostSyncProbe


def outcome(fn):
    try:
        value = fn()
    except Exception as exc:
        return ("raised", type(exc), str(exc))
    return ("returned", type(value), value.tolist() if hasattr(value, "tolist") else value,
            getattr(value, "dtype", None), getattr(value, "shape", None))


def test_the_wrappers_pass_every_call_shape_on_as_numpy_takes_it(probe_class):
    import numpy as np

    host = np.arange(6.0).reshape(2, 3)
    calls = [
        lambda: np.asarray(),
        lambda: np.array(),
        lambda: np.array(a=5),  # not numpy's name for it: numpy refuses it, so must the wrapper
        lambda: np.asarray(a=[1, 2]),
        lambda: np.array(object=[3]),
        lambda: np.asarray([1, 2], np.int8),
        lambda: np.asarray([1, 2], dtype=np.int8, order="F"),
        lambda: np.array([[1]], ndmin=3),
        lambda: np.array(host, copy=False, dtype=np.int64),  # numpy 2: cannot avoid a copy
        lambda: np.asanyarray(host, None),
        lambda: np.asarray(host, None, None, None),
    ]
    plain = [outcome(c) for c in calls]
    probe = probe_class(numpy_hooks=True)
    probe.start()
    try:
        assert probe.numpy_wrapped
        wrapped = [outcome(c) for c in calls]
        assert np.asarray(host) is host
    finally:
        probe.stop()
    assert wrapped == plain


def test_a_jax_array_with_more_arguments_is_one_read_of_its_kind(probe_class):
    import jax.numpy as jnp
    import numpy as np

    probe = probe_class(numpy_hooks=True)
    probe.start()
    try:
        line = sys._getframe().f_lineno
        a = np.asarray(jnp.arange(3.0), np.float32)  # +1
        b = np.array(jnp.arange(3.0), dtype=np.int32, ndmin=2)  # +2
        counts = {k[1]: v for k, v in probe.counts().items() if k[0] == __file__}
    finally:
        probe.stop()
    assert a.dtype == np.float32 and b.shape == (1, 3) and b.dtype == np.int32
    assert counts == {line + 1: {"asarray": 1}, line + 2: {"array": 1}}


@pytest.mark.parametrize("value, wrapped", [("0", False), ("off", False), ("1", True), ("on", True), ("", False)])
def test_jaxtop_numpy_hooks_in_the_environment_decides_auto(probe_class, monkeypatch, value, wrapped):
    import numpy as np

    monkeypatch.setenv("JAXTOP_NUMPY_HOOKS", value)
    original = np.asarray
    probe = probe_class()  # "auto": numpy untouched unless the environment asks for its wrappers
    probe.start()
    try:
        assert probe.started and probe.numpy_wrapped is wrapped
        assert (np.asarray is not original) is wrapped
        assert probe.snapshot()["numpy_hooks"] is wrapped
    finally:
        probe.stop()
    assert np.asarray is original


def test_by_default_numpy_is_untouched_item_is_counted_and_the_gap_is_said(probe_class):
    import jax.numpy as jnp
    import numpy as np

    from jaxtop.probes.host_sync import array_class_state

    before = array_class_state()
    probe = probe_class()
    probe.start()
    try:
        assert not probe.numpy_wrapped and np.asarray is before["numpy"]["asarray"]
        x = jnp.arange(3.0)
        line = sys._getframe().f_lineno
        np.asarray(x)  # numpy reads the CPU buffer in C: no jax hook sees it
        x[1].item()  # jax's Python: counted without numpy's wrappers
        float(x[2])
        counts = {k[1]: v for k, v in probe.counts().items() if k[0] == __file__}
        probe.sample()  # the backend is up: the probe learns it has a CPU device
        snap = probe.snapshot()
    finally:
        probe.stop()
    assert counts == {line + 2: {"item": 1}, line + 3: {"float": 1}}
    assert "np.asarray/np.array of CPU arrays not counted" in snap["uncounted"]
    assert "JAXTOP_NUMPY_HOOKS=1" in snap["uncounted"]
    # As the dashboard reads it: decoded whole, the note under the syncs.
    from jaxtop.dashboard.holders import fold_records
    from jaxtop.wire.records import from_dict

    rec = from_dict({"type": "sample", "t": snap["t"], "host_syncs": snap})
    assert rec.odd == ()
    view = fold_records([rec])
    assert view.syncs_uncounted == snap["uncounted"] and view.syncs_available and view.syncs_total == 2
    after = array_class_state()
    assert all(after[k][n] is v for k in before for n, v in before[k].items())


def test_a_budget_turns_the_wrappers_on_unless_the_environment_refuses(probe_class, monkeypatch):
    import jax.numpy as jnp
    import numpy as np

    probe = probe_class()
    probe.start()
    try:
        assert probe.count_numpy_reads() and probe.numpy_wrapped
        np.asarray(jnp.ones(2))
        assert probe.total == 1 and "uncounted" not in probe.snapshot()
    finally:
        probe.stop()
    monkeypatch.setenv("JAXTOP_NUMPY_HOOKS", "0")
    original = np.asarray
    probe = probe_class()
    probe.start()
    try:
        assert probe.count_numpy_reads() is False and np.asarray is original
        probe.sample()
        assert "(JAXTOP_NUMPY_HOOKS=0)" in probe.snapshot()["uncounted"]
    finally:
        probe.stop()


def _fork_while_held(lock, child) -> int:
    """Fork while another thread holds ``lock``; the child runs ``child``
    and exits 0, or is ended by SIGALRM after 5 s (it hung). Returns the
    child's exit code (negative: the signal that ended it)."""
    held, release = threading.Event(), threading.Event()

    def holder():
        with lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert held.wait(5)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # JAX's own: forking a multithreaded program
            pid = os.fork()
        if pid == 0:
            code = 1
            try:
                import signal

                signal.alarm(5)  # its default action ends the child
                child()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)
    finally:
        release.set()
        t.join()


def test_a_forked_child_counts_although_another_thread_held_the_counts_lock(probe_class):
    probe = probe_class(numpy_hooks=False)
    probe.start()
    try:
        assert _fork_while_held(probe._lock, lambda: (probe.counts(), probe.reset(), probe.snapshot())) == 0
    finally:
        probe.stop()


def test_a_forked_child_starts_a_probe_although_another_thread_held_the_install_lock(probe_class):
    from jaxtop.probes import host_sync

    def start_and_stop():
        p = probe_class(numpy_hooks=False)
        p.start()
        assert p.started
        p.stop()

    assert _fork_while_held(host_sync._install_lock, start_and_stop) == 0


FAILING_READS = """\
import sys
import jax.numpy as jnp
x = jnp.arange(3.0)
try:
    float(x)  # more than one element
except TypeError:
    sys.excepthook(*sys.exc_info())
x.item()  # the same, through jax's item(): the program's own traceback ends it
"""


def test_a_failing_read_prints_the_traceback_it_prints_without_jaxtop(child_env, tmp_path):
    import subprocess

    from conftest import PY

    script = tmp_path / "failing_reads.py"
    script.write_text(FAILING_READS)
    plain = subprocess.run([PY, str(script)], env=child_env, capture_output=True, text=True, timeout=120)
    under = subprocess.run([PY, "-m", "jaxtop", "run", str(script)], env=child_env, capture_output=True, text=True,
                           timeout=120)
    assert plain.returncode == under.returncode == 1
    assert "can only convert an array of size 1" in plain.stderr and "jaxtop" not in plain.stderr
    assert under.stderr == plain.stderr
