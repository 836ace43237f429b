"""The dashboard's model: records in, frozen snapshots out.

Fed the same way from a live socket, a recording or a test (``feed(pid,
record)``); keeps all history (bounded, see :mod:`jaxtop.dashboard.history`); builds an
immutable :class:`Snapshot` for the widgets. No Textual, no sockets.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from jaxtop import protocol
from jaxtop.dashboard.history import History, Window, _num
from jaxtop.dashboard.holders import HoldersFold, HoldersView
from jaxtop.dashboard.ledger import LedgerStore
from jaxtop.protocol import DIRECTIONS
from jaxtop.timeline import DEVICE_SERIES, PROCESS_SERIES, Cursor, device_row, nvml_map

# DEVICE_SERIES and PROCESS_SERIES (jaxtop.timeline) are the timelines'
# columns: the agent's coarse history sends buckets of the same series.
STALE_INTERVALS = 3
MAX_EVENTS = 500
#: Devices shown per process. Each keeps about 3 MB of history, so a stream
#: naming thousands of device ids (a bug, or a hostile peer or recording)
#: must not make the dashboard allocate gigabytes. A process addresses its
#: local devices only: 8 GPUs, 4-8 TPU chips, or as many CPU devices as
#: ``--xla_force_host_platform_device_count`` makes.
MAX_DEVICES = 64
#: A live stream whose newest sample is this much older than the wall clock
#: (or 3 intervals, if longer) is still loading its backlog.
LOADING_LAG_S = 2.0
#: The shortest time axis drawn: a run's first sample alone still gets one.
MIN_SPAN_S = 1.0
#: Why a live buffer has no place in a scan's memory map (``live_arrays.unmapped``).
UNMAPPED_KINDS = ("not_ready", "last_address", "sharded")
#: While an agent's fine history loads after the present, what it brought
#: so far goes into the timelines at most this often (a merge of every
#: level), and at its end.
PAST_MERGE_S = 1.0
#: The same for its coarse history: the first part at once (the first frame
#: needs it), the rest at most this often, and when it ends.
COARSE_MERGE_S = 0.25
#: Sample fields the Holders screen folds (:class:`HoldersFold`).
HOLDERS_FIELDS = ("holders", "labels", "host_syncs")

#: Connection states shown in the header.
CONNECTING, LIVE, STALE, DISCONNECTED, EXITED, REPLAY = "connecting", "live", "stale", "disconnected", "exited", "replay"


@dataclass(frozen=True)
class Event:
    t: float
    pid: int
    kind: str  # compile, donation, dropped, disconnect, error, exit, profile, info, ...
    text: str


@dataclass(frozen=True)
class DeviceView:
    """Everything the screen shows for one device, at one moment."""

    pid: int
    id: int
    platform: str
    source: str  # memory_stats | live_arrays
    bytes_in_use: int | None
    pool_bytes: int | None
    bytes_limit: int | None
    peak_bytes_in_use: int | None
    largest_free_block_bytes: int | None
    num_allocs: int | None
    live_bytes: int | None
    live_count: int | None
    nvml: dict[str, Any] | None  # the matching NVML GPU, if any
    fragmentation: float | None
    fragmentation_reason: str | None
    allocs_per_s: float | None
    allocs_reason: str | None
    buffer_map: tuple[tuple[int, int], ...]
    map_complete: bool
    top_buffers: tuple[dict[str, Any], ...]
    timeline: Window
    # The scan the map comes from: its buffer count and bytes, and the
    # buffers it could not place, by kind (see UNMAPPED_KINDS). The latest
    # live_bytes/live_count may come from a later scan than the map.
    map_live_count: int | None = None
    map_live_bytes: int | None = None
    unmapped: dict[str, int] = field(default_factory=dict)
    #: Holes among live buffers' addresses (0-1), the latest scan's; None
    #: when some buffer has no address or no scan measured it.
    live_holes: float | None = None
    #: Seconds between the live-array scan behind ``live_bytes`` and this
    #: view's moment, and the same for the map: the agent scans less often
    #: when scanning costs more (many arrays), and says when it did. None
    #: where the stream does not say (older agents).
    live_age_s: float | None = None
    map_age_s: float | None = None

    @property
    def label(self) -> str:
        return f"{self.platform}:{self.id}"

    @property
    def cached_unused_bytes(self) -> int | None:
        if self.pool_bytes is None or self.bytes_in_use is None:
            return None
        return self.pool_bytes - self.bytes_in_use

    @property
    def headroom_bytes(self) -> int | None:
        if self.bytes_limit is None or self.pool_bytes is None:
            return None
        return self.bytes_limit - self.pool_bytes


@dataclass(frozen=True)
class ProcessView:
    pid: int
    argv: tuple[str, ...]
    backend: str | None
    versions: dict[str, Any]
    state: str
    sample_age_s: float | None
    uptime_s: float | None
    interval_s: float
    seq: int | None
    transfers: dict[str, dict[str, Any]]  # per direction: count_per_s, bytes_per_s, totals
    top_shapes: tuple[dict[str, Any], ...]
    capture: dict[str, Any]
    process: dict[str, Any]
    compile: dict[str, Any]
    donation: dict[str, Any]
    nvml_status: dict[str, Any]
    history: Window
    last_profile: dict[str, Any] | None
    # The time axis every timeline of this process shares: (start, end),
    # Unix seconds; None before the first sample.
    span: tuple[float, float] | None = None
    demo: dict[str, Any] | None = None  # the demo workload's state, if any
    external: str | None = None  # set for an external view (no agent): what it can see
    nvml: dict[str, Any] | None = None  # the latest NVML reading of the process
    holders: HoldersView | None = None  # memory by allocation site, named pytrees, host syncs
    oom_censuses: tuple[dict[str, Any], ...] = ()  # out-of-memory censuses, oldest first


@dataclass(frozen=True)
class Snapshot:
    """One frozen picture of the model for the widgets."""

    t: float
    processes: tuple[ProcessView, ...]
    devices: tuple[DeviceView, ...]
    selected: int  # index into devices; -1 = overview
    window_s: float | None
    events: tuple[Event, ...]
    notices: tuple[str, ...] = ()
    replay: dict[str, Any] | None = None

    @property
    def device(self) -> DeviceView | None:
        if 0 <= self.selected < len(self.devices):
            return self.devices[self.selected]
        return None

    def process_of(self, device: DeviceView | None) -> ProcessView | None:
        pid = device.pid if device is not None else (self.processes[0].pid if self.processes else None)
        for p in self.processes:
            if p.pid == pid:
                return p
        return None


@dataclass
class _DeviceState:
    id: int
    platform: str
    latest: dict[str, Any] = field(default_factory=dict)
    history: History = field(default_factory=lambda: History(DEVICE_SERIES))
    prev_allocs: tuple[float, int] | None = None
    allocs_per_s: float | None = None
    buffer_map: tuple[tuple[int, int], ...] = ()
    map_complete: bool = True
    top_buffers: tuple[dict[str, Any], ...] = ()
    map_live_count: int | None = None
    map_live_bytes: int | None = None
    map_t: float | None = None  # when the agent derived the map (None: not said)
    unmapped: dict[str, int] = field(default_factory=dict)
    past: History | None = None  # history rows received after the present, not yet merged


class ProcessModel:
    """State of one agent's stream."""

    def __init__(self, pid: int, new_history: Callable[[tuple[str, ...]], History] = History) -> None:
        self.pid = pid
        self.hello: dict[str, Any] = {}
        self.state = CONNECTING
        self.devices: dict[int, _DeviceState] = {}
        self.history = new_history(PROCESS_SERIES)
        self.latest: dict[str, Any] = {}
        self.last_t: float | None = None  # agent time of the last sample
        self.last_recv: float | None = None  # our monotonic clock at receipt
        self.rates: dict[str, dict[str, Any]] = {}
        self.last_profile: dict[str, Any] | None = None
        self.holders = HoldersFold()
        self.oom_censuses: list[dict[str, Any]] = []  # oldest first, one per census id
        self.backend: str | None = None
        self.versions: dict[str, Any] = {}
        self.nvml_status: dict[str, Any] = {}
        self.demo: dict[str, Any] | None = None
        self.started_t: float | None = None  # the process's start (process probe), not the agent's
        self.samples = 0  # samples applied so far (a loading indicator counts them)
        self.devices_refused = False  # a device beyond MAX_DEVICES was left out (said once)
        # History sent after the present (hello.history.present_first): the
        # coarse buckets go into the timelines as they come; the fine
        # samples are gathered in `past` histories and merged now and then.
        self.history_loading = False  # between a hello that announces it and history_end
        self.coarse_done = True  # the coarse part of this connection's history is in
        self.present_t: float | None = None  # this connection's present: history is older
        self.history_floor: float | None = None  # the newest sample before it (events up to it were seen)
        self.past: History | None = None
        self.past_cursor: Cursor | None = None
        self.past_samples = 0
        self.past_last_t: float | None = None
        self.past_merged_at = 0.0  # model clock
        self.past_holders: list[dict[str, Any]] = []  # history samples' Holders fields, oldest first
        # Coarse rows not merged yet: (history, bucket) -> (history, times, lows, highs).
        self.coarse_pending: dict[tuple[int, float], tuple[History, list[Any], list[np.ndarray], list[np.ndarray]]] = {}
        self.coarse_merges = 0  # merges of this connection's coarse history so far
        self.coarse_step: float | None = None  # its bucket: coarser levels need no fine rows…
        self.coarse_first_t: float | None = None  # …from where it starts
        self.coarse_merged_at = 0.0  # model clock
        self.present_holders: list[dict[str, Any]] = []  # the same of the present and later samples


