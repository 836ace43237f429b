"""Which line makes each implicit transfer: the agent's side (probes/transfer_sites.py).

Pure layer first (the stamps' clock, the matching of lines to the calls
noted on their thread, what is said when a line has no call), then a real
program under ``jaxtop run``. The probe on real jitted calls in this process
(the post hook, the slow path, jax_debug_nans still raising, the hook going
out and back, its bounds) is in tests/test_transfer_sites_hook.py.
The per-line counts of whole programs are checked against JAX's own guard
errors in tests/test_transfer_sites_oracle.py.
"""

from __future__ import annotations

import json
import subprocess
import struct
import sys
import threading
import time

import numpy as np
import pytest

from jaxtop.probes.base import Tick
from jaxtop.probes.transfer_sites import MATCH_WINDOW_S, NUMPY, PY_SCALAR, TransferSitesProbe, describe_value, parse_stamps


def _new_jax() -> bool:
    try:
        from jax._src import api
    except ImportError:
        return False
    return hasattr(api, "_post_hook_state")


#: jax 0.5 and later: the post hook is a config state, per thread too.
NEW_JAX = _new_jax()


def _stamp(direction: str, native: int, *times: float) -> bytes:
    """The relay's run of stamps: the lines' Unix times as doubles, in hex."""
    return f"{direction},{native},".encode() + struct.pack(f"{len(times)}d", *times).hex().encode()


class _Code:
    """Stands for a code object: what the matcher reads of one."""

    def __init__(self, filename: str, name: str) -> None:
        self.co_filename, self.co_name = filename, name


def _probe() -> TransferSitesProbe:
    probe = TransferSitesProbe()
    probe._native = {threading.get_native_id(): threading.get_ident()}
    probe._offset_fixed = 0.0  # the records below are given in wall time
    probe._running = True  # as if started: the records are made by hand
    probe.tie_every = 1  # every tick ties its lines (the agent batches five)
    return probe


def _call(probe: TransferSitesProbe, t: float, line: int, callee: str = "step", described=None,
          ident: int | None = None) -> None:
    """A call noted at wall time ``t`` (as the slow path notes one: its line known)."""
    probe._slow.append((ident or threading.get_ident(), t, callee, (_Code("/w/train.py", "main"), line), described))


def _sites(field) -> dict[tuple[str, int, str], int]:
    return {(s["direction"], s["line"], s["callee"]): s["count_total"] for s in field["sites"]}


# -- pure: the relay's stamps --------------------------------------------------------------

def test_a_stamp_reads_back_as_the_moment_it_was_written():
    now = time.time()
    (direction, native, times), = parse_stamps(_stamp("h2d", 77, now - 0.25), now)
    assert (direction, native, times.tolist()) == ("h2d", 77, [now - 0.25])


def test_runs_of_stamps_keep_their_order_and_their_threads():
    now = time.time()
    data = _stamp("h2d", 9, now - 0.5, now - 0.45, now - 0.4) + b" " + _stamp("d2d", 9, now - 0.4) + b" " + _stamp(
        "h2d", 10, now - 0.3)
    groups = parse_stamps(data, now)
    assert [(d, n, ts.tolist()) for d, n, ts in groups] == [
        ("h2d", 9, [now - 0.5, now - 0.45, now - 0.4]), ("d2d", 9, [now - 0.4]), ("h2d", 10, [now - 0.3])]


def test_a_threads_runs_from_several_reports_are_read_together_in_order():
    now = time.time()
    data = b" ".join([_stamp("h2d", 9, now - 0.9, now - 0.8), _stamp("d2h", 9, now - 0.7),
                      _stamp("h2d", 9, now - 0.6), b"h2d,9," + b"zz" * 8, _stamp("h2d", 9, now - 0.5)])
    assert [(d, n, ts.tolist()) for d, n, ts in parse_stamps(data, now)] == [
        ("h2d", 9, [now - 0.9, now - 0.8, now - 0.6, now - 0.5]), ("d2h", 9, [now - 0.7])]


def test_malformed_stamps_are_skipped():
    now = time.time()
    good = _stamp("d2d", 3, now)
    assert [g[0] for g in parse_stamps(b"h2d,1 nonsense h2d,x,00ff h2d,2,00ff " + good, now)] == ["d2d"]
    assert parse_stamps(b"h2d,1 nonsense h2d,x,12:00:00.0 h2d,2,zz", now) == []
    # Within a run only what can be a line's time counts (not nan, inf, negative, a day old or minutes ahead).
    (_, _, times), = parse_stamps(_stamp("h2d", 4, now - 1, float("nan"), -3.0, float("inf"), now - 2 * 86400,
                                         now + 3600, now - 0.5), now)
    assert times.tolist() == [now - 1, now - 0.5]


