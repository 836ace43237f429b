"""Where the agent's records go: every client, the shared history, the
recording and the Prometheus exposition, in one order.

Beside a busy program each tick finds the agent's code and data evicted
from the CPU's caches. While no client is connected, samples are therefore
kept as taken and encoded together once a second, when the recording
writes them anyway (:meth:`Stream.flush`); a client that connects gets them
in its greeting (flushed first), and from then on each sample is sent as it
is taken. Any other record (hello, a census, the exit) goes out at once,
after the samples before it.

Standard library only (the agent imports it inside the user's job).
"""

from __future__ import annotations

import time
from typing import Any

from jaxtop.agent import log as log_module
from jaxtop.agent.history import Backfill
from jaxtop.agent.log import RecordLog
from jaxtop.wire import protocol

__all__ = ["Stream"]


class Stream:
    """The agent's outgoing records.

    Args:
        backfill_s: how much history a newly connected client receives.

    Attributes:
        clients: the connected clients (``jaxtop.agent.clients.Clients``), set by the agent.
        log: the recording, when there is one.
        prometheus: the exposition's state (``jaxtop.wire.prometheus.StreamState``), when served.
    """

    def __init__(self, backfill_s: float) -> None:
        self.backfill_s = backfill_s
        self.backfill = Backfill()  # one history, shared by every client
        self.clients: Any = None
        self.log: RecordLog | None = None
        self.prometheus: Any = None
        self._encoder = protocol.StreamEncoder()  # samples: unchanged fields keep their encoding
        self._deferred: list[dict[str, Any]] = []  # samples not encoded yet (no client)
        self._deferred_t = time.monotonic()

    def emit(self, record: dict[str, Any], keep: bool = True) -> None:
        """Send ``record``; ``keep``: also keep it in the history (samples,
        censuses), else only hello's facts are noted (hello, backend, exit)."""
        sample = record["type"] == protocol.SAMPLE
        if sample and keep and not self.clients and not record.get("final"):
            # Nobody watches live: the sample is encoded and kept with the
            # others of its second, when the log takes them.
            if self.prometheus is not None:
                self.prometheus.update(record)
            self._deferred.append(record)
            if time.monotonic() - self._deferred_t >= log_module.LOG_FLUSH_S:
                self.flush()
            return
        self.flush()  # in order, before anything else
        line = self._encoder.encode(record) if sample else protocol.encode(record)
        if self.prometheus is not None:
            self.prometheus.update(record)
        if keep:
            self.backfill.add(record, line)  # the fine and coarse levels, the present
            self.backfill.trim(record["t"] - self.backfill_s)
        elif record.get("type") == protocol.HELLO:
            self.backfill.note_hello(record)
        if self.clients is not None:
            self.clients.broadcast(line)
        if self.log is not None:
            self.log.write(line, urgent=not sample or bool(record.get("final")))

    def flush(self) -> None:
        """Encode the samples kept while no client was connected, keep them
        in the history and hand them to the log, in order."""
        self._deferred_t = time.monotonic()
        deferred = self._deferred
        if not deferred:
            return
        self._deferred = []
        encode, add, log = self._encoder.encode, self.backfill.add, self.log
        for record in deferred:
            line = encode(record)
            add(record, line)
            if log is not None:
                log.add(line)
        self.backfill.trim(deferred[-1]["t"] - self.backfill_s)
        if log is not None:
            log.write()

    def greeting(self, hello: dict[str, Any]) -> tuple[Any, ...]:
        """What a new client receives first (a :class:`jaxtop.agent.history.Greeting`):
        hello, the present (the newest sample with the last map and sparse
        fields), the coarse history, then the fine one from ``backfill_s``
        ago (ranges of the shared history, not copies), then
        ``history_end`` (docs/protocol.md, "History")."""
        self.flush()
        hello["history"] = self.backfill.describe(self.backfill_s)
        self.backfill.note_hello(hello)
        return self.backfill.greeting(protocol.encode(hello), time.time() - self.backfill_s)

    def recent_lines(self, n: int) -> list[bytes]:
        """The last ``n`` kept records as sent, oldest first."""
        deferred = list(self._deferred)  # taken by the agent thread meanwhile: a copy, encoded apart
        end = self.backfill.end
        kept = self.backfill.lines(end - max(0, n - len(deferred)), end) if n > len(deferred) else []
        return kept + [protocol.encode(r) for r in deferred[max(0, len(deferred) - n):]]

    def close_log(self) -> None:
        """Write what is held and close the recording (never raises)."""
        try:
            self.flush()
        except Exception:
            self._deferred = []
        if self.log is not None:
            self.log.close()  # samples still held, and a gzip trailer

    def forget(self) -> None:
        """In a fork child, or after stop: drop what is held, write nothing more."""
        self._deferred = []
        self.backfill.clear()
