"""``jaxtop detach``: stop the agent in a running process, which keeps running."""

from __future__ import annotations

import sys

from jaxtop.cli.exits import EXIT_USAGE
from jaxtop.wire.paths import SocketDirError


def cmd_detach(pid: int) -> int:
    """``jaxtop detach PID``; returns the exit status."""
    from jaxtop import inject as injector
    from jaxtop.wire import client

    try:
        injector.detach(pid)
    except (client.AgentNotFound, SocketDirError) as exc:
        print(f"jaxtop detach: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (injector.InjectError, OSError) as exc:
        print(f"jaxtop detach: {exc}", file=sys.stderr)
        return 1
    print(f"jaxtop: agent in pid {pid} stopped; the process keeps running")
    return 0
