"""The advisor on records made here, one rule at a time (pure: no JAX, no
socket): evidence that holds over the window gives advice, a spike or a
burst too short gives none, advice leaves when the evidence leaves, each
detector's threshold on both sides, and odd or hostile records give "n/a —
why", never a traceback. The same advisor on real programs, the demo and
the chip's recordings: tests/test_advice_programs.py and
tests/test_advice_recordings.py."""

from __future__ import annotations

import math
from typing import Any

import pytest

from jaxtop.advice import STRATEGIES, Advisor, advice_json, report_lines
from jaxtop.advice import detectors as detectors_module
from jaxtop.wire.records import decode, from_dict
from jaxtop.wire import protocol
from jaxtop.wire.safe_text import terminal_safe

T0 = 1_800_000_000.0
FILE = "/work/prog/train.py"


def sample(t: float, **parts: Any) -> Any:
    rec = {"type": "sample", "t": T0 + t, **parts}
    return from_dict(rec)


def h2d_site(line: int, count: int, callee: str = "step", function: str = "<module>", args: list | None = None,
             calls: int | None = None, nbytes: int | None = None, direction: str = "h2d") -> dict[str, Any]:
    return {"direction": direction, "file": FILE, "line": line, "function": function, "callee": callee,
            "count_total": count, "calls_total": count if calls is None else calls,
            "bytes_total": nbytes if nbytes is not None else count * 65536,
            "args": args if args is not None else [{"name": "batch", "kind": "NumPy array",
                                                    "shape": "float32[64,256]", "bytes": 65536}]}


def advise(records: list[Any], window_s: float = 60.0) -> Any:
    advisor = Advisor(window_s=window_s)
    for r in records:
        advisor.feed(r)
    return advisor.evaluate()


def steady(seconds: float, per_s: float, make: Any, start: float = 0.0, every: float = 1.0) -> list[Any]:
    """A field a second (as the agent sends sparse fields), its totals rising by per_s."""
    out = []
    n = int(seconds / every)
    for k in range(1, n + 1):
        t = start + k * every
        out.append(make(t, int(per_s * t)))
    return out


def sites(t: float, total: int, **kw: Any) -> Any:
    return sample(t, transfer_sites={"sites": [h2d_site(55, total, **kw)]},
                  transfers={"h2d": {"count_total": total}})


def test_a_batch_split_across_the_devices_is_put_with_its_sharding_and_a_device_copy_is_advised_on():
    """JAX's spmd example (pmap over 8 devices): a NumPy batch of 8 slices
    fed every step gets a fix that puts it split, a slice a device (a plain
    jax.device_put made it 48,000 device-to-device copies there); steady
    device-to-device copies get advice too (that literal fix read "none")."""
    eight = [{"id": i, "platform": "cpu", "source": "live_arrays", "live_arrays": {"bytes": 10}} for i in range(8)]
    split = [{"name": "batch", "kind": "NumPy array", "shape": "float32[8,16,64]", "bytes": 32768}]

    def fed(t: float, n: int) -> Any:
        return sample(t, devices=eight, transfer_sites={"sites": [h2d_site(55, n, args=split)]},
                      transfers={"h2d": {"count_total": n}})

    (a,) = advise(steady(30, 50, fed)).of("placement")
    assert "jax.device_put(batch, NamedSharding(Mesh(jax.devices(), ('d',)), P('d')))" in a.fix
    assert "one slice a device (8 devices)" in a.fix
    # Two batches (the example's x and y): one put names both.
    pair = split + [{"name": "y", "kind": "NumPy array", "shape": "float32[8,16,10]", "bytes": 5120}]
    (both,) = advise(steady(30, 50, lambda t, n: sample(t, devices=eight, transfer_sites={"sites": [
        h2d_site(55, n, args=pair)]}))).of("placement")
    assert "batch, y = jax.device_put((batch, y), NamedSharding(" in both.fix and "their first axes are" in both.fix
    # The evidence still names what the calls copy (a fix's wording once took its place).
    assert "of NumPy array float32[8,16,64] `batch`, NumPy array float32[8,16,10] `y` at" in both.evidence
    # One device, or a first axis of another length: the plain fix.
    (one,) = advise(steady(30, 50, lambda t, n: sample(t, devices=eight[:1], transfer_sites={"sites": [
        h2d_site(55, n, args=split)]}))).of("placement")
    assert "NamedSharding" not in one.fix and "jax.device_put(batch) one step ahead" in one.fix

    def copied(t: float, n: int) -> Any:
        return sample(t, devices=eight, transfer_sites={"sites": [
            h2d_site(57, n, callee="_multi_slice", direction="d2d", args=split) | {"callee": "_multi_slice (op)"}]})

    (d2d,) = advise(steady(30, 4000, copied)).of("placement")
    assert d2d.line == 57 and "4,000/s implicit device-to-device copies" in d2d.evidence
    assert "by jax's `_multi_slice (op)`" in d2d.evidence and "jax.device_put(x, NamedSharding(" in d2d.fix


