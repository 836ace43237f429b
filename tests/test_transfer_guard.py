"""Pure layer: transfer-guard line parser, counter, and the guard setting.

The lines below were recorded from jaxlib 0.10.2 on CPU (h2d, cached call,
weak-typed scalar, d2d) or copied from jaxlib's source (GPU d2h, the older
``transfer_guard_lib.cc`` prefix).
"""

from __future__ import annotations

import pytest

from jaxtop.probes import transfer_guard as tg
from jaxtop.probes.transfer_guard import (
    CachedParser,
    GuardController,
    GuardLine,
    TransferCounter,
    dtype_bits,
    parse_line,
)

PREFIX = "W1202 18:34:30.919532    2146 guard_lib.cc:125] "
OLD_PREFIX = "W0611 09:01:02.000017   31337 external/xla/xla/python/transfer_guard_lib.cc:149] "
# jaxlib before 0.7 logged through XLA/TSL: another header form.
TSL_PREFIX = "2026-12-03 19:09:21.852989: W external/xla/xla/python/transfer_guard_lib.cc:108] "
TSL_TID_PREFIX = "2026-12-03 19:09:21.852989: W   31337 external/xla/xla/python/guard_lib.cc:115] "
CPU0 = "SingleDeviceSharding(device=CpuDevice(id=0), memory_kind=device)"
CPU1 = "SingleDeviceSharding(device=CpuDevice(id=1), memory_kind=device)"

H2D_MATRIX = PREFIX + f"host-to-device transfer: aval=ShapedArray(float32[1000,1000]), dst_sharding={CPU0}"
H2D_CACHED = PREFIX + "host-to-device transfer: "
H2D_WEAK = PREFIX + f"host-to-device transfer: aval=ShapedArray(float32[], weak_type=True), dst_sharding={CPU0}"
D2D_3 = (
    "W1202 19:10:03.642390    6082 guard_lib.cc:140] device-to-device transfer: "
    f"aval=ShapedArray(bfloat16[8]), sharding={CPU0}, dst_sharding={CPU1}"
)
D2D_2 = PREFIX + f"device-to-device transfer: aval=ShapedArray(int8[3]), dst_sharding={CPU1}"
D2H_GPU = PREFIX + "device-to-host transfer: shape=(2,3), dtype=F32, device=cuda:0"


# -- parse_line ------------------------------------------------------------------


def test_h2d_with_aval_and_dst_sharding():
    assert parse_line(H2D_MATRIX) == GuardLine("h2d", "float32[1000,1000]", 4_000_000)


def test_cached_jit_call_has_empty_payload():
    # Counted as a transfer, but its size is unknown: None, never 0.
    parsed = parse_line(H2D_CACHED)
    assert parsed == GuardLine("h2d", None, None)
    assert parse_line(H2D_CACHED + "\n") == GuardLine("h2d", None, None)
    assert parse_line(H2D_CACHED.rstrip()) == GuardLine("h2d", None, None)


def test_weak_typed_scalar():
    assert parse_line(H2D_WEAK) == GuardLine("h2d", "float32[]", 4)


def test_d2d_with_source_and_destination_sharding():
    assert parse_line(D2D_3) == GuardLine("d2d", "bfloat16[8]", 16)


def test_d2d_with_destination_only():
    assert parse_line(D2D_2) == GuardLine("d2d", "int8[3]", 3)


def test_gpu_d2h_shape_dtype_form():
    assert parse_line(D2H_GPU) == GuardLine("d2h", "f32[2,3]", 24)


def test_gpu_d2h_scalar_and_spaces():
    assert parse_line(PREFIX + "device-to-host transfer: shape=(), dtype=S32, device=cuda:1") == GuardLine(
        "d2h", "s32[]", 4
    )
    assert parse_line(PREFIX + "device-to-host transfer: shape=(4, 5), dtype=BF16, device=cuda:0") == GuardLine(
        "d2h", "bf16[4,5]", 40
    )


