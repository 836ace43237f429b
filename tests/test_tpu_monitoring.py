"""Pure layer: the TPU runtime's monitoring probe against a fake
``libtpu.sdk.tpumonitoring`` (no TPU is lent to CI: the fake stands for the
SDK only, with the formats its documentation and readers show).

What is checked: the documented formats are read; ``[]`` answers (what a
TPU v5e with libtpu 0.0.42.1 gave for every metric) are said once, never as
0; the runtime's exceptions, a missing module and malformed strings become
reasons, never an exception in the program; nothing of libtpu is imported
off a TPU backend or before jax imported libtpu; a reading is cheap.
"""

from __future__ import annotations

import sys
import time
import types
from typing import Any

import pytest

from interpreter_waits import adds_for, long_waits, waits_beside
from jaxtop.probes.base import Tick
from jaxtop.probes.tpu_monitoring import (
    EMPTY_REASON, IDLE_INTERVAL_S, METRICS, READ_INTERVAL_S, SLOW_READS, TpuMonitoringProbe, Unreadable, parse,
)
from jaxtop.wire import protocol

#: libtpu 0.0.42.1's list_supported_metrics(), as the chip named them.
SUPPORTED_0_0_42 = [
    "duty_cycle_pct", "tensorcore_util", "hbm_capacity_usage", "hbm_capacity_total", "hlo_queue_size",
    "hlo_execution_timing", "host_to_device_transfer_latency", "device_to_host_transfer_latency",
    "runtime_hbm_utilization", "idle_duration", "tpu_throttle_score", "ici_link_health", "buffer_transfer_latency",
    "inbound_buffer_transfer_latency", "collective_e2e_latency", "host_compute_latency", "tcp_min_rtt",
    "tcp_delivery_rate",
]
#: Answers in the documented formats (one chip).
DOCUMENTED = {
    "duty_cycle_pct": ["45.32"],
    "tensorcore_util": ["12.50"],
    "hbm_capacity_usage": ["5747032064"],
    "hbm_capacity_total": ["17179869184"],
    "hlo_queue_size": ["tensorcore-0: 2"],
    "hlo_execution_timing": ["'tensorcore-0', '10.00', '9.50', '12.00', '13.00', '20.00'"],
    "host_to_device_transfer_latency": ["'8MB+', '2233.25', '2182.02', '2300.10', '2400.00', '2500.00'"],
    "device_to_host_transfer_latency": [],
}
DESCRIPTIONS = {
    "hlo_execution_timing": "HLO execution time distribution per core (core, mean, p50, p90, p95, p999) in us",
    "host_to_device_transfer_latency": "Transfer latencies by buffer size (size, mean, p50, p90, p99, p99.9) in us",
}


class FakeMetric:
    def __init__(self, values: Any, description: str = "", raises: BaseException | None = None,
                 delay_s: float = 0.0) -> None:
        self.values, self._description, self.raises, self.delay_s = values, description, raises, delay_s

    def data(self) -> Any:
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.raises is not None:
            raise self.raises
        return list(self.values) if isinstance(self.values, list) else self.values

    def description(self) -> str:
        return self._description


def install(monkeypatch, answers: dict[str, Any], supported: list[str] | None = None,
            get_raises: dict[str, BaseException] | None = None, list_raises: bool = False,
            data_raises: dict[str, BaseException] | None = None, delay_s: float = 0.0) -> types.ModuleType:
    """A fake ``libtpu.sdk.tpumonitoring`` in sys.modules, as ``import libtpu`` by jax leaves it."""
    mod = types.ModuleType("libtpu.sdk.tpumonitoring")
    mod.calls = []  # type: ignore[attr-defined]

    def list_supported_metrics():
        if list_raises:
            raise RuntimeError("listing failed")
        return list(supported if supported is not None else answers)

    def get_metric(name):
        mod.calls.append(name)  # type: ignore[attr-defined]
        if get_raises and name in get_raises:
            raise get_raises[name]
        if name not in answers:
            raise ValueError(f"unknown metric {name}")
        return FakeMetric(answers[name], DESCRIPTIONS.get(name, ""), (data_raises or {}).get(name), delay_s)

    mod.list_supported_metrics = list_supported_metrics  # type: ignore[attr-defined]
    mod.get_metric = get_metric  # type: ignore[attr-defined]
    sdk = types.ModuleType("libtpu.sdk")
    sdk.tpumonitoring = mod  # type: ignore[attr-defined]
    libtpu = types.ModuleType("libtpu")
    libtpu.sdk = sdk  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "libtpu", libtpu)
    monkeypatch.setitem(sys.modules, "libtpu.sdk", sdk)
    monkeypatch.setitem(sys.modules, "libtpu.sdk.tpumonitoring", mod)
    return mod


