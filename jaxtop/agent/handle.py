"""``jaxtop.instrument()`` and the :class:`Handle` it returns.

The one agent of this process lives here (``_handle``), so that repeated
``instrument()`` calls, ``jaxtop detach`` and ``Handle.stop()`` agree on it.
Importing this module imports neither jax nor Textual.
"""

from __future__ import annotations

import os
from typing import Any
from jaxtop.probes.forksafe import ForkLock

_lock = ForkLock()
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
        return self._agent.running

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


def current() -> "Handle | None":
    """The handle of this process's running agent, or None."""
    handle = _handle
    return handle if handle is not None and handle.running else None


def instrument(
    interval_s: float = 0.1,
    *,
    log_path: str | None = None,
    backfill_s: float = 600.0,
    slow_interval_s: float = 1.0,
    capture_stderr: bool = True,
    nvml: bool = True,
    prometheus_port: int | None = None,
    prometheus_addr: str | None = None,
    job: str | None = None,
    prometheus_push: str | None = None,
) -> Handle:
    """Start the jaxtop agent in this process (idempotent).

    Call it early, ideally before ``import jax``; it never creates a JAX
    backend itself and never raises into your program once started.

    Args:
        interval_s: sample period in seconds.
        log_path: also record the stream to this JSON-lines file (compressed
            as written when the name ends in ``.gz``).
        backfill_s: history sent to a client that connects later.
        slow_interval_s: least time between two live-array scans (their cost
            may space them further: jaxtop.agent.cadence).
        capture_stderr: count implicit transfers from the guard's log lines.
        nvml: read NVIDIA driver metrics when a driver is present.
        prometheus_port: also serve Prometheus metrics on this port
            (default: ``$JAXTOP_PROMETHEUS_PORT`` if set; needs
            prometheus-client). Binds ``prometheus_addr``, loopback
            (127.0.0.1) when None.
        job: the run this process belongs to: the ``job`` label of its
            metrics (default ``$JAXTOP_JOB``, else ``jax-COORDINATOR`` in a
            jax.distributed job, else the program's name).
        prometheus_push: push the last metrics to this Pushgateway URL at
            exit (default ``$JAXTOP_PROMETHEUS_PUSH``; needs prometheus-client).

    Returns:
        The handle of the (already) running agent; ``.stop()`` stops it.

    Raises:
        OSError: the socket or the metrics port could not be bound, or the
            log file could not be opened. Nothing is left behind (all or
            nothing: no socket file, no bound port, no open file), so a
            later call can succeed. In particular ``jaxtop.wire.paths.SocketDirError`` (an
            OSError) when the socket directory is not safe to use: not a
            directory, a symbolic link, another user's, or open to group or
            others. jaxtop creates that directory with mode 0700 but never
            changes one it did not create; the message names the path and
            its owner.
        ImportError: a Prometheus port or push was asked for without prometheus-client.
        ValueError: ``$JAXTOP_PROMETHEUS_PORT`` is not a port number.
    """
    global _handle
    with _lock:
        if _handle is not None and _handle.running:
            return _handle
        from jaxtop.agent import Agent

        if prometheus_port is None and os.environ.get("JAXTOP_PROMETHEUS_PORT"):
            text = os.environ["JAXTOP_PROMETHEUS_PORT"]
            if not text.isdigit() or not 0 < int(text) < 65536:
                raise ValueError(f"JAXTOP_PROMETHEUS_PORT={text!r} is not a port number")
            prometheus_port = int(text)
        agent = Agent(
            interval_s=interval_s,
            slow_interval_s=slow_interval_s,
            backfill_s=backfill_s,
            log_path=log_path,
            capture_stderr=capture_stderr,
            nvml=nvml,
            prometheus_port=prometheus_port,
            prometheus_addr=prometheus_addr,
            job=job,
            prometheus_push=prometheus_push,
        )
        agent.start()
        _handle = Handle(agent)
        return _handle