@pytest.mark.parametrize(
    "aval, nbytes",
    [
        ("bfloat16[10]", 20),
        ("float16[3,3]", 18),
        ("int8[7]", 7),
        ("uint8[7]", 7),
        ("bool[9]", 9),
        ("complex64[2]", 16),
        ("complex128[2]", 32),
        ("float64[5]", 40),
        ("int4[3]", 2),  # packed: 12 bits round up to 2 bytes
        ("float8_e4m3fn[6]", 6),
        ("float0[6]", 0),
        ("int32[0,5]", 0),
    ],
)
def test_element_sizes(aval, nbytes):
    line = PREFIX + f"host-to-device transfer: aval=ShapedArray({aval}), dst_sharding={CPU0}"
    parsed = parse_line(line)
    assert parsed is not None
    assert parsed.shape_key == aval
    assert parsed.nbytes == nbytes


@pytest.mark.parametrize(
    "name, bits",
    [
        ("float32", 32), ("F32", 32), ("bf16", 16), ("BF16", 16), ("bfloat16", 16),
        ("S8", 8), ("U16", 16), ("C64", 64), ("PRED", 8), ("bool", 8), ("uint4", 4),
        ("F8E5M2", 8), ("token", 0),
    ],
)
def test_dtype_bits(name, bits):
    assert dtype_bits(name) == bits


def test_unknown_dtype_gives_unknown_bytes_not_zero():
    assert dtype_bits("opaque") is None
    parsed = parse_line(PREFIX + "device-to-host transfer: shape=(3,), dtype=OPAQUE, device=cuda:0")
    assert parsed is not None and parsed.direction == "d2h"
    assert parsed.nbytes is None


def test_symbolic_dimension_gives_unknown_bytes():
    parsed = parse_line(PREFIX + f"host-to-device transfer: aval=ShapedArray(float32[b,3]), dst_sharding={CPU0}")
    assert parsed == GuardLine("h2d", "float32[b,3]", None)


def test_old_and_new_jaxlib_prefixes_parse_the_same():
    payload = f"host-to-device transfer: aval=ShapedArray(float32[1000,1000]), dst_sharding={CPU0}"
    assert parse_line(OLD_PREFIX + payload) == parse_line(PREFIX + payload)
    assert parse_line(OLD_PREFIX + "host-to-device transfer: ") == GuardLine("h2d", None, None)
    assert parse_line(OLD_PREFIX + "device-to-device transfer: aval=ShapedArray(float32[2]), "
                      f"dst_sharding={CPU1}") == GuardLine("d2d", "float32[2]", 8)


@pytest.mark.parametrize("prefix", [PREFIX, OLD_PREFIX, TSL_PREFIX, TSL_TID_PREFIX, ""])
def test_every_header_form_and_a_bare_message_parse_the_same(prefix):
    payload = f"device-to-device transfer: aval=ShapedArray(int8[3]), dst_sharding={CPU1}"
    assert parse_line(prefix + payload) == GuardLine("d2d", "int8[3]", 3)
    assert tg.guard_message(prefix + payload + "\n") == payload
    # After a progress bar's unfinished line, as jaxlib's write lands there.
    if prefix:
        assert parse_line("\r 3/9 [##" + prefix + payload) == GuardLine("d2d", "int8[3]", 3)


def test_cached_parser_takes_messages_and_whole_lines():
    parser = tg.CachedParser()
    message = f"host-to-device transfer: aval=ShapedArray(float32[2]), dst_sharding={CPU0}"
    expected = GuardLine("h2d", "float32[2]", 8)
    assert parser(message) == expected
    assert parser(TSL_PREFIX + message) == expected
    assert parser(PREFIX + message + "\n") == expected
    assert parser("not a guard line") is None


@pytest.mark.parametrize(
    "line",
    [
        "",
        "\n",
        "hello world",
        "user said: host-to-device transfer: aval=ShapedArray(float32[2])",  # no header
        "2026-12-03 19:09:21.852989: W b.cc:1] device-to-host transfers are fine",
        "Traceback (most recent call last):",
        "W1202 18:34:30.919532    2146 cpu_client.cc:10] some other warning",
        "I1202 18:34:30.919532    2146 guard_lib.cc:125] host-to-device transfers are fine",
        "Epoch 3: 45%|████▌     | 45/100 [00:03<00:04, 12.1it/s]\r",
    ],
)
def test_non_guard_lines(line):
    assert parse_line(line) is None


# -- TransferCounter ---------------------------------------------------------------


