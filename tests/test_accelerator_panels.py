"""Pure and pilot layers: panels named after the backend, NVML said only
where the devices are NVIDIA GPUs, and the TPU runtime's readings on the
Host & TPU panel, drawn from recordings through the model.

The TPU recording is jaxtop's own run on a TPU v5e (tests/fixtures/tpu/, no
``accelerator`` field: it predates the probe); its readings are added here
as the probe sends them, where a test needs some.
"""

from __future__ import annotations

import copy
import gzip
import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from jaxtop.dashboard.accelerator import backend_kind, nvml_absent, nvml_worth_saying
from jaxtop.wire.records import Nvml
from jaxtop.dashboard.model import Model
from jaxtop.probes.tpu_monitoring import EMPTY_REASON, METRICS
from jaxtop.widgets.panels import EventsPanel, HostPanel, Panel, TransfersPanel

FIXTURES = Path(__file__).parent / "fixtures"
TPU_RECORDING = FIXTURES / "tpu" / "training-loop.jsonl.gz"
GPU_RECORDING = FIXTURES / "synthetic_gpu.jsonl"
CPU_RECORDING = FIXTURES / "cpu_train_loop.jsonl"
GiB = 1 << 30
#: (width, height) of the Host and Transfers panels at 120x40 and 80x24.
HOST_SIZES = [(59, 4), (39, 4)]
TRANSFER_SIZES = [(60, 7), (40, 5)]
#: The words no panel may say on a TPU or CPU machine without NVIDIA's library.
NVIDIA_WORDS = ("NVML", "GPU", "PCIe")


