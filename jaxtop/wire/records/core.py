"""The records an agent writes, as types: ``hello``, ``backend``, ``sample``
(and its ``backfill`` copy), ``history``, ``history_end``, ``dropped``,
``error``, ``exit``, ``reply``, ``pong`` and ``oom_census``.

Each field is named once, here; the agent writes the same names from plain
dicts (it runs in someone's training job with nothing but jax installed,
so it cannot import msgspec), and ``tests/test_records.py`` decodes a real
agent's stream with every unknown key reported, so a field the agent adds
or renames fails there instead of reading n/a in one view. docs/protocol.md
says what each field means; ``tests/test_records.py`` holds its tables to
these types.

A part whose readers still take keys themselves is :data:`Raw` (a JSON
object, its strings already made terminal-safe by the decoder).
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from jaxtop.wire.records.base import DeviceId, Num, Raw, Rec, Time
from jaxtop.wire.records.holders import Holders, HostSyncs, Labels
from jaxtop.wire.records.jit import Jit
from jaxtop.wire.records.oom import (
    CensusAllocatorLog, CensusArrays, CensusDevice, CensusHost, CensusRequest, CensusSites, CensusSkipped,
    CensusTimeline, CensusTiming, CensusTrigger,
)
from jaxtop.wire.records.sites import TransferSites

__all__ = [
    "RECORD_TYPES", "AgentStats", "Accelerator", "Backend", "Backfill", "Capture", "Compile", "Device", "DeviceInfo",
    "AcceleratorMetrics", "Event", "Distributed", "PrometheusAddress", "MemoryProfile", "ProfileSite", "Donation", "Dropped", "External", "Odd", "kind_of", "RECORDS", "Unknown", "Error", "Exit", "Gpu", "Hello", "History", "HistoryEnd", "HistoryInfo",
    "LiveArrays", "Nvml", "OomCensus", "Pong", "Process", "Record", "Reply", "Sample", "TopBuffer", "TopShape",
    "Transfer", "Transfers",
]


# -- a sample's parts --------------------------------------------------------------------------

class Event(Rec):
    """One of a sample's ``events``: what the agent (or a demo) has to say
    beside the figures. Every producer writes a ``text``; an event from
    another writer without one is quoted by its other fields."""

    kind: str | None = None  # error, leak_suspect, leak_watch, oom, guard, strategy, profile…
    t: Time = None
    text: str | None = None
    source: str | None = None  # where an error came from (e.g. stderr_capture)
    census_id: str | None = None  # an oom event's census


class TopBuffer(Rec):
    """One of a device's largest live buffers (``live_arrays.top``)."""

    nbytes: Num = None
    dtype: str | None = None
    shape: Union[str, list[Num], None] = None  # as the agent wrote it: "[8192, 16384]"
    ptr: Num = None


class LiveArrays(Rec):
    """A device's live arrays at its last scan (``devices[].live_arrays``)."""

    bytes: Num = None  # the live arrays' buffers on the device, each once
    count: Num = None
    largest_bytes: Num = None
    scanned_t: Time = None
    holes: Num = None  # 0-1: holes / (holes + bytes) among the buffers at map_t
    in_use_bytes: Num = None  # the allocator's bytes_in_use right after the scan
    not_ready_count: Num = None
    not_ready_bytes: Num = None
    # Why no scheduled scan runs (the next would pause the program longer
    # than $JAXTOP_MAX_PAUSE_MS allows, 1 ms by default), with the figures;
    # the totals are the last scan's.
    held: str | None = None
    held_pause_s: Num = None  # the pause the next scan is predicted to put on the program
    # On samples that carry a new buffer map of the device:
    top: list[TopBuffer] | None = None
    # [[address, bytes], ...] in address order, kept as its JSON text: a map
    # is up to thousands of pairs, and only the newest one a batch of
    # samples brings is ever shown, so the others are never decoded
    # (jaxtop.wire.records.decoder.buffer_map decodes the one kept). Empty
    # (falsy) on a sample without one: msgspec keeps a Raw only alone.
    map: msgspec.Raw = msgspec.Raw()
    map_complete: bool | None = None
    map_t: Time = None
    unmapped: dict[str, Num] | None = None  # why buffers have no place in the map: kind -> count


class Device(Rec):
    """One local device of a sample (``devices[]``)."""

    id: DeviceId | None = None
    platform: str | None = None
    source: str | None = None  # memory_stats, or live_arrays where the backend has no allocator figures
    bytes_in_use: Num = None
    peak_bytes_in_use: Num = None
    peak_rise_bytes: Num = None
    pool_bytes: Num = None
    peak_pool_bytes: Num = None
    bytes_limit: Num = None
    largest_free_block_bytes: Num = None
    largest_alloc_size: Num = None
    bytes_reserved: Num = None
    peak_bytes_reserved: Num = None
    bytes_reservable_limit: Num = None
    num_allocs: Num = None
    fragmentation: Num = None
    fragmentation_reason: str | None = None
    live_arrays: LiveArrays | None = None