def tpu_probe(**kwargs: Any) -> TpuMonitoringProbe:
    probe = TpuMonitoringProbe(platforms=kwargs.pop("platforms", lambda: {"tpu", "cpu"}), thread=False, **kwargs)
    probe.start()
    return probe


def slow_tick(probe: TpuMonitoringProbe) -> Any:
    """One slow tick, the reading due (the cadence is tested on its own)."""
    probe._next_read = 0.0
    return probe.on_tick(Tick(time.time(), slow=True))


def test_documented_formats_are_read(monkeypatch):
    install(monkeypatch, DOCUMENTED, supported=SUPPORTED_0_0_42)
    value = slow_tick(tpu_probe())
    assert value["kind"] == "tpu" and value["available"] is True
    m = value["metrics"]
    assert m["duty_cycle_pct"] == [45.32] and m["tensorcore_util"] == [12.5]
    assert m["hbm_capacity_usage"] == [5747032064] and m["hbm_capacity_total"] == [17179869184]
    assert m["hlo_queue_size"] == {"tensorcore-0": 2}
    assert value["hlo_queue_size"] == 2  # the one number, all cores together
    assert m["hlo_execution_timing"] == [{"label": "tensorcore-0", "mean": 10.0, "p50": 9.5, "p90": 12.0,
                                          "p95": 13.0, "p999": 20.0}]
    # The description names p99 where the layout has it: not misnamed p95.
    assert m["host_to_device_transfer_latency"] == [{"label": "8MB+", "mean": 2233.25, "p50": 2182.02,
                                                     "p90": 2300.1, "p99": 2400.0, "p999": 2500.0}]
    assert value["unavailable"] == {"device_to_host_transfer_latency": EMPTY_REASON}
    assert protocol.decode(protocol.encode({"type": "sample", "t": 1.0, "accelerator": value}))["accelerator"] == value


def test_older_names_are_found_through_the_list(monkeypatch):
    answers = {"tensorcore_utilization": ["3.0"], "hlo_exec_timing": ["'tensorcore-0', '1', '1', '1', '1', '1'"]}
    install(monkeypatch, answers)
    value = slow_tick(tpu_probe())
    assert value["metrics"]["tensorcore_util"] == [3.0]
    assert value["metrics"]["hlo_execution_timing"][0]["label"] == "tensorcore-0"
    assert value["unavailable"]["duty_cycle_pct"].startswith("not offered by this libtpu")


def test_empty_answers_are_said_once_and_asked_less_often(monkeypatch):
    """Every metric ``[]`` (the v5e's answer): one field, sent once, each
    metric n/a with the reason; no value is 0."""
    install(monkeypatch, {name: [] for name in SUPPORTED_0_0_42})
    probe = tpu_probe()
    first = slow_tick(probe)
    assert first["metrics"] == {} and "hlo_queue_size" not in first
    assert first["unavailable"] == {name: EMPTY_REASON for name in METRICS}
    assert [slow_tick(probe) for _ in range(5)] == [None] * 5  # nothing new: not per sample
    assert probe.interval_s == IDLE_INTERVAL_S  # doubled on each empty reading, up to the idle cadence
    # The runtime starts answering: sent again, and read every second again.
    install(monkeypatch, {**{name: [] for name in SUPPORTED_0_0_42}, "duty_cycle_pct": ["80.0"]})
    probe._load()
    later = slow_tick(probe)
    assert later["metrics"] == {"duty_cycle_pct": [80.0]} and probe.interval_s == READ_INTERVAL_S