# -- pure: lines to calls ---------------------------------------------------------------------

def test_each_line_goes_to_the_first_call_after_it_on_its_thread():
    probe, me = _probe(), threading.get_native_id()
    t0 = time.time() - 1.0
    # Call A at line 10 logs two lines, then returns (its record); call B at line 20 one line.
    _call(probe, t0 + 0.000010, 10)
    _call(probe, t0 + 0.000050, 20, callee="sin")
    probe.take_stamps(b" ".join([_stamp("h2d", me, t0 + 0.000002), _stamp("h2d", me, t0 + 0.000004),
                                 _stamp("h2d", me, t0 + 0.000030)]))
    field = probe.on_tick(Tick(now=time.time()))
    assert _sites(field) == {("h2d", 10, "step"): 2, ("h2d", 20, "sin"): 1}
    assert field["unattributed"] == {} and field["pending"] == 0
    calls = {s["line"]: s["calls_total"] for s in field["sites"]}
    assert calls == {10: 1, 20: 1}  # two lines of one call


def test_lines_are_tied_in_batches_of_ticks_and_none_is_lost():
    from jaxtop.probes.transfer_sites import TIE_EVERY_TICKS

    probe, me = _probe(), threading.get_native_id()
    probe.tie_every = TIE_EVERY_TICKS
    t0 = time.time() - 2.0
    fields = []
    for k in range(2 * TIE_EVERY_TICKS):
        _call(probe, t0 + k * 0.01 + 0.001, 10 + k % 2)
        probe.take_stamps(_stamp("h2d", me, t0 + k * 0.01))
        # Ticks 0.13 s apart (an agent at its CPU ceiling): each batch spans 1.3 s.
        fields.append(probe.on_tick(Tick(now=t0 + 0.5 + 0.13 * k)))
    tied = [f for f in fields if f is not None]
    assert len(tied) == 2 and fields[TIE_EVERY_TICKS - 1] is tied[0]  # one field a batch
    assert tied[0]["history_s"] is None and tied[1]["history_s"] == pytest.approx(0.13 * TIE_EVERY_TICKS)
    assert _sites(tied[-1]) == {("h2d", 10, "step"): TIE_EVERY_TICKS, ("h2d", 11, "step"): TIE_EVERY_TICKS}
    assert tied[-1]["unattributed"] == {} and tied[-1]["pending"] == 0
    # One history entry a batch, holding that batch's lines.
    def made(line: int, batch: int) -> int:  # calls at this line in that batch (lines alternate)
        return sum(1 for k in range(batch * TIE_EVERY_TICKS, (batch + 1) * TIE_EVERY_TICKS) if 10 + k % 2 == line)

    assert {site["line"]: site["history"] for site in tied[-1]["sites"]} == {
        line: [made(line, 0), made(line, 1)] for line in (10, 11)}


def test_the_field_names_only_what_the_wire_types_name_and_decodes_clean(monkeypatch):
    """Every key the probe writes is a field of the dashboard's types
    (:class:`jaxtop.wire.records.TransferSites`): one renamed on one side
    only would read n/a there, silently, as an unknown key does."""
    import msgspec

    from jaxtop.probes import transfer_sites
    from jaxtop.probes.transfer_values import ArgInfo
    from jaxtop.wire.records import TransferArg, TransferSite, TransferSites, TransferSitesOther, decode

    monkeypatch.setattr(transfer_sites, "SITES_SENT", 1)  # the second line goes to `other`
    probe, me = _probe(), threading.get_native_id()
    t0 = time.time() - 10
    args = (ArgInfo("batch['x']", NUMPY, "float32[8,4]", 128), ArgInfo("lr", PY_SCALAR, "float[]", 4))
    _call(probe, t0 + 0.000010, 10, described=args)
    _call(probe, t0 + 0.000030, 20, callee="sin")
    # Two lines of the first call, one of the second, one no call follows (unattributed).
    probe.take_stamps(b" ".join([_stamp("h2d", me, t0, t0 + 0.000002), _stamp("h2d", me, t0 + 0.000020),
                                 _stamp("h2d", me, t0 + 5.0)]))
    probe.on_tick(Tick(now=time.time() - 0.1))
    field = probe.on_tick(Tick(now=time.time(), final=True))  # a second history entry: history_s measured

    def names(cls) -> set[str]:
        return {f.encode_name for f in msgspec.structs.fields(cls)}

    assert set(field) == names(TransferSites) - {"error"}  # written alone, by jaxtop.agent.probe_list, where it raised
    assert set(field["other"]) == names(TransferSitesOther)
    (site,) = field["sites"]
    # ``same`` is written only where two calls' values were compared (these
    # were read once): tests/test_transfer_args_same.py has it on the wire.
    assert set(site) == names(TransferSite) and all(set(a) == names(TransferArg) - {"same"} for a in site["args"])
    assert field["unattributed"] == {"h2d": 1} and field["history_s"] is not None and site["history"]
    rec = decode(json.dumps({"type": "sample", "t": time.time(), "transfer_sites": field}))
    assert rec.odd == () and rec.transfer_sites == msgspec.convert(field, TransferSites)
    assert rec.transfer_sites.sites[0].args[0] == TransferArg(name="batch['x']", kind=NUMPY, shape="float32[8,4]",
                                                              bytes=128)
    assert rec.transfer_sites.other.count_total == 1