def feed(counter: TransferCounter, *lines: str) -> None:
    for line in lines:
        parsed = parse_line(line)
        assert parsed is not None, line
        counter.add(parsed)


def test_counter_interval_and_totals():
    c = TransferCounter()
    feed(c, H2D_MATRIX, H2D_MATRIX, H2D_CACHED, H2D_WEAK, D2D_3)
    first = c.take()
    assert first["h2d"] == {
        "count": 4,
        "bytes_known": 8_000_004,
        "count_bytes_unknown": 1,
        "count_total": 4,
        "bytes_known_total": 8_000_004,
        "count_bytes_unknown_total": 1,
    }
    assert first["d2d"]["count"] == 1 and first["d2d"]["bytes_known"] == 16
    assert first["d2h"] == {k: 0 for k in first["d2h"]}

    feed(c, D2H_GPU, H2D_CACHED)
    second = c.take()
    # take() reset the interval, the totals keep growing.
    assert second["h2d"]["count"] == 1
    assert second["h2d"]["bytes_known"] == 0
    assert second["h2d"]["count_bytes_unknown"] == 1
    assert second["h2d"]["count_total"] == 5
    assert second["h2d"]["bytes_known_total"] == 8_000_004
    assert second["h2d"]["count_bytes_unknown_total"] == 2
    assert second["d2d"]["count"] == 0 and second["d2d"]["count_total"] == 1
    assert second["d2h"]["count"] == 1 and second["d2h"]["bytes_known"] == 24

    third = c.take()
    assert all(third[d]["count"] == 0 for d in tg.DIRECTIONS)
    assert third["h2d"]["count_total"] == 5


def test_counter_top_shapes_sorted_by_count_and_limited():
    c = TransferCounter()
    feed(c, *[H2D_WEAK] * 5, *[H2D_MATRIX] * 3, *[H2D_CACHED] * 4, D2D_3, D2H_GPU)
    top = c.take(top=3)["top_shapes"]
    assert top == [
        {"direction": "h2d", "shape": "float32[]", "count": 5},
        {"direction": "h2d", "shape": "(cached call, shape not logged)", "count": 4},
        {"direction": "h2d", "shape": "float32[1000,1000]", "count": 3},
    ]
    # Shapes are cumulative: they survive take().
    again = c.take(top=10)["top_shapes"]
    assert len(again) == 5
    assert again[0]["count"] == 5


def test_counter_same_shape_in_two_directions_is_two_entries():
    c = TransferCounter()
    c.add(GuardLine("h2d", "float32[8]", 32))
    c.add(GuardLine("d2d", "float32[8]", 32))
    shapes = {(s["direction"], s["shape"]) for s in c.take()["top_shapes"]}
    assert shapes == {("h2d", "float32[8]"), ("d2d", "float32[8]")}


def test_counter_keeps_a_bounded_number_of_shapes(monkeypatch):
    monkeypatch.setattr(tg, "_TOP_SHAPES_KEPT", 3)
    c = TransferCounter()
    for n in range(10):
        c.add(GuardLine("h2d", f"float32[{n}]", 4 * n))
    c.add(GuardLine("h2d", "float32[0]", 0))  # already known: still counted
    out = c.take(top=100)
    assert out["h2d"]["count"] == 11  # counts are never dropped
    assert len(out["top_shapes"]) == 3
    assert out["top_shapes"][0] == {"direction": "h2d", "shape": "float32[0]", "count": 2}


def test_counter_is_thread_safe():
    import threading

    c = TransferCounter()
    line = GuardLine("h2d", "float32[]", 4)

    def work():
        for _ in range(5000):
            c.add(line)

    threads = [threading.Thread(target=work) for _ in range(4)]
    taken = []
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        taken.append(c.take()["h2d"]["count"])
    for t in threads:
        t.join()
    taken.append(c.take()["h2d"]["count"])
    assert sum(taken) == 20000
    assert c.take()["h2d"]["count_total"] == 20000


# -- GuardController against the real jax config ------------------------------------

OPTIONS = (
    "jax_transfer_guard_host_to_device",
    "jax_transfer_guard_device_to_host",
    "jax_transfer_guard_device_to_device",
)


