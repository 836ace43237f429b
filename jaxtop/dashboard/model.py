"""The dashboard's model: records in, frozen snapshots out.

Fed the same way from a live socket, a recording or a test (``feed(pid,
record)``); keeps all history (bounded, see :mod:`jaxtop.dashboard.history`); builds an
immutable :class:`Snapshot` for the widgets (:mod:`jaxtop.dashboard.views`),
whose every field is typed: no wire object reaches a widget. No Textual, no
sockets.

The classes a replay index pickles (:class:`Event`, :class:`ProcessModel`
and its device states) live here, under the module name its unpickler
accepts.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, Iterable, Union

from jaxtop.wire import protocol
from jaxtop.wire.records import (
    Backend, Backfill, Dropped, Error, Exit, Hello, HistoryEnd, Odd, OomCensus, Record, Reply, Sample, Unknown,
    MemoryProfile, Transfer, WhoHolds, kind_of, reply_result,
)
from jaxtop.wire.records import History as HistoryRecord
from jaxtop.wire.records import from_dict as records_from_dict
from jaxtop.wire.safe_text import terminal_safe
from jaxtop.dashboard.accelerator import nvml_worth_saying
from jaxtop.dashboard.advising import AdviceFeed
from jaxtop.dashboard.holders import who_said
from jaxtop.dashboard.backlog import COARSE_MERGE_S, HOLDERS_FIELDS, PAST_MERGE_S, HistoryFeed, has_sparse, sparse_part
from jaxtop.dashboard.batch import UNMAPPED_KINDS, Batch
from jaxtop.dashboard.events import MAX_EVENTS, Event, merged_events, sample_events
from jaxtop.dashboard.history import History
from jaxtop.dashboard.ledger import LedgerStore
from jaxtop.dashboard.readings import NO_NVML, TransferView, device_order, nvml_of_devices
from jaxtop.dashboard.rows import NO_TOTALS, NO_TRANSFERS, device_row, gpus_by_index, process_row, transfer_totals
from jaxtop.dashboard.snapshot import MIN_SPAN_S, CensusViews, device_view, process_view
from jaxtop.dashboard.state import ProcessModel, _DeviceState
from jaxtop.dashboard.views import (
    CONNECTING, DISCONNECTED, EXITED, LIVE, REPLAY, STALE, DeviceView, ProcessView, ReplayView, Snapshot,
)
from jaxtop.wire.protocol import DIRECTIONS
from jaxtop.wire.timeline import DEVICE_SERIES, PROCESS_SERIES

#: What the model is fed: a decoded record, or a dict that it decodes the same way.
Fed = Union[Record, Unknown, dict[str, Any]]

__all__ = [
    "COARSE_MERGE_S", "CONNECTING", "DEVICE_SERIES", "DISCONNECTED", "EXITED", "HOLDERS_FIELDS", "LIVE",
    "LOADING_LAG_S", "MAX_DEVICES", "MAX_EVENTS", "MIN_SPAN_S", "PAST_MERGE_S", "PROCESS_SERIES", "REPLAY", "STALE",
    "STALE_INTERVALS", "UNMAPPED_KINDS", "DeviceView", "Event", "Model", "ProcessModel", "ProcessView", "ReplayView",
    "Snapshot",
]

# DEVICE_SERIES and PROCESS_SERIES (jaxtop.wire.timeline) are the timelines'
# columns: the agent's coarse history sends buckets of the same series.
STALE_INTERVALS = 3
#: Devices shown per process. Each keeps about 3 MB of history, so a stream
#: naming thousands of device ids (a bug, or a hostile peer or recording)
#: must not make the dashboard allocate gigabytes. A process addresses its
#: local devices only: 8 GPUs, 4-8 TPU chips, or as many CPU devices as
#: ``--xla_force_host_platform_device_count`` makes.
MAX_DEVICES = 64
#: A live stream whose newest sample is this much older than the wall clock
#: (or 3 intervals, if longer) is still loading its backlog.
LOADING_LAG_S = 2.0
#: Compile lines this close to the newest one fold into it (see _compile_event).
COMPILE_FOLD_S = 10.0


class Model(HistoryFeed, AdviceFeed):
    """All processes being watched. Thread-safe: a reader thread feeds it,
    the UI thread takes snapshots.

    Feeding and reading live here; the history an agent sends after the
    present is :class:`~jaxtop.dashboard.backlog.HistoryFeed`'s, and the
    views a snapshot holds are built by :mod:`jaxtop.dashboard.snapshot`.
    """

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
        self._census_views: CensusViews = {}  # OOM census views built so far (snapshots reuse them)
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
            self.events = merged_events(self.events, pid, ours)
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
            self.events = merged_events(self.events, pid, list(events))
            self.version += 1

    def add_event(self, pid: int, kind: str, text: str, t: float | None = None) -> None:
        with self._lock:
            self._event(pid, kind, text, t)

    def _event(self, pid: int, kind: str, text: str, t: Any = None) -> None:
        # A record's own time where it is one (a number any clock can show),
        # else now: the events list sorts and prints every time.
        when = protocol.timestamp(t)
        # Texts made here quote records, errors and paths: shown, never obeyed.
        self.events.append(Event(when if when is not None else time.time(), pid, terminal_safe(kind),
                                 terminal_safe(text)))
        self.version += 1

    def _odd(self, proc: ProcessModel, what: str, text: str, t: Any = None) -> None:
        """Say once per process that the stream held ``what``, which cannot
        be shown (``text`` says what was done instead)."""
        if what not in proc.odd_said:
            proc.odd_said.add(what)
            self._event(proc.pid, "error", text, t)

    def add_notice(self, text: str) -> None:
        with self._lock:
            self.notices.append(terminal_safe(text))
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

    def feed(self, pid: int, record: Fed) -> None:
        """Apply one record from the stream of ``pid``.

        A record the decoder read with parts of the wrong shape (a list
        where an object belongs, a string for a number) is applied without
        them, which read n/a, and an error event says so once per field; a
        record the model still fails on is skipped with an error event: one
        odd record from a newer agent, a bug or a hostile peer must not stop
        the reader thread that feeds the model, nor a snapshot.
        """
        self.feed_many(pid, (record,))

    def feed_many(self, pid: int, records: Iterable[Fed]) -> int:
        """Apply several records of ``pid`` in order, as one change.

        The same result as :meth:`feed` for each record in turn, but a
        backlog (an agent's backfill, a recording) goes in at a fraction of
        the cost: the lock is taken once, history rows are appended to the
        ring buffers in one numpy write per series set, and a device's
        buffer map, of which only the newest is ever shown, is decoded once
        per batch instead of once per scan.

        Args:
            records: Typed records, as :func:`jaxtop.wire.records.decode`
                makes them; a dict (a test's, a scrape's) is decoded here
                the same way.

        Returns:
            How many records were applied.
        """
        self.step_aside()
        batch = Batch()
        n = 0
        with self._lock:
            proc = self.process(pid)
            proc.last_recv = self._clock()
            for item in records:
                n += 1
                if isinstance(item, dict):
                    try:
                        record = records_from_dict(item)
                    except protocol.ProtocolError as exc:
                        self._event(pid, "error", f"malformed record skipped: {exc}", None)
                        continue
                else:
                    record = item
                try:
                    self._apply(proc, record, batch)
                except Exception as exc:
                    self._event(pid, "error", f"malformed {kind_of(record)!r} record skipped: {type(exc).__name__}: {exc}",
                                None)
            batch.flush()
            for rates_of, row, by_direction in batch.rates.values():
                rates_of.rates = _rates(rates_of.transfer_window.rates(), row, by_direction)
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

    def _apply(self, proc: ProcessModel, rec: Record | Unknown, batch: Batch) -> None:
        cls = rec.__class__
        if cls is Unknown:
            return  # a newer agent's record type: skipped, as the protocol says
        if rec.odd:
            kind = kind_of(rec)
            for odd in rec.odd:
                self._odd(proc, odd.where, _odd_text(kind, odd), rec.t)
        pid = proc.pid
        if cls is Sample:
            self._sample(proc, rec, batch)
        elif cls is Backfill:
            self._past_sample(proc, rec, batch)
        elif cls is HistoryRecord:
            self._coarse(proc, rec, batch)
        elif cls is Hello:
            self._hello(proc, rec)
        elif cls is Backend:
            proc.backend = rec.backend or proc.backend
            proc.versions.update(rec.versions or {})
            self._event(pid, "info", f"JAX backend ready: {proc.backend}, {len(rec.devices or ())} device(s)", rec.t)
            self._say_nvml(proc, rec.t)
        elif cls is HistoryEnd:
            batch.flush()
            self._history_end(proc)
        elif cls is Dropped:
            self._event(pid, "dropped", f"{protocol.shown(rec.count)} samples dropped "
                        f"({protocol.shown(rec.reason if rec.reason is not None else 'client too slow')})", rec.t)
        elif cls is Error:
            self._event(pid, "error", f"agent: {protocol.shown(rec.message)}", rec.t)
        elif cls is Exit:
            proc.state = EXITED
            self._event(pid, "exit", "process exited (final sample received)", rec.t)
        elif cls is OomCensus:
            self._oom_census(proc, rec)
        elif cls is Reply:
            self._reply(proc, rec)

    def _hello(self, proc: ProcessModel, rec: Hello) -> None:
        if proc.history_loading:
            self._history_end(proc)  # a new connection: what came of the last one stays
        proc.history_loading = rec.history is not None and bool(rec.history.present_first)
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
        proc.backend = rec.backend
        proc.versions = dict(rec.versions or {})
        proc.nvml_status = rec.nvml or NO_NVML
        proc.jax_to_nvml = nvml_of_devices(proc.nvml_status)
        interval = rec.interval_s
        proc.interval_s = float(interval) if interval is not None and 0 < interval <= 86400 else 0.1
        if proc.state in (CONNECTING, DISCONNECTED, STALE):
            proc.state = LIVE
        cap = rec.transfer_capture
        if cap is not None and cap.available is False:
            self._event(proc.pid, "info", f"transfer counts n/a: {protocol.shown(cap.reason)}", rec.t)
        proc.nvml_said = False
        self._say_nvml(proc, rec.t)

    def _say_nvml(self, proc: ProcessModel, t: float | None) -> None:
        """Why NVML is n/a, once, where that is news (not on a TPU or CPU machine without NVIDIA's library)."""
        due = None if proc.nvml_said else nvml_worth_saying(proc.nvml_status, proc.backend, proc.hello.external is not None)
        if due is not None:
            proc.nvml_said = True
            if due:
                self._event(proc.pid, "info", f"NVML n/a: {protocol.shown(proc.nvml_status.reason)}", t)

    def _oom_census(self, proc: ProcessModel, census: OomCensus) -> None:
        # A census sent again (its OOM turned out to be uncaught) replaces the first copy.
        kept = [c for c in proc.oom_censuses if c.id != census.id]
        proc.oom_censuses = (kept + [census])[-20:]

    def _reply(self, proc: ProcessModel, rec: Reply) -> None:
        if self.ledgers.feed_reply(proc.pid, rec):
            return
        # A reply's result has the shape of its command's: a memory profile's
        # names its file (or the error that stopped it).
        profile = reply_result(rec, MemoryProfile) if isinstance(rec.result, dict) and (
            "top_sites" in rec.result or "path" in rec.result) else None
        who = reply_result(rec, WhoHolds) if isinstance(rec.result, dict) and "who" in rec.result else None
        if who is not None:
            self._advise(proc, rec)  # the leak advice names the holders
            for text in who_said(who):
                self._event(proc.pid, "holders", text, rec.t)
        elif profile is not None:
            proc.last_profile = profile
            if profile.error:
                self._event(proc.pid, "profile", f"memory profile failed: {protocol.shown(profile.error)}", rec.t)
            else:
                self._event(proc.pid, "profile", f"memory profile saved: {protocol.shown(profile.path)}", rec.t)
        elif rec.ok is False:
            self._event(proc.pid, "error", f"command failed: {protocol.shown(rec.error)}", rec.t)

    def _sample(self, proc: ProcessModel, rec: Sample, batch: Batch) -> None:
        t = rec.t
        if t is None:
            self._odd(proc, "t", "a sample without a usable time was skipped (said once)")
            return
        batch.samples += 1
        dt = (t - proc.last_t) if proc.last_t is not None else None
        if dt is not None and dt <= 0:
            dt = None
        interval = proc.tick_s
        if rec.present and proc.history_loading and proc.present_t is None:
            proc.present_t = t  # the history that follows is older than this
        if proc.history_loading and has_sparse(rec):
            proc.present_holders.append(sparse_part(rec))
        proc.last_t = t
        proc.latest = rec
        self._advise(proc, rec)
        proc.holders.feed(rec)  # every sample: its time is what the Holders screen's ages are measured to
        if rec.transfer_sites is not None:
            proc.transfer_sites.feed(rec)
        if rec.oom_census is not None:  # an agent that sends the census inside a sample
            self._oom_census(proc, rec.oom_census)
        if rec.demo is not None:
            proc.demo = rec.demo
        if rec.accelerator is not None:
            proc.accelerator = rec.accelerator
        if rec.agent is not None:
            proc.agent = rec.agent
        if proc.state in (CONNECTING, STALE, DISCONNECTED):
            proc.state = LIVE
        nvml_by_index, jax_to_nvml = gpus_by_index(rec.nvml), proc.jax_to_nvml
        for dev in rec.devices or ():
            did = dev.id
            if did is None:
                continue
            state = proc.devices.get(did)
            if state is None:
                state = self._new_device(proc, did, dev.platform, t)
                if state is None:
                    continue
            state.latest = dev
            allocs = state.allocs
            allocs.feed(t, dev.num_allocs, state.platform)
            live = dev.live_arrays
            if live is not None and live.map:
                batch.maps[id(state)] = (state, live)  # a later scan in this batch replaces it
            batch.add(state.history, t, device_row(dev, nvml_by_index.get(jax_to_nvml.get(did)) if nvml_by_index else None,
                                                   allocs.per_s))
        row = process_row(rec, dt if dt is not None else interval, nvml_by_index)
        # The panel's rates: over the last seconds of totals (a sample's own
        # count swings with the relay's batches). The timelines draw each
        # sample's own.
        transfers = rec.transfers
        if transfers is not None:
            by_direction = (transfers.h2d, transfers.d2h, transfers.d2d)
            proc.transfer_window.push(t, transfer_totals(by_direction))
        else:
            by_direction = NO_TRANSFERS
            proc.transfer_window.push(t, NO_TOTALS)
        batch.rates[proc.pid] = (proc, row, by_direction)  # the panel's: the batch's last sample's
        host = rec.process
        if host is not None and host.started_t is not None:
            proc.started_t = host.started_t
        batch.add(proc.history, t, row)
        if (rec.compile is not None and rec.compile.count) or (rec.donation is not None and rec.donation.failed) \
                or rec.events:
            for kind, text, et in sample_events(rec, t):
                if kind == "compile":
                    self._compile_event(proc, rec, text, et)
                else:
                    self._event(proc.pid, kind, text, et)
        if rec.jit is not None:
            for kind, text, et in self.ledgers.feed_sample(proc.pid, rec):
                self._event(proc.pid, kind, text, et)

    def _compile_event(self, proc: ProcessModel, rec: Sample, text: str, t: float | None) -> None:
        """A sample's compiles, folded into the newest compile line while
        compiles keep coming (within :data:`COMPILE_FOLD_S` of it and nothing
        said in between): a storm of one compile a sample is one line that
        counts, not 500 lines that push everything else out of the list."""
        n = (rec.compile.count if rec.compile is not None else None) or 0
        fold = proc.compile_fold
        when = t
        last = self.events[-1] if self.events else None
        if (fold is not None and last is fold[0] and when is not None and when - last.t <= COMPILE_FOLD_S
                and n.__class__ is int):
            self.events.pop()
            total = fold[2] + n
            since = time.strftime("%H:%M:%S", time.localtime(fold[1]))
            text = f"{total} backend compiles since {since};" + text.split(";", 1)[-1]
            self._event(proc.pid, "compile", text, when)
            proc.compile_fold = (self.events[-1], fold[1], total)
            return
        self._event(proc.pid, "compile", text, t)
        first = self.events[-1]
        proc.compile_fold = (first, first.t, n) if n.__class__ is int else None

    def _new_device(self, proc: ProcessModel, did: Any, platform: Any, t: Any) -> _DeviceState | None:
        """A device first seen now, or None past :data:`MAX_DEVICES` (said once)."""
        if len(proc.devices) >= MAX_DEVICES:
            if not proc.devices_refused:
                proc.devices_refused = True
                self._event(proc.pid, "error", f"more than {MAX_DEVICES} devices in one process: device "
                            f"{repr(did)[:40]} and any later new one are not shown", t)
            return None
        state = proc.devices[did] = _DeviceState(did, protocol.text_of(platform) or "?", history=self._new_history(DEVICE_SERIES))
        return state

    # -- reading -----------------------------------------------------------------
    def refresh_states(self) -> None:
        """Mark live processes stale after 3 missed intervals."""
        now = self._clock()
        with self._lock:
            for proc in self.processes.values():
                if proc.state not in (LIVE, STALE) or proc.last_recv is None:
                    continue
                state = STALE if now - proc.last_recv > STALE_INTERVALS * max(proc.tick_s, 0.05) else LIVE
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
                        backfill_s = (p.hello.history.backfill_s if p.hello.history is not None else None) or 0.0
                        reached = p.past_last_t if p.past_last_t is not None else p.present_t - backfill_s
                        behind = max(behind, p.present_t - reached)
                    continue
                lag = wall - p.last_t
                if lag > max(LOADING_LAG_S, STALE_INTERVALS * p.tick_s):
                    samples += p.samples
                    behind = max(behind, lag)
        return (samples, behind) if (behind or history) else None

    def device_keys(self) -> list[tuple[int, int]]:
        with self._lock:
            return [(pid, did) for pid, p in self.processes.items() for did in sorted(p.devices, key=device_order)]

    def snapshot(self, selected: int = 0, window_s: float | None = 600.0, replay: dict[str, Any] | None = None,
                 now: float | None = None) -> Snapshot:
        """One frozen picture of every process and device.

        Args:
            selected: The device shown (an index, wrapped), -1 for the overview.
            window_s: The timelines' window; None for the whole run.
            replay: The playback's state (a source's ``replay_state()``).
            now: The wall clock (tests freeze it).
        """
        wall = now if now is not None else time.time()
        mono = self._clock()
        with self._lock:
            devices: list[DeviceView] = []
            procs: list[ProcessView] = []
            for p in self.processes.values():
                for did in sorted(p.devices, key=device_order):
                    devices.append(device_view(p, p.devices[did], window_s, p.last_t))
                procs.append(process_view(p, window_s, wall, mono, bool(replay), self._census_views,
                                          self.ledgers.largest_call(p.pid), self._advice_of(p)))
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
                replay=ReplayView.from_state(replay),
            )


def _rates(windowed: tuple[float | None, ...], row: tuple[Any, ...],
           by_direction: tuple[Transfer | None, Transfer | None, Transfer | None]) -> dict[str, TransferView]:
    """The Transfers panel's figures by direction: rates over the last
    seconds of totals (``windowed``; the sample's own interval until there
    are two samples: ``row``) and the totals since start."""
    rates = {}
    for i, (d, tr) in enumerate(zip(DIRECTIONS, by_direction)):
        rates[d] = TransferView(
            count_per_s=windowed[2 * i] if windowed[2 * i] is not None else row[i],
            bytes_known_per_s=windowed[2 * i + 1] if windowed[2 * i + 1] is not None else row[3 + i],
            count_total=int(tr.count_total) if tr is not None and tr.count_total is not None else None,
            bytes_known_total=int(tr.bytes_known_total) if tr is not None and tr.bytes_known_total is not None else None,
            count_bytes_unknown_total=int(tr.count_bytes_unknown_total)
            if tr is not None and tr.count_bytes_unknown_total is not None else None,
        )
    return rates


def _odd_text(kind: str, odd: Odd) -> str:
    # A device without a usable id, or an item of the wrong shape, cannot be
    # shown at all; any other part reads n/a.
    fate = "it is left out" if odd.where == "devices[].id" or odd.where.endswith("]") else "it is shown as n/a"
    return f"malformed {kind!r} record: {odd.where} is {odd.value}, not {odd.should}; {fate} (said once)"