class Model:
    """All processes being watched. Thread-safe: a reader thread feeds it,
    the UI thread takes snapshots."""

    def __init__(self, clock=time.monotonic, new_history: Callable[[tuple[str, ...]], History] = History) -> None:
        """
        Args:
            clock: What receipt times and staleness are measured on.
            new_history: Makes each time series store (a replay index being
                built gives one that logs every row).
        """
        self._lock = threading.Lock()
        self._clock = clock
        self._new_history = new_history
        self.processes: dict[int, ProcessModel] = {}
        self.events: collections.deque[Event] = collections.deque(maxlen=MAX_EVENTS)
        self.notices: list[str] = []
        self.version = 0  # bumps on every change
        #: Bumps when a frame should go out at once, not at the next redraw:
        #: the first of a present's coarse history is in (its newest part,
        #: which fills the timelines' recent past), all of it, or the whole
        #: history.
        self.milestone = 0
        self.ledgers = LedgerStore()  # each process's jit ledger (the Jit screen reads it)
        # Called by feed_many before each batch, outside the lock. The
        # dashboard sets it so that a thread loading a backlog steps aside
        # (sleeps, the GIL free) while the UI answers a key: two busy threads
        # share one GIL half and half, which doubles a key's answer.
        self.pace: Callable[[], None] | None = None

    def empty_like(self) -> Model:
        """A new, empty model on this model's clock.

        A replay seeking backwards rebuilds a process in one of these, then
        :meth:`adopt` s it: the clock must be the same, or ages and staleness
        in the rebuilt process would be measured on another time line.
        """
        return Model(clock=self._clock)

    # -- feeding ---------------------------------------------------------------
    def step_aside(self) -> None:
        """Let the UI go first if it is answering a key (:attr:`pace`).

        A thread feeding a backlog calls this between pieces of its work;
        it returns at once when nobody set ``pace`` or nothing waits.
        """
        pace = self.pace
        if pace is not None:
            pace()

    def process(self, pid: int) -> ProcessModel:
        proc = self.processes.get(pid)
        if proc is None:
            proc = self.processes[pid] = ProcessModel(pid, self._new_history)
        return proc

    def reset(self, pid: int) -> None:
        """Forget one process (a replay seeking backwards rebuilds it)."""
        with self._lock:
            self.processes.pop(pid, None)
            self.ledgers.forget(pid)
            self.events = collections.deque((e for e in self.events if e.pid != pid), maxlen=MAX_EVENTS)
            self.version += 1

    def adopt(self, pid: int, rebuilt: Model) -> None:
        """Swap in ``pid`` as rebuilt in another model, in one step, so a
        snapshot taken meanwhile never sees a half-built process."""
        with self._lock, rebuilt._lock:
            self.processes[pid] = rebuilt.processes[pid]
            self.ledgers.adopt(pid, rebuilt.ledgers)
            ours = [e for e in rebuilt.events if e.pid == pid]
            self.events = _merged_events(self.events, pid, ours)
            self.version += 1

    def process_state(self, pid: int) -> tuple[ProcessModel | None, list[Event], Any]:
        """Everything this model holds of ``pid``: its process, its events and
        its ledger table (a replay index keeps these at its checkpoints)."""
        with self._lock:
            return self.processes.get(pid), [e for e in self.events if e.pid == pid], self.ledgers.table(pid)

    def restore_process(self, pid: int, state: tuple[ProcessModel | None, list[Event], Any]) -> None:
        """Put back what :meth:`process_state` gave, replacing ``pid``."""
        proc, events, table = state
        with self._lock:
            if proc is None:
                self.processes.pop(pid, None)
            else:
                proc.last_recv = self._clock()  # receipt times are on this model's clock
                self.processes[pid] = proc
            self.ledgers.put_table(pid, table)
            self.events = _merged_events(self.events, pid, list(events))
            self.version += 1

    def add_event(self, pid: int, kind: str, text: str, t: float | None = None) -> None:
        with self._lock:
            self._event(pid, kind, text, t)

    def _event(self, pid: int, kind: str, text: str, t: float | None = None) -> None:
        self.events.append(Event(t if t is not None else time.time(), pid, kind, text))
        self.version += 1

    def add_notice(self, text: str) -> None:
        with self._lock:
            self.notices.append(text)
            self.version += 1

    def set_state(self, pid: int, state: str, why: str | None = None) -> None:
        with self._lock:
            proc = self.process(pid)
            if proc.state == state:
                return
            if proc.state == EXITED and state == DISCONNECTED:
                return  # an exited process stays exited
            proc.state = state
            if state in (DISCONNECTED, EXITED):
                self._event(pid, "disconnect" if state == DISCONNECTED else "exit", why or state)
                if proc.history_loading:  # the connection ended within its history: keep what came
                    self._history_end(proc)
            self.version += 1

    def feed(self, pid: int, record: dict[str, Any]) -> None:
        """Apply one wire record from the stream of ``pid``.

        A record of the right type but the wrong shape (a list where an
        object belongs, a string for a number) is skipped with an error
        event: one odd record from a newer agent, a bug or a hostile peer
        must not stop the reader thread that feeds the model.
        """
        self.feed_many(pid, (record,))

    def feed_many(self, pid: int, records: Iterable[dict[str, Any]]) -> int:
        """Apply several wire records of ``pid`` in order, as one change.

        The same result as :meth:`feed` for each record in turn, but a
        backlog (an agent's backfill, a recording) goes in at a fraction of
        the cost: the lock is taken once, history rows are appended to the
        ring buffers in one numpy write per series set, and a device's
        buffer map, of which only the newest is ever shown, is decoded once
        per batch instead of once per scan.

        Returns:
            How many records were applied.
        """
        self.step_aside()
        batch = _Batch()
        n = 0
        with self._lock:
            proc = self.process(pid)
            proc.last_recv = self._clock()
            for record in records:
                n += 1
                kind = record.get("type")
                try:
                    self._apply(proc, kind, record, batch)
                except Exception as exc:
                    self._event(pid, "error", f"malformed {kind!r} record skipped: {type(exc).__name__}: {exc}", None)
            batch.flush()
            proc.samples += batch.samples
            now = proc.last_recv or 0.0
            if proc.coarse_pending and (proc.coarse_done or proc.coarse_merges == 0
                                        or now - proc.coarse_merged_at >= COARSE_MERGE_S):
                if proc.coarse_merges == 0:
                    self.milestone += 1  # its newest part: the timelines' recent past is filled now
                self._merge_coarse(proc)
            if batch.past and now - proc.past_merged_at >= PAST_MERGE_S:
                self._merge_past(proc)
            self.version += 1
        return n

    def _apply(self, proc: ProcessModel, kind: Any, record: dict[str, Any], batch: _Batch) -> None:
        pid = proc.pid
        if kind == protocol.HELLO:
            self._hello(proc, record)
        elif kind == protocol.BACKEND:
            proc.backend = record.get("backend") or proc.backend
            proc.versions.update(record.get("versions") or {})
            self._event(pid, "info", f"JAX backend ready: {proc.backend}, {len(record.get('devices') or [])} device(s)", record.get("t"))
        elif kind == protocol.SAMPLE:
            self._sample(proc, record, batch)
        elif kind == protocol.BACKFILL:
            self._past_sample(proc, record, batch)
        elif kind == protocol.HISTORY:
            self._coarse(proc, record, batch)
        elif kind == protocol.HISTORY_END:
            batch.flush()
            self._history_end(proc)
        elif kind == protocol.DROPPED:
            self._event(pid, "dropped", f"{record.get('count')} samples dropped ({record.get('reason', 'client too slow')})", record.get("t"))
        elif kind == protocol.ERROR:
            self._event(pid, "error", f"agent: {record.get('message')}", record.get("t"))
        elif kind == protocol.EXIT:
            proc.state = EXITED
            self._event(pid, "exit", "process exited (final sample received)", record.get("t"))
        elif kind == protocol.OOM_CENSUS:
            self._oom_census(proc, record)
        elif kind == protocol.REPLY:
            self._reply(proc, record)

    def _hello(self, proc: ProcessModel, rec: dict[str, Any]) -> None:
        if proc.history_loading:
            self._history_end(proc)  # a new connection: what came of the last one stays
        history = rec.get("history")
        proc.history_loading = isinstance(history, dict) and bool(history.get("present_first"))
        proc.coarse_done = not proc.history_loading
        proc.present_t = None
        proc.history_floor = proc.last_t
        proc.past_cursor = None
        proc.past_samples = 0
        proc.past_last_t = None
        proc.past_merged_at = proc.last_recv or 0.0
        proc.coarse_merges = 0
        proc.coarse_step = None
        proc.coarse_first_t = None
        proc.hello = rec
        proc.backend = rec.get("backend")
        proc.versions = dict(rec.get("versions") or {})
        proc.nvml_status = rec.get("nvml") or {}
        if proc.state in (CONNECTING, DISCONNECTED, STALE):
            proc.state = LIVE
        cap = rec.get("transfer_capture") or {}
        if not cap.get("available", True):
            self._event(proc.pid, "info", f"transfer counts n/a: {cap.get('reason')}", rec.get("t"))
        if proc.nvml_status and not proc.nvml_status.get("available", False):
            self._event(proc.pid, "info", f"NVML n/a: {proc.nvml_status.get('reason')}", rec.get("t"))

    def _oom_census(self, proc: ProcessModel, census: dict[str, Any]) -> None:
        # A census sent again (its OOM turned out to be uncaught) replaces the first copy.
        kept = [c for c in proc.oom_censuses if c.get("id") != census.get("id")]
        proc.oom_censuses = (kept + [census])[-20:]

    def _reply(self, proc: ProcessModel, rec: dict[str, Any]) -> None:
        if self.ledgers.feed_reply(proc.pid, rec):
            return
        result = rec.get("result")
        if isinstance(result, dict) and ("top_sites" in result or "path" in result):
            proc.last_profile = result
            if result.get("error"):
                self._event(proc.pid, "profile", f"memory profile failed: {result['error']}", rec.get("t"))
            else:
                self._event(proc.pid, "profile", f"memory profile saved: {result.get('path')}", rec.get("t"))
        elif not rec.get("ok", True):
            self._event(proc.pid, "error", f"command failed: {rec.get('error')}", rec.get("t"))

    def _sample(self, proc: ProcessModel, rec: dict[str, Any], batch: _Batch) -> None:
        t = rec.get("t")
        if not isinstance(t, (int, float)):
            return
        batch.samples += 1
        dt = (t - proc.last_t) if proc.last_t is not None else None
        if dt is not None and dt <= 0:
            dt = None
        interval = (proc.hello.get("interval_s") or 0.1)
        if rec.get("present") is True and proc.history_loading and proc.present_t is None:
            proc.present_t = t  # the history that follows is older than this
        if proc.history_loading and any(k in rec for k in HOLDERS_FIELDS):
            proc.present_holders.append(_holders_part(rec))
        proc.last_t = t
        proc.latest = rec
        proc.holders.feed(rec)
        if isinstance(rec.get("oom_census"), dict):  # an agent that sends the census inside a sample
            self._oom_census(proc, rec["oom_census"])
        if isinstance(rec.get("demo"), dict):
            proc.demo = rec["demo"]
        if proc.state in (CONNECTING, STALE, DISCONNECTED):
            proc.state = LIVE
        nvml = rec.get("nvml") if isinstance(rec.get("nvml"), dict) else None
        nvml_by_index = {g.get("index"): g for g in (nvml or {}).get("devices", []) if isinstance(g, dict)}
        jax_to_nvml = {d.get("jax_id"): d.get("index") for d in proc.nvml_status.get("devices", []) if isinstance(d, dict)}
        for dev in rec.get("devices") or []:
            if not isinstance(dev, dict) or "id" not in dev:
                continue
            state = proc.devices.get(dev["id"])
            if state is None:
                state = self._new_device(proc, dev["id"], dev.get("platform", "?"), t)
                if state is None:
                    continue
            state.latest = dev
            num_allocs = dev.get("num_allocs")
            if isinstance(num_allocs, (int, float)):
                if state.prev_allocs is not None and t > state.prev_allocs[0]:
                    state.allocs_per_s = max(0.0, (num_allocs - state.prev_allocs[1]) / (t - state.prev_allocs[0]))
                state.prev_allocs = (t, num_allocs)
            live = dev.get("live_arrays") or {}
            if "map" in live:
                batch.maps[id(state)] = (state, live)  # a later scan in this batch replaces it
            gpu = nvml_by_index.get(jax_to_nvml.get(dev["id"]))
            batch.add(state.history, t, tuple(device_row(dev, gpu, state.allocs_per_s)))
        transfers = rec.get("transfers") or {}
        row: dict[str, Any] = {}
        rates: dict[str, dict[str, Any]] = {}
        for d in DIRECTIONS:
            tr = transfers.get(d) or {}
            span = dt if dt is not None else interval
            count, nbytes = tr.get("count"), tr.get("bytes_known")
            rate = count / span if isinstance(count, (int, float)) else None
            brate = nbytes / span if isinstance(nbytes, (int, float)) else None
            row[f"{d}_per_s"], row[f"{d}_bytes_per_s"] = rate, brate
            rates[d] = {
                "count_per_s": rate,
                "bytes_known_per_s": brate,
                "count_total": tr.get("count_total"),
                "bytes_known_total": tr.get("bytes_known_total"),
                "count_bytes_unknown_total": tr.get("count_bytes_unknown_total"),
            }
        proc.rates = rates
        host = rec.get("process") or {}
        row["rss_bytes"], row["cpu_percent"] = host.get("rss_bytes"), host.get("cpu_percent")
        started = host.get("started_t")
        if isinstance(started, (int, float)) and not isinstance(started, bool):
            proc.started_t = float(started)
        gpus = list(nvml_by_index.values())
        if gpus:
            tx = [g.get("pcie_tx_bytes_per_s") for g in gpus if g.get("pcie_tx_bytes_per_s") is not None]
            rx = [g.get("pcie_rx_bytes_per_s") for g in gpus if g.get("pcie_rx_bytes_per_s") is not None]
            row["pcie_tx_bytes_per_s"] = sum(tx) if tx else None
            row["pcie_rx_bytes_per_s"] = sum(rx) if rx else None
        batch.add(proc.history, t, tuple(row.get(name) for name in PROCESS_SERIES))
        for kind, text, et in _sample_events(rec, t):
            self._event(proc.pid, kind, text, et)
        for kind, text, et in self.ledgers.feed_sample(proc.pid, rec):
            self._event(proc.pid, kind, text, et)

    def _new_device(self, proc: ProcessModel, did: Any, platform: Any, t: Any) -> _DeviceState | None:
        """A device first seen now, or None past :data:`MAX_DEVICES` (said once)."""
        if len(proc.devices) >= MAX_DEVICES:
            if not proc.devices_refused:
                proc.devices_refused = True
                self._event(proc.pid, "error", f"more than {MAX_DEVICES} devices in one process: device "
                            f"{repr(did)[:40]} and any later new one are not shown", t)
            return None
        state = proc.devices[did] = _DeviceState(did, str(platform), history=self._new_history(DEVICE_SERIES))
        return state

    # -- history received after the present -------------------------------------
    def _device_for_history(self, proc: ProcessModel, did: Any, t: Any) -> _DeviceState | None:
        state = proc.devices.get(did)
        if state is None:
            if not isinstance(did, (int, str)) or isinstance(did, bool):
                return None
            platform = next((d.get("platform") for d in proc.hello.get("devices") or ()
                             if isinstance(d, dict) and d.get("id") == did), None) or "?"
            state = self._new_device(proc, did, platform, t)
        return state

    def _coarse(self, proc: ProcessModel, rec: dict[str, Any], batch: _Batch) -> None:
        """An agent's coarse history: min/max per bucket of the timeline
        series, older than the present; into every level it can fill."""
        if proc.history.log is not None:
            return  # a replay index logs rows in order only
        step = rec.get("level_s")
        rows = rec.get("rows")
        if not isinstance(step, (int, float)) or not step > 0 or not isinstance(rows, list):
            return
        pcols = _columns(rec.get("process_columns"), PROCESS_SERIES)
        dcols = _columns(rec.get("device_columns"), DEVICE_SERIES)
        ts: list[Any] = []
        plo: list[Any] = []
        phi: list[Any] = []
        per_device: dict[Any, tuple[list[Any], list[Any], list[Any]]] = {}
        for row in rows:
            if not isinstance(row, list) or len(row) < 5 or not isinstance(row[0], (int, float)) \
                    or isinstance(row[0], bool) or not math.isfinite(row[0]):
                continue
            t = row[0]
            ts.append(t)
            plo.append(row[2])
            phi.append(row[3])
            for dev in row[4] if isinstance(row[4], list) else ():
                if isinstance(dev, list) and len(dev) >= 3:
                    entry = per_device.get(dev[0])
                    if entry is None:
                        entry = per_device[dev[0]] = ([], [], [])
                    entry[0].append(t)
                    entry[1].append(dev[1])
                    entry[2].append(dev[2])
        if not ts:
            return
        proc.coarse_step = float(step) if proc.coarse_step is None else min(proc.coarse_step, float(step))
        first = float(min(ts))
        proc.coarse_first_t = first if proc.coarse_first_t is None else min(proc.coarse_first_t, first)
        pending: list[tuple[History, list[Any], np.ndarray, np.ndarray]] = [
            (proc.history, ts, _matrix(plo, pcols, len(PROCESS_SERIES)), _matrix(phi, pcols, len(PROCESS_SERIES)))]
        for did, (dts, lo, hi) in per_device.items():
            state = self._device_for_history(proc, did, ts[-1])
            if state is not None:
                pending.append((state.history, dts, _matrix(lo, dcols, len(DEVICE_SERIES)),
                                _matrix(hi, dcols, len(DEVICE_SERIES))))
        for history, times, lo, hi in pending:
            entry = proc.coarse_pending.get((id(history), float(step)))
            if entry is None:
                entry = proc.coarse_pending[(id(history), float(step))] = (history, [], [], [])
            entry[1].extend(times)
            entry[2].append(lo)
            entry[3].append(hi)

    def _merge_coarse(self, proc: ProcessModel) -> None:
        """The coarse rows received so far into the timelines (one merge
        per history, however many records brought them)."""
        for (_, step), (history, ts, los, his) in proc.coarse_pending.items():
            history.merge_buckets(step, np.asarray(ts, dtype=np.float64), np.concatenate(los), np.concatenate(his))
        proc.coarse_pending = {}
        proc.coarse_merges += 1
        proc.coarse_merged_at = proc.last_recv or 0.0

    def _past_sample(self, proc: ProcessModel, rec: dict[str, Any], batch: _Batch) -> None:
        """A sample of the agent's fine history, sent after the present: its
        timeline rows and its events, nothing else (the panels show the
        present; its totals are the present's)."""
        if not proc.coarse_done:
            proc.coarse_done = True
            self.milestone += 1
        t = rec.get("t")
        if proc.history.log is not None or not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t):
            return
        if proc.present_t is not None and t >= proc.present_t:
            return  # the present itself (it is in already), or newer
        cursor = proc.past_cursor
        if cursor is None:
            cursor = proc.past_cursor = Cursor(proc.hello.get("interval_s") or 0.1, nvml_map(proc.hello))
        rows = cursor.rows(rec)
        if rows is None:
            return
        _, process, devices, _ = rows
        if proc.past is None:
            proc.past = History(PROCESS_SERIES, proc.history.levels)
        batch.add(proc.past, t, process)
        for did, row in devices:
            state = self._device_for_history(proc, did, t)
            if state is None:
                continue
            if state.past is None:
                state.past = History(DEVICE_SERIES, state.history.levels)
            batch.add(state.past, t, row)
        batch.past = True
        proc.past_samples += 1
        proc.past_last_t = t
        if proc.history_floor is None or t > proc.history_floor:  # not seen on an earlier connection
            for kind, text, et in _sample_events(rec, t):
                self._past_event(proc.pid, kind, text, et)
        if any(k in rec for k in HOLDERS_FIELDS) and len(proc.past_holders) < 10_000:
            proc.past_holders.append(_holders_part(rec))

    def _past_event(self, pid: int, kind: str, text: str, t: Any) -> None:
        """An event of the history: older than those shown, so it never
        pushes one of them out of the bounded list."""
        if len(self.events) < MAX_EVENTS:
            self._event(pid, kind, text, t)

    def _merge_past(self, proc: ProcessModel) -> None:
        """The fine history gathered so far into the timelines: the levels
        finer than the coarse history's buckets (those have every sample
        already, the fine ones included)."""
        def below(past: History) -> float | None:
            covered = proc.coarse_first_t is not None and past.first_t is not None and past.first_t >= proc.coarse_first_t
            return proc.coarse_step if covered else None

        if proc.past is not None:
            proc.history.merge(proc.past, below(proc.past))
            proc.past = None
        for state in proc.devices.values():
            if state.past is not None:
                state.history.merge(state.past, below(state.past))
                state.past = None
        proc.past_merged_at = proc.last_recv or 0.0

    def _history_end(self, proc: ProcessModel) -> None:
        """The history is in (or its connection ended): merge what came, and
        fold the Holders fields in time order, history first."""
        if proc.coarse_pending:
            self._merge_coarse(proc)
        self._merge_past(proc)
        if proc.past_holders:
            fold = HoldersFold()
            seen: set[Any] = set()
            for part in proc.past_holders + proc.present_holders:
                holders = part.get("holders")
                if isinstance(holders, dict) and "seq" in holders:
                    if holders["seq"] in seen:
                        part = {k: v for k, v in part.items() if k != "holders"}
                    seen.add(holders["seq"])
                fold.feed(part)
            proc.holders = fold
        proc.past_holders, proc.present_holders = [], []
        proc.history_loading = False
        proc.coarse_done = True
        self.milestone += 1

    # -- reading -----------------------------------------------------------------
    def refresh_states(self) -> None:
        """Mark live processes stale after 3 missed intervals."""
        now = self._clock()
        with self._lock:
            for proc in self.processes.values():
                if proc.state not in (LIVE, STALE) or proc.last_recv is None:
                    continue
                interval = proc.hello.get("interval_s") or 0.1
                state = STALE if now - proc.last_recv > STALE_INTERVALS * max(interval, 0.05) else LIVE
                if state != proc.state:
                    proc.state = state
                    self.version += 1

    def loading(self, now: float | None = None) -> tuple[int, float] | None:
        """Whether a live stream is still catching up on its backlog.

        A live process whose newest sample is older than a few intervals is
        being fed its backfill (or another backlog) faster than real time.

        Returns:
            (samples loaded so far, seconds still behind) over the processes
            that are behind, or None when every live stream is current.
        """
        wall = now if now is not None else time.time()
        samples, behind, history = 0, 0.0, False
        with self._lock:
            for p in self.processes.values():
                if p.state not in (LIVE, STALE) or p.last_t is None:
                    continue
                if p.history_loading:
                    # The present is in; its history follows it (older).
                    history = True
                    samples += p.past_samples
                    if p.present_t is not None:
                        reached = p.past_last_t if p.past_last_t is not None else p.present_t - (
                            p.hello.get("history") or {}).get("backfill_s", 0.0)
                        behind = max(behind, p.present_t - reached)
                    continue
                interval = p.hello.get("interval_s") or 0.1
                lag = wall - p.last_t
                if lag > max(LOADING_LAG_S, STALE_INTERVALS * interval):
                    samples += p.samples
                    behind = max(behind, lag)
        return (samples, behind) if (behind or history) else None

    def device_keys(self) -> list[tuple[int, int]]:
        with self._lock:
            return [(pid, did) for pid, p in self.processes.items() for did in sorted(p.devices)]

    def snapshot(self, selected: int = 0, window_s: float | None = 600.0, replay: dict[str, Any] | None = None, now: float | None = None) -> Snapshot:
        wall = now if now is not None else time.time()
        mono = self._clock()
        with self._lock:
            devices: list[DeviceView] = []
            procs: list[ProcessView] = []
            for pid, p in self.processes.items():
                end_t = p.last_t
                for did in sorted(p.devices):
                    devices.append(self._device_view(p, p.devices[did], window_s, end_t))
                age = (mono - p.last_recv) if (p.last_recv is not None and p.state in (LIVE, STALE)) else None
                started = _started_t(p)
                ref = p.last_t if p.state in (EXITED, DISCONNECTED, REPLAY) or replay else wall
                latest = p.latest
                history = p.history.window(window_s, end_t)
                procs.append(ProcessView(
                    pid=pid,
                    argv=tuple(p.hello.get("argv") or ()),
                    backend=p.backend,
                    versions=dict(p.versions),
                    state=p.state,
                    sample_age_s=age,
                    uptime_s=(ref - started) if (started and ref) else None,
                    interval_s=p.hello.get("interval_s") or 0.1,
                    seq=latest.get("seq"),
                    transfers=dict(p.rates),
                    top_shapes=tuple((latest.get("transfers") or {}).get("top_shapes") or ()),
                    capture=dict(latest.get("transfer_capture") or p.hello.get("transfer_capture") or {}),  # the newest status wins
                    process=dict(latest.get("process") or {}),
                    compile=dict(latest.get("compile") or {}),
                    donation=dict(latest.get("donation") or {}),
                    nvml_status=dict(p.nvml_status),
                    history=history,
                    last_profile=p.last_profile,
                    span=_span(history, window_s, end_t),
                    demo=p.demo,
                    external=p.hello["external"].get("note") if isinstance(p.hello.get("external"), dict) else None,
                    nvml=dict(latest.get("nvml") or {}) or None,
                    holders=p.holders.view(),
                    oom_censuses=tuple(p.oom_censuses),
                ))
            n = len(devices)
            sel = -1 if selected < 0 or n == 0 else selected % n
            return Snapshot(
                t=wall,
                processes=tuple(procs),
                devices=tuple(devices),
                selected=sel,
                window_s=window_s,
                # Events arrive per pid in order, but several pids (and a
                # replay rebuilding one) interleave: show them by time.
                events=tuple(sorted(self.events, key=lambda e: e.t)),
                notices=tuple(self.notices),
                replay=replay,
            )

    def _device_view(self, p: ProcessModel, s: _DeviceState, window_s: float | None, end_t: float | None) -> DeviceView:
        d = s.latest
        live = d.get("live_arrays") or {}
        jax_to_nvml = {x.get("jax_id"): x.get("index") for x in p.nvml_status.get("devices", []) if isinstance(x, dict)}
        gpu = None
        nv = p.latest.get("nvml") if isinstance(p.latest.get("nvml"), dict) else None
        if nv:
            for g in nv.get("devices", []):
                if g.get("index") == jax_to_nvml.get(s.id):
                    gpu = g
        allocs_reason = None
        if d.get("num_allocs") is None:
            allocs_reason = "allocator reports no num_allocs" if d.get("source") == "memory_stats" else "no allocator statistics on this backend"
        return DeviceView(
            pid=p.pid,
            id=s.id,
            platform=s.platform,
            source=str(d.get("source", "?")),
            bytes_in_use=d.get("bytes_in_use"),
            pool_bytes=d.get("pool_bytes"),
            bytes_limit=d.get("bytes_limit"),
            peak_bytes_in_use=d.get("peak_bytes_in_use"),
            largest_free_block_bytes=d.get("largest_free_block_bytes"),
            num_allocs=d.get("num_allocs"),
            live_bytes=live.get("bytes"),
            live_count=live.get("count"),
            nvml=dict(gpu) if gpu else None,
            fragmentation=d.get("fragmentation"),
            fragmentation_reason=d.get("fragmentation_reason"),
            allocs_per_s=s.allocs_per_s if d.get("num_allocs") is not None else None,
            allocs_reason=allocs_reason,
            buffer_map=s.buffer_map,
            map_complete=s.map_complete,
            top_buffers=s.top_buffers,
            timeline=s.history.window(window_s, end_t),
            map_live_count=s.map_live_count,
            map_live_bytes=s.map_live_bytes,
            unmapped=dict(s.unmapped),
            live_holes=live.get("holes") if isinstance(live.get("holes"), (int, float)) else None,
            live_age_s=_age(end_t, live.get("scanned_t")),
            map_age_s=_age(end_t, s.map_t),
        )