class Transfer(Rec):
    """One direction of ``transfers``: the implicit transfers the guard logged."""

    count: Num = None
    bytes_known: Num = None  # a lower bound: a cached call's line gives no shape
    count_bytes_unknown: Num = None
    count_total: Num = None
    bytes_known_total: Num = None
    count_bytes_unknown_total: Num = None


class TopShape(Rec):
    """One of ``transfers.top_shapes``."""

    direction: str | None = None
    shape: str | None = None
    count: Num = None


class Transfers(Rec):
    """``transfers``: h2d, d2h, d2d and the most frequent shapes."""

    h2d: Transfer | None = None
    d2h: Transfer | None = None
    d2d: Transfer | None = None
    top_shapes: list[TopShape] | None = None
    error: str | None = None  # the probe raised while taking this sample: why (jaxtop.agent.probe_list)

    def direction(self, name: str) -> Transfer | None:
        """The direction named ``name`` (``h2d``, ``d2h``, ``d2d``)."""
        return getattr(self, name, None)


class Process(Rec):
    """``process``: the host's view of the program."""

    available: bool | None = None  # False: the probe failed, ``reason`` says why
    reason: str | None = None
    rss_bytes: Num = None
    vms_bytes: Num = None
    peak_rss_bytes: Num = None
    rss_anon_bytes: Num = None  # the resident set's parts (Linux), None where not read
    rss_file_bytes: Num = None
    rss_shmem_bytes: Num = None
    cpu_percent: Num = None
    threads: Num = None
    started_t: Time = None
    error: str | None = None  # the probe raised while taking this sample: why (jaxtop.agent.probe_list)


class Compile(Rec):
    """``compile``: backend compiles (jax.monitoring)."""

    count: Num = None
    count_total: Num = None
    seconds_total: Num = None
    cache_hits_total: Num = None
    available: bool | None = None  # False: the probe could not start, ``reason`` says why
    reason: str | None = None
    error: str | None = None  # the probe raised while taking this sample: why (jaxtop.agent.probe_list)


class Donation(Rec):
    """``donation``: donated buffers jax could not reuse."""

    failed: Num = None
    failed_total: Num = None
    last_message: str | None = None
    available: bool | None = None  # False: the probe could not start, ``reason`` says why
    reason: str | None = None
    error: str | None = None  # the probe raised while taking this sample: why (jaxtop.agent.probe_list)


class Gpu(Rec):
    """One GPU of ``nvml.devices`` (a sample's readings, a hello's names)."""

    index: int | None = None
    name: str | None = None
    uuid: str | None = None
    jax_id: DeviceId | None = None
    memory_used_bytes: Num = None
    memory_total_bytes: Num = None
    gpu_util_percent: Num = None
    mem_util_percent: Num = None
    temperature_c: Num = None
    power_w: Num = None
    pcie_tx_bytes_per_s: Num = None
    pcie_rx_bytes_per_s: Num = None
    process_memory_bytes: Num = None
    process_memory_reason: str | None = None


class Nvml(Rec):
    """``nvml``: the driver's readings (a sample) or names (a hello)."""

    available: bool | None = None
    reason: str | None = None
    t: Time = None
    devices: list[Gpu] | None = None
    error: str | None = None  # the probe raised while taking this sample: why (jaxtop.agent.probe_list)


class Capture(Rec):
    """``transfer_capture``: whether transfers are counted, and the guard's
    levels as the user chose them."""

    available: bool | None = None
    reason: str | None = None
    note: str | None = None
    guard: dict[str, str] | None = None
    error: str | None = None  # the probe raised while taking this sample: why (jaxtop.agent.probe_list)


class AgentStats(Rec):
    """``agent``: the agent's own cost and cadence (one sample a second)."""

    cpu_s_total: Num = None
    thread_cpu_s_total: Num = None
    budget_share: Num = None
    cpu_share: Num = None
    ceiling_share: Num = None
    tick_s: Num = None
    scan_interval_s: Num = None
    scan_cpu_s: Num = None
    detail_interval_s: Num = None
    detail_cpu_s: Num = None
    suspended_s: Num = None