def records(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def snapshot_of(recs: list[dict[str, Any]]):
    model = Model(clock=lambda: 0.0)
    pid = next(r["pid"] for r in recs if r.get("type") == "hello")
    model.feed_many(pid, recs)
    last = max(r["t"] for r in recs if r.get("type") == "sample")
    return model.snapshot(selected=0, window_s=None, now=last)


def drawn(panel: Panel, snap, width: int, height: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(panel.draw(snap, width, height))
    return console.export_text()


def with_readings(recs: list[dict[str, Any]], value: dict[str, Any], every: int = 0) -> list[dict[str, Any]]:
    """The recording with the ``accelerator`` field the probe sends: on the
    first sample that has a device (and each ``every``-th one after it)."""
    out, seen = [], 0
    for r in recs:
        if r.get("type") == "sample" and r.get("devices"):
            if seen == 0 or (every and seen % every == 0):
                r = dict(r, accelerator=dict(value, t=r["t"]))
            seen += 1
        out.append(r)
    return out


EMPTY_READING = {"kind": "tpu", "available": True, "source": "libtpu.sdk.tpumonitoring", "metrics": {},
                 "unavailable": {name: EMPTY_REASON for name in METRICS}}
ANSWERED = {"kind": "tpu", "available": True, "source": "libtpu.sdk.tpumonitoring",
            "metrics": {"duty_cycle_pct": [87.5], "tensorcore_util": [41.25], "hbm_capacity_usage": [11 * GiB],
                        "hbm_capacity_total": [16 * GiB], "hlo_queue_size": {"tensorcore-0": 3}},
            "hlo_queue_size": 3,
            "unavailable": {"hlo_execution_timing": EMPTY_REASON, "host_to_device_transfer_latency": EMPTY_REASON,
                            "device_to_host_transfer_latency": EMPTY_REASON}}


@pytest.fixture(scope="module")
def tpu_records() -> list[dict[str, Any]]:
    return records(TPU_RECORDING)


# -- a TPU: no NVML, no GPU, no PCIe ----------------------------------------------------------------

@pytest.mark.parametrize(("width", "height"), HOST_SIZES)
def test_the_tpu_recording_names_the_tpu_and_says_nothing_of_nvml(tpu_records, width, height):
    snap = snapshot_of(tpu_records)
    host = drawn(HostPanel(), snap, width, height)
    assert host.splitlines()[0].strip() == "Host & TPU"
    assert not any(word in host for word in NVIDIA_WORDS), host
    # The recording predates the runtime's readings: n/a with why, never 0.
    assert "TPU" in host.splitlines()[2] and "n/a" in host.splitlines()[2] and "0%" not in host
    assert "RSS" in host and "compiles 309" in host


@pytest.mark.parametrize(("width", "height"), TRANSFER_SIZES)
def test_the_tpu_transfers_panel_has_no_pcie_line(tpu_records, width, height):
    text = drawn(TransfersPanel(), snapshot_of(tpu_records), width, height)
    assert "h2d" in text and not any(word in text for word in NVIDIA_WORDS), text


def test_the_tpu_recording_brings_no_nvml_event(tpu_records):
    snap = snapshot_of(tpu_records)
    assert not [e.text for e in snap.events if "NVML" in e.text]
    assert any(e.text == "JAX backend ready: tpu, 1 device(s)" for e in snap.events)
    assert "NVML" not in drawn(EventsPanel(), snap, 120, 500)


def test_before_the_backend_the_host_panel_names_nothing(tpu_records):
    """The hello comes before jax: the backend is not known yet, and NVML's
    absence is not news either way until it is."""
    hello = [r for r in tpu_records if r["type"] == "hello"]
    hello_and_first = hello + [r for r in tpu_records if r["type"] == "sample"][:5]
    snap = snapshot_of(hello_and_first)
    host = drawn(HostPanel(), snap, 59, 4)
    assert host.splitlines()[0].strip() == "Host" and not any(w in host for w in NVIDIA_WORDS)
    assert not [e for e in snap.events if "NVML" in e.text]


def test_the_runtimes_empty_answers_read_na_once_with_the_reason(tpu_records):
    """What the probe would have sent on that chip: every metric []."""
    snap = snapshot_of(with_readings(tpu_records, EMPTY_READING))
    line = drawn(HostPanel(), snap, 120, 4).splitlines()[2]
    assert line.strip() == "TPU runtime metrics n/a — the runtime reports nothing (data() is [])"
    for width, _ in HOST_SIZES:
        line = drawn(HostPanel(), snap, width, 4).splitlines()[2]
        assert "n/a" in line and "%" not in line and len(line.rstrip()) <= width


def test_the_runtimes_answers_are_shown(tpu_records):
    snap = snapshot_of(with_readings(tpu_records, ANSWERED))
    acc = snap.processes[0].accelerator
    assert acc is not None and acc.hlo_queue_size == 3 and acc.duty_cycle_pct == (87.5,)
    wide = drawn(HostPanel(), snap, 59, 4).splitlines()[2]
    assert wide.strip() == "TPU duty 88%  TC 41%  HBM 11.0 of 16.0 GiB  queued 3"
    widest = drawn(HostPanel(), snap, 100, 4).splitlines()[2]
    assert widest.strip() == "TPU duty 88%  TensorCore 41%  HBM 11.0 of 16.0 GiB  queued 3"
    narrow = drawn(HostPanel(), snap, 39, 4).splitlines()[2]
    assert "88%" in narrow and "41%" in narrow and "3" in narrow and len(narrow.rstrip()) <= 39


def test_a_metric_the_runtime_left_out_is_na_with_its_reason(tpu_records):
    partial = copy.deepcopy(ANSWERED)
    del partial["metrics"]["tensorcore_util"], partial["metrics"]["hlo_queue_size"], partial["hlo_queue_size"]
    partial["unavailable"].update(tensorcore_util=EMPTY_REASON, hlo_queue_size="RuntimeError: boom")
    snap = snapshot_of(with_readings(tpu_records, partial))
    line = drawn(HostPanel(), snap, 120, 4).splitlines()[2]
    assert "duty 88%" in line and "TensorCore n/a (none reported)" in line and "queued n/a (error)" in line
    assert "0%" not in line


def test_the_readings_stand_between_the_samples_that_carry_them(tpu_records):
    """The field is sent when it changes: the model keeps the last one."""
    recs = with_readings(tpu_records, ANSWERED)
    assert sum("accelerator" in r for r in recs) == 1
    assert snapshot_of(recs).processes[0].accelerator.tensorcore_util_pct == (41.25,)


def test_a_runtime_that_could_not_be_read_says_why(tpu_records):
    value = {"kind": "tpu", "available": False,
             "reason": "jax did not import libtpu's Python package, so jaxtop does not"}
    line = drawn(HostPanel(), snapshot_of(with_readings(tpu_records, value)), 120, 4).splitlines()[2]
    assert line.strip() == f"TPU runtime metrics n/a — {value['reason']}"


def test_an_odd_accelerator_field_is_said_once_and_shown_na(tpu_records):
    recs = with_readings(tpu_records, ANSWERED, every=50)
    for r in recs:
        if "accelerator" in r:
            r["accelerator"] = ["not", "an", "object"]
            break
    snap = snapshot_of(recs)
    assert len([e for e in snap.events if "accelerator" in e.text]) == 1
    assert snap.processes[0].accelerator is not None  # the later, well-formed readings stand


@pytest.mark.parametrize("odd", [
    {"kind": "tpu", "metrics": {"duty_cycle_pct": ["87"], "tensorcore_util": [float("nan")],
                                "hbm_capacity_usage": [10**400], "hbm_capacity_total": {"a": 1}},
     "hlo_queue_size": 1e300, "unavailable": ["not", "an", "object"]},
    {"kind": 7, "available": False, "reason": {"nested": [[["deep"]]]}},
    {"kind": "tpu", "metrics": [], "hlo_queue_size": -3, "unavailable": {"duty_cycle_pct": 12}},
])
def test_hostile_readings_draw_na_without_an_error(tpu_records, odd):
    snap = snapshot_of(with_readings(tpu_records, odd))
    for width, height in HOST_SIZES:
        text = drawn(HostPanel(), snap, width, height)
        assert "render error" not in text and len(text.splitlines()) == 4
        assert all(len(line) <= width for line in text.splitlines())


# -- a GPU: NVML's rows stay, and its failure is still said ---------------------------------------

def test_the_gpu_recording_still_shows_nvml_gpu_and_pcie():
    snap = snapshot_of(records(GPU_RECORDING))
    host = drawn(HostPanel(), snap, 59, 4)
    assert host.splitlines()[0].strip() == "Host & GPU"
    assert host.splitlines()[2].startswith(" GPU ") and "°C" in host
    assert "PCIe TX" in drawn(TransfersPanel(), snap, 60, 7)


def test_on_a_gpu_a_failing_nvml_is_still_said():
    recs = records(GPU_RECORDING)
    for r in recs:
        if r["type"] == "hello":
            r["nvml"] = {"available": False, "reason": "NVML unavailable: NVMLError_DriverNotLoaded: Driver Not Loaded"}
        r.pop("nvml", None) if r["type"] == "sample" else None
    snap = snapshot_of(recs)
    host = drawn(HostPanel(), snap, 59, 4)
    assert host.splitlines()[0].strip() == "Host & GPU" and "GPU n/a — NVML unavailable" in host
    assert "PCIe n/a (no NVML device)" in drawn(TransfersPanel(), snap, 60, 7)
    assert [e.text for e in snap.events if "NVML" in e.text] == [
        "NVML n/a: NVML unavailable: NVMLError_DriverNotLoaded: Driver Not Loaded"]


# -- a CPU: "Host", nothing of NVML ----------------------------------------------------------------

def test_the_cpu_recording_is_host_only():
    snap = snapshot_of(records(CPU_RECORDING))
    host = drawn(HostPanel(), snap, 59, 4)
    lines = host.splitlines()
    assert lines[0].strip() == "Host" and "RSS" in lines[1] and "compiles" in lines[2]
    assert not any(w in host for w in NVIDIA_WORDS)
    assert not any(w in drawn(TransfersPanel(), snap, 60, 7) for w in NVIDIA_WORDS)
    assert not [e for e in snap.events if "NVML" in e.text]


# -- the rules, on what recordings hold ------------------------------------------------------------

@pytest.mark.parametrize(("backend", "platforms", "kind"), [
    ("tpu", (), "tpu"), (None, ["tpu"], "tpu"), ("gpu", (), "gpu"), ("cuda", (), "gpu"), ("rocm", (), "gpu"),
    ("cpu", ["gpu"], "cpu"), (None, [], None), (None, ["?"], None), ("METAL", (), "metal"), (7, ["cpu"], "cpu"),
])
def test_backend_kind(backend, platforms, kind):
    assert backend_kind(backend, platforms) == kind


@pytest.mark.parametrize(("reason", "absent"), [
    ("NVML unavailable: NVMLError_LibraryNotFound: NVML Shared Library Not Found", True),
    ("NVML unavailable: NVMLError_DriverNotLoaded: Driver Not Loaded", True),
    ("nvidia-ml-py is not installed (No module named 'pynvml')", True),
    ("disabled", True),
    ("not exported to Prometheus", True),
    ("NVML unavailable: NVMLError_NoPermission: Insufficient Permissions", False),
    (None, False),
])
def test_nvml_absent(reason, absent):
    assert nvml_absent(Nvml(available=False, reason=reason)) is absent


def test_when_an_nvml_failure_is_news():
    missing = Nvml(available=False, reason="NVML unavailable: NVMLError_LibraryNotFound: NVML Shared Library Not Found")
    denied = Nvml(available=False, reason="NVML unavailable: NVMLError_NoPermission: Insufficient Permissions")
    assert nvml_worth_saying(missing, "tpu") is False and nvml_worth_saying(missing, "cpu") is False
    assert nvml_worth_saying(missing, "gpu") is True and nvml_worth_saying(denied, "cpu") is True
    assert nvml_worth_saying(missing, None) is None  # the backend decides, when it comes
    assert nvml_worth_saying(missing, None, external=True) is True  # NVML is one of its two sources
    assert nvml_worth_saying(Nvml(available=True), "gpu") is None


# -- the whole screen, in the app -------------------------------------------------------------------

@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_the_replayed_tpu_screen_says_no_nvml_gpu_or_pcie(size):
    from test_app_pilot import settle, text_of

    from jaxtop.dashboard.app import make_app
    from jaxtop.dashboard.sources import ReplaySource

    src = ReplaySource(str(TPU_RECORDING), start_playing=False)
    app = make_app(src)
    async with app.run_test(size=size) as pilot:
        await settle(pilot, app, lambda: src.replay_state().get("t_end") is not None, timeout=30)
        src.seek(src.replay_state()["t_end"])
        await settle(pilot, app, lambda: app.snapshot.devices and app.snapshot.processes[0].compile.count_total == 309,
                     timeout=30)
        # Every panel but the memory layers, whose NVML row has tests of its own.
        shown = {p.id: text_of(p) for p in app.query(Panel) if p.display and p.id != "memory"}
        assert "Host & TPU" in shown["host"] and {"header", "timeline", "transfers", "events"} <= set(shown)
        for name, text in shown.items():
            assert not any(word in text for word in NVIDIA_WORDS), (name, text)