def test_the_runtimes_exceptions_are_reasons_not_crashes(monkeypatch):
    install(monkeypatch, DOCUMENTED, list_raises=True,
            get_raises={"duty_cycle_pct": RuntimeError("metrics service unavailable " + "x" * 500)},
            data_raises={"tensorcore_util": OSError("vbar control agent too old")})
    probe = tpu_probe()
    value = slow_tick(probe)
    reasons = value["unavailable"]
    assert reasons["duty_cycle_pct"].startswith("RuntimeError: metrics service unavailable")
    assert len(reasons["duty_cycle_pct"]) <= 160  # a long message is cut
    assert reasons["tensorcore_util"] == "OSError: vbar control agent too old"
    assert value["metrics"]["hbm_capacity_total"] == [17179869184]  # the list failed: each asked by its name


def test_malformed_strings_read_na_with_the_answer_quoted(monkeypatch):
    answers = {
        "duty_cycle_pct": ["abc"],
        "tensorcore_util": ["12.5", "x", "nan", "250"],  # one chip readable; a percent over 100 is not one
        "hbm_capacity_usage": ["-5"],
        "hbm_capacity_total": "17179869184",  # a string, not a list
        "hlo_queue_size": ["tensorcore-0: x", "tensorcore-1: 3", "tensorcore-2: 1.5"],
        "hlo_execution_timing": ["'tensorcore-0', '1', '2'"],  # a layout no description names
        "host_to_device_transfer_latency": None,
        "device_to_host_transfer_latency": [["nested"]],
    }
    install(monkeypatch, answers)
    value = slow_tick(tpu_probe())
    m, why = value["metrics"], value["unavailable"]
    assert m["tensorcore_util"] == [12.5, None, None, None]
    assert m["hlo_queue_size"] == {"tensorcore-1": 3} and value["hlo_queue_size"] == 3
    assert why["duty_cycle_pct"] == "unreadable answer ['abc']"
    assert why["hbm_capacity_usage"] == "unreadable answer ['-5']"
    assert why["hbm_capacity_total"] == "data() gave str, not a list"
    assert why["hlo_execution_timing"].startswith("unreadable answer")
    assert why["host_to_device_transfer_latency"] == "data() gave NoneType, not a list"
    assert why["device_to_host_transfer_latency"].startswith("unreadable answer")
    assert set(m) | set(why) == set(METRICS)


@pytest.mark.parametrize(("shape", "values", "expected"), [
    ("percent", ["45.32%", " 7 ", "'3.5'"], [45.32, 7.0, 3.5]),
    ("percent", [12, 0.5, True], [12.0, 0.5, None]),
    ("bytes", ["1e3", "inf"], [1000, None]),
    ("keyed", ["7"], {"0": 7}),
    ("keyed", ["'tensorcore-0': 0"], {"tensorcore-0": 0}),
    ("distribution", ["[tensorcore-0, 1, 2, 3, 4]"], [{"label": "tensorcore-0", "p50": 1.0, "p90": 2.0,
                                                       "p95": 3.0, "p999": 4.0}]),
    ("distribution", ["1, 2, 3, 4, 5"], [{"label": None, "mean": 1.0, "p50": 2.0, "p90": 3.0, "p95": 4.0,
                                          "p999": 5.0}]),
])
def test_parse(shape, values, expected):
    assert parse(shape, values) == expected


@pytest.mark.parametrize("values", [[], ["", " "], ["n/a"], [None]])
def test_parse_refuses_answers_without_a_value(values):
    with pytest.raises(Unreadable):
        parse("percent", values)


def test_libtpu_not_imported_by_jax_is_never_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "libtpu", raising=False)
    loads = []
    probe = tpu_probe(loader=lambda: loads.append(1))
    value = slow_tick(probe)
    assert loads == [] and "libtpu" not in sys.modules
    assert value == {"kind": "tpu", "available": False, "t": value["t"],
                     "reason": "jax did not import libtpu's Python package, so jaxtop does not"}
    assert slow_tick(probe) is None  # said once


def test_a_missing_sdk_module_is_a_reason(monkeypatch):
    install(monkeypatch, DOCUMENTED)
    monkeypatch.setitem(sys.modules, "libtpu.sdk", None)  # the package without its sdk: import fails
    value = slow_tick(tpu_probe())
    assert value["available"] is False and value["reason"].startswith("libtpu.sdk.tpumonitoring: ModuleNotFoundError")


