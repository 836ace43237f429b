"""``jaxtop ls``: the instrumented processes of this user."""

from __future__ import annotations

import argparse
import sys
import time

from jaxtop.wire.safe_text import terminal_safe


def uptime(started_t: float | None) -> str:
    """How long since ``started_t`` (wall-clock seconds), as ``M:SS`` or ``H:MM:SS``; ``?`` for None."""
    if started_t is None:
        return "?"
    s = max(0, int(time.time() - started_t))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def cmd_ls(args: argparse.Namespace) -> int:
    """``jaxtop ls``: a table, or JSON lines with ``--json``; returns the exit status."""
    from jaxtop.wire import client, paths

    if args.pids:
        # No connection: quick enough for shell completion on every tab.
        try:
            names = sorted(p.name for p in paths.socket_dir().glob("*.sock"))
        except OSError:
            names = []
        for name in names:
            pid = name[: -len(".sock")]
            if pid.isdigit() and client.pid_alive(int(pid)):
                print(pid)
        return 0
    agents = client.list_agents(on_refused=lambda why: print(f"jaxtop ls: {why}", file=sys.stderr))
    if args.json:
        import json

        for a in agents:
            print(json.dumps({"pid": a.pid, "argv": a.argv, "started_t": a.started_t, "socket": str(a.socket_path)}))
        return 0
    if not agents:
        print(f"No instrumented JAX processes for this user (looked in {paths.socket_dir()}).")
        print("Start one with: jaxtop run your_script.py   (or call jaxtop.instrument() in it)")
        return 0
    rows = [("PID", "UPTIME", "COMMAND", "SOCKET")]
    # A program's argv is its own to choose: shown, never obeyed by the terminal.
    rows += [(str(a.pid), uptime(a.started_t), terminal_safe(a.command), terminal_safe(str(a.socket_path)))
             for a in agents]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print(f"{r[0]:>{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}")
    return 0