def _levels(jax):
    return {name: getattr(jax.config, name) for name in ("jax_transfer_guard", *OPTIONS)}


@pytest.fixture
def jax_guard(monkeypatch):
    """The real jax config, put back exactly as it was after each test."""
    import jax

    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    saved = _levels(jax)
    controllers: list[GuardController] = []
    try:
        # Start from jax's defaults even if JAX_TRANSFER_GUARD* is set here.
        jax.config.update("jax_transfer_guard", None)
        for name in OPTIONS:
            jax.config.update(name, None)
        yield jax, controllers
    finally:
        for ctl in controllers:
            ctl.restore()
        jax.config.update("jax_transfer_guard", saved["jax_transfer_guard"])
        for name in OPTIONS:
            jax.config.update(name, saved[name])
        assert _levels(jax) == saved


class Visibility:
    def __init__(self):
        self.calls: list[tuple[set[str], str]] = []

    def __call__(self, shown, silenced):
        self.calls.append((set(shown), silenced))

    @property
    def last(self):
        return self.calls[-1]


def make(jax_guard):
    jax, controllers = jax_guard
    vis = Visibility()
    ctl = GuardController(vis)
    controllers.append(ctl)
    return jax, ctl, vis


def test_default_config_is_switched_to_log_and_nothing_is_shown(jax_guard):
    jax, ctl, vis = make(jax_guard)
    assert _levels(jax) == {"jax_transfer_guard": None, **{o: None for o in OPTIONS}}
    ctl.start()
    assert ctl.active
    assert {o: getattr(jax.config, o) for o in OPTIONS} == {o: "log" for o in OPTIONS}
    assert vis.last == (set(), "")
    assert ctl.user_levels() == {"h2d": "allow", "d2h": "allow", "d2d": "allow"}
    ctl.restore()
    assert not ctl.active
    # None stays None: not "allow", which would override a later global setting.
    assert _levels(jax) == {"jax_transfer_guard": None, **{o: None for o in OPTIONS}}


def test_user_log_on_one_direction_is_visible_and_untouched(jax_guard):
    jax, ctl, vis = make(jax_guard)
    jax.config.update("jax_transfer_guard_host_to_device", "log")
    ctl.start()
    assert vis.last == ({"h2d"}, "")
    assert jax.config.jax_transfer_guard_host_to_device == "log"
    assert jax.config.jax_transfer_guard_device_to_host == "log"
    assert jax.config.jax_transfer_guard_device_to_device == "log"
    assert ctl.user_levels()["h2d"] == "log"
    ctl.restore()
    assert jax.config.jax_transfer_guard_host_to_device == "log"  # theirs: kept
    assert jax.config.jax_transfer_guard_device_to_host is None
    assert jax.config.jax_transfer_guard_device_to_device is None


def test_user_log_explicit_counts_as_visible(jax_guard):
    jax, ctl, vis = make(jax_guard)
    jax.config.update("jax_transfer_guard_device_to_device", "log_explicit")
    ctl.start()
    assert vis.last == ({"d2d"}, "")
    assert jax.config.jax_transfer_guard_device_to_device == "log_explicit"


def test_user_disallow_is_left_alone(jax_guard):
    jax, ctl, vis = make(jax_guard)
    jax.config.update("jax_transfer_guard_host_to_device", "disallow")
    ctl.start()
    assert jax.config.jax_transfer_guard_host_to_device == "disallow"
    assert jax.config.jax_transfer_guard_device_to_host == "log"
    assert vis.last == (set(), "")
    assert ctl.user_levels()["h2d"] == "disallow"
    ctl.restore()
    assert jax.config.jax_transfer_guard_host_to_device == "disallow"
    assert jax.config.jax_transfer_guard_device_to_host is None


def test_user_global_setting_applies_to_every_direction(jax_guard):
    jax, ctl, vis = make(jax_guard)
    jax.config.update("jax_transfer_guard", "disallow")
    ctl.start()
    assert {o: getattr(jax.config, o) for o in OPTIONS} == {o: "disallow" for o in OPTIONS}
    assert ctl.user_levels() == {"h2d": "disallow", "d2h": "disallow", "d2d": "disallow"}
    assert vis.last == (set(), "")