# -- the window ----------------------------------------------------------------------------

def test_a_steady_line_gets_advice_with_its_rate_window_and_fix():
    report = advise(steady(30, 50, sites))
    (a,) = report.of("placement")
    assert (a.file, a.line, a.function, a.jitted) == (FILE, 55, "<module>", "step")
    assert a.where == "train.py:55"
    assert "50/s implicit host-to-device copies" in a.evidence and "over the last 29 s" in a.evidence
    assert "float32[64,256] `batch`" in a.evidence
    assert a.gain.startswith("-50/s implicit transfers")
    assert "jax.device_put(batch)" in a.fix
    assert a.basis == "measured"
    assert report.of("guard") and "h2d@train.py:55=0" in report.of("guard")[0].fix


def test_one_spike_is_not_a_habit():
    # 3,000 transfers at once, then nothing: a set-up burst, not a per-step copy.
    recs = [sites(1, 3000)] + [sample(float(t)) for t in range(2, 30)] + [sites(30, 3000)]
    assert not advise(recs).of("placement")


def test_advice_leaves_when_the_evidence_leaves():
    recs = steady(40, 50, sites)
    assert advise(recs).of("placement")
    # The user fixed it at t=40: the total stops rising; after a third of
    # the window the line is no longer advised on.
    quiet = [sites(t, 2000) for t in range(41, 70)]
    assert not advise(recs + quiet).of("placement")


def test_too_short_a_run_is_not_judged_on_rates():
    report = advise(steady(3, 50, sites))
    assert not report.advice
    why = {n.strategy: n.why for n in report.not_judged}
    assert "s of samples; a rate is judged over at least 4 s" in why["placement"]


def test_no_sample_no_advice():
    report = Advisor().evaluate()
    assert report.t is None and not report.advice
    assert {n.strategy for n in report.not_judged} == set(STRATEGIES)
    assert report_lines(report) == ["advice: n/a (no sample yet)"]


# -- placement, batching, jit, host syncs -------------------------------------------------------

@pytest.mark.parametrize("same, fix, title", [
    (True, "jax.device_put(batch) once, before the loop: it is the same value every call", "once, before the loop"),
    (False, "jax.device_put(batch) one step ahead of the call", "ahead of the call"),
    (None, "if `batch` is the same array every call, jax.device_put it once", "ahead of the call")])
def test_placement_tells_the_same_array_from_new_data(same, fix, title):
    """The agent compares two calls' arguments it read: the same array (put
    it once) or new data each call (put it ahead); unknown: both said."""
    arg = {"name": "batch", "kind": "NumPy array", "shape": "float32[64,256]", "bytes": 65536}
    if same is not None:
        arg["same"] = same
    (a,) = advise(steady(30, 50, lambda t, n: sites(t, n, args=[arg]))).of("placement")
    assert fix in a.fix and title in a.title, (a.title, a.fix)
    assert ("the same array (object and contents)" in a.evidence) == (same is True)
    assert ("new data at each call read" in a.evidence) == (same is False)
    if same is False:
        assert "once, before the loop" not in a.fix


