"""Finding and connecting to agents; the recorder behind ``jaxtop log``.

No Textual, no jax: usable from scripts and the headless logging mode.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable

from jaxtop import paths, protocol


class AgentNotFound(RuntimeError):
    """No agent listens for that process; the message says how to fix it."""


@dataclass
class AgentInfo:
    """One instrumented process found in the socket directory."""

    pid: int
    socket_path: Path
    argv: list[str]
    started_t: float | None

    @property
    def command(self) -> str:
        return " ".join(self.argv) if self.argv else "?"


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, exited but not yet reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc: kill() said it exists


def no_agent_message(pid: int) -> str:
    if not pid_alive(pid):
        return f"no process with pid {pid}"
    return (
        f"no jaxtop agent in pid {pid} (no socket at {paths.socket_path(pid)}); "
        "start the program with `jaxtop run SCRIPT` or call jaxtop.instrument() in it"
    )


def connect(pid: int, timeout_s: float = 2.0) -> socket.socket:
    """Connect to the agent of ``pid``.

    Raises:
        AgentNotFound: no live agent socket for that pid (stale ones are removed).
    """
    path = paths.socket_path(pid)
    if not path.exists():
        raise AgentNotFound(no_agent_message(pid))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(str(path))
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT) and not pid_alive(pid):
            _remove_stale(path)
            raise AgentNotFound(f"pid {pid} has exited (removed its stale socket {path})") from None
        if exc.errno == errno.ECONNREFUSED:
            _remove_stale(path)
            raise AgentNotFound(f"stale socket {path}: nothing listens there (removed); {no_agent_message(pid)}") from None
        raise AgentNotFound(f"cannot connect to {path}: {exc.strerror}") from None
    return sock


def _remove_stale(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def list_agents(timeout_s: float = 1.0) -> list[AgentInfo]:
    """Instrumented processes of this user; stale sockets are removed quietly."""
    directory = paths.socket_dir()
    found: list[AgentInfo] = []
    try:
        entries = sorted(directory.glob("*.sock"))
    except OSError:
        return found
    for path in entries:
        try:
            pid = int(path.stem)
        except ValueError:
            continue
        if not pid_alive(pid):
            _remove_stale(path)
            continue
        try:
            sock = connect(pid, timeout_s)
        except AgentNotFound:
            continue
        hello: dict = {}
        try:
            with sock, sock.makefile("rb") as stream:
                for record in protocol.iter_records(stream):
                    if record.get("type") == "hello":
                        hello = record
                    break
        except OSError:
            pass
        found.append(AgentInfo(pid, path, list(hello.get("argv") or []), hello.get("started_t")))
    return found


def record(
    pid: int,
    out: IO[bytes],
    duration_s: float | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> int:
    """Copy an agent's stream to ``out`` until it ends, time runs out, or
    ``should_stop()``. Only whole lines are written, byte for byte.
    ``on_record`` also gets each decoded record (undecodable lines are still
    copied, and skipped for it).

    Returns:
        Number of lines written.
    """
    sock = connect(pid)
    sock.settimeout(0.2)
    deadline = time.monotonic() + duration_s if duration_s is not None else None
    pending = b""
    lines = 0
    with sock:
        while not should_stop():
            if deadline is not None and time.monotonic() >= deadline:
                break
            try:
                chunk = sock.recv(1 << 16)
            except socket.timeout:
                continue
            except OSError:
                break
            if not chunk:
                break
            pending += chunk
            cut = pending.rfind(b"\n") + 1
            if cut:
                out.write(pending[:cut])
                out.flush()
                if on_record is not None:
                    for line in pending[:cut].splitlines():
                        try:
                            on_record(protocol.decode(line))
                        except protocol.ProtocolError:
                            pass
                lines += pending.count(b"\n", 0, cut)
                pending = pending[cut:]
    return lines