def test_refresh_picks_up_a_later_global_log(jax_guard):
    jax, ctl, vis = make(jax_guard)
    ctl.start()
    n_calls = len(vis.calls)
    ctl.refresh()  # nothing changed: no new notification
    assert len(vis.calls) == n_calls
    jax.config.update("jax_transfer_guard", "log")
    ctl.refresh()
    assert vis.last == ({"h2d", "d2h", "d2d"}, "")
    assert ctl.user_levels() == {"h2d": "log", "d2h": "log", "d2d": "log"}
    ctl.restore()
    # The user's own choice stays after jaxtop leaves.
    assert {o: getattr(jax.config, o) for o in OPTIONS} == {o: "log" for o in OPTIONS}


def test_refresh_picks_up_a_later_per_direction_disallow(jax_guard):
    jax, ctl, vis = make(jax_guard)
    ctl.start()
    jax.config.update("jax_transfer_guard_device_to_host", "disallow")
    ctl.refresh()
    assert ctl.user_levels()["d2h"] == "disallow"
    assert jax.config.jax_transfer_guard_device_to_host == "disallow"  # not overwritten
    assert vis.last == (set(), "")
    ctl.restore()
    assert jax.config.jax_transfer_guard_device_to_host == "disallow"
    assert jax.config.jax_transfer_guard_host_to_device is None


def test_refresh_after_user_sets_allow_keeps_counting(jax_guard):
    # The user's "allow" differs from "log" only in the lines, which the relay
    # hides from them: jaxtop must switch such a direction back to "log" or it
    # silently stops counting transfers.
    jax, ctl, vis = make(jax_guard)
    ctl.start()
    jax.config.update("jax_transfer_guard", "allow")
    ctl.refresh()
    assert ctl.user_levels() == {"h2d": "allow", "d2h": "allow", "d2d": "allow"}
    assert {o: getattr(jax.config, o) for o in OPTIONS} == {o: "log" for o in OPTIONS}
    assert vis.last == (set(), "")
    ctl.refresh()  # our own "log" is not mistaken for a user change
    assert ctl.user_levels()["h2d"] == "allow"
    ctl.restore()
    # Their newest choice comes back, not the value from before start().
    assert {o: getattr(jax.config, o) for o in OPTIONS} == {o: "allow" for o in OPTIONS}


def test_refresh_and_restore_are_inert_when_not_started(jax_guard):
    jax, ctl, vis = make(jax_guard)
    before = _levels(jax)
    ctl.refresh()
    ctl.restore()
    assert vis.calls == []
    assert _levels(jax) == before


def test_restore_twice_is_harmless(jax_guard):
    jax, ctl, vis = make(jax_guard)
    ctl.start()
    ctl.restore()
    jax.config.update("jax_transfer_guard_host_to_device", "disallow")
    ctl.restore()  # must not undo a change made after jaxtop left
    assert jax.config.jax_transfer_guard_host_to_device == "disallow"


def test_silenced_abseil_warnings_are_re_enabled_and_reported(jax_guard, monkeypatch):
    from jax._src.lib import utils

    jax, ctl, vis = make(jax_guard)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    hook = getattr(utils, "absl_set_min_log_level", None)
    try:
        ctl.start()
        if hook is not None:
            assert vis.last == (set(), "IW")
            assert ctl.reason is None
        else:  # jaxlib < 0.7 (TSL logging): no way back, and the reason says what to do
            assert vis.last == (set(), "")
            assert "TF_CPP_MIN_LOG_LEVEL=1" in ctl.reason
    finally:
        ctl.restore()
        if hook is not None:
            hook(0)  # this test process's default


@pytest.mark.parametrize("env, level", [(None, 0), ("1", 1), ("3", 3), ("junk", 0)])
def test_cpp_threshold_from_environment(monkeypatch, env, level):
    if env is None:
        monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    else:
        monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", env)
    assert tg._level_of_cpp_threshold() == level


