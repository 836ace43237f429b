"""Pure layer: device memory helpers and JaxMemoryProbe (probes/jax_memory.py).

GPU dicts are shaped like what jaxlib's ``PyDevice::MemoryStats`` returns: the default BFC
allocator's 10 keys, the cuda_async allocator's 5, and the PJRT C API's -1
for fields it does not set. The CPU tests use the real backend in-process.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from jaxtop.probes import jax_memory as jm
from jaxtop.probes import buffer_detail
from jaxtop.probes.jax_memory import JaxMemoryProbe, fragmentation, normalize_stats

GiB = 1 << 30
MiB = 1 << 20

BFC_GPU = {
    "num_allocs": 37,
    "bytes_in_use": 5 * GiB,
    "peak_bytes_in_use": 6 * GiB,
    "largest_alloc_size": 2 * GiB,
    "bytes_limit": 60 * GiB,
    "bytes_reserved": 0,
    "peak_bytes_reserved": 0,
    "largest_free_block_bytes": 1 * GiB,
    "pool_bytes": 8 * GiB,
    "peak_pool_bytes": 8 * GiB,
}
CUDA_ASYNC_GPU = {
    "num_allocs": 5,
    "bytes_in_use": 300 * MiB,
    "peak_bytes_in_use": 400 * MiB,
    "largest_alloc_size": 128 * MiB,
    "bytes_limit": 60 * GiB,
}
PJRT_C_API_GPU = {
    "num_allocs": 3,
    "bytes_in_use": 12 * MiB,
    "peak_bytes_in_use": 16 * MiB,
    "largest_alloc_size": 8 * MiB,
    "bytes_limit": 60 * GiB,
    "bytes_reserved": -1,
    "peak_bytes_reserved": -1,
    "largest_free_block_bytes": -1,
    "bytes_reservable_limit": -1,
    "pool_bytes": -1,
    "peak_pool_bytes": -1,
}


# -- normalize_stats ---------------------------------------------------------------


def test_normalize_maps_minus_one_to_none_and_keeps_the_rest():
    out = normalize_stats(PJRT_C_API_GPU)
    assert out["bytes_in_use"] == 12 * MiB
    assert out["bytes_limit"] == 60 * GiB
    for key in ("bytes_reserved", "largest_free_block_bytes", "pool_bytes", "peak_pool_bytes"):
        assert out[key] is None, key
    assert set(out) == set(PJRT_C_API_GPU)


def test_normalize_passes_a_bfc_dict_through_unchanged():
    assert normalize_stats(BFC_GPU) == BFC_GPU
    assert normalize_stats(BFC_GPU) is not BFC_GPU  # a copy: callers may add fields


def test_normalize_keeps_zero_and_unknown_keys():
    out = normalize_stats({"bytes_reserved": 0, "new_field_from_newer_jaxlib": 7, "name": "x"})
    assert out == {"bytes_reserved": 0, "new_field_from_newer_jaxlib": 7, "name": "x"}


def test_normalize_none_is_none():
    assert normalize_stats(None) is None


# -- fragmentation -----------------------------------------------------------------


def test_fragmentation_of_default_bfc_dict():
    # pool 8 GiB, 5 in use: 3 GiB cached, the largest free chunk 1 GiB.
    value, reason = fragmentation(BFC_GPU, "gpu")
    assert reason is None
    assert value == pytest.approx(1 - 1 / 3)


def test_fragmentation_zero_when_free_space_is_one_block():
    stats = dict(BFC_GPU, largest_free_block_bytes=3 * GiB)
    assert fragmentation(stats) == (0.0, None)


def test_fragmentation_is_zero_not_nan_when_nothing_is_free():
    stats = dict(BFC_GPU, bytes_in_use=8 * GiB, largest_free_block_bytes=0)
    value, reason = fragmentation(stats)
    assert value == 0.0 and reason is None


def test_fragmentation_clamped_to_unit_interval():
    # Stats are read non-atomically; inconsistent numbers must not leave [0, 1].
    assert fragmentation(dict(BFC_GPU, largest_free_block_bytes=5 * GiB))[0] == 0.0
    assert fragmentation(dict(BFC_GPU, bytes_in_use=9 * GiB))[0] == 0.0


def test_fragmentation_unavailable_for_cuda_async():
    value, reason = fragmentation(normalize_stats(CUDA_ASYNC_GPU), "gpu")
    assert value is None
    assert reason and "pool_bytes" in reason


def test_fragmentation_unavailable_through_pjrt_c_api_minus_ones():
    value, reason = fragmentation(normalize_stats(PJRT_C_API_GPU), "gpu")
    assert value is None
    assert reason


def test_fragmentation_on_cpu_none_says_why():
    value, reason = fragmentation(None, "cpu")
    assert value is None
    assert "None" in reason and "cpu" in reason


# -- JaxMemoryProbe, real CPU backend ---------------------------------------------------


@pytest.fixture(scope="module")
def cpu_jax():
    import jax

    if jax.default_backend() != "cpu":
        pytest.skip("these tests describe the CPU backend")
    return jax


def test_backend_ready_once_arrays_exist(cpu_jax):
    cpu_jax.numpy.zeros(1).block_until_ready()
    assert jm.backend_ready() is True


def test_cpu_probe_falls_back_to_live_arrays(cpu_jax):
    jnp = cpu_jax.numpy
    mine = [jnp.ones((256, 256), jnp.float32), jnp.arange(1000, dtype=jnp.int32), jnp.zeros((3, 5), jnp.bfloat16),
            jnp.zeros((128, 256), jnp.float32)]  # two of 64 KiB or more: a hole figure
    for a in mine:
        a.block_until_ready()
    my_bytes = sum(a.nbytes for a in mine)

    probe = JaxMemoryProbe()
    assert probe.backend == "cpu"
    described = probe.describe()
    assert described[0]["platform"] == "cpu" and described[0]["id"] == probe.devices[0].id

    probe.scan_live_arrays(now=123.0)
    recs = probe.sample(include_map=True)
    assert len(recs) == len(probe.devices)
    rec = next(r for r in recs if r["id"] == mine[0].devices().pop().id)
    assert rec["source"] == "live_arrays"
    assert rec["platform"] == "cpu"
    assert rec["bytes_in_use"] >= my_bytes
    assert rec["peak_rise_bytes"] is None
    assert rec["fragmentation"] is None
    assert "None" in rec["fragmentation_reason"]
    live = rec["live_arrays"]
    assert live["bytes"] == rec["bytes_in_use"]
    assert live["count"] >= 3
    assert live["largest_bytes"] >= 256 * 256 * 4
    assert live["scanned_t"] == 123.0
    mapped = {ptr: n for ptr, n in live["map"]}
    if not jm.addresses_askable():
        # Before jaxlib 0.10.1 asking an output's address adds an Array to
        # the program's live_arrays(): counted, never placed.
        assert mapped == {} and rec["live_arrays"]["unmapped"]["no_address"] >= len(mine)
        return
    for a in mine:
        assert mapped.get(a.unsafe_buffer_pointer()) == a.nbytes
    assert [p for p, _ in live["map"]] == sorted(mapped)
    assert live["map_complete"] is True
    assert live["top"][0]["nbytes"] == live["largest_bytes"]
    # Every buffer here has an address: the holes among them are measured,
    # by the same rule as from jax.live_arrays()' own pointers (each buffer once).
    spans = {(a.unsafe_buffer_pointer(), a.nbytes) for a in cpu_jax.live_arrays() if len(a.devices()) == 1}
    oracle = buffer_detail.hole_ratio(sorted(spans))
    assert oracle is not None and live["holes"] == pytest.approx(oracle) and 0.0 <= live["holes"] <= 1.0

    # Without the map the record stays small.
    small = probe.sample(include_map=False)[0]["live_arrays"]
    assert "map" not in small and "top" not in small
    del mine


def test_cpu_probe_sees_arrays_go_away(cpu_jax):
    jnp = cpu_jax.numpy
    probe = JaxMemoryProbe()
    big = jnp.ones((1024, 1024), jnp.float32).block_until_ready()
    probe.scan_live_arrays(time.time())
    with_big = probe.sample(include_map=False)[0]["bytes_in_use"]
    big.delete()
    probe.scan_live_arrays(time.time())
    without = probe.sample(include_map=False)[0]["bytes_in_use"]
    assert with_big - without >= 4 * MiB


def test_sample_before_any_scan_reports_zero_live_bytes_and_no_scan_time(cpu_jax):
    probe = JaxMemoryProbe()
    rec = probe.sample(include_map=True)[0]
    assert rec["live_arrays"]["scanned_t"] is None
    assert rec["live_arrays"]["map"] == []


class FakeDevice:
    def __init__(self, id, stats_seq, platform="gpu"):
        self.id = id
        self.platform = platform
        self.device_kind = "NVIDIA H200"
        self._stats = list(stats_seq)

    def memory_stats(self):
        item = self._stats.pop(0) if len(self._stats) > 1 else self._stats[0]
        if isinstance(item, Exception):
            raise item
        return None if item is None else dict(item)


def test_fake_gpu_device_uses_memory_stats(cpu_jax, monkeypatch):
    probe = JaxMemoryProbe()
    second = dict(BFC_GPU, peak_bytes_in_use=7 * GiB, bytes_in_use=4 * GiB)
    monkeypatch.setattr(probe, "devices", [FakeDevice(0, [BFC_GPU, second])])
    first = probe.sample(include_map=False)[0]
    assert first["source"] == "memory_stats"
    for key, value in BFC_GPU.items():
        assert first[key] == value, key
    assert first["peak_rise_bytes"] is None  # nothing to compare with yet
    assert first["fragmentation"] == pytest.approx(2 / 3)
    assert "fragmentation_reason" not in first

    rec = probe.sample(include_map=False)[0]
    assert rec["peak_rise_bytes"] == 1 * GiB
    assert rec["bytes_in_use"] == 4 * GiB
    assert rec["fragmentation"] == pytest.approx(0.75)  # 4 GiB cached, 1 GiB largest block
    assert probe.describe()[0] == {"id": 0, "platform": "gpu", "kind": "NVIDIA H200", "process_index": 0}


def test_fake_pjrt_c_api_device_gives_none_not_minus_one(cpu_jax, monkeypatch):
    probe = JaxMemoryProbe()
    monkeypatch.setattr(probe, "devices", [FakeDevice(0, [PJRT_C_API_GPU])])
    rec = probe.sample(include_map=False)[0]
    assert rec["source"] == "memory_stats"
    assert rec["pool_bytes"] is None and rec["largest_free_block_bytes"] is None
    assert rec["fragmentation"] is None and rec["fragmentation_reason"]
    assert -1 not in rec.values()


def test_fake_cuda_async_device(cpu_jax, monkeypatch):
    probe = JaxMemoryProbe()
    monkeypatch.setattr(probe, "devices", [FakeDevice(3, [CUDA_ASYNC_GPU])])
    rec = probe.sample(include_map=False)[0]
    assert rec["id"] == 3
    assert rec["bytes_in_use"] == 300 * MiB
    assert "pool_bytes" not in rec  # not invented
    assert rec["fragmentation"] is None
    assert "cuda_async" in rec["fragmentation_reason"]


def test_memory_stats_raising_falls_back_to_live_arrays(cpu_jax, monkeypatch):
    probe = JaxMemoryProbe()
    monkeypatch.setattr(probe, "devices", [FakeDevice(0, [RuntimeError("UNIMPLEMENTED")])])
    rec = probe.sample(include_map=False)[0]
    assert rec["source"] == "live_arrays"
    assert rec["fragmentation"] is None


def test_scan_counts_each_shard_on_its_device_and_skips_deleted_arrays(cpu_jax, monkeypatch):
    """A sharded array's bytes per device come from its sharding; its shards
    are never materialised (that would add Arrays to the program's own
    jax.live_arrays())."""
    import numpy as np

    probe = JaxMemoryProbe()
    d0, d1 = FakeDevice(0, [None], "cpu"), FakeDevice(1, [None], "cpu")

    class Sharded:
        dtype = np.dtype("float32")
        shape = (8,)
        nbytes = 32
        sharding = SimpleNamespace(device_set={d0, d1}, addressable_devices={d0, d1},
                                   shard_shape=lambda shape: (shape[0] // 2,))

        @property
        def addressable_shards(self):
            raise AssertionError("the scan materialised the shards")

    class Deleted:
        @property
        def dtype(self):
            raise RuntimeError("Array has been deleted")

    fake_jax = SimpleNamespace(live_arrays=lambda: [Sharded(), Deleted()])
    monkeypatch.setattr(probe, "_jax", fake_jax)
    monkeypatch.setattr(probe, "devices", [d0, d1])
    probe.scan_live_arrays(now=1.0)
    recs = {r["id"]: r for r in probe.sample(include_map=True)}
    assert recs[0]["bytes_in_use"] == 16 and recs[1]["bytes_in_use"] == 16
    assert recs[0]["live_arrays"]["top"][0]["shape"] == "[4]"
    # No address without the shard: the map says what it left out.
    assert recs[0]["live_arrays"]["map"] == [] and recs[0]["live_arrays"]["unmapped"] == {"sharded": 1}


def test_scan_counts_a_buffer_shared_by_two_arrays_once(cpu_jax, monkeypatch):
    probe = JaxMemoryProbe()
    d0 = FakeDevice(0, [None], "cpu")

    def array(ptr):
        return SimpleNamespace(dtype="float32", shape=(4,), nbytes=16, sharding=SimpleNamespace(device_set={d0}),
                               is_deleted=lambda: False, is_ready=lambda: True, unsafe_buffer_pointer=lambda: ptr)

    monkeypatch.setattr(probe, "_jax", SimpleNamespace(live_arrays=lambda: [array(0x40), array(0x40), array(0x80)]))
    monkeypatch.setattr(probe, "devices", [d0])
    probe.scan_live_arrays(now=1.0)
    (rec,) = probe.sample(include_map=True)
    assert rec["bytes_in_use"] == 32 and rec["live_arrays"]["count"] == 2
    assert rec["live_arrays"]["map"] == [[0x40, 16], [0x80, 16]]


class FakeArray:
    """An Array stand-in that takes weak references, as jax's Arrays do, so
    the scan remembers it by identity (SimpleNamespace takes none)."""

    def __init__(self, device, ptr, nbytes=16, ready=True):
        import numpy as np

        self.dtype, self.shape, self.nbytes = np.dtype("float32"), (nbytes // 4,), nbytes
        self.sharding = SimpleNamespace(device_set={device})
        self.ptr, self.ready, self.asked = ptr, ready, 0

    def is_deleted(self):
        return False

    def is_ready(self):
        self.asked += 1
        return self.ready

    def unsafe_buffer_pointer(self):
        return self.ptr


def _probe_over(monkeypatch, arrays, devices):
    probe = JaxMemoryProbe()
    monkeypatch.setattr(probe, "_jax", SimpleNamespace(live_arrays=lambda: list(arrays)))
    monkeypatch.setattr(probe, "devices", devices)
    return probe


def test_a_buffer_seen_ready_keeps_its_address_and_is_not_asked_again(cpu_jax, monkeypatch):
    d0 = FakeDevice(0, [None], "cpu")
    arr = FakeArray(d0, 0x40)
    probe = _probe_over(monkeypatch, [arr], [d0])
    probe.scan_live_arrays(now=1.0)
    arr.ready = False  # an address never changes while its Array lives
    probe.scan_live_arrays(now=2.0)
    (rec,) = probe.sample(include_map=True)
    assert rec["live_arrays"]["map"] == [[0x40, 16]] and "unmapped" not in rec["live_arrays"]
    assert arr.asked == 1


def test_an_unchanged_set_of_arrays_is_not_read_again(cpu_jax, monkeypatch):
    d0 = FakeDevice(0, [None], "cpu")
    arrays = [FakeArray(d0, 0x1000 * (i + 1), nbytes=8 * (i + 1)) for i in range(50)]
    probe = _probe_over(monkeypatch, arrays, [d0])
    assert probe.scan_live_arrays(now=1.0) is True and probe.arrays.read_last == 50
    assert probe.scan_live_arrays(now=2.0) is False and probe.arrays.read_last == 0
    assert all(a.asked == 1 for a in arrays)
    (rec,) = probe.sample(include_map=False)
    assert rec["bytes_in_use"] == sum(8 * (i + 1) for i in range(50))
    assert rec["live_arrays"]["count"] == 50 and rec["live_arrays"]["scanned_t"] == 2.0


def test_arrivals_and_departures_are_read_alone_and_totals_follow(cpu_jax, monkeypatch):
    d0, d1 = FakeDevice(0, [None], "cpu"), FakeDevice(1, [None], "cpu")
    arrays = [FakeArray(d0, 0x1000 * (i + 1), nbytes=100) for i in range(10)]
    probe = _probe_over(monkeypatch, arrays, [d0, d1])
    probe.scan_live_arrays(now=1.0)
    del arrays[3:5]  # two go away (their objects die: CPython may give their ids to the next ones)
    arrays.append(FakeArray(d1, 0x90000, nbytes=8))
    arrays.append(FakeArray(d0, 0xA0000, nbytes=1000))
    assert probe.scan_live_arrays(now=2.0) is True
    assert probe.arrays.read_last == 2  # only the newcomers were read
    recs = {r["id"]: r for r in probe.sample(include_map=False)}
    assert recs[0]["bytes_in_use"] == 8 * 100 + 1000 and recs[0]["live_arrays"]["count"] == 9
    assert recs[0]["live_arrays"]["largest_bytes"] == 1000
    assert recs[1]["bytes_in_use"] == 8 and recs[1]["live_arrays"]["count"] == 1
    del arrays[-1]  # the largest goes: the largest is found again
    probe.scan_live_arrays(now=3.0)
    assert probe.sample(include_map=False)[0]["live_arrays"]["largest_bytes"] == 100


def test_a_shared_buffer_stays_counted_once_when_its_first_holder_goes(cpu_jax, monkeypatch):
    d0 = FakeDevice(0, [None], "cpu")
    first, second, other = FakeArray(d0, 0x40), FakeArray(d0, 0x40), FakeArray(d0, 0x80)
    arrays = [first, second, other]
    probe = _probe_over(monkeypatch, arrays, [d0])
    probe.scan_live_arrays(now=1.0)
    assert probe.sample(include_map=False)[0]["bytes_in_use"] == 32
    arrays.remove(first)
    probe.scan_live_arrays(now=2.0)
    (rec,) = probe.sample(include_map=True)
    assert rec["bytes_in_use"] == 32 and rec["live_arrays"]["count"] == 2
    assert rec["live_arrays"]["map"] == [[0x40, 16], [0x80, 16]]
    arrays.remove(second)
    probe.scan_live_arrays(now=3.0)
    assert probe.sample(include_map=False)[0]["bytes_in_use"] == 16


def test_a_pending_buffer_is_asked_again_until_it_has_an_address(cpu_jax, monkeypatch):
    d0 = FakeDevice(0, [None], "cpu")
    arr = FakeArray(d0, 0x40, nbytes=64, ready=False)
    probe = _probe_over(monkeypatch, [arr], [d0])
    probe.scan_live_arrays(now=1.0)
    (rec,) = probe.sample(include_map=True)
    assert rec["bytes_in_use"] == 64 and rec["live_arrays"]["unmapped"] == {"not_ready": 1}
    arr.ready = True
    probe.scan_live_arrays(now=2.0)
    (rec,) = probe.sample(include_map=True)
    assert rec["bytes_in_use"] == 64 and rec["live_arrays"]["map"] == [[0x40, 64]]
    assert "unmapped" not in rec["live_arrays"]
    probe.scan_live_arrays(now=3.0)
    assert arr.asked == 2  # placed: not asked again


def test_the_detail_is_carried_once_per_derivation(cpu_jax, monkeypatch):
    """Samples carry the map only when it was derived anew (a reader keeps the
    last one); its map_t is the scan it shows (1.0), not its derivation (1.5)."""
    d0 = FakeDevice(0, [None], "cpu")
    arrays = [FakeArray(d0, 0x40)]
    probe = _probe_over(monkeypatch, arrays, [d0])
    probe.scan_live_arrays(now=1.0, detail=False)
    assert probe.detail_stale()
    probe.refresh_detail(now=1.5)
    assert not probe.detail_stale()
    first = probe.sample(include_map=True)[0]["live_arrays"]
    assert first["map"] == [[0x40, 16]] and first["map_t"] == 1.0
    assert "map" not in probe.sample(include_map=True)[0]["live_arrays"]
    probe.scan_live_arrays(now=2.0, detail=False)  # nothing changed
    assert not probe.detail_stale()
    arrays.append(FakeArray(d0, 0x80))
    probe.scan_live_arrays(now=3.0, detail=False)
    assert probe.detail_stale()


def test_scan_never_waits_for_a_buffer_still_being_computed(cpu_jax, monkeypatch):
    """A pending buffer is counted but not mapped: asking for its pointer
    would block (holding the GIL) until the step that produces it finishes."""
    probe = JaxMemoryProbe()
    d0 = FakeDevice(0, [None], "cpu")

    def must_not_wait():
        raise AssertionError("unsafe_buffer_pointer() called on a pending buffer")

    pending = SimpleNamespace(
        dtype="float32", shape=(256,), nbytes=1024,
        sharding=SimpleNamespace(device_set={d0}),
        is_deleted=lambda: False, is_ready=lambda: False, unsafe_buffer_pointer=must_not_wait,
    )
    ready = SimpleNamespace(
        dtype="float32", shape=(4,), nbytes=16,
        sharding=SimpleNamespace(device_set={d0}),
        is_deleted=lambda: False, is_ready=lambda: True, unsafe_buffer_pointer=lambda: 0x40,
    )
    monkeypatch.setattr(probe, "_jax", SimpleNamespace(live_arrays=lambda: [pending, ready]))
    monkeypatch.setattr(probe, "devices", [d0])
    probe.scan_live_arrays(now=1.0)
    (rec,) = probe.sample(include_map=True)
    assert rec["bytes_in_use"] == 1040  # both counted
    assert rec["live_arrays"]["map"] == [[0x40, 16]]  # only the ready one placed


def _oracle(jax):
    """Bytes and buffers per device, straight from jax.live_arrays(): each
    single-device buffer once by address."""
    seen, per = set(), {}
    for a in jax.live_arrays():
        (dev,) = a.sharding.device_set
        key = (dev.id, a.unsafe_buffer_pointer())
        if key in seen:
            continue
        seen.add(key)
        nbytes, count = per.get(dev.id, (0, 0))
        per[dev.id] = (nbytes + a.nbytes, count + 1)
    return per


def test_totals_at_50000_arrays_match_jax_live_arrays_through_churn(cpu_jax):
    """At model scale (50,000 arrays: parameters plus optimizer state) the
    incremental totals equal a full count from jax.live_arrays(), after
    arrivals, departures and a program that rebinds part of its state."""
    jnp = cpu_jax.numpy
    held = [jnp.full((i % 7 + 1, 3), i, dtype=jnp.float32 if i % 2 else jnp.int8) for i in range(50_000)]
    cpu_jax.block_until_ready(held)
    probe = JaxMemoryProbe()
    try:
        probe.scan_live_arrays(now=1.0)

        def totals():
            return {r["id"]: (r["bytes_in_use"], r["live_arrays"]["count"]) for r in probe.sample(include_map=False)
                    if r["live_arrays"]["count"]}

        assert totals() == _oracle(cpu_jax)
        probe.scan_live_arrays(now=2.0)
        if jm.addresses_askable():
            assert probe.arrays.read_last == 0  # the probe asked nothing that made an Array
        else:
            # Before jaxlib 0.10.1 the oracle's questions made an Array per buffer: read once, as aliases.
            assert probe.arrays.read_last == 50_000 and totals() == _oracle(cpu_jax)
        assert probe.scan_live_arrays(now=2.5) is False and probe.arrays.read_last == 0
        # A step that rebinds a fifth of the state, frees some and makes new ones.
        for i in range(0, 50_000, 5):
            held[i] = held[i] + 1
        del held[-3000:]
        held.extend(jnp.zeros((64,)) for _ in range(1000))
        cpu_jax.block_until_ready(held)
        assert probe.scan_live_arrays(now=3.0) is True
        assert probe.arrays.read_last < 12_000  # the newcomers, not everything
        assert totals() == _oracle(cpu_jax)
    finally:
        probe.close()
        del held


def test_a_first_scan_leaves_the_collector_nothing_new_to_follow(cpu_jax):
    """The references a scan keeps per array are taken out of the cyclic
    collector's lists, and the parents' open slots hold plain ints: a first
    scan of 20,000 arrays (half put from the host, half a jitted call's
    outputs) adds almost no object the collector follows. Before, it added
    two per array put from the host (a weak reference, a one-key list), which
    at 50,000 arrays set off a full collection of the program's heap
    (60-110 ms holding the interpreter, measured by benchmarks/start_cost.py)."""
    import gc

    import numpy as np

    jnp = cpu_jax.numpy
    put = [cpu_jax.device_put(np.full((4,), i, np.float32)) for i in range(10_000)]
    made = [jnp.full((3,), i, dtype=jnp.float32) for i in range(10_000)]
    cpu_jax.block_until_ready(made)
    probe = JaxMemoryProbe()
    try:
        gc.collect()
        before = len(gc.get_objects())
        probe.scan_live_arrays(now=1.0)
        added = len(gc.get_objects()) - before
        assert added < 1000, added
        counted = {r["id"]: r["live_arrays"]["count"] for r in probe.sample(include_map=False)}
        assert sum(counted.values()) >= 20_000
        # The references still tell an array gone: untracked, not unhooked.
        del put[:5000]
        gc.collect()
        assert probe.scan_live_arrays(now=2.0) is True
        assert sum(r["live_arrays"]["count"] for r in probe.sample(include_map=False)) == sum(counted.values()) - 5000
    finally:
        probe.close()
        del put, made


def test_a_scan_hands_the_interpreter_back_while_it_reads(cpu_jax, monkeypatch):
    """Reading a newcomer costs ~7 µs of Python; Python takes the interpreter
    from a busy thread only every 5 ms. A first scan of 50,000 arrays in one
    go held a thread of the program up to 116-247 ms: the scan hands it back
    every READ_PIECE reads."""
    from jaxtop.probes import live_arrays

    jnp = cpu_jax.numpy
    held = [jnp.full((2,), i, dtype=jnp.float32) for i in range(1000)]
    cpu_jax.block_until_ready(held)
    handed: list[float] = []
    monkeypatch.setattr(live_arrays, "hand_back", lambda: handed.append(1.0) or 0.0)
    probe = JaxMemoryProbe()
    try:
        probe.scan_live_arrays(now=1.0)
        assert probe.arrays.read_last >= 1000
        assert len(handed) >= probe.arrays.read_last // live_arrays.READ_PIECE >= 10
    finally:
        probe.close()
        del held
