"""Stopping the agent in a running process (injected or not), which keeps running."""

from __future__ import annotations

import time
from typing import Any

from jaxtop.wire import client, paths
from jaxtop.inject.target import InjectError


def detach(pid: int, timeout_s: float = 5.0) -> dict[str, Any]:
    """Ask the agent in ``pid`` to stop; returns its reply."""
    from jaxtop.wire import protocol

    deadline = time.monotonic() + timeout_s
    rec: dict[str, Any] | None = None
    with client.AgentConnection.open(pid) as agent:
        command_id = agent.send_command("detach")
        # Samples keep coming until the agent acts on the command: skip to its reply.
        for line in agent.lines(should_stop=lambda: time.monotonic() >= deadline):
            try:
                candidate = protocol.decode(line)
            except protocol.ProtocolError:
                continue
            if candidate.get("type") == "reply" and candidate.get("id") == command_id:
                rec = candidate
                break
    if rec is None:
        if time.monotonic() >= deadline:
            raise InjectError(f"the agent in process {pid} did not reply within {timeout_s:g} s")
        raise InjectError(f"the agent in process {pid} closed the connection without replying")
    if not rec.get("ok"):
        raise InjectError(f"detach failed: {rec.get('error')}")
    deadline = time.monotonic() + timeout_s
    while paths.socket_path(pid).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return rec.get("result") or {}
