"""jaxtop: ``top`` for JAX memory.

``import jaxtop; jaxtop.instrument()`` starts the agent in this process; then
``jaxtop attach PID`` (or ``jaxtop log PID``) reads it. Importing this package
imports neither jax nor Textual.
"""

from __future__ import annotations

import threading
from typing import Any

__version__ = "0.1.0"
__all__ = ["instrument", "Handle", "__version__"]

_lock = threading.Lock()
_handle: "Handle | None" = None


class Handle:
    """The running agent of this process, as returned by :func:`instrument`."""

    def __init__(self, agent: Any) -> None:
        self._agent = agent

    @property
    def socket_path(self) -> str | None:
        """Where clients connect (``…/PID.sock``)."""
        return self._agent.socket_path

    @property
    def agent(self) -> Any:
        return self._agent

    @property
    def running(self) -> bool:
        return not self._agent._stopped.is_set()

    def stop(self) -> None:
        """Stop the agent: socket removed, stderr and the transfer guard restored."""
        global _handle
        with _lock:
            self._agent.stop()
            if _handle is self:
                _handle = None

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<jaxtop agent pid={self._agent.pid} {state} socket={self.socket_path}>"


def instrument(
    interval_s: float = 0.1,
    *,
    log_path: str | None = None,
    backfill_s: float = 600.0,
    slow_interval_s: float = 1.0,
    capture_stderr: bool = True,
    nvml: bool = True,
) -> Handle:
    """Start the jaxtop agent in this process (idempotent).

    Call it early, ideally before ``import jax``; it never creates a JAX
    backend itself and never raises into your program once started.

    Args:
        interval_s: sample period in seconds.
        log_path: also record the stream to this JSON-lines file.
        backfill_s: history sent to a client that connects later.
        slow_interval_s: period of the live-array scan.
        capture_stderr: count implicit transfers from the guard's log lines.
        nvml: read NVIDIA driver metrics when a driver is present.

    Returns:
        The handle of the (already) running agent; ``.stop()`` stops it.

    Raises:
        OSError: the socket could not be created (nothing was changed).
    """
    global _handle
    with _lock:
        if _handle is not None and _handle.running:
            return _handle
        from jaxtop.agent import Agent

        agent = Agent(
            interval_s=interval_s,
            slow_interval_s=slow_interval_s,
            backfill_s=backfill_s,
            log_path=log_path,
            capture_stderr=capture_stderr,
            nvml=nvml,
        )
        agent.start()
        _handle = Handle(agent)
        return _handle