def test_off_a_tpu_backend_nothing_is_imported_or_sent(monkeypatch):
    mod = install(monkeypatch, DOCUMENTED)
    loads = []
    answers: list[Any] = [None, None, {"cuda", "cpu"}]  # no backend yet, then a GPU one
    probe = tpu_probe(platforms=lambda: answers.pop(0) if answers else {"cuda", "cpu"},
                      loader=lambda: loads.append(1))
    assert [slow_tick(probe) for _ in range(6)] == [None] * 6
    assert loads == [] and mod.calls == []
    # Before start() (jax not imported) nothing is asked either.
    unstarted = TpuMonitoringProbe(platforms=lambda: pytest.fail("asked before jax was imported"), thread=False)
    assert unstarted.on_tick(Tick(time.time(), slow=True)) is None


def test_fast_ticks_read_nothing(monkeypatch):
    mod = install(monkeypatch, DOCUMENTED)
    probe = tpu_probe()
    assert probe.on_tick(Tick(time.time(), slow=False)) is None and mod.calls == []


def test_a_reading_is_cheap(monkeypatch):
    """Eight metrics read and parsed, on the fake: what jaxtop adds to the
    runtime's own cost, once a second at most."""
    install(monkeypatch, DOCUMENTED, supported=SUPPORTED_0_0_42)
    probe = tpu_probe()
    slow_tick(probe)
    n = 300
    started = time.thread_time()  # CPU: the reads sleep between metrics (the interpreter handed back)
    for _ in range(n):
        probe.read_once()
    per_reading = (time.thread_time() - started) / n
    print(f"one reading of {len(METRICS)} metrics on the fake: {per_reading * 1e6:.0f} us of CPU")
    assert per_reading < 2e-3  # measured 40-60 us on a 2-core VM
    # The cadence is kept from what the runtime costs, not from the sleeps
    # that hand the interpreter back between calls (16 of 0.5 ms).
    slow_tick(probe)
    assert probe.read_s is not None and probe.read_s < 4e-3, probe.read_s


def test_a_costly_runtime_is_read_less_often(monkeypatch):
    install(monkeypatch, DOCUMENTED, delay_s=0.005)  # 8 metrics x 5 ms: 40 ms a reading
    probe = tpu_probe()
    slow_tick(probe)
    assert probe.read_s >= 0.04
    # At most 1 % of a core: the next reading 4 s or more later, not 1 s.
    assert probe._next_read - time.monotonic() > 3.0
    assert probe.on_tick(Tick(time.time(), slow=True)) is None  # not due: nothing read, nothing new


def test_the_thread_reads_and_stops(monkeypatch):
    install(monkeypatch, DOCUMENTED)
    probe = TpuMonitoringProbe(platforms=lambda: {"tpu"})
    probe.start()
    deadline = time.monotonic() + 10
    value = None
    while value is None and time.monotonic() < deadline:
        value = probe.on_tick(Tick(time.time(), slow=True))
        time.sleep(0.01)
    thread = probe._thread
    assert value is not None and value["metrics"]["duty_cycle_pct"] == [45.32]
    assert thread is not None and thread.name == "jaxtop-tpu-monitoring" and thread.daemon
    probe.stop()
    assert not thread.is_alive()
    probe.stop()  # twice: fine


def test_the_agent_lists_the_probe_after_nvml():
    from jaxtop.agent.agent import Agent

    agent = Agent(capture_stderr=False, nvml=True)
    try:
        names = [p.name for p in agent.probes]
        assert names.index("accelerator") == names.index("nvml") + 1
        assert isinstance(agent.probes.get("accelerator"), TpuMonitoringProbe)
        assert agent.probes.get("accelerator").needs_jax
    finally:
        agent.probes.stop()
        agent._close_wake_pipe()


def test_a_huge_answer_is_read_in_part_and_quoted_short(monkeypatch):
    """A hostile runtime answers with two million values, or one of 50 MB:
    jaxtop reads the first values only and quotes a few characters (it used
    to turn the whole answer into text: 460 MB)."""
    import tracemalloc

    from jaxtop.probes.tpu_monitoring import MAX_REASON

    huge = ["x" * 20] * 2_000_000
    big = ["9" * (50 << 20)]

    class Prebuilt(FakeMetric):
        def data(self):  # the runtime's own lists, made before the measurement
            return self.values

    mod = install(monkeypatch, DOCUMENTED)
    plain = mod.get_metric
    mod.get_metric = lambda name: (Prebuilt(huge) if name == "duty_cycle_pct" else Prebuilt(big)
                                   if name == "tensorcore_util" else plain(name))
    probe = tpu_probe()
    tracemalloc.start()
    value = slow_tick(probe)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 << 20, peak
    why = value["unavailable"]
    assert len(why["duty_cycle_pct"]) <= MAX_REASON and "more" in why["duty_cycle_pct"]
    assert len(why["tensorcore_util"]) <= MAX_REASON
    assert value["metrics"]["hbm_capacity_total"] == [17179869184]  # the rest still read


