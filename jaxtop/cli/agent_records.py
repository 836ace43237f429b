"""What an agent sends a client that connects, as typed records: its hello,
its present, its history, then live samples (``jaxtop snapshot`` and
``jaxtop advise PID`` read it; neither sends the agent anything)."""

from __future__ import annotations

from typing import Any, Callable, Iterator

__all__ = ["agent_records"]


def agent_records(pid: int, timeout_s: float, should_stop: Callable[[], bool]) -> Iterator[Any]:
    """The records of ``pid``'s agent, decoded, until ``should_stop()`` or
    the connection ends; a line that is not a record is skipped. Close the
    iterator (``contextlib.closing``) to close the connection at once.

    Raises:
        jaxtop.wire.client.AgentNotFound: no agent.
    """
    from jaxtop.wire import client, protocol
    from jaxtop.wire.records import decode

    with client.AgentConnection.open(pid, timeout_s=min(timeout_s, 5.0)) as conn:
        for line in conn.lines(should_stop=should_stop):
            try:
                record = decode(line)
            except protocol.ProtocolError:
                continue
            yield record