def test_a_lines_arguments_say_whose_call_they_are_when_another_callee_is_shown():
    """A line that calls two things: ``uniform(k, minval=a, maxval=b)``
    described, then an op at the same line whose call was not read. The
    line shows the latest callee; its arguments are the other's, and say so."""
    from jaxtop.probes.transfer_values import ArgInfo

    probe = _probe()
    where = ("/w/train.py", 10, "main")
    scalars = (ArgInfo("minval", PY_SCALAR, "float[]", 4), ArgInfo("maxval", PY_SCALAR, "float[]", 4))
    resolved = {"a": (where, "uniform", False, scalars, False, None), "b": (where, "dynamic_slice", True, None, False, None)}
    probe._resolve = lambda note: resolved[note[0]]
    t = time.time()
    probe._credit("h2d", ("a",), t, 2, 1)
    (site,) = probe.field()["sites"]
    assert (site["callee"], site["args_of"]) == ("uniform", None)
    probe._credit("h2d", ("b",), t + 0.01, 1, 1)
    (site,) = probe.field()["sites"]
    assert site["callee"] == "dynamic_slice (op)" and [a["name"] for a in site["args"]] == ["minval", "maxval"]
    assert site["args_of"] == "uniform"


def test_a_line_waits_for_its_call_to_return():
    probe, me = _probe(), threading.get_native_id()
    t0 = time.time()
    probe.take_stamps(_stamp("h2d", me, t0))
    assert probe.on_tick(Tick(now=t0 + 0.1))["pending"] == 1  # the call is still running
    _call(probe, t0 + 0.2, 30)
    field = probe.on_tick(Tick(now=t0 + 0.3))
    assert _sites(field) == {("h2d", 30, "step"): 1} and field["pending"] == 0


def test_a_line_no_call_follows_is_unattributed_with_the_reason_never_guessed():
    probe, me = _probe(), threading.get_native_id()
    t0 = time.time() - 10
    probe.take_stamps(_stamp("h2d", me, t0))
    _call(probe, t0 + MATCH_WINDOW_S + 1.0, 40)  # a later call, too late to be the one
    field = probe.on_tick(Tick(now=time.time()))
    assert field["sites"] == []
    assert field["unattributed"] == {"h2d": 1}
    assert list(field["unattributed_reasons"]) == ["no jax call returned after it on its thread"]


def test_a_line_of_an_unknown_thread_is_unattributed():
    """A thread id that is none of this process's (Linux thread ids are the
    machine's): another process wrote to the program's stderr."""
    probe = _probe()
    t0 = time.time() - 1
    _call(probe, t0 + 0.001, 10)
    probe.take_stamps(_stamp("h2d", 999_999_999, t0))
    field = probe.on_tick(Tick(now=time.time()))
    assert field["unattributed"] == {"h2d": 1} and "another process" in next(iter(field["unattributed_reasons"]))