def test_a_reading_stuck_in_the_runtime_is_said_as_n_a(monkeypatch):
    """data() that never returns: the reading thread cannot be freed, but the
    wire says which call is stuck, and for how long, within STUCK_S."""
    import threading

    from jaxtop.probes import tpu_monitoring

    release = threading.Event()

    class Stuck(FakeMetric):
        def data(self):
            release.wait(30)
            return ["1"]

    mod = install(monkeypatch, DOCUMENTED)
    mod.get_metric = lambda name: Stuck([])
    monkeypatch.setattr(tpu_monitoring, "STUCK_S", 0.3)
    probe = TpuMonitoringProbe(platforms=lambda: {"tpu"})
    probe.start()
    try:
        deadline = time.monotonic() + 10
        said = None
        while said is None and time.monotonic() < deadline:
            value = probe.on_tick(Tick(time.time(), slow=True))
            if value is not None and value.get("available") is False:
                said = value["reason"]
            time.sleep(0.05)
        assert said is not None and "duty_cycle_pct" in said and "stuck" in said, said
    finally:
        release.set()
        probe.stop()


def test_a_metric_whose_call_outlasts_the_pause_limit_is_read_no_more(monkeypatch):
    """libtpu's calls keep the interpreter: one that takes longer than the
    pause limit SLOW_READS times in a row holds every thread of the program
    that long at each reading, so it is read no more, and the field says
    why."""
    mod = install(monkeypatch, DOCUMENTED, delay_s=0.003)
    probe = tpu_probe(pause_limit_s=0.001)
    for _ in range(SLOW_READS - 1):
        slow_tick(probe)
        assert probe._retired == {}  # a first slow call may be the runtime setting up; a busy host slows one
    slow_tick(probe)
    calls = len(mod.calls)
    value = slow_tick(probe)
    assert len(mod.calls) == calls  # nothing asked of libtpu any more
    reasons = probe._latest["unavailable"]
    assert set(reasons) == set(METRICS)
    assert "took 3." in reasons["duty_cycle_pct"] and "over the 1 ms pause limit" in reasons["duty_cycle_pct"]
    assert value is None or value["metrics"] == {}


def test_without_a_pause_limit_a_slow_metric_is_still_read(monkeypatch):
    mod = install(monkeypatch, DOCUMENTED, delay_s=0.003)
    probe = tpu_probe(pause_limit_s=None)
    for _ in range(3):
        slow_tick(probe)
    assert probe._retired == {} and mod.calls.count("duty_cycle_pct") == 3


def test_the_reads_hand_the_interpreter_back_between_metrics(monkeypatch):
    """Each of eight metrics holds the interpreter in C for ~4 ms (as a
    pybind11 call does). Read back to back, a thread of the program that
    wants it waits for all of them, up to Python's switch interval (set to
    50 ms here, so that the figure stands out of a loaded machine's noise:
    32 ms or more); handed back between metrics, for one call at most."""
    n = adds_for(0.004)  # a C loop of ~4 ms that never lets the interpreter go

    class Holding(FakeMetric):
        def data(self) -> Any:
            sum(range(n))
            return super().data()

    mod = install(monkeypatch, DOCUMENTED)
    plain_get = mod.get_metric
    mod.get_metric = lambda name: Holding(plain_get(name).values)
    probe = tpu_probe(pause_limit_s=None)
    slow_tick(probe)
    late = waits_beside(probe.read_once, 5)
    # Each reading back to back makes one wait of 32 ms or more; one wait
    # over 15 ms is let pass (a loaded machine may not wake the sleeper
    # within a hand-back or two).
    assert len(long_waits(late, 0.015)) <= 1, f"waits over 15 ms: {long_waits(late, 0.015)} (a call: ~{n} adds)"
