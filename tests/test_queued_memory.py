"""In-use memory that no live array holds: work queued ahead of an
accelerator by async dispatch, from the agent's scan to every place a user
reads it (Memory panel, timeline, snapshot, OOM verdict).

On a TPU v5e an MLP training loop held 10-11 GiB while its live arrays were
2.4 GiB (tests/fixtures/tpu/training-loop.jsonl.gz): the largest figure of
the run, unexplained before. The chip's recording is replayed here; the
agent's side is driven with a stand-in TPU device (no chip in CI).
"""

from __future__ import annotations

import gzip
import io
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from jaxtop.dashboard.model import Model
from jaxtop.dashboard.views import UNHELD_PAIR_S, unheld_of
from jaxtop.wire import protocol

FIXTURE = Path(__file__).parent / "fixtures" / "tpu" / "training-loop.jsonl.gz"
GiB, MiB = 1 << 30, 1 << 20


def _model_at(seconds: float) -> tuple[Model, float]:
    """The model fed the chip's recording up to ``seconds`` into it."""
    model = Model(clock=lambda: 0.0)
    with gzip.open(FIXTURE, "rb") as f:
        records = list(protocol.iter_records(f))
    t0 = records[0]["t"]
    for rec in records:
        if rec["t"] - t0 > seconds:
            break
        model.feed(1, rec)
    return model, t0 + seconds


def _stalled_at_sample_400() -> Model:
    """The chip's run whose live-array scan stalled, fed up to sample 400
    (the scan then ~20 s old)."""
    model = Model(clock=lambda: 0.0)
    with gzip.open(FIXTURE.with_name("training-loop-stall.jsonl.gz"), "rb") as f:
        for rec in protocol.iter_records(f):
            model.feed(1, rec)
            if rec.get("type") == "sample" and rec.get("seq") == 400:
                break
    return model


def _panel_text(panel, snap, width, height) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(panel.draw(snap, width, height))
    return console.export_text()


# -- pure: the figure ---------------------------------------------------------------

def test_unheld_is_exact_when_the_scan_read_the_allocator():
    assert unheld_of("memory_stats", 12 * GiB, 2 * GiB, 30.0, 10 * GiB) == (8 * GiB, True)


def test_unheld_pairs_a_recent_scan_with_the_sample_and_says_it_is_approximate():
    assert unheld_of("memory_stats", 12 * GiB, 2 * GiB, 0.4, None) == (10 * GiB, False)
    # A stale scan beside a fresh in-use figure would be a made-up number.
    assert unheld_of("memory_stats", 12 * GiB, 2 * GiB, UNHELD_PAIR_S + 0.1, None) is None


def test_unheld_is_unknown_without_allocator_statistics():
    """CPU: in use *is* the live arrays' sum; nothing to compare."""
    assert unheld_of("live_arrays", 2 * GiB, 2 * GiB, 0.0, None) is None
    assert unheld_of("memory_stats", 2 * GiB, None, 0.0, 2 * GiB) is None


def test_unheld_never_goes_below_zero():
    """Arrays made between the scan and the allocator's read: not negative memory."""
    assert unheld_of("memory_stats", 1 * GiB, 2 * GiB, 0.0, 1 * GiB) == (0, True)


# -- the agent: a stand-in TPU device -----------------------------------------------

class _TpuDevice:
    platform, device_kind = "tpu", "TPU v5 lite"

    def __init__(self, in_use):
        self.id, self.in_use = 0, in_use

    def memory_stats(self):
        return {"bytes_in_use": self.in_use, "peak_bytes_in_use": self.in_use, "bytes_limit": 16 * GiB,
                "largest_free_block_bytes": 16 * GiB - self.in_use, "num_allocs": 3}