def test_a_line_of_a_thread_of_this_process_without_python_says_so():
    import os

    pytest.importorskip("jax")
    import jax

    jax.numpy.ones(2).block_until_ready()  # XLA's own threads exist
    python = {t.native_id for t in threading.enumerate()}
    native = next((int(t) for t in os.listdir("/proc/self/task") if int(t) not in python), None)
    if native is None:
        pytest.skip("no thread without Python in this process")
    probe = _probe()
    t0 = time.time() - 1
    probe.take_stamps(_stamp("h2d", native, t0))
    field = probe.on_tick(Tick(now=time.time()))
    assert list(field["unattributed_reasons"]) == ["made by a thread without Python code"]


def test_a_thread_whose_calls_never_reached_the_hook_says_why():
    """Lines from a thread of the program that never left a note while the
    hook was in: the thread runs jax's post hook of its own."""
    probe, me = _probe(), threading.get_native_id()
    probe._active = True
    t0 = time.time() - 10
    probe.take_stamps(_stamp("h2d", me, t0))
    field = probe.on_tick(Tick(now=time.time()))
    (reason,) = field["unattributed_reasons"]
    assert "post hook of its own" in reason


def test_a_header_without_a_thread_is_matched_only_where_one_thread_calls_jax():
    """jaxlib before 0.5 (TSL's header) names no thread."""
    probe = _probe()
    t0 = time.time() - 1
    _call(probe, t0 + 0.001, 10)
    probe.take_stamps(_stamp("h2d", 0, t0))
    assert _sites(probe.on_tick(Tick(now=time.time()))) == {("h2d", 10, "step"): 1}
    # Two threads calling jax around the line: which one made it is unknowable.
    _call(probe, t0 + 0.5, 11)
    _call(probe, t0 + 0.5001, 12, ident=12345)
    probe.take_stamps(_stamp("h2d", 0, t0 + 0.4))
    field = probe.on_tick(Tick(now=time.time()))
    assert field["unattributed"] == {"h2d": 1} and "several threads" in next(iter(field["unattributed_reasons"]))


def test_a_host_read_line_goes_to_the_read_not_to_a_call():
    probe, me = _probe(), threading.get_native_id()
    t0 = time.time() - 1
    probe._reads_in.append((threading.get_ident(), t0 + 0.00002, ("/w/train.py", 50, "main"), "float"))
    _call(probe, t0 + 0.00001, 49)  # a call that returned between: not the read's
    probe.take_stamps(_stamp("d2h", me, t0))
    field = probe.on_tick(Tick(now=time.time()))
    assert _sites(field) == {("d2h", 50, "host read (float)"): 1}


def test_an_overflowing_ring_leaves_its_lines_unattributed(monkeypatch):
    from jaxtop.probes import transfer_sites

    monkeypatch.setattr(transfer_sites, "RING", 4)
    probe, me = _probe(), threading.get_native_id()
    probe._slow = transfer_sites.deque(maxlen=4)
    t0 = time.time() - 1
    for i in range(10):  # ten calls, the ring keeps the last four
        _call(probe, t0 + i * 0.001 + 0.0005, 60 + i)
    probe.take_stamps(b" ".join(_stamp("h2d", me, t0 + i * 0.001) for i in range(10)))
    field = probe.on_tick(Tick(now=time.time()))
    # Records older than the first one kept may be lost, one of them between
    # that record and the line before it: only the lines after it are matched.
    assert _sites(field) == {("h2d", 67, "step"): 1, ("h2d", 68, "step"): 1, ("h2d", 69, "step"): 1}
    assert field["unattributed"] == {"h2d": 7}


# -- pure: what was transferred ---------------------------------------------------------------

def test_a_calls_host_values_are_described_by_name_kind_shape_and_size():
    import jax

    out = []
    describe_value("batch", {"x": np.ones((8, 4), np.float32), "w": jax.numpy.ones(3), "n": [1.0, 2]}, np,
                   jax.Array, out)
    assert [(a.name, a.kind, a.shape, a.nbytes) for a in out] == [
        ("batch['x']", NUMPY, "float32[8,4]", 128),
        ("batch['n'][0]", "list of " + PY_SCALAR, "float[]", 4),
        ("batch['n'][1]", "list of " + PY_SCALAR, "int[]", 4),
    ]
    out = []
    describe_value("x", np.ones(3), np, jax.Array, out)  # float64: copied as float32 without jax_enable_x64
    assert out[0].nbytes == 12


# -- a real program under jaxtop run ---------------------------------------------------------------

