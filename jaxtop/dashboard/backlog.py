"""History an agent sends after the present, into the model's timelines.

A client that connects gets the present first, then its history, older:
the coarse buckets go into the timelines as they come, the fine samples are
gathered in ``past`` histories and merged now and then, and the Holders
fields of the history are folded, in time order, when it ends.
:class:`HistoryFeed` is the part of :class:`~jaxtop.dashboard.model.Model`
that does this.
"""

from __future__ import annotations

import collections
import math
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from jaxtop.dashboard.batch import Batch
from jaxtop.dashboard.events import MAX_EVENTS, sample_events
from jaxtop.dashboard.history import History, _num
from jaxtop.dashboard.holders import HoldersFold
from jaxtop.dashboard.transfer_sites import TransferSitesFold
from jaxtop.dashboard.readings import is_device_id
from jaxtop.dashboard.rows import Cursor
from jaxtop.wire.records import History as HistoryRecord
from jaxtop.wire.records import Sample
from jaxtop.wire.timeline import DEVICE_SERIES, PROCESS_SERIES

if TYPE_CHECKING:
    from jaxtop.dashboard.events import Event
    from jaxtop.dashboard.state import ProcessModel, _DeviceState

#: While an agent's fine history loads after the present, what it brought
#: so far goes into the timelines at most this often (a merge of every
#: level), and at its end.
PAST_MERGE_S = 1.0
#: The same for its coarse history: the first part at once (the first frame
#: needs it), the rest at most this often, and when it ends.
COARSE_MERGE_S = 0.25
#: Sparse sample fields folded in time order once a history is in: the
#: Holders screen's (:class:`HoldersFold`) and the transfer sites
#: (:class:`TransferSitesFold`).
HOLDERS_FIELDS = ("holders", "labels", "host_syncs", "transfer_sites")


class HistoryFeed:
    """The model's handling of history received after the present."""

    milestone: int
    events: collections.deque[Event]

    if TYPE_CHECKING:
        def _event(self, pid: int, kind: str, text: str, t: float | None = None) -> None: ...

        def _new_device(self, proc: ProcessModel, did: Any, platform: Any, t: Any) -> _DeviceState | None: ...

    def _device_for_history(self, proc: ProcessModel, did: Any, t: Any) -> _DeviceState | None:
        state = proc.devices.get(did)
        if state is None:
            if not is_device_id(did):
                return None
            platform = next((d.platform for d in proc.hello.devices or () if d.id == did), None) or "?"
            state = self._new_device(proc, did, platform, t)
        return state

    def _coarse(self, proc: ProcessModel, rec: HistoryRecord, batch: Batch) -> None:
        """An agent's coarse history: min/max per bucket of the timeline
        series, older than the present; into every level it can fill."""
        if proc.history.log is not None:
            return  # a replay index logs rows in order only
        step, rows = rec.level_s, rec.rows
        if step is None or not step > 0 or rows is None:
            return
        # The rows are positional (a matrix per record): their shape is
        # checked here, row by row, as the matrices are built.
        pcols = _columns(rec.process_columns, PROCESS_SERIES)
        dcols = _columns(rec.device_columns, DEVICE_SERIES)
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

    def _past_sample(self, proc: ProcessModel, rec: Sample, batch: Batch) -> None:
        """A sample of the agent's fine history, sent after the present: its
        timeline rows and its events, nothing else (the panels show the
        present; its totals are the present's)."""
        if not proc.coarse_done:
            proc.coarse_done = True
            self.milestone += 1
        t = rec.t
        if t is None or (proc.present_t is not None and t >= proc.present_t):
            return  # the present itself (it is in already), or newer
        proc.advisor.feed(rec)  # in time order: the present and later samples wait for history_end
        if proc.history.log is not None:
            return
        cursor = proc.past_cursor
        if cursor is None:
            cursor = proc.past_cursor = Cursor(proc.interval_s, proc.jax_to_nvml)
        rows = cursor.rows(rec)
        if rows is None:
            return
        _, process, devices = rows
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
            for kind, text, et in sample_events(rec, t):
                self._past_event(proc.pid, kind, text, et)
        if has_sparse(rec) and len(proc.past_holders) < 10_000:
            proc.past_holders.append(sparse_part(rec))

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
        fold the Holders fields and the transfer sites in time order, history
        first."""
        if proc.coarse_pending:
            self._merge_coarse(proc)
        self._merge_past(proc)
        if proc.past_holders:
            fold = HoldersFold()
            seen: set[Any] = set()
            for part in proc.past_holders + proc.present_holders:
                holders = part.holders
                if holders is not None and holders.seq is not None:
                    if holders.seq in seen:
                        part = msgspec.structs.replace(part, holders=None)
                    seen.add(holders.seq)
                fold.feed(part)
            proc.holders = fold
            sites = TransferSitesFold()
            for part in proc.past_holders + proc.present_holders:
                sites.feed(part)
            proc.transfer_sites = sites
        proc.past_holders, proc.present_holders = [], []
        for held in proc.advice_held:
            proc.advisor.feed(held)
        proc.advice_held = []
        proc.history_loading = False
        proc.coarse_done = True
        self.milestone += 1


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


def has_sparse(rec: Sample) -> bool:
    """Whether a sample carries one of :data:`HOLDERS_FIELDS`."""
    return rec.holders is not None or rec.labels is not None or rec.host_syncs is not None \
        or rec.transfer_sites is not None


def sparse_part(rec: Sample) -> Sample:
    """What :class:`HoldersFold` and :class:`TransferSitesFold` read of a
    sample (or a history sample): kept until the history is in, so the rest
    of the sample is let go."""
    return Sample(t=rec.t, holders=rec.holders, labels=rec.labels, host_syncs=rec.host_syncs,
                  transfer_sites=rec.transfer_sites)


