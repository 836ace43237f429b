"""Pure layer: the process, compile and donation probes, in-process with real jax (CPU)."""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import warnings
from pathlib import Path

import pytest

from jaxtop.probes import donation as donation_mod
from jaxtop.probes.compile import CompileProbe
from jaxtop.probes.donation import MESSAGE_PREFIX, DonationProbe
from jaxtop.probes.process import ProcessProbe

_fresh = itertools.count(1)


# -- ProcessProbe --------------------------------------------------------------------


def test_process_probe_on_this_process():
    probe = ProcessProbe()
    assert probe.pid == os.getpid()
    out = probe.sample()
    assert out["rss_bytes"] > 10 * 1024 * 1024  # a Python with jax loaded
    assert out["vms_bytes"] >= out["rss_bytes"]
    assert out["threads"] >= 1
    assert isinstance(out["cpu_percent"], float) and out["cpu_percent"] >= 0.0
    # ru_maxrss (KiB on Linux) is the true peak: never below the current RSS.
    assert out["peak_rss_bytes"] >= out["rss_bytes"] * 0.99


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="procfs")
def test_the_resident_set_s_parts_are_the_kernel_s_and_shared_memory_shows():
    """A program whose RSS is mostly a runtime's shared buffers (a TPU host
    read 14.5 GiB for 176 MiB of arrays) shows which part: 64 MiB of
    shared memory mapped and touched here move ``rss_shmem_bytes`` by
    about that, not ``rss_anon_bytes``; the parts add up to the kernel's
    VmRSS."""
    import mmap

    probe = ProcessProbe()
    try:
        before = probe.sample(slow=True)
        size = 64 << 20
        fd = os.memfd_create("jaxtop-test")
        try:
            os.ftruncate(fd, size)
            with mmap.mmap(fd, size) as shared:
                for at in range(0, size, mmap.PAGESIZE):
                    shared[at] = 1
                after = probe.sample(slow=True)
                with open("/proc/self/status") as f:
                    status = {k: v for k, _, v in (line.partition(":") for line in f)}
        finally:
            os.close(fd)
    finally:
        probe.close()
    grew = after["rss_shmem_bytes"] - before["rss_shmem_bytes"]
    assert 0.95 * size <= grew <= 1.1 * size, (before, after)
    assert after["rss_anon_bytes"] - before["rss_anon_bytes"] < size / 4
    parts = after["rss_anon_bytes"] + after["rss_file_bytes"] + after["rss_shmem_bytes"]
    assert abs(parts - int(status["VmRSS"].split()[0]) * 1024) < 16 << 20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="procfs")
def test_process_probe_procfs_path_agrees_with_psutil():
    import threading

    import psutil

    probe = ProcessProbe()
    assert probe._files is not None
    before = probe.sample()["rss_bytes"]
    # bytearray(n) is calloc'd: fresh mmap'd zero pages that are not resident
    # until written, so whether it counted depended on the heap's state. A
    # repeated byte is written out: every page resident, and at 64 MiB (over
    # glibc's 32 MiB mmap threshold ceiling) given back to the OS on del.
    ballast = bytearray(b"\x01") * (64 * 1024 * 1024)
    stop = threading.Event()
    extra = threading.Thread(target=stop.wait)
    extra.start()
    try:
        out = probe.sample(slow=True)
        mem = psutil.Process().memory_info()
        assert out["rss_bytes"] > before + 48 * 1024 * 1024
        assert abs(out["rss_bytes"] - mem.rss) < 8 * 1024 * 1024
        assert abs(out["vms_bytes"] - mem.vms) < 64 * 1024 * 1024
        assert out["threads"] == psutil.Process().num_threads()
    finally:
        stop.set()
        extra.join()
    del ballast
    # The kept-open files are read afresh: RSS follows the process down.
    assert probe.sample()["rss_bytes"] < out["rss_bytes"] - 32 * 1024 * 1024
    assert probe.sample(slow=True)["threads"] == out["threads"] - 1


def test_process_probe_falls_back_to_psutil_when_procfs_fails():
    probe = ProcessProbe()
    if probe._files is None:
        pytest.skip("no procfs here: psutil is the only path")
    os.close(probe._files.statm)
    probe._files.statm = -1  # the next pread fails with EBADF
    out = probe.sample()
    assert probe._files is None
    assert out["rss_bytes"] > 10 * 1024 * 1024
    assert out["peak_rss_bytes"] >= out["rss_bytes"] * 0.99


def test_process_probe_cpu_percent_sees_work():
    probe = ProcessProbe()
    sum(i * i for i in range(2_000_000))
    assert probe.sample()["cpu_percent"] > 0.0


def test_process_probe_of_another_pid_has_no_peak():
    probe = ProcessProbe(pid=os.getppid())
    out = probe.sample()
    assert "peak_rss_bytes" not in out  # getrusage only knows about us
    assert out["rss_bytes"] > 0