PROGRAM = '''
import time
import numpy as np
import jax, jax.numpy as jnp

@jax.jit
def step(w, batch, lr):
    return w - lr * (batch["x"].sum() + batch["y"].sum())

w = jnp.ones((4,))
for i in range(40):
    batch = {"x": np.ones((8, 4), np.float32), "y": np.zeros((8,), np.float32)}
    w = step(w, batch, 0.1)  # LINE_STEP
    s = jnp.sin(np.ones(3, np.float32))  # LINE_SIN
    time.sleep(0.01)
'''


def _line(source: str, tag: str) -> int:
    return next(i for i, text in enumerate(source.splitlines(), 1) if tag in text)


@pytest.mark.slow
def test_a_program_under_jaxtop_run_names_every_line(tmp_path, child_env):
    program = tmp_path / "train.py"
    program.write_text(PROGRAM)
    log = tmp_path / "run.jsonl"
    res = subprocess.run([sys.executable, "-m", "jaxtop", "run", "--log", str(log), str(program)],
                         capture_output=True, text=True, timeout=120, env=child_env)
    assert res.returncode == 0, res.stderr[-2000:]
    samples = [json.loads(line) for line in log.read_text().splitlines()]
    field = [s["transfer_sites"] for s in samples if s.get("type") == "sample" and s.get("transfer_sites")][-1]
    counts = {(s["line"], s["callee"]): s["count_total"] for s in field["sites"] if s["file"] == str(program)}
    assert counts[(_line(PROGRAM, "LINE_STEP"), "step")] == 40 * 3  # x, y and lr, every call
    assert counts[(_line(PROGRAM, "LINE_SIN"), "sin (op)")] == 40
    assert field["unattributed"] == {}
    total = [s["transfers"]["h2d"]["count_total"] for s in samples if s.get("type") == "sample"][-1]
    assert sum(s["count_total"] for s in field["sites"] if s["direction"] == "h2d") == total
    step = next(s for s in field["sites"] if s["callee"] == "step")
    assert {(a["name"], a["kind"]) for a in step["args"]} >= {("lr", PY_SCALAR)} or step["args_seen"] == "transfer"


def test_a_line_called_with_two_shapes_in_turn_is_sized_by_the_mean_of_the_calls_read():
    """JAX's MNIST example sizes the training set and then the test set at
    one line (float32[1024,784], then [256,784]). One call's sizes stood
    for all: whichever was read last, 2.4x low (or 1.6x high). The mean of
    the calls read is the line's true bytes when it reads both alike."""
    from jaxtop.probes.transfer_site import SIZES_READ, Site
    from jaxtop.probes.transfer_values import ArgInfo

    def call(rows: int) -> tuple:
        return (ArgInfo(name="inputs", kind="NumPy array", shape=f"float32[{rows},784]", nbytes=rows * 784 * 4),)

    site = Site()
    site.merge(call(1024), False, 0.0, "predict")
    site.merge(call(256), False, 0.1, "predict")
    site.add(200, 200)
    truth = 100 * (1024 + 256) * 784 * 4
    assert site.bytes == truth  # each call read alike: the mean is the truth
    for k in range(SIZES_READ):  # only test-set calls read since: the mean follows them
        site.merge(call(256), False, 1.0 + k, "predict")
    assert site.sizes == (256 * 784 * 4,)
    # A call of another arity is not averaged into this one's positions.
    site.merge(call(1024) + call(8), False, 20.0, "predict")
    assert site.sizes == (1024 * 784 * 4, 8 * 784 * 4)


def test_a_line_whose_values_go_in_pieces_is_sized_by_the_values_not_a_value_a_piece():
    """A pmap copies each NumPy value a slice a device, a guard line each:
    16 lines a call for two values on 8 devices. Each line a whole value
    read jax's spmd MNIST example 8x (~115 MiB/s for ~14.4); the pieces a
    value are learned from a batch that holds whole calls, and a call's
    lines may come in two batches."""
    from jaxtop.probes.transfer_site import Site

    site = Site()
    site.sizes = (32768, 5120)  # x float32[8,16,64], y float32[8,16,10]
    site.add(16, 1)
    assert site.bytes == 32768 + 5120
    site.add(8, 1)  # the first half of a call's lines: x's 8 slices
    site.add(8, 0)  # and the rest, in the next batch
    assert site.bytes == 2 * (32768 + 5120)
    site.add(160, 10)
    assert site.bytes == 12 * (32768 + 5120)
    one = Site()
    one.sizes = (4096,)
    one.add(5, 5)  # a line a call: as before
    assert one.bytes == 5 * 4096 and one.pieces == 1