def test_cached_parser_agrees_with_parse_line_and_stays_bounded():
    from jaxtop.probes.transfer_guard import CachedParser

    parse = CachedParser(capacity=3)
    lines = [
        "W1203 07:06:04.123456  4242 guard_lib.cc:117] host-to-device transfer: aval=ShapedArray(float32[64,64]), dst_sharding=SingleDeviceSharding(device=CpuDevice(id=0))",
        "W1203 07:06:04.223456  4243 guard_lib.cc:117] host-to-device transfer: aval=ShapedArray(float32[64,64]), dst_sharding=SingleDeviceSharding(device=CpuDevice(id=0))",
        "W1203 07:06:05.000001  4242 guard_lib.cc:117] host-to-device transfer:",
        "W1203 07:06:05.000002  4242 guard_lib.cc:117] device-to-host transfer: shape=(4, 8), dtype=F32, device=cuda:0",
        "I1203 07:06:05.000003  4242 other.cc:1] not a transfer",
    ]
    def message(line):
        return line.split("] ", 1)[1]  # what the stderr capture passes

    for _ in range(3):
        for line in lines:
            assert parse(message(line)) == parse_line(line)
    # The two h2d lines differ only in their header: one memo entry.
    assert len(parse._memo) <= 3
    assert parse(message(lines[0])).nbytes == 64 * 64 * 4


def test_counting_a_message_n_times_equals_n_lines():
    from jaxtop.probes.transfer_guard import CachedParser, TransferCounter

    parse = CachedParser()
    lines = [
        "W1203 07:06:04.123456  4242 guard_lib.cc:117] host-to-device transfer: aval=ShapedArray(float32[64,64]), dst_sharding=SingleDeviceSharding(device=CpuDevice(id=0))",
        "W1203 07:06:05.000001  4242 guard_lib.cc:117] host-to-device transfer:",
        "W1203 07:06:05.000002  4242 guard_lib.cc:117] device-to-host transfer: shape=(4, 8), dtype=F32, device=cuda:0",
    ]
    one_by_one, at_once = TransferCounter(), TransferCounter()
    for line in lines * 5:
        one_by_one.add(parse(line.split("] ", 1)[1]))
    for line in lines:
        at_once.add(parse(line.split("] ", 1)[1]), 5)
    assert at_once.take() == one_by_one.take()


# -- sharded transfers: one line per shard, each with the whole aval ----------------

MESH_8 = "NamedSharding(mesh=Mesh('batch': 8, axis_types=(Auto,)), spec=P('batch',), memory_kind=device)"


@pytest.mark.parametrize(
    "sharding, expected",
    [
        (MESH_8, 1 * 16 * 10 * 4),  # split 8 ways on the first axis
        ("NamedSharding(mesh=Mesh('batch': 8), spec=PartitionSpec('batch',), memory_kind=unpinned_host)", 640),  # jax 0.4.x
        ("NamedSharding(mesh=Mesh('x': 2, 'y': 4, axis_types=(Auto, Auto)), spec=P(None, None, ('x', 'y')), memory_kind=device)",
         8 * 16 * 1 * 4),  # the last axis (10) split 8 ways: floor, never above a shard
        ("NamedSharding(mesh=Mesh('batch': 8, axis_types=(Auto,)), spec=P(), memory_kind=device)", 8 * 16 * 10 * 4),  # replicated
        ("GSPMDSharding({replicated})", 8 * 16 * 10 * 4),
        ("GSPMDSharding({devices=[8,1,1]<=[8]})", 640),
        ("SingleDeviceSharding(device=CpuDevice(id=0), memory_kind=device)", 8 * 16 * 10 * 4),
        ("PmapSharding(sharding_spec=ShardingSpec((Unstacked(8),), (ShardedAxis(axis=0),)), device_ids=[0, 1])", None),
    ],
)
def test_sharded_transfer_bytes_are_per_shard_or_unknown(sharding, expected):
    line = f"host-to-device transfer: aval=ShapedArray(float32[8,16,10]), dst_sharding={sharding}"
    parsed = parse_line(line)
    assert parsed.shape_key == "float32[8,16,10]"
    assert parsed.nbytes == expected


def test_sharded_lines_sum_to_the_array_not_eight_times_it():
    line = f"host-to-device transfer: aval=ShapedArray(float32[8,16,10]), dst_sharding={MESH_8}"
    counter = TransferCounter()
    parser = CachedParser()
    for _ in range(8):
        counter.add(parser(line), 1)
    assert counter.take()["h2d"]["bytes_known"] == 8 * 16 * 10 * 4
