"""What the advisor keeps of a process's records: the running totals of
every line's transfers and host reads, the jit ledger, the memory profiles,
the devices' in-use-beyond-live and holes, failed donations.

:class:`Evidence` is fed typed records in order (an agent's history and
live samples, or a recording's) and holds nothing but what the detectors
read. Feeding a sample costs a few attribute reads unless it carries a
sparse field (sent at most once a second) or a second has passed since the
last device reading: the dashboard feeds it from its ingest.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from jaxtop.advice.series import MAX_POINTS, Total
from jaxtop.dashboard.ledger import LedgerStore, LedgerView
from jaxtop.wire.protocol import fragmentation_na
from jaxtop.wire.records import (
    Hello, Holders, HostSyncs, Record, Reply, Sample, SyncSite, TransferSite, Unknown, WhoHolds, WhoSite, reply_result,
)

__all__ = ["DeviceReading", "Evidence", "HOLDER_PROFILES_KEPT", "SiteKey"]

#: A line of the program: (file, line, function).
SiteKey = tuple[str, int, str]
#: Lines whose totals are kept at most (the agent lists its 50 busiest
#: transfer lines and its busiest host-read lines).
MAX_SITES = 400
#: Memory profiles kept (the agent takes one every few seconds).
HOLDER_PROFILES_KEPT = 16
#: Seconds between two readings of the devices kept.
DEVICE_EVERY_S = 1.0


@dataclass
class TransferLine:
    """One line's implicit transfers in one direction into one callee."""

    direction: str
    file: str
    line: int
    function: str
    callee: str
    count: Total = field(default_factory=Total)
    calls: Total = field(default_factory=Total)
    bytes: Total = field(default_factory=Total)
    latest: TransferSite | None = None  # its newest field (arguments, scalar)

    @property
    def op(self) -> bool:
        """A jax op run outside jit (``sin (op)``), not a jitted function."""
        return self.callee.endswith(" (op)")


@dataclass
class SyncLine:
    """One line that reads device arrays on the host."""

    file: str
    line: int
    function: str
    count: Total = field(default_factory=Total)
    latest: SyncSite | None = None


@dataclass(frozen=True)
class DeviceReading:
    """A device's figures at one sample (taken at most once a second)."""

    t: float
    platform: str | None
    allocator: bool  # bytes in use are the allocator's (memory_stats), not the live arrays' sum
    in_use: float | None
    live: float | None  # the live arrays' bytes (the agent's last scan)
    limit: float | None
    holes: float | None  # 0-1, among the live buffers of the last map
    fragmentation: float | None  # the allocator's, where it has one and it means one (never a TPU's)