class _Array:
    def __init__(self, device, ptr, nbytes, ready=True):
        import numpy as np

        self.dtype, self.shape, self.nbytes = np.dtype("float32"), (nbytes // 4,), nbytes
        self.sharding = SimpleNamespace(device_set={device})
        self.ptr, self.ready = ptr, ready

    def is_deleted(self):
        return False

    def is_ready(self):
        return self.ready

    def unsafe_buffer_pointer(self):
        return self.ptr


@pytest.fixture
def cpu_jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_platforms", "cpu")
    return jax


def test_the_scan_reads_the_allocator_and_counts_what_is_still_computing(cpu_jax, monkeypatch):
    from jaxtop.probes.jax_memory import JaxMemoryProbe

    dev = _TpuDevice(in_use=9 * GiB)
    done = _Array(dev, 0x1000, 1 * GiB)
    queued = [_Array(dev, 0x2000 + i, 256 * MiB, ready=False) for i in range(3)]
    probe = JaxMemoryProbe()
    monkeypatch.setattr(probe, "_jax", SimpleNamespace(live_arrays=lambda: [done, *queued]))
    monkeypatch.setattr(probe, "devices", [dev])
    probe.scan_live_arrays(now=1.0)
    dev.in_use = 11 * GiB  # the sample's own figure moves on; the scan's stays
    (rec,) = probe.sample(include_map=False)
    live = rec["live_arrays"]
    assert live["bytes"] == 1 * GiB + 3 * 256 * MiB
    assert live["in_use_bytes"] == 9 * GiB and rec["bytes_in_use"] == 11 * GiB
    assert (live["not_ready_count"], live["not_ready_bytes"]) == (3, 3 * 256 * MiB)
    for a in queued:
        a.ready = True
    probe.scan_live_arrays(now=2.0)  # asked again: they are done now
    (rec,) = probe.sample(include_map=False)
    assert "not_ready_count" not in rec["live_arrays"] and rec["live_arrays"]["in_use_bytes"] == 11 * GiB


def test_cpu_scans_carry_no_allocator_figure(cpu_jax):
    """memory_stats() is None on CPU: no in-use figure of the scan is made up."""
    from jaxtop.probes.jax_memory import JaxMemoryProbe

    keep = cpu_jax.numpy.ones(1000).block_until_ready()
    probe = JaxMemoryProbe()
    probe.scan_live_arrays(now=1.0)
    recs = probe.sample(include_map=False)
    assert recs and all("in_use_bytes" not in r["live_arrays"] for r in recs)
    del keep


# -- the chip's recording, replayed ---------------------------------------------------

def test_the_recording_shows_ten_gib_no_array_holds_and_what_one_step_holds():
    model, now = _model_at(40.0)
    snap = model.snapshot(now=now)
    dev = snap.devices[0]
    assert dev.platform == "tpu"
    unheld, exact = dev.unheld
    assert not exact  # this agent's scans did not read the allocator
    assert 9.5 * GiB < unheld < 11 * GiB
    assert unheld == dev.bytes_in_use - dev.live_bytes
    call = snap.processes[0].largest_call
    assert call.name == "jit_step"  # the training step, not an eager op
    assert call.call_held_bytes == 1073742848 + 53912064  # its outputs and temporaries (from the ledger)


def test_memory_panel_names_the_layer_and_leaves_nvml_and_pool_out_on_a_tpu():
    from jaxtop.widgets.panels import MemoryPanel

    model, now = _model_at(40.0)
    snap = model.snapshot(now=now)
    for width, height in ((60, 7), (40, 6)):
        text = _panel_text(MemoryPanel(), snap, width, height)
        assert "not in arrays" in text and "queued work" in text, text
        assert "jit_step" in text, text
        assert "NVML" not in text and "pool" not in text, text


def test_memory_panel_is_quiet_while_nothing_is_queued():
    """At rest (before the loop) the gap is the runtime's few KiB: no note."""
    from jaxtop.widgets.panels import MemoryPanel

    model, now = _model_at(16.0)
    snap = model.snapshot(now=now)
    assert snap.devices[0].unheld is not None and snap.devices[0].unheld[0] < MiB
    assert "queued" not in _panel_text(MemoryPanel(), snap, 60, 7)


def test_the_timeline_draws_live_arrays_under_in_use_and_names_the_gap():
    from jaxtop.widgets.panels import memory_strip

    model, now = _model_at(40.0)
    strip = memory_strip(model.snapshot(now=now, window_s=None).devices[0])
    assert "live arrays" in [s.name for s in strip.series]
    assert "not in arrays" in strip.note


def test_snapshot_text_says_the_layer_and_a_stale_scan_s_age():
    from jaxtop.dashboard.snapshot_text import snapshot_text as _text

    model, now = _model_at(40.0)
    text = _text(model.snapshot(now=now))
    line = next(x for x in text.splitlines() if "not in arrays" in x)
    assert "≈10.3 GiB" in line and "jit_step" in line
    assert "scanned 2" in _text(_stalled_at_sample_400().snapshot(now=0.0))  # ~20 s old in that run


# -- the OOM census -----------------------------------------------------------------

def test_oom_verdict_names_what_no_live_array_held():
    from jaxtop.probes.oom.verdict import device_verdict

    stats = {"bytes_in_use": 15 * GiB, "bytes_limit": 16 * GiB, "largest_free_block_bytes": 1 * GiB}
    text = device_verdict(stats, 2 * GiB, live_bytes=4 * GiB)
    assert "needed 1.00 GiB more" in text and "11.0 GiB of the in-use memory belonged to no live array" in text
    # The chip's own OOM: the program's arrays held it all; no such clause.
    assert "no live array" not in device_verdict(stats, 2 * GiB, live_bytes=15 * GiB - 72 * 1024)
    assert "no live array" not in device_verdict(stats, 2 * GiB)  # arrays not scanned completely


def test_a_stale_scan_says_its_age_first_on_a_small_panel():
    """The chip's stalled run (scan 20 s old at sample 400): the panel says
    how old the live arrays are before anything else, at 80x24's size."""
    from jaxtop.widgets.panels import MemoryPanel

    text = _panel_text(MemoryPanel(), _stalled_at_sample_400().snapshot(now=0.0), 40, 6)
    assert "live arrays as of 2" in text, text  # "as of 21s ago"


def test_the_runtime_s_queue_is_named_where_libtpu_answers():
    """libtpu's hlo_queue_size (the accelerator field) beside the layer."""
    from jaxtop.dashboard.snapshot_text import snapshot_text
    from jaxtop.widgets.panels import MemoryPanel

    model, now = _model_at(40.0)
    model.feed(1, {"type": "sample", "t": now, "seq": 10**6, "devices": [],
                   "accelerator": {"kind": "tpu", "available": True, "t": now, "hlo_queue_size": 7, "metrics": {}}})
    snap = model.snapshot(now=now)
    assert snap.processes[0].accelerator.hlo_queue_size == 7
    assert "queue 7" in _panel_text(MemoryPanel(), snap, 60, 7)
    assert "7 programs in the TPU runtime's queue" in snapshot_text(snap)