class AcceleratorMetrics(Rec):
    """``accelerator.metrics``: the metrics that answered, by libtpu's name;
    per-accelerator lists are in the runtime's order, None where one was
    unreadable."""

    duty_cycle_pct: list[Num] | None = None
    tensorcore_util: list[Num] | None = None
    hbm_capacity_usage: list[Num] | None = None
    hbm_capacity_total: list[Num] | None = None
    hlo_queue_size: dict[str, Num] | None = None  # core label -> programs waiting
    # Rows {label, mean, p50, p90, p95, p999} in microseconds (the
    # statistics as the metric's description names them: p99 on some).
    hlo_execution_timing: list[dict[str, Union[str, Num]]] | None = None
    host_to_device_transfer_latency: list[dict[str, Union[str, Num]]] | None = None
    device_to_host_transfer_latency: list[dict[str, Union[str, Num]]] | None = None


class Accelerator(Rec):
    """``accelerator``: a TPU runtime's own monitoring."""

    kind: str | None = None
    available: bool | None = None
    reason: str | None = None
    t: Time = None
    source: str | None = None
    metrics: AcceleratorMetrics | None = None
    unavailable: dict[str, str] | None = None  # metric -> why it did not answer
    hlo_queue_size: Num = None
    error: str | None = None  # the probe raised while taking this sample: why (jaxtop.agent.probe_list)


# -- records -----------------------------------------------------------------------------------

ODD_KEY = "\u2066odd"


class Odd(Rec):
    """A part of a record of the wrong type, read as n/a: where, what it
    was (as a message quotes it) and what it should have been."""

    where: str
    value: str
    should: str


class _Record(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag_field="type"):
    t: Time = None
    #: The parts the decoder could not read (each then reads n/a). Its key
    #: starts with a bidi isolate (U+2066), which sends a line to the
    #: decoder's careful path, raw or escaped; that path shows the isolate
    #: as ``\u2066`` text and drops the key. So no stream can fill it.
    odd: tuple[Odd, ...] = msgspec.field(default=(), name=ODD_KEY)


class DeviceInfo(Rec):
    """A device as ``hello`` and ``backend`` name it."""

    id: DeviceId | None = None
    platform: str | None = None
    kind: str | None = None
    process_index: Num = None


class HistoryInfo(Rec):
    """``hello.history``: what follows the hello on connecting."""

    present_first: bool | None = None
    backfill_s: Num = None
    coarse_bucket_s: Num = None
    coarse_s: Num = None


#: ``versions``: jaxtop, python, jax, jaxlib (None until jax is imported).
Versions = dict[str, Union[str, None]]


class External(Rec):
    """``hello.external``: only in the dashboard's own view of a process
    without an agent (psutil and NVML from outside); never sent by an agent."""

    note: str | None = None
    probes: list[str] | None = None


class PrometheusAddress(Rec):
    """``hello.prometheus``: where the agent serves its metrics."""

    addr: str | None = None
    port: Num = None


class Distributed(Rec):
    """Where the process stands in a multi-process job (empty before the
    backend exists)."""

    process_index: Num = None
    process_count: Num = None
    coordinator: str | None = None  # the address given to jax.distributed.initialize


class Hello(_Record, tag="hello"):
    """The first line of every stream: who, what, which devices."""

    protocol: Num = None
    pid: Num = None
    argv: list[str] | None = None
    started_t: Time = None
    versions: Versions | None = None
    backend: str | None = None
    devices: list[DeviceInfo] | None = None  # empty until the program creates its backend
    interval_s: Num = None
    slow_interval_s: Num = None
    backfill_s: Num = None
    history: HistoryInfo | None = None
    transfer_capture: Capture | None = None
    nvml: Nvml | None = None
    host: str | None = None
    job: str | None = None  # --job / JAXTOP_JOB (None: the Prometheus exposition names one)
    detail_na: str | None = None  # a Prometheus stream: why maps, shapes, holders… are n/a
    prometheus: PrometheusAddress | None = None  # where the agent serves Prometheus metrics
    distributed: Distributed | None = None
    external: External | None = None
    source: str | None = None  # "prometheus": the dashboard's own stream of a Prometheus server's series
    synthetic: bool | None = None  # True in jaxtop.testing.synthetic's streams (benchmarks, demos); never an agent's


class Backend(_Record, tag="backend"):
    """The program created its JAX backend."""

    backend: str | None = None
    devices: list[DeviceInfo] | None = None
    versions: Versions | None = None
    distributed: Distributed | None = None