def _merged_events(events: Iterable[Event], pid: int, ours: list[Event]) -> collections.deque[Event]:
    """``events`` with ``pid``'s replaced by ``ours``. Alone, ``ours`` keep
    the order they were fed in (a replay rebuilt by seeking shows what
    playing gave); among other processes' events, all go in time order."""
    kept = [e for e in events if e.pid != pid]
    merged = sorted(kept + ours, key=lambda e: e.t) if kept else ours
    return collections.deque(merged, maxlen=MAX_EVENTS)


class _Batch:
    """What :meth:`Model.feed_many` defers to the end of a batch: history
    rows (appended in one numpy write per history) and each device's newest
    buffer map (the only one a snapshot shows)."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[History, list[float], list[list[float]]]] = {}
        self.maps: dict[int, tuple[_DeviceState, dict[str, Any]]] = {}
        self.samples = 0
        self.past = False  # fine history rows went into `past` histories

    def add(self, history: History, t: float, values: tuple[Any, ...]) -> None:
        entry = self.rows.get(id(history))
        if entry is None:
            entry = self.rows[id(history)] = (history, [], [])
        entry[1].append(t)
        # Numbers pass as they are; anything else as History.append stores it.
        entry[2].append([v if (v.__class__ is float or v.__class__ is int) else _num(v) for v in values])

    def flush(self) -> None:
        for state, live in self.maps.values():
            _take_map(state, live)
        for history, ts, rows in self.rows.values():
            history.extend(np.asarray(ts, dtype=np.float64), np.asarray(rows, dtype=np.float32))
        self.rows.clear()
        self.maps.clear()


def _sample_events(rec: dict[str, Any], t: float) -> list[tuple[str, str, Any]]:
    """The events list's lines a sample brings, ``(kind, text, t)``: its
    compiles, failed donations and the agent's events. One wording for a
    live sample and for one of the history."""
    out = []
    comp = rec.get("compile") or {}
    if comp.get("count"):
        out.append(("compile", f"{comp['count']} backend compile(s); {comp.get('count_total')} total, "
                               f"{comp.get('seconds_total', 0):.2f} s", t))
    don = rec.get("donation") or {}
    if don.get("failed"):
        out.append(("donation", f"{don['failed']} failed donation(s): {don.get('last_message') or ''}", t))
    for ev in rec.get("events") or []:
        if isinstance(ev, dict):
            text = ev.get("text") or ", ".join(f"{k}={v}" for k, v in ev.items() if k not in ("kind", "t"))
            out.append((str(ev.get("kind", "event")), text, ev.get("t", t)))
    return out


def _age(end_t: float | None, t: Any) -> float | None:
    """Seconds from ``t`` to ``end_t`` (never below 0), None if either is unknown."""
    if end_t is None or not protocol.is_number(t):
        return None
    return max(0.0, float(end_t) - float(t))


def _take_map(state: _DeviceState, live: dict[str, Any]) -> None:
    """Keep the buffer map of a map-carrying ``live_arrays``, with the counts
    of its own scan, so that the map's caption never compares it with the
    bytes of another scan."""
    state.buffer_map = tuple((int(p), int(n)) for p, n in live.get("map") or [] if p is not None)
    state.map_complete = bool(live.get("map_complete", True))
    state.top_buffers = tuple(live.get("top") or ())
    count, nbytes = live.get("count"), live.get("bytes")
    state.map_live_count = int(count) if isinstance(count, (int, float)) else None
    map_t = live.get("map_t")
    state.map_t = float(map_t) if protocol.is_number(map_t) else None
    state.map_live_bytes = int(nbytes) if isinstance(nbytes, (int, float)) else None
    # Absent means "none skipped" (the agent omits an empty dict) or an
    # older agent that did not say; the caption tells the two apart by count.
    unmapped = live.get("unmapped") if isinstance(live.get("unmapped"), dict) else {}
    # A kind this viewer does not know counts as "without an address".
    state.unmapped = {k: int(v) for k, v in unmapped.items() if k in UNMAPPED_KINDS and isinstance(v, (int, float)) and v > 0}


def _columns(names: Any, ours: tuple[str, ...]) -> list[tuple[int, int]] | None:
    """Where each column of a coarse record goes among ``ours``: None when
    they are ours, in our order; else ``(theirs, ours)`` index pairs."""
    if not isinstance(names, list):
        return None
    if tuple(names) == ours:
        return None
    index = {n: i for i, n in enumerate(ours)}
    return [(j, index[n]) for j, n in enumerate(names) if isinstance(n, str) and n in index]


def _matrix(rows: list[Any], columns: list[tuple[int, int]] | None, k: int) -> np.ndarray:
    """Rows of a coarse record (numbers or null) as float32, our column order."""
    if columns is None:
        out = np.array(rows, dtype=np.float32)
        if out.ndim != 2 or out.shape[1] != k:
            raise ValueError(f"expected {k} columns")
        return out
    out = np.full((len(rows), k), np.nan, dtype=np.float32)
    for i, row in enumerate(rows):
        if isinstance(row, list):
            for j, ours in columns:
                if j < len(row):
                    out[i, ours] = _num(row[j])
    return out


def _holders_part(rec: dict[str, Any]) -> dict[str, Any]:
    """What :class:`HoldersFold` reads of a sample (or a history sample)."""
    part: dict[str, Any] = {"type": protocol.SAMPLE, "t": rec.get("t")}
    for key in HOLDERS_FIELDS:
        if key in rec:
            part[key] = rec[key]
    return part


def _started_t(p: ProcessModel) -> float | None:
    """When the program started: the process's own start time when the
    probe reports it, else the agent's (hello), which is later when the
    agent was injected into a running program."""
    if p.started_t is not None:
        return p.started_t
    started = p.hello.get("started_t")
    return float(started) if isinstance(started, (int, float)) else None


def _span(history: Window, window_s: float | None, end_t: float | None) -> tuple[float, float] | None:
    """The time axis all timelines of a process share.

    It ends at the last sample and reaches back ``window_s`` (the whole run
    for None), but not before the first sample: a run shorter than the
    window fills the chart instead of a sliver at its right edge. Devices
    appear after the process's first samples (when the program creates its
    backend), so their strips start blank at the left: that is when there
    was no device memory yet.
    """
    if end_t is None:
        return None
    first = float(history.t[0]) if len(history.t) else end_t
    start = max(end_t - window_s, first) if window_s else first
    return (min(start, end_t - MIN_SPAN_S), float(end_t))