def test_process_probe_peak_is_never_below_the_current_rss():
    from types import SimpleNamespace

    from jaxtop.probes.process import _peak_rss_bytes

    # ru_maxrss is updated lazily and read at another moment than RSS: it
    # can lag below the RSS just read (seen: "RSS 467 MiB (peak 466 MiB)").
    lagging = SimpleNamespace(ru_maxrss=466 * 1024 if sys.platform != "darwin" else 466 << 20)
    assert _peak_rss_bytes(lagging, 467 << 20) == 467 << 20
    assert _peak_rss_bytes(lagging, 100 << 20) == 466 << 20


def test_process_probe_reports_the_process_start_not_the_probe_start():
    import time

    import psutil

    probe = ProcessProbe()
    out = probe.sample()
    # This process started before the probe (the pytest run is older).
    assert abs(out["started_t"] - psutil.Process().create_time()) < 1.5
    assert out["started_t"] <= time.time()
    # Another process: its own start time, from the same source.
    parent = ProcessProbe(pid=os.getppid()).sample()
    assert abs(parent["started_t"] - psutil.Process(os.getppid()).create_time()) < 1.5


def test_start_ticks_survive_odd_command_names():
    from jaxtop.probes.process import start_ticks

    fields = " ".join(str(i) for i in range(3, 53)).replace("22", "123456", 1)
    assert start_ticks(f"4242 (a) b (c) d) {fields}".encode()) == 123456
    assert start_ticks(f"1 (python3) {fields}".encode()) == 123456


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="procfs")
def test_process_start_time_from_procfs_matches_psutil():
    import psutil

    from jaxtop.probes.process import process_start_time

    assert abs(process_start_time(os.getpid()) - psutil.Process().create_time()) < 1.5
    assert process_start_time(2**22 + 12345) is None  # no such process: None, no exception


def test_process_that_vanished_is_a_reason_not_an_exception():
    import psutil

    probe = ProcessProbe()

    class Gone:
        @contextlib.contextmanager
        def oneshot(self):
            yield

        def memory_info(self):
            raise psutil.NoSuchProcess(probe.pid)

    probe._proc = Gone()
    probe.close()  # off procfs, onto psutil
    out = probe.sample()
    assert out["available"] is False
    assert "psutil" in out["reason"]


# -- CompileProbe -----------------------------------------------------------------------


@pytest.fixture
def compile_probe():
    probe = CompileProbe()
    probe.start()
    try:
        yield probe
    finally:
        probe.stop()


def _new_function():
    """A function jax has never compiled (a fresh closure constant)."""
    import jax

    k = float(next(_fresh)) + 0.5

    @jax.jit
    def f(x):
        return x * k + 1.0

    return f


def test_compile_count_and_seconds(compile_probe):
    import jax.numpy as jnp

    assert compile_probe.active and compile_probe.reason is None
    compile_probe.sample()  # start a clean interval
    x = jnp.ones((4,), jnp.float32)
    _new_function()(x).block_until_ready()
    _new_function()(x).block_until_ready()
    out = compile_probe.sample()
    assert out["count"] >= 2
    assert out["count_total"] >= 2
    assert out["seconds_total"] > 0.0


def test_cached_call_does_not_count(compile_probe):
    import jax.numpy as jnp

    f = _new_function()
    x = jnp.ones((4,), jnp.float32)
    f(x).block_until_ready()
    before = compile_probe.sample()["count_total"]
    for _ in range(5):
        f(x).block_until_ready()
    after = compile_probe.sample()
    assert after["count"] == 0
    assert after["count_total"] == before
    f(jnp.ones((5,), jnp.float32)).block_until_ready()  # a new shape recompiles
    assert compile_probe.sample()["count"] >= 1


def test_compile_probe_unregisters_on_stop():
    from jax._src import monitoring

    from jaxtop.probes import compile_events
    from jaxtop.probes.executables import JitLedgerProbe

    ours = compile_events.listener(compile_events.DURATION), compile_events.listener(compile_events.EVENT)
    probe, other, ledger = CompileProbe(), CompileProbe(), JitLedgerProbe(explain=False)
    probe.start()
    other.start()
    ledger.start()
    assert ledger._on_duration in compile_events.subscribers(compile_events.DURATION)
    # Three probes, one jaxtop listener per kind in jax's lists.
    assert monitoring.get_event_duration_listeners().count(ours[0]) == 1
    assert monitoring.get_event_listeners().count(ours[1]) == 1
    assert probe._on_duration in compile_events.subscribers(compile_events.DURATION)
    assert probe._on_event in compile_events.subscribers(compile_events.EVENT)
    ledger.stop()
    other.stop()
    probe.stop()
    assert probe._on_duration not in compile_events.subscribers(compile_events.DURATION)
    assert probe._on_event not in compile_events.subscribers(compile_events.EVENT)
    # The last subscriber out takes the listener out of jax.
    if not compile_events.subscribers(compile_events.DURATION):
        assert ours[0] not in monitoring.get_event_duration_listeners()
    if not compile_events.subscribers(compile_events.EVENT):
        assert ours[1] not in monitoring.get_event_listeners()
    total = probe.sample()["count_total"]
    import jax.numpy as jnp

    _new_function()(jnp.ones((2,))).block_until_ready()
    assert probe.sample()["count_total"] == total
    probe.stop()  # twice: harmless