class Evidence:
    """The records of one process, as the detectors read them.

    Args:
        fold_jit: fold the samples' ``jit`` fields into a ledger of its own;
            False where whoever evaluates passes the ledger it keeps (the
            dashboard's model folds them already).
    """

    def __init__(self, fold_jit: bool = True) -> None:
        self.ledgers = LedgerStore() if fold_jit else None
        self.first_t: float | None = None
        self.last_t: float | None = None
        self.transfers: dict[tuple[str, str, int, str], TransferLine] = {}
        self._sites_t: float | None = None  # the last transfer_sites field's time
        self.syncs: dict[SiteKey, SyncLine] = {}
        self.syncs_field: HostSyncs | None = None  # the newest host_syncs field
        self.profiles: collections.deque[Holders] = collections.deque(maxlen=HOLDER_PROFILES_KEPT)
        self.holders_error: str | None = None
        #: (file, line) -> the program's names that keep the site's arrays (a ``holders_who`` reply)
        self.who: dict[tuple[str, int], WhoSite] = {}
        self.devices: dict[object, collections.deque[DeviceReading]] = {}
        self.donation_failed = Total()
        self.donation_message: str | None = None
        self.sites_seen = False  # a sample carried transfer_sites (an agent that ties transfers to lines)
        self.transfers_seen = False  # the agent counted an implicit transfer
        self.capture_reason: str | None = None  # why transfers are not captured, where the agent said so
        self._device_t: float | None = None

    # -- feeding ----------------------------------------------------------------------
    def feed(self, record: Record | Unknown) -> None:
        """Take one record (any type: those that say nothing here are skipped)."""
        if isinstance(record, Sample):  # a backfill is a sample of the agent's history
            self.feed_sample(record)
        elif isinstance(record, Reply) and isinstance(record.result, dict) and "who" in record.result:
            who = reply_result(record, WhoHolds)
            for site in (who.who or ()) if who is not None else ():
                if site.file and site.line.__class__ is int and site.arrays:
                    if len(self.who) >= MAX_SITES and (site.file, site.line) not in self.who:
                        continue
                    self.who[(site.file, site.line)] = site
        elif isinstance(record, Hello):
            capture = record.transfer_capture
            if capture is not None and capture.available is False:
                self.capture_reason = capture.reason or "the agent gave no reason"

    def feed_sample(self, rec: Sample) -> None:
        t = rec.t
        if t is None:
            return
        if self.last_t is not None and t < self.last_t:
            return  # older than what is in
        if self.first_t is None:
            self.first_t = t
        self.last_t = t
        if rec.transfer_sites is not None and rec.transfer_sites.sites is not None:
            self.sites_seen = True
            self._transfer_sites(t, rec.transfer_sites.sites)
        transfers = rec.transfers
        if transfers is not None:
            for direction in (transfers.h2d, transfers.d2h):
                if direction is not None and direction.count_total:
                    self.transfers_seen = True
        capture = rec.transfer_capture
        if capture is not None and capture.available is not None:
            self.capture_reason = None if capture.available else (capture.reason or "the agent gave no reason")
        if rec.host_syncs is not None and rec.host_syncs.sites is not None:
            self._host_syncs(t, rec.host_syncs)
        elif rec.host_syncs is not None:
            self.syncs_field = rec.host_syncs
        if rec.holders is not None:
            if rec.holders.sites is not None:
                self.profiles.append(rec.holders)
                self.holders_error = None
            elif rec.holders.error:
                self.holders_error = rec.holders.error
        if rec.jit is not None and self.ledgers is not None:
            self.ledgers.feed_sample(0, rec)
        donation = rec.donation
        if donation is not None and donation.failed_total is not None:
            self.donation_failed.add(t, donation.failed_total)
            if donation.last_message:
                self.donation_message = donation.last_message
        if rec.devices and (self._device_t is None or t - self._device_t >= DEVICE_EVERY_S):
            self._device_t = t
            for dev in rec.devices:
                if dev.id is None:
                    continue
                readings = self.devices.get(dev.id)
                if readings is None:
                    if len(self.devices) >= 64:
                        continue
                    readings = self.devices[dev.id] = collections.deque(maxlen=MAX_POINTS)
                live = dev.live_arrays
                readings.append(DeviceReading(
                    t=t, platform=dev.platform, allocator=dev.source == "memory_stats", in_use=dev.bytes_in_use,
                    live=live.bytes if live is not None else None, limit=dev.bytes_limit,
                    holes=live.holes if live is not None else None,
                    fragmentation=None if fragmentation_na(dev.platform) else dev.fragmentation))

    def _transfer_sites(self, t: float, sites: list[TransferSite]) -> None:
        prev_t, self._sites_t = self._sites_t, t
        for site in sites:
            if site.file is None or site.line is None or site.direction is None or site.count_total is None:
                continue
            # A line is the agent's site: its callee is named anew as calls
            # are tied to it (a line of two ops reads `add (op)`, then
            # `multiply (op)`): the latest name is kept, the totals go on.
            key = (site.direction, site.file, site.line, site.function or "")
            line = self.transfers.get(key)
            if line is None:
                if len(self.transfers) >= MAX_SITES:
                    continue
                line = self.transfers[key] = TransferLine(site.direction, site.file, site.line, site.function or "",
                                                          site.callee or "")
                if prev_t is not None:
                    # Listed for the first time: its transfers so far were
                    # made since the field before (a line is listed as soon
                    # as it transfers, among the busiest), from zero.
                    line.count.add(prev_t, 0)
                    line.calls.add(prev_t, 0)
                    line.bytes.add(prev_t, 0)
            line.callee = site.callee or line.callee
            line.count.add(t, site.count_total)
            if site.calls_total is not None:
                line.calls.add(t, site.calls_total)
            if site.bytes_total is not None:
                line.bytes.add(t, site.bytes_total)
            line.latest = site

    def _host_syncs(self, t: float, rec: HostSyncs) -> None:
        self.syncs_field = rec
        when = rec.t if rec.t is not None else t
        for site in rec.sites or ():
            if site.file is None or site.line is None or site.count is None:
                continue
            key = (site.file, int(site.line), site.function or "")
            line = self.syncs.get(key)
            if line is None:
                if len(self.syncs) >= MAX_SITES:
                    continue
                line = self.syncs[key] = SyncLine(site.file, int(site.line), site.function or "")
            line.count.add(when, site.count)
            line.latest = site

    # -- reading ----------------------------------------------------------------------
    def ledger(self) -> LedgerView | None:
        """The ledger it folded itself (None: it folds none, or no sample had one)."""
        return self.ledgers.view(0) if self.ledgers is not None else None

    @property
    def span_s(self) -> float:
        if self.first_t is None or self.last_t is None:
            return 0.0
        return self.last_t - self.first_t
