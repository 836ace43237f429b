"""``jaxtop attach`` and bare ``jaxtop``: the dashboard on running agents,
injecting one first where asked."""

from __future__ import annotations

import os
import sys

from jaxtop.cli.exits import EXIT_USAGE
from jaxtop.cli.ls import uptime
from jaxtop.wire.safe_text import terminal_safe
from jaxtop.inject import DEFAULT_TIMEOUT_S as DEFAULT_INJECT_TIMEOUT_S

INJECT_EXPLAINED = """\
pid {pid} has no jaxtop agent. jaxtop can inject one: gdb stops the process for
about a second, queues one line of Python for its main thread and detaches;
the main thread then starts the agent between two bytecodes. The agent turns
the transfer guard to `log` and relays stderr (your output is unchanged);
`jaxtop detach {pid}` undoes all of it. Same user only. docs/attach.md has the
details and the risks."""


def no_terminal(prog: str) -> str | None:
    """Why the dashboard cannot be drawn here (stdout is not a terminal:
    a pipe, a file, a CI log), or None. Full-screen escape codes written to
    a file are of no use to anyone."""
    if "web_driver" in os.environ.get("TEXTUAL_DRIVER", ""):
        return None  # jaxtop serve: the browser is the terminal
    try:
        if sys.stdout.isatty():
            return None
    except (AttributeError, ValueError):
        pass
    return (f"jaxtop {prog}: stdout is not a terminal, and the dashboard needs one. For scripts and logs: "
            "jaxtop snapshot PID [--json] (the figures once), jaxtop log PID (the stream as JSON lines)")


def inject_agent(pid: int, timeout_s: float, prog: str) -> bool:
    """Inject the agent into ``pid``, saying what happened on stderr.

    Args:
        pid: the process to inject into.
        timeout_s: how long to wait for it to run the injected agent.
        prog: the command, for the messages (``attach``, ``log``).

    Returns:
        False on failure (the message is printed).
    """
    from jaxtop import inject as injector

    try:
        injector.check_target(pid)  # what needs no ptrace, before saying "injecting"
        print(f"jaxtop: injecting the agent into pid {pid}…", file=sys.stderr, flush=True)
        report = injector.inject(pid, timeout_s=timeout_s)
    except injector.InjectError as exc:
        print(f"jaxtop {prog}: {exc}", file=sys.stderr)
        return False
    note = "" if report.get("jax_imported", True) else " (jax not imported yet: probing starts when it is)"
    print(f"jaxtop: agent running in pid {pid}{note}", file=sys.stderr)
    return True


def _ensure_agents(pids: list[int], inject: bool, no_inject: bool, timeout_s: float) -> list[int] | int:
    """Make sure each pid has an agent; returns the pids to watch from
    outside (no agent, by choice), or an exit code."""
    from jaxtop import inject as injector
    from jaxtop.wire import client

    external = []
    for pid in pids:
        if client.paths.socket_path(pid).exists():
            try:
                # Connect once now, so that a socket served by another uid is
                # refused here, in one line, not inside the dashboard.
                client.connect(pid).close()
            except client.AgentNotFound:
                pass  # stale: the dashboard says so, as for any agent that is gone
            continue
        if not client.pid_alive(pid):
            print(f"jaxtop attach: {client.no_agent_message(pid)}", file=sys.stderr)
            return EXIT_USAGE
        if no_inject:
            external.append(pid)
            continue
        try:
            # Before any prompt: a process that cannot be injected at all
            # (not Python, PID 1, another user's, not attachable) is said so now.
            injector.check_target(pid)
        except injector.InjectError as exc:
            print(f"jaxtop attach: {exc}", file=sys.stderr)
            return 1
        refused = no_terminal("attach")  # nothing is injected for a dashboard that cannot be drawn
        if refused:
            print(refused, file=sys.stderr)
            return EXIT_USAGE
        if not inject:
            if not sys.stdin.isatty():
                print(f"jaxtop attach: {client.no_agent_message(pid)}\n"
                      "  add --inject to start one in it, or --no-inject for an external view (psutil + NVML only)",
                      file=sys.stderr)
                return EXIT_USAGE
            print(INJECT_EXPLAINED.format(pid=pid))
            answer = input("Inject the agent now? [y]es / [e]xternal view only / [N]o: ").strip().lower()
            if answer in ("e", "external"):
                external.append(pid)
                continue
            if answer not in ("y", "yes"):
                return 0
        if not inject_agent(pid, timeout_s, "attach"):
            return 1
    return external


def cmd_attach(pids: list[int], refresh_s: float | None = None, inject: bool = False, no_inject: bool = False,
               inject_timeout: float = DEFAULT_INJECT_TIMEOUT_S) -> int:
    """``jaxtop attach PID...``: the live dashboard on ``pids``; returns the exit status."""
    from jaxtop.wire import paths

    paths.check_socket_dir()  # SocketDirError: main() says so, exit 2
    external = _ensure_agents(pids, inject, no_inject, inject_timeout)
    if isinstance(external, int):
        return external
    refused = no_terminal("attach")
    if refused:
        print(refused, file=sys.stderr)
        return EXIT_USAGE
    from jaxtop.dashboard.app import DEFAULT_REFRESH_S, live_app

    live_app(pids, refresh_s=refresh_s or DEFAULT_REFRESH_S, external=external).run_as_main()
    return 0


def cmd_attach_prometheus(url: str, job: str | None, refresh_s: float | None = None) -> int:
    """``jaxtop attach --prometheus URL [--job NAME]``: the dashboard on every
    process of the job, read from Prometheus; returns the exit status."""
    from jaxtop.dashboard.sources.prometheus import PrometheusError, PrometheusSource

    source = PrometheusSource(url, job=job)
    try:
        found = source.check()
    except PrometheusError as exc:
        # The server's own words can be in it: shown, never obeyed.
        print(f"jaxtop attach: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    if not found:
        which = f"job ~ {job!r}" if job else "any job"
        print(f"jaxtop attach: {url} has no jaxtop metrics for {which} (is the job's /metrics in its scrape "
              "config? docs/cluster.md)", file=sys.stderr)
        return 1
    refused = no_terminal("attach")
    if refused:
        print(refused, file=sys.stderr)
        return EXIT_USAGE
    from jaxtop.dashboard.app import DEFAULT_REFRESH_S, make_app

    make_app(source, refresh_s=refresh_s or DEFAULT_REFRESH_S).run_as_main()
    return 0


def cmd_default() -> int:
    """Bare `jaxtop`: attach to the only agent, pick among several, or explain."""
    from jaxtop.wire import client, paths

    agents = client.list_agents(on_refused=lambda why: print(f"jaxtop: {why}", file=sys.stderr))
    if not agents:
        print(f"No instrumented JAX processes for this user (looked in {paths.socket_dir()}).")
        print("Start one with:  jaxtop run your_script.py   or try:  jaxtop demo")
        return EXIT_USAGE  # nothing to attach to (a script can tell)
    if len(agents) == 1:
        return cmd_attach([agents[0].pid])
    if not sys.stdin.isatty():
        print("Several instrumented processes; choose with `jaxtop attach PID [PID...]`:")
        for a in agents:
            print(f"  {a.pid}  {uptime(a.started_t)}  {terminal_safe(a.command)}")
        return EXIT_USAGE
    from jaxtop.dashboard.picker import pick

    chosen = pick(agents)
    if not chosen:
        return 0
    return cmd_attach(chosen)
