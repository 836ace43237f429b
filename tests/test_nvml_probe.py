"""Pure layer: NvmlProbe (probes/nvml.py) against a fake ``pynvml`` module.

The fake follows nvidia-ml-py's names and units: memory in bytes, power in
milliwatts, PCIe throughput in KB/s, per-process ``usedGpuMemory`` in bytes.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from jaxtop.dashboard.accelerator import nvml_absent
from jaxtop.probes import nvml as nvml_module
from jaxtop.probes.nvml import NvmlProbe, visible_index_map
from jaxtop.wire.records import Nvml

GiB = 1 << 30


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class FakeNvml:
    """A stand-in for the ``pynvml`` module: two GPUs by default."""

    NVML_TEMPERATURE_GPU = 0
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1

    def __init__(self, count=2, pids=None, fail=(), init_error=None):
        self.count = count
        self.pids = pids if pids is not None else {0: [(os.getpid(), 3 * GiB), (99999, GiB)], 1: []}
        self.fail = set(fail)
        self.init_error = init_error
        self.calls: list[str] = []
        self.shutdown_called = False

    def _maybe_fail(self, name):
        self.calls.append(name)
        if name in self.fail:
            raise NVMLError_NotSupported("Not Supported")

    def nvmlInit(self):
        self.calls.append("init")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self):
        self.shutdown_called = True

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        self._maybe_fail("handle")
        return ("handle", i)

    def nvmlDeviceGetName(self, h):
        self._maybe_fail("name")
        return b"NVIDIA H200" if h[1] == 0 else "NVIDIA H200"  # bytes in old bindings

    def nvmlDeviceGetUUID(self, h):
        self._maybe_fail("uuid")
        return f"GPU-0000000{h[1]}-aaaa-bbbb-cccc-dddddddddddd"

    def nvmlDeviceGetMemoryInfo(self, h):
        self._maybe_fail("memory")
        total = 141 * GiB
        used = (10 + h[1]) * GiB
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, h):
        self._maybe_fail("utilization")
        return SimpleNamespace(gpu=87 + h[1], memory=40)

    def nvmlDeviceGetTemperature(self, h, sensor):
        self._maybe_fail("temperature")
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 55

    def nvmlDeviceGetPowerUsage(self, h):
        self._maybe_fail("power")
        return 312_500  # mW

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        self._maybe_fail("pcie")
        return {self.NVML_PCIE_UTIL_TX_BYTES: 2000, self.NVML_PCIE_UTIL_RX_BYTES: 500}[counter]  # KB/s

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self._maybe_fail("processes")
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self.pids.get(h[1], [])]


def started(nv, pid=None):
    probe = NvmlProbe(pid=pid, nvml=nv)
    assert probe.start(thread=False) is True
    return probe


def test_happy_path_values_and_units():
    nv = FakeNvml()
    probe = started(nv)
    out = probe.sample()
    assert out["available"] is True
    assert isinstance(out["t"], float)
    d0, d1 = out["devices"]
    assert d0["index"] == 0 and d1["index"] == 1
    assert d0["memory_used_bytes"] == 10 * GiB
    assert d0["memory_total_bytes"] == 141 * GiB
    assert d1["memory_used_bytes"] == 11 * GiB
    assert d0["gpu_util_percent"] == 87 and d1["gpu_util_percent"] == 88
    assert d0["mem_util_percent"] == 40
    assert d0["temperature_c"] == 55
    assert d0["power_w"] == pytest.approx(312.5)  # mW -> W
    assert d0["pcie_tx_bytes_per_s"] == 2000 * 1024  # KB/s -> bytes/s
    assert d0["pcie_rx_bytes_per_s"] == 500 * 1024
    assert d0["process_memory_bytes"] == 3 * GiB
    assert "process_memory_reason" not in d0
    assert probe.errors == {}
    probe.stop()
    assert nv.shutdown_called
    assert probe.sample()["available"] is False


def test_describe_names_and_uuids():
    probe = started(FakeNvml())
    desc = probe.describe()
    assert desc["available"] is True
    assert [d["name"] for d in desc["devices"]] == ["NVIDIA H200", "NVIDIA H200"]  # bytes decoded
    assert desc["devices"][1]["uuid"].startswith("GPU-00000001")


def test_describe_maps_jax_ids_through_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    desc = started(FakeNvml()).describe()
    assert [(d["index"], d["jax_id"]) for d in desc["devices"]] == [(0, None), (1, 0)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd")
    desc = started(FakeNvml()).describe()
    assert [(d["index"], d["jax_id"]) for d in desc["devices"]] == [(0, 0), (1, None)]


def test_library_not_found_means_unavailable_with_a_reason():
    nv = FakeNvml(init_error=NVMLError_LibraryNotFound("NVML Shared Library Not Found"))
    probe = NvmlProbe(nvml=nv)
    assert probe.start(thread=False) is False
    assert probe.available is False
    assert "NVMLError_LibraryNotFound" in probe.reason
    assert "Not Found" in probe.reason
    assert probe.sample() == {"available": False, "reason": probe.reason}
    assert probe.describe() == {"available": False, "reason": probe.reason}
    assert probe._thread is None
    probe.stop()  # no crash, no shutdown of something never initialised
    assert not nv.shutdown_called


def test_missing_pynvml_module_is_a_reason_not_a_crash(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    monkeypatch.setattr(nvml_module, "_library_missing", lambda: None)  # as on a machine with the driver
    probe = NvmlProbe()
    assert probe.start(thread=False) is False
    assert "not installed" in probe.reason


def test_without_the_driver_s_library_pynvml_is_not_imported(tmp_path):
    """A real agent's NVML probe on a machine without NVIDIA's library (this
    one, CI): the reason is pynvml's own, and pynvml (~28 ms, ~6,600 objects
    the collector follows) is not imported into the program."""
    import ctypes
    import subprocess
    import sys

    try:
        ctypes.CDLL(nvml_module.NVML_LIBRARY)
    except OSError:
        pass
    else:
        pytest.skip("NVIDIA's library is on this machine")
    code = ("import sys; from jaxtop.probes.nvml import NvmlProbe; p = NvmlProbe(); "
            "print(p.start(thread=False), 'pynvml' in sys.modules, p.reason)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    started, imported, reason = out.strip().split(" ", 2)
    assert (started, imported) == ("False", "False")
    assert reason.startswith("NVML unavailable: NVMLError_LibraryNotFound: NVML Shared Library Not Found (")
    assert nvml_module.NVML_LIBRARY in reason
    assert nvml_absent(Nvml(available=False, reason=reason))  # the dashboard reads it as no driver here


def test_one_failing_call_leaves_that_field_none():
    probe = started(FakeNvml(fail={"power"}))
    d0 = probe.sample()["devices"][0]
    assert d0["power_w"] is None
    assert d0["memory_used_bytes"] == 10 * GiB
    assert d0["temperature_c"] == 55
    assert d0["pcie_tx_bytes_per_s"] == 2000 * 1024
    assert "NotSupported" in probe.errors["power"]


@pytest.mark.parametrize("failing", ["memory", "utilization", "temperature", "pcie"])
def test_each_field_fails_alone(failing):
    probe = started(FakeNvml(fail={failing}))
    d0 = probe.sample()["devices"][0]
    fields = {
        "memory": ("memory_used_bytes", "memory_total_bytes"),
        "utilization": ("gpu_util_percent", "mem_util_percent"),
        "temperature": ("temperature_c",),
        "pcie": ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"),
    }
    for name, keys in fields.items():
        for key in keys:
            if name == failing:
                assert d0[key] is None, key
            else:
                assert d0[key] is not None, key
    assert d0["power_w"] == pytest.approx(312.5)


def test_process_list_unavailable_gives_reason():
    probe = started(FakeNvml(fail={"processes"}))
    d0 = probe.sample()["devices"][0]
    assert d0["process_memory_bytes"] is None
    assert "NotSupported" in d0["process_memory_reason"]


def test_our_pid_not_in_process_list():
    probe = started(FakeNvml(), pid=424242)
    d0, d1 = probe.sample()["devices"]
    for d in (d0, d1):
        assert d["process_memory_bytes"] is None  # not 0: unknown
        assert "424242" in d["process_memory_reason"]
        assert "container" in d["process_memory_reason"]


def test_driver_without_per_process_memory():
    nv = FakeNvml(pids={0: [(os.getpid(), None)], 1: []})
    d0 = started(nv).sample()["devices"][0]
    assert d0["process_memory_bytes"] is None
    assert "per-process" in d0["process_memory_reason"]


def test_several_contexts_of_one_pid_are_summed():
    nv = FakeNvml(pids={0: [(os.getpid(), GiB), (os.getpid(), 2 * GiB)], 1: []})
    assert started(nv).sample()["devices"][0]["process_memory_bytes"] == 3 * GiB


def test_fast_poll_keeps_slow_readings():
    nv = FakeNvml()
    probe = started(nv)
    nv.calls.clear()
    probe.poll(slow=False)
    assert "pcie" not in nv.calls and "processes" not in nv.calls
    d0 = probe.sample()["devices"][0]
    assert d0["pcie_tx_bytes_per_s"] == 2000 * 1024
    assert d0["process_memory_bytes"] == 3 * GiB


def test_missing_handle_skips_that_gpu():
    nv = FakeNvml(fail={"handle"})
    probe = started(nv)
    assert probe.sample()["devices"] == []
    assert "handle" in probe.errors


def test_thread_polls_and_stops():
    nv = FakeNvml()
    probe = NvmlProbe(nvml=nv)
    assert probe.start(thread=True)
    assert probe._thread is not None and probe._thread.daemon
    probe.stop()
    assert not probe._thread.is_alive()


# -- visible_index_map ---------------------------------------------------------------------


def test_visible_unset_is_identity():
    assert visible_index_map(3, None) == {0: 0, 1: 1, 2: 2}


def test_visible_reordered():
    assert visible_index_map(4, "1,0") == {0: 1, 1: 0}
    assert visible_index_map(4, " 2 , 3 ") == {0: 2, 1: 3}


def test_visible_uuids():
    uuids = "GPU-5a6d2f1c-0000-1111-2222-333333333333,MIG-GPU-5a6d2f1c/1/0"
    assert visible_index_map(2, uuids) == {
        0: "GPU-5a6d2f1c-0000-1111-2222-333333333333",
        1: "MIG-GPU-5a6d2f1c/1/0",
    }


def test_visible_empty_hides_every_gpu():
    assert visible_index_map(2, "") == {}
    assert visible_index_map(2, "  ") == {}


def test_visible_stops_at_first_invalid_ordinal():
    assert visible_index_map(4, "0,-1,1") == {0: 0}