class Sample(_Record, tag="sample"):
    """One sample (see docs/protocol.md for each part)."""

    seq: Num = None
    present: bool | None = None  # the newest sample, sent first on connecting
    final: bool | None = None  # taken at interpreter exit: its totals are the program's
    devices: list[Device] | None = None
    transfers: Transfers | None = None
    process: Process | None = None
    compile: Compile | None = None
    donation: Donation | None = None
    nvml: Nvml | None = None
    transfer_capture: Capture | None = None
    accelerator: Accelerator | None = None
    agent: AgentStats | None = None
    events: list[Event] | None = None
    # Sparse parts: only on samples that have news of them.
    jit: Jit | None = None
    holders: Holders | None = None
    labels: Labels | None = None
    host_syncs: HostSyncs | None = None
    transfer_sites: TransferSites | None = None
    demo: Raw = None
    oom_census: OomCensus | None = None  # an agent that sent its census inside a sample


class Backfill(Sample, tag="backfill"):
    """A kept sample sent as history on connecting: older than the present."""


class History(_Record, tag="history"):
    """The coarse level: rows of min/max per bucket of the timeline series."""

    level_s: Num = None
    process_columns: list[str] | None = None
    device_columns: list[str] | None = None
    sum_columns: list[str] | None = None
    rows: list[Any] | None = None  # each row's shape is checked where it is read (jaxtop.dashboard.backlog)


class HistoryEnd(_Record, tag="history_end"):
    records: Num = None
    history_records: Num = None


class Dropped(_Record, tag="dropped"):
    """A slow client missed ``count`` samples."""

    count: Num = None
    count_total: Num = None
    reason: str | None = None


class Error(_Record, tag="error"):
    message: str | None = None
    fatal: bool | None = None


class Exit(_Record, tag="exit"):
    pid: Num = None


class Reply(_Record, tag="reply"):
    """The answer to a command."""

    id: Any = None
    ok: bool | None = None
    result: Any = None  # its command's shape: read with decoder.reply_result
    error: str | None = None
    retry_after_s: Num = None
    reply_bytes: Num = None  # a reply too large to send: its size (jaxtop.agent.clients)
    cached_age_s: Num = None  # a cached command's answer: how old it is


class ProfileSite(Rec):
    """One allocation site of a device memory profile."""

    site: str | None = None
    bytes: Num = None
    allocations: Num = None


class MemoryProfile(Rec):
    """The ``memory_profile`` command's result: the saved profile's file and
    top sites, or the error that stopped it."""

    path: str | None = None
    error: str | None = None
    total_bytes: Num = None
    seconds: Num = None
    top_sites: list[ProfileSite] | None = None


class Pong(_Record, tag="pong"):
    id: Any = None


class OomCensus(_Record, tag="oom_census"):
    """What held the memory when the program ran out (docs/protocol.md,
    "OOM census"; its parts are in :mod:`jaxtop.wire.records.oom`). The
    census of an error later found uncaught is sent again with the same
    ``id``: a reader keeps the last copy of each."""

    version: Num = None  # the census layout's version (1)
    id: str | None = None  # "PID-N": the process and the census's number in it
    pid: Num = None
    argv: list[str] | None = None
    trigger: CensusTrigger | None = None
    request: CensusRequest | None = None  # None: the error's text gave no request
    devices: list[CensusDevice] | None = None
    host: CensusHost | None = None
    verdict: str | None = None  # one line: why it ran out
    arrays: CensusArrays | None = None  # None: not scanned
    sites: CensusSites | None = None  # None: skipped or failed
    timeline: CensusTimeline | None = None
    allocator_log: CensusAllocatorLog | None = None  # GPU, when the allocator's lines reached the agent
    timing: CensusTiming | None = None
    skipped: list[CensusSkipped] | None = None  # parts not taken in full
    errors: list[str] | None = None  # parts that failed, one line each
    complete: bool | None = None  # nothing was skipped
    suppressed_before: Num = None  # OOMs not censused (rate limit) since the previous census
    path: str | None = None  # the census file (None: not written, ``file_error`` says why)
    file_error: str | None = None


#: Every record a stream may hold.
Record = Union[Hello, Backend, Sample, Backfill, History, HistoryEnd, Dropped, Error, Exit, Reply, Pong, OomCensus]
RECORDS: tuple[type[_Record], ...] = (Hello, Backend, Sample, Backfill, History, HistoryEnd, Dropped, Error, Exit,
                                      Reply, Pong, OomCensus)
#: Each record type's class, by its ``type``.
RECORD_TYPES: dict[str, type[_Record]] = {cls.__struct_config__.tag: cls for cls in RECORDS}


class Unknown(msgspec.Struct, frozen=True, kw_only=True):
    """A record of a type this reader does not know (a newer agent's):
    skipped, as the protocol says, never an error."""

    type: str
    t: Time = None


def kind_of(record: _Record | Unknown) -> str:
    """A record's ``type``, as the wire spells it."""
    if isinstance(record, Unknown):
        return record.type
    return str(record.__struct_config__.tag)