def test_a_python_scalar_that_never_changes_is_put_once_and_one_that_does_is_carried():
    const = {"name": "lr", "kind": "Python scalar", "shape": "float[]", "bytes": 4, "same": True}
    moving = {"name": "step", "kind": "Python scalar", "shape": "int[]", "bytes": 4, "same": False}
    (a,) = advise(steady(30, 50, lambda t, n: sites(t, n, args=[const, moving]))).of("placement")
    assert "`lr` is the same value at each call read: jnp.asarray it once" in a.fix
    assert "keep `step` on the device (it changes every call)" in a.fix


def test_many_calls_per_step_are_batching_not_placement():
    def make(t: float, n: int) -> Any:
        return sample(t, transfer_sites={"sites": [
            h2d_site(55, n // 32, calls=n // 32),  # the step: 10 calls/s
            h2d_site(60, n, callee="score", args=[{"name": "x", "kind": "NumPy array", "shape": "float32[8]",
                                                   "bytes": 32}], nbytes=n * 32),
        ]}, transfers={"h2d": {"count_total": n}})
    report = advise(steady(20, 320, make))
    (b,) = report.of("batching")
    assert b.line == 60 and "32 for each call of `step` at train.py:55" in b.evidence
    assert [a.line for a in report.of("placement")] == [55]


def test_a_step_beside_an_evaluation_every_tenth_step_is_not_batching():
    # Both feed 64 KiB batches: the busier line is the step, not items of the other.
    def make(t: float, n: int) -> Any:
        return sample(t, transfer_sites={"sites": [h2d_site(55, n), h2d_site(80, n // 10, callee="evaluate")]},
                      transfers={"h2d": {"count_total": n}})
    report = advise(steady(20, 100, make))
    assert not report.of("batching")
    assert sorted(a.line for a in report.of("placement")) == [55, 80]


def test_calls_from_a_comprehension_are_batching():
    make = lambda t, n: sites(t, n, function="step.<listcomp>", callee="one")  # noqa: E731
    report = advise(steady(20, 400, make))
    assert report.of("batching") and not report.of("placement")
    assert "comprehension" in report.of("batching")[0].evidence


def test_scalars_are_kept_on_the_device_not_made_static():
    args = [{"name": "step", "kind": "Python scalar", "shape": "int[]", "bytes": 4}]
    report = advise(steady(20, 30, lambda t, n: sites(t, n, args=args, nbytes=4 * n)))
    (a,) = report.of("placement")
    assert "keep `step` on the device" in a.fix and "static_argnums would recompile" in a.fix


def test_eager_ops_with_host_values_are_jit_advice():
    def make(t: float, n: int) -> Any:
        return sample(t, transfer_sites={"sites": [
            h2d_site(21, n, callee="multiply (op)", function="post",
                     args=[{"name": "y", "kind": "Python scalar", "shape": "float[]", "bytes": 4}]),
            h2d_site(22, n, callee="add (op)", function="post",
                     args=[{"name": "y", "kind": "Python scalar", "shape": "float[]", "bytes": 4}]),
            h2d_site(9, n, callee="convert_element_type (op)", function="setup"),  # creation: not jit's
        ]}, transfers={"h2d": {"count_total": 3 * n}})
    report = advise(steady(20, 40, make))
    (j,) = report.of("jit")
    assert (j.line, j.function) == (21, "post") and "80/s eager op calls" in j.evidence
    assert "post = jax.jit(post)" in j.fix
    assert not report.of("placement")  # ops run eagerly are not a jitted call's arguments


def syncs(t: float, n: int, line: int = 56) -> Any:
    return sample(t, host_syncs={"t": T0 + t, "available": True, "count": n, "sites": [
        {"site": f"train.py:{line}", "function": "<module>", "file": FILE, "line": line, "count": n,
         "kinds": {"item": n}}]})


def step_and_read(t: float, n: int, every: int = 1) -> Any:
    rec = sites(t, n)  # the step, fed a batch each call
    return from_dict({**msg(rec), "host_syncs": msg(syncs(t, n // every)).get("host_syncs")})


def test_a_host_read_every_step_is_advised_on():
    (a,) = advise(steady(20, 30, step_and_read)).of("host_sync")
    assert a.line == 56 and "30/s host reads (item) at train.py:56, 1.0 per call of the step" in a.evidence
    assert "step % 100" in a.fix


def test_a_host_read_without_a_known_step_is_not_judged():
    # Every batch put on the device ahead: no line tells the step's rate, and
    # 30 reads/s may be every step or every hundredth.
    report = advise(steady(20, 30, syncs))
    assert not report.of("host_sync")
    why = {n.strategy: n.why for n in report.not_judged}["host_sync"]
    assert "30/s at train.py:56" in why and "the step's rate is unknown" in why


def test_a_read_every_tenth_step_is_the_fix_already_made():
    report = advise(steady(20, 100, lambda t, n: step_and_read(t, n, every=10)))
    assert not report.of("host_sync") and "host_sync" not in {n.strategy for n in report.not_judged}


def msg(rec: Any) -> dict[str, Any]:
    import msgspec
    return msgspec.to_builtins(rec)


def test_host_syncs_unavailable_says_why():
    recs = [sample(float(t), host_syncs={"available": False, "reason": "hooks not in"}) for t in range(1, 10)]
    why = {n.strategy: n.why for n in advise(recs).not_judged}
    assert why["host_sync"] == "host reads are not counted: hooks not in"


# -- the ledger: donation, in-place, checkpointing -------------------------------------------------

def ledger(t: float, **fn: Any) -> dict[str, Any]:
    row = {"name": "jit_step", "compiles": 1, "live": 1, "argument_bytes": 320 << 10, "output_bytes": 256 << 10,
           "alias_bytes": 0, "temp_bytes": 4, "call_site": f"{FILE}:28"}
    row.update(fn)
    return {"available": True, "full": True, "t": T0 + t, "live_count": 1, "functions": [row]}


def holders(t: float, line: int = 28, nbytes: int = 256 << 10, count: int = 2, function: str = "<module>",
            **more: Any) -> dict[str, Any]:
    return {"t": T0 + t, "seq": int(t), "bytes": nbytes, "count": count, "sites_total": 1, "sites": [
        {"site": f"train.py:{line}", "function": function, "file": FILE, "line": line, "bytes": nbytes,
         "count": count, **more}]}


def donation_case(**fn: Any) -> Any:
    return advise([sample(1.0, jit=ledger(1.0, **fn)), sample(5.0, holders=holders(5.0)), sample(9.0)])


def test_outputs_kept_at_the_calling_line_and_not_aliased_are_donation():
    (a,) = donation_case().of("donation")
    assert (a.line, a.jitted, a.basis) == (28, "step", "inferred")
    assert "256 KiB of outputs from 320 KiB of arguments, none aliased" in a.evidence
    assert a.gain.startswith("up to -256 KiB of new outputs a call in flight")
    assert "donate_argnums=..." in a.fix and "the optimizer state, not only the first" in a.fix


def test_a_last_profile_that_caught_the_state_twice_does_not_hide_donation():
    """A profile taken while the new state and the one it replaces were both
    alive reads twice the outputs at the line: the least of the last
    profiles is what the line keeps (Flax's miniGPT example lost its
    donation advice to the moment of its last profile)."""
    recs = [sample(1.0, jit=ledger(1.0)), sample(5.0, holders=holders(5.0)),
            sample(8.0, holders=holders(8.0, nbytes=512 << 10)), sample(9.0)]
    (a,) = advise(recs).of("donation")
    assert "keeps 256 KiB of them alive" in a.evidence
    twice = [sample(1.0, jit=ledger(1.0)), sample(5.0, holders=holders(5.0, nbytes=512 << 10)),
             sample(8.0, holders=holders(8.0, nbytes=512 << 10)), sample(9.0)]
    assert not advise(twice).of("donation")  # kept twice all along: something else holds the old state


def test_a_line_only_the_last_profile_lists_is_no_line_that_keeps_the_state():
    """An evaluation step run every 50 steps made the model's copy the last
    profile found at its line; the next training step took it over. One
    profile of three is no evidence that the line keeps a state (Flax's
    MNIST example with donation applied got advice whose fix raised)."""
    recs = [sample(1.0, jit=ledger(1.0)), sample(3.0, holders=holders(3.0, line=40)),
            sample(5.0, holders=holders(5.0, line=40)), sample(8.0, holders=holders(8.0)), sample(9.0)]
    assert not advise(recs).of("donation")


def test_a_partly_donated_state_is_judged_on_the_rest():
    # 1 MiB of parameters donated, 4 MiB of optimizer state not.
    fn = {"argument_bytes": 6 << 20, "output_bytes": 5 << 20, "alias_bytes": 1 << 20}
    recs = [sample(1.0, jit=ledger(1.0, **fn)), sample(5.0, holders=holders(5.0, nbytes=5 << 20)), sample(9.0)]
    (a,) = advise(recs).of("donation")
    assert "1.00 MiB of them aliased already" in a.evidence and a.gain.startswith("up to -4.00 MiB")


@pytest.mark.parametrize("change", [
    {"alias_bytes": 256 << 10},  # donated already
    {"output_bytes": 64 << 20},  # outputs larger than its arguments: no input to take
    {"output_bytes": 16 << 10, "argument_bytes": 20 << 10},  # too small to matter
    {"call_site": f"{FILE}:40"},  # the 256 KiB kept elsewhere (an input's line, parameters read every step)
    {"alias_bytes": None},  # XLA's analysis n/a
])
def test_no_donation_advice_without_its_evidence(change):
    assert not donation_case(**change).of("donation")


def test_donation_without_a_memory_profile_is_not_judged():
    report = advise([sample(1.0, jit=ledger(1.0)), sample(9.0)])
    why = {n.strategy: n.why for n in report.not_judged}
    assert "no memory profile" in why["donation"]


def test_a_failed_donation_is_reported_with_jax_s_message():
    recs = [sample(1.0, donation={"failed": 0, "failed_total": 0}),
            sample(5.0, donation={"failed": 2, "failed_total": 2, "last_message": "Some donated buffers were not usable"})]
    (a,) = advise(recs).of("donation")
    assert "2 donated buffer(s)" in a.evidence and "not usable" in a.evidence


def storm(t: float, kind: str, name: str) -> dict[str, Any]:
    return {"since_t": T0, "t": T0 + t, "function": f"jit_{name}", "name": name, "kind": kind, "compiles": 120,
            "window_s": 60.0, "rate_per_s": 12.0, "site": f"{FILE}:34"}


def test_a_storm_of_growing_shapes_is_in_place_advice():
    jit = {**ledger(9.0), "storm": storm(9.0, "eager", "concatenate")}
    (a,) = advise([sample(1.0), sample(9.0, jit=jit)]).of("in_place")
    assert (a.line, a.jitted) == (34, "concatenate") and "120 compiles of `concatenate` within the last 60 s" in a.evidence
    assert "lax.dynamic_update_slice" in a.fix


def test_an_eager_storm_of_another_op_is_not_in_place():
    jit = {**ledger(9.0), "storm": storm(9.0, "eager", "sin")}
    assert not advise([sample(1.0), sample(9.0, jit=jit)]).of("in_place")


def test_a_storm_worded_as_new_function_objects_is_in_place_when_its_arguments_grew():
    """An older agent worded a storm by its newest reason: a buffer grown a
    row a step, its jit made anew at each restart of the growth, read "a new
    function object" one time in 32. Its executables' arguments grew: still
    an array rebuilt every step. Without growth it is a closure storm."""
    def exes(sizes):
        return [{"id": i, "name": "jit_grow", "argument_bytes": b, "first_t": T0 + 2 + i / 10}
                for i, b in enumerate(sizes)]

    grown = {**ledger(9.0), "storm": storm(9.0, "redefined", "grow"), "executables": exes([512, 1024, 1536, 2048])}
    (a,) = advise([sample(1.0), sample(9.0, jit=grown)]).of("in_place")
    assert a.line == 34 and "its arguments 512 B -> 2.00 KiB" in a.evidence
    flat = {**ledger(9.0), "storm": storm(9.0, "redefined", "grow"), "executables": exes([512, 512, 512])}
    assert not advise([sample(1.0), sample(9.0, jit=flat)]).of("in_place")


def test_a_storm_over_before_the_window_is_not_advised_on():
    jit = {**ledger(1.0), "storm": storm(1.0, "types", "grow")}
    assert not advise([sample(1.0, jit=jit)] + [sample(float(t)) for t in range(2, 100)]).of("in_place")


def test_temporaries_larger_than_the_arrays_are_checkpointing():
    recs = [sample(1.0, jit=ledger(1.0, temp_bytes=8 << 20, argument_bytes=2 << 20, output_bytes=1 << 20)),
            sample(9.0)]
    (a,) = advise(recs).of("checkpointing")
    assert "8.00 MiB, 2.7x its arguments and outputs" in a.evidence and "jax.checkpoint" in a.fix
    # 1.2x (Flax's miniGPT example, whose temporaries nnx.remat left as they were): no advice.
    recs = [sample(1.0, jit=ledger(1.0, temp_bytes=int(3.6 * 2**20), argument_bytes=2 << 20, output_bytes=1 << 20)),
            sample(9.0)]
    assert not advise(recs).of("checkpointing")


# -- devices: run-ahead, fragmentation; leaks ----------------------------------------------------------

def device(t: float, in_use: float, live: float, platform: str = "gpu", **more: Any) -> Any:
    return sample(t, devices=[{"id": 0, "platform": platform, "source": "memory_stats", "bytes_in_use": in_use,
                               "bytes_limit": 16 << 30, "live_arrays": {"bytes": live, "count": 9}, **more}])


def test_memory_beyond_the_live_arrays_is_runahead():
    recs = [sample(0.5, jit=ledger(0.5, output_bytes=1 << 30, argument_bytes=1 << 30, temp_bytes=0))]
    recs += [device(float(t), 9 << 30, 2 << 30) for t in range(1, 30)]
    (a,) = advise(recs).of("runahead")
    assert "7.00 GiB in use beyond the live arrays" in a.evidence and "7.0 calls of `step`" in a.evidence
    assert "block_until_ready" in a.fix


def test_runahead_is_judged_now_not_over_the_set_up():
    # Set-up without run-ahead, then the loop: judged over the newest third.
    recs = [device(float(t), 2 << 30, 2 << 30) for t in range(1, 40)]
    recs += [device(float(t), 9 << 30, 2 << 30) for t in range(40, 60)]
    assert advise(recs).of("runahead")
    # …and the other way round: gone once the loop bounds it.
    recs = [device(float(t), 9 << 30, 2 << 30) for t in range(1, 40)]
    recs += [device(float(t), 2 << 30, 2 << 30) for t in range(40, 60)]
    assert not advise(recs).of("runahead")


def test_runahead_on_a_backend_without_allocator_figures_is_not_judged():
    recs = [sample(float(t), devices=[{"id": 0, "platform": "cpu", "source": "live_arrays", "bytes_in_use": 10,
                                       "live_arrays": {"bytes": 10}}]) for t in range(1, 10)]
    why = {n.strategy: n.why for n in advise(recs).not_judged}
    assert "memory_stats() is None" in why["runahead"]


def test_fragmentation_of_a_gpu_allocator_but_never_a_tpu_s():
    assert advise([device(float(t), 1 << 30, 1 << 30, fragmentation=0.6) for t in range(1, 20)]).of("fragmentation")
    tpu = [device(float(t), 1 << 30, 1 << 30, platform="tpu", fragmentation=0.6) for t in range(1, 20)]
    assert not advise(tpu).of("fragmentation")


def test_holes_among_live_buffers_are_fragmentation_where_no_allocator_says():
    def dev(t: float, holes: float, platform: str = "gpu") -> Any:
        return sample(t, devices=[{"id": 0, "platform": platform, "source": "live_arrays",
                                   "live_arrays": {"bytes": 10, "holes": holes}}])
    (a,) = advise([dev(float(t), 0.4) for t in range(1, 20)]).of("fragmentation")
    assert a.basis == "inferred" and "holes are 40 %" in a.evidence
    assert not advise([dev(float(t), 0.1) for t in range(1, 20)]).of("fragmentation")
    # A CPU has no device pool: its holes are the host heap's.
    report = advise([dev(float(t), 0.9, "cpu") for t in range(1, 20)])
    assert not report.of("fragmentation")
    assert "no device memory pool" in {n.strategy: n.why for n in report.not_judged}["fragmentation"]


def test_a_leak_suspect_is_advised_on_with_its_growth():
    growth = {"rises": 6, "since_t": T0, "for_s": 50, "bytes_per_min": 349 << 20}
    recs = [sample(1.0), sample(9.0, holders=holders(9.0, line=70, nbytes=1 << 30, count=90, suspect=True,
                                                      growth=growth))]
    (a,) = advise(recs).of("leak")
    assert a.line == 70 and "+349 MiB/min for 50 s, 6 rises in a row" in a.evidence


def test_a_leak_names_who_keeps_it_once_a_search_was_asked_for():
    """Before a ``holders_who`` search the leak advice says how to ask for
    one; after it, the program's names that keep the arrays lead the title,
    the evidence and the fix. A search that found no name says so."""
    growth = {"rises": 6, "since_t": T0, "for_s": 50, "bytes_per_min": 349 << 20}
    recs = [sample(1.0), sample(9.0, holders=holders(9.0, line=70, nbytes=1 << 30, count=90, suspect=True,
                                                      growth=growth))]
    (before,) = advise(recs).of("leak")
    assert "not who keeps them" in before.evidence and "`k` on the Holders screen" in before.fix

    def who(paths: dict[str, int]) -> Any:
        return from_dict({"type": "reply", "t": T0 + 9.5, "id": 4, "ok": True, "result": {
            "who": [{"file": FILE, "line": 70, "arrays": 3, "paths": paths, "unnamed": 3 - sum(paths.values()),
                     "objects": 120, "complete": True}], "seconds": 0.01, "longest_piece_s": 0.001}})

    (named,) = advise(recs + [who({"__main__.history[…]": 3})]).of("leak")
    assert named.title == "__main__.history[…] keeps this line's arrays"
    assert "kept by `__main__.history[…]` (3 of its arrays searched for: 3 found under those names)" in named.evidence
    assert named.fix.startswith("stop __main__.history[…] from keeping")
    (unnamed,) = advise(recs + [who({})]).of("leak")
    assert "a search found no name of the program's" in unnamed.evidence and "`k` on the" not in unnamed.fix


# -- robustness -------------------------------------------------------------------------------------

def test_one_failing_detector_takes_no_other_down(monkeypatch):
    def broken(w: Any) -> Any:
        raise ZeroDivisionError("boom")
    table = list(detectors_module.DETECTORS)
    table[0] = ("placement", broken)
    monkeypatch.setattr("jaxtop.advice.advisor.DETECTORS", tuple(table))
    report = advise(steady(20, 30, step_and_read))
    assert report.of("guard")
    assert {n.strategy: n.why for n in report.not_judged}["placement"] == "the detector failed: ZeroDivisionError: boom"


HOSTILE_LINES = [
    # Numbers of every odd kind where figures go.
    b'{"type":"sample","t":1800000001,"transfer_sites":{"sites":[{"direction":"h2d","file":"/a.py","line":5,'
    b'"count_total":1e308,"calls_total":-5,"bytes_total":NaN}]}}',
    b'{"type":"sample","t":1800000002,"transfer_sites":{"sites":[{"direction":"h2d","file":"/a.py","line":5,'
    b'"count_total":"many","args":[{"name":"\\u001b[2Jx","kind":"\\u202eNumPy","shape":5}]}]}}',
    b'{"type":"sample","t":1800000003,"jit":{"full":true,"functions":[{"name":"jit_f","live":1,'
    b'"output_bytes":1e300,"argument_bytes":1e300,"alias_bytes":0,"temp_bytes":Infinity,"call_site":"\\u001b]0;x"}]}}',
    b'{"type":"sample","t":1800000004,"holders":{"sites":[{"site":"a.py:5","file":"/a.py","line":-3,"bytes":1e30,'
    b'"count":0,"suspect":true,"growth":{"bytes_per_min":-1e300}}]},"devices":[{"id":0,"platform":"gpu",'
    b'"source":"memory_stats","bytes_in_use":1e300,"live_arrays":{"bytes":-1,"holes":7}}]}',
    b'{"type":"sample","t":1700000000,"host_syncs":{"sites":[{"file":"/a.py","line":1,"count":1e9}]}}',  # backwards
    b'{"type":"sample","t":1800000009,"donation":{"failed_total":1e308,"last_message":"\\u009b31m"}}',
]


def test_hostile_records_give_text_and_json_never_a_traceback():
    advisor = Advisor()
    for line in HOSTILE_LINES:
        try:
            advisor.feed(decode(line))
        except protocol.ProtocolError:
            pass
    report = advisor.evaluate()
    text = "\n".join(report_lines(report))
    assert terminal_safe(text) == text  # nothing a terminal would obey
    doc = advice_json(report)
    assert all(not (isinstance(v, float) and not math.isfinite(v)) for a in doc["advice"] for v in a.values())
    import json
    json.dumps(doc, allow_nan=False)


def test_ten_thousand_lines_are_bounded():
    from jaxtop.advice.evidence import MAX_SITES

    recs = [sample(float(t), transfer_sites={"sites": [h2d_site(i + t * 100, 1) for i in range(100)]})
            for t in range(1, 101)]
    advisor = Advisor()
    for r in recs:
        advisor.feed(r)
    assert len(advisor.evidence.transfers) == MAX_SITES
    advisor.evaluate()


def test_a_line_that_began_in_the_window_is_judged_steady_over_its_own_time():
    """Flax's miniGPT example recorded alone: 10 s of start-up (imports,
    compiles), then 7 s of steps copying a batch each. Sliced over the
    whole window its line rose in 3 of 6 slices and read as a spike: no
    placement advice. Over its own time it rose in every slice; a burst
    that stopped, or a line too young for two slices, is still no evidence."""
    from jaxtop.advice.series import Total

    steps = Total()
    for t in range(10, 21):
        steps.add(float(t), 130.0 * (t - 10))
    assert steps.over(0.0, 20.0).steady
    burst = Total()
    for t, v in ((10.0, 0.0), (11.0, 500.0), (12.0, 900.0), (16.0, 900.0), (20.0, 900.0)):
        burst.add(t, v)
    assert not burst.over(0.0, 20.0).steady
    young = Total()
    for t, v in ((17.5, 0.0), (18.5, 100.0), (19.5, 200.0)):
        young.add(t, v)
    assert not young.over(0.0, 20.0).steady