# -- DonationProbe ---------------------------------------------------------------------


def _bad_donation():
    """A jitted function whose donated int32 input can never hold its output."""
    import jax
    import jax.numpy as jnp

    k = float(next(_fresh))

    @jax.jit
    def f(x):
        return jnp.zeros((3,), jnp.float32) + x.sum().astype(jnp.float32) + k

    return jax.jit(f, donate_argnums=0)


def _int_input(n):
    import jax.numpy as jnp

    return jnp.arange(n, dtype=jnp.int32)


@pytest.fixture
def donation_probe():
    probe = DonationProbe()
    probe.start()
    try:
        yield probe
    finally:
        probe.stop()


def test_donation_probe_patches_the_emitting_module(donation_probe):
    assert donation_probe.reason is None
    assert donation_probe._patched
    module = sys.modules["jax._src.interpreters.mlir"]
    assert isinstance(module.warnings, donation_mod._CountingWarnings)


def test_each_failed_donation_is_counted_and_still_shown(donation_probe):
    f = _bad_donation()
    donation_probe.sample()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        f(_int_input(4)).block_until_ready()
        f(_int_input(5)).block_until_ready()
        f(_int_input(6)).block_until_ready()
    ours = [w for w in seen if str(w.message).startswith(MESSAGE_PREFIX)]
    assert len(ours) == 3
    assert all(w.category is UserWarning for w in ours)
    out = donation_probe.sample()
    assert out["failed"] == 3
    assert out["failed_total"] == 3
    # Older jax (0.4.30) names the buffer "ShapedArray(int32[6])", newer jax "int32[6]".
    assert out["last_message"] in ("Some donated buffers were not usable: int32[6].",
                                   "Some donated buffers were not usable: ShapedArray(int32[6]).")
    assert donation_probe.sample()["failed"] == 0  # interval reset
    assert donation_probe.sample()["failed_total"] == 3


def test_counted_even_when_the_user_ignores_the_warning(donation_probe):
    f = _bad_donation()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("ignore")
        f(_int_input(7)).block_until_ready()
        f(_int_input(8)).block_until_ready()
    assert seen == []  # the user's filter still rules what they see
    assert donation_probe.sample()["failed"] == 2


def test_pytest_warns_sees_it_with_the_probe_installed(donation_probe):
    with pytest.warns(UserWarning, match="Some donated buffers were not usable"):
        _bad_donation()(_int_input(9)).block_until_ready()
    assert donation_probe.sample()["failed_total"] == 1


def test_warning_location_is_unchanged_by_the_probe():
    # stacklevel is passed on one frame up, so filters keyed on module or line
    # (and the "filename:lineno:" the user reads) see jax's own call site.
    def where():
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            _bad_donation()(_int_input(10)).block_until_ready()
        (w,) = [w for w in seen if str(w.message).startswith(MESSAGE_PREFIX)]
        return w.filename, w.lineno, w.category

    plain = where()
    probe = DonationProbe()
    probe.start()
    try:
        assert where() == plain
    finally:
        probe.stop()
    # The location is jax's own call site, not a frame of the probe (checked
    # by path, not by name: the checkout itself may be called "jaxtop").
    import jax

    assert Path(plain[0]).resolve().is_relative_to(Path(jax.__file__).parent.resolve()), plain[0]


def test_other_warnings_pass_through_uncounted(donation_probe):
    module = sys.modules["jax._src.interpreters.mlir"]
    with pytest.warns(DeprecationWarning, match="something else"):
        module.warnings.warn("something else", DeprecationWarning)
    with pytest.warns(UserWarning, match=MESSAGE_PREFIX):
        module.warnings.warn(UserWarning(MESSAGE_PREFIX + ": as an instance"))
    out = donation_probe.sample()
    assert out["failed_total"] == 1
    # Other attributes of the module reach the real one.
    assert module.warnings.catch_warnings is warnings.catch_warnings


def test_stop_restores_the_module_reference():
    module = sys.modules["jax._src.interpreters.mlir"]
    assert module.warnings is warnings
    probe = DonationProbe()
    probe.start()
    assert module.warnings is not warnings
    probe.stop()
    assert module.warnings is warnings
    probe.stop()  # twice: harmless
    assert module.warnings is warnings
    # Not counted any more.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _bad_donation()(_int_input(11)).block_until_ready()
    assert probe.sample()["failed_total"] == 0


def test_two_probes_do_not_wrap_each_other():
    module = sys.modules["jax._src.interpreters.mlir"]
    first, second = DonationProbe(), DonationProbe()
    first.start()
    try:
        second.start()  # finds a wrapper, not the real module: leaves it alone
        assert module.warnings._real is warnings
        assert all(m is not module for m, _ in second._patched)
    finally:
        second.stop()
        first.stop()
    assert module.warnings is warnings
