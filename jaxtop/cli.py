"""``jaxtop`` command line: argument checks and wiring, nothing more."""

from __future__ import annotations

import argparse
import os
import runpy
import signal
import sys
import time
from typing import Sequence

from jaxtop.protocol import JAXTOP_VERSION
from jaxtop.inject import DEFAULT_TIMEOUT_S as DEFAULT_INJECT_TIMEOUT_S
from jaxtop.prometheus import DEFAULT_ADDR as DEFAULT_PROMETHEUS_ADDR

EXIT_USAGE = 2


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def _prometheus_options(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--prometheus", type=_port, metavar="PORT", help=text)
    parser.add_argument("--prometheus-addr", default=DEFAULT_PROMETHEUS_ADDR, metavar="ADDR",
                        help="address for --prometheus (default 127.0.0.1; 0.0.0.0 exposes it to the network)")


def _inject_timeout_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--inject-timeout", type=_positive_float, default=DEFAULT_INJECT_TIMEOUT_S, metavar="S",
                        help="how long to wait for the target to run the injected agent (default 15)")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}")
    return value


def _pid(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxtop",
        description="top for JAX memory: device memory, fragmentation and host<->device transfers.",
    )
    parser.add_argument("--version", action="version", version=f"jaxtop {JAXTOP_VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="run a Python program with the jaxtop agent started first",
        description="Run SCRIPT (or -m MODULE) like `python`, with the agent started first. "
        "Same sys.argv, __main__, exit code and exceptions as a plain run.",
    )
    run.add_argument("--log", metavar="FILE", help="also record the stream to FILE (JSON lines)")
    run.add_argument("--interval", type=_positive_float, default=0.1, metavar="S", help="sample period in seconds (default 0.1)")
    run.add_argument("--no-capture", action="store_true", help="do not capture stderr (no transfer counts)")
    _prometheus_options(run, "also serve Prometheus metrics on PORT (docs/cluster.md)")
    run.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script")
    run.add_argument("target", nargs="*", metavar="SCRIPT [ARGS...]", help="the program and its arguments")

    ls = sub.add_parser("ls", help="list instrumented processes of this user")
    ls.add_argument("--json", action="store_true", help="print JSON lines instead of a table")

    log = sub.add_parser(
        "log",
        help="record a running agent's stream as JSON lines",
        description="Record until the target exits, the duration ends, or SIGINT/SIGTERM; then exit 0.",
    )
    log.add_argument("pid", type=_pid)
    log.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    log.add_argument("--duration", type=_positive_float, metavar="S", help="stop after S seconds")
    _prometheus_options(log, "re-export the stream as Prometheus metrics on PORT")
    log.add_argument("--inject", action="store_true", help="no agent in PID: inject one first (docs/attach.md)")
    _inject_timeout_option(log)

    attach = sub.add_parser(
        "attach",
        help="open the dashboard on running agents",
        description="Open the live dashboard on one or more instrumented processes.",
    )
    attach.add_argument("pids", type=_pid, nargs="+", metavar="PID")
    how = attach.add_mutually_exclusive_group()
    how.add_argument("--inject", "-y", action="store_true",
                     help="inject the agent into a PID that has none, without asking (docs/attach.md)")
    how.add_argument("--no-inject", action="store_true",
                     help="never inject: a PID without an agent gets the external view (psutil + NVML only)")
    _inject_timeout_option(attach)
    attach.add_argument("--refresh", type=_positive_float, default=None, metavar="S",
                        help="seconds between redraws (default 2; every sample is kept regardless)")

    demo = sub.add_parser(
        "demo",
        help="run the built-in workload and flip each memory strategy live",
        description="Start a jitted workload with the agent and open the dashboard with a Strategies panel. "
        "--headless runs every strategy off then on and prints what changed.",
    )
    demo.add_argument("--headless", action="store_true", help="no dashboard: print the before/after table")
    demo.add_argument("--steps", type=int, default=30, help="steps per variant in --headless (default 30)")
    demo.add_argument("--json", action="store_true", help="--headless output as JSON")
    demo.add_argument("--small", action="store_true", help="smallest workload sizes")

    detach = sub.add_parser(
        "detach",
        help="stop the agent in a running process (injected or not); the process keeps running",
        description="Stop the agent in PID: its socket is removed, stderr and the transfer guard are put back.",
    )
    detach.add_argument("pid", type=_pid)

    export = sub.add_parser(
        "export",
        help="turn a recording into CSV or a Perfetto trace",
        description="CSV: one row per sample and device (columns in docs/protocol.md). perfetto: Chrome "
        "trace-event JSON for ui.perfetto.dev (counter tracks for memory and transfers, instants for compiles "
        "and failed donations).",
    )
    export.add_argument("file", help="a JSON-lines recording (plain or .gz)")
    export.add_argument("--format", choices=("csv", "perfetto"), required=True)
    export.add_argument("-o", "--output", metavar="OUT", help="where to write (default: FILE with .csv / .perfetto.json; - for stdout)")
    export.add_argument("-j", "--jobs", type=int, metavar="N",
                        help="processes for a big uncompressed recording (default: the CPUs this process may use, at most 8)")

    replay = sub.add_parser("replay", help="open the dashboard on a recording")
    replay.add_argument("file", help="a JSON-lines recording, plain or .gz (jaxtop run --log / jaxtop log / w in the dashboard)")
    replay.add_argument("--speed", type=_positive_float, default=1.0, help="playback speed (default 1)")
    replay.add_argument("--refresh", type=_positive_float, default=0.25, metavar="S",
                        help="seconds between redraws while playing (default 0.25)")
    return parser


_RUN_OPTIONS_WITH_VALUE = {"--log", "--interval", "--prometheus", "--prometheus-addr"}


def split_run_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split ``run``'s own options from the program and its arguments.

    Everything after SCRIPT (or after ``-m MODULE``) belongs to the program,
    even when it looks like one of jaxtop's options, as with ``python``.
    """
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return argv[:i], argv[i + 1 :]
        if arg == "-m":
            return argv[: i + 2], argv[i + 2 :]
        if arg.startswith("-m") and len(arg) > 2:
            return argv[: i + 1], argv[i + 1 :]
        if arg in _RUN_OPTIONS_WITH_VALUE:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return argv[:i], argv[i:]
    return argv, []


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run":
        own, program = split_run_argv(argv[1:])
        args = parser.parse_args(["run", *own])
        args.target = program
        return cmd_run(parser, args)
    args = parser.parse_args(argv)
    if args.command == "run":
        return cmd_run(parser, args)
    if args.command == "ls":
        return cmd_ls(args)
    if args.command == "log":
        return cmd_log(args)
    if args.command == "attach":
        return cmd_attach(args.pids, args.refresh, inject=args.inject, no_inject=args.no_inject,
                          inject_timeout=args.inject_timeout)
    if args.command == "detach":
        return cmd_detach(args.pid)
    if args.command == "export":
        return cmd_export(args)
    if args.command == "replay":
        return cmd_replay(args)
    if args.command == "demo":
        return cmd_demo(args)
    return cmd_default()


# -- dashboard -------------------------------------------------------------------

INJECT_EXPLAINED = """\
pid {pid} has no jaxtop agent. jaxtop can inject one: gdb stops the process for
about a second, queues one line of Python for its main thread and detaches;
the main thread then starts the agent between two bytecodes. The agent turns
the transfer guard to `log` and relays stderr (your output is unchanged);
`jaxtop detach {pid}` undoes all of it. Same user only. docs/attach.md has the
details and the risks."""


def _inject(pid: int, timeout_s: float, prog: str) -> bool:
    """Inject the agent into ``pid``, saying what happened; False on failure."""
    from jaxtop import inject as injector

    print(f"jaxtop: injecting the agent into pid {pid}…", file=sys.stderr, flush=True)
    try:
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
    from jaxtop import client

    external = []
    for pid in pids:
        if client.paths.socket_path(pid).exists():
            continue
        if not client.pid_alive(pid):
            print(f"jaxtop attach: {client.no_agent_message(pid)}", file=sys.stderr)
            return EXIT_USAGE
        if no_inject:
            external.append(pid)
            continue
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
        if not _inject(pid, timeout_s, "attach"):
            return 1
    return external


def cmd_attach(pids: list[int], refresh_s: float | None = None, inject: bool = False, no_inject: bool = False,
               inject_timeout: float = DEFAULT_INJECT_TIMEOUT_S) -> int:
    external = _ensure_agents(pids, inject, no_inject, inject_timeout)
    if isinstance(external, int):
        return external
    from jaxtop.dashboard.app import DEFAULT_REFRESH_S, live_app

    live_app(pids, refresh_s=refresh_s or DEFAULT_REFRESH_S, external=external).run()
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from jaxtop import export

    if not os.path.isfile(args.file):
        print(f"jaxtop export: no such file: {args.file}", file=sys.stderr)
        return EXIT_USAGE
    write = export.write_csv if args.format == "csv" else export.write_perfetto
    jobs = args.jobs if args.jobs is not None else export.default_jobs()
    if jobs < 1:
        print("jaxtop export: --jobs must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    output = args.output
    if output is None:
        root = args.file[:-3] if args.file.endswith(".gz") else args.file
        root = os.path.splitext(root)[0]
        output = root + (".csv" if args.format == "csv" else ".perfetto.json")
    try:
        if output == "-":
            stats = write(args.file, sys.stdout, jobs=jobs)
        else:
            tmp = output + ".tmp"
            try:
                with open(tmp, "w", newline="") as out:
                    stats = write(args.file, out, jobs=jobs)
                os.replace(tmp, output)
            except BaseException:
                if os.path.exists(tmp):  # no half-written file left behind
                    os.unlink(tmp)
                raise
    except OSError as exc:
        print(f"jaxtop export: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("jaxtop export: interrupted; nothing written", file=sys.stderr)
        return 130
    notes = []
    if stats.malformed:
        notes.append(f"{stats.malformed} malformed line(s) skipped (first: {stats.first_error})")
    if stats.truncated:
        notes.append("the last line was truncated and skipped")
    where = "" if output == "-" else f" -> {output}"
    print(f"jaxtop export: {stats.records} records{where}" + ("; " + "; ".join(notes) if notes else ""), file=sys.stderr)
    return 0


def cmd_detach(pid: int) -> int:
    from jaxtop import client, inject as injector

    try:
        injector.detach(pid)
    except client.AgentNotFound as exc:
        print(f"jaxtop detach: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (injector.InjectError, OSError) as exc:
        print(f"jaxtop detach: {exc}", file=sys.stderr)
        return 1
    print(f"jaxtop: agent in pid {pid} stopped; the process keeps running")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    if args.steps < 1:
        print("jaxtop demo: --steps must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    if args.headless:
        from jaxtop.demo.headless import run

        return run(steps=args.steps, as_json=args.json, small=args.small)
    if args.json:
        print("jaxtop demo: --json needs --headless", file=sys.stderr)
        return EXIT_USAGE
    from jaxtop.demo.app import run_demo

    return run_demo(small=args.small)


def cmd_replay(args: argparse.Namespace) -> int:
    from jaxtop.dashboard.app import replay_app

    if not os.path.isfile(args.file):
        print(f"jaxtop replay: no such file: {args.file}", file=sys.stderr)
        return EXIT_USAGE
    try:
        app = replay_app(args.file, speed=args.speed, refresh_s=args.refresh)
    except (OSError, ValueError) as exc:
        print(f"jaxtop replay: {exc}", file=sys.stderr)
        return EXIT_USAGE
    app.run()
    return 0


def cmd_default() -> int:
    """Bare `jaxtop`: attach to the only agent, pick among several, or explain."""
    from jaxtop import client, paths

    agents = client.list_agents()
    if not agents:
        print(f"No instrumented JAX processes for this user (looked in {paths.socket_dir()}).")
        print("Start one with:  jaxtop run your_script.py   or try:  jaxtop demo")
        return 0
    if len(agents) == 1:
        return cmd_attach([agents[0].pid])
    if not sys.stdin.isatty():
        print("Several instrumented processes; choose with `jaxtop attach PID [PID...]`:")
        for a in agents:
            print(f"  {a.pid}  {_uptime(a.started_t)}  {a.command}")
        return EXIT_USAGE
    from jaxtop.dashboard.picker import pick

    chosen = pick(agents)
    if not chosen:
        return 0
    return cmd_attach(chosen)


# -- run -------------------------------------------------------------------------

def _trim_traceback(tb):
    """Drop jaxtop's and runpy's frames so the traceback reads like `python SCRIPT`."""
    ours = {__file__, runpy.__file__, "<frozen runpy>"}
    while tb is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    return tb


# The program's globals live until interpreter exit, as a plain `python
# SCRIPT`'s __main__ does, so the final sample sees the arrays it still holds.
_program_globals: dict | None = None


def cmd_run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.module is None and not args.target:
        parser.error("run: give a SCRIPT to run, or -m MODULE")
    if args.module is None:
        script = args.target[0]
        if not os.path.exists(script):
            print(f"jaxtop run: can't open file {script!r}: no such file", file=sys.stderr)
            return EXIT_USAGE
    import jaxtop

    try:
        jaxtop.instrument(interval_s=args.interval, log_path=args.log, capture_stderr=not args.no_capture,
                          prometheus_port=args.prometheus, prometheus_addr=args.prometheus_addr)
    except (OSError, ImportError, ValueError) as exc:
        print(f"jaxtop run: cannot start the agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    global _program_globals
    try:
        if args.module is not None:
            sys.argv = [args.module, *args.target]
            sys.path[0] = os.getcwd()  # as `python -m` does
            _program_globals = runpy.run_module(args.module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args.target)
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            _program_globals = runpy.run_path(script, run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        # Report it as the interpreter would (through the user's own
        # excepthook, if their program installed one), exit status 1.
        tb = _trim_traceback(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        return 1
    return 0


# -- ls --------------------------------------------------------------------------

def _uptime(started_t: float | None) -> str:
    if started_t is None:
        return "?"
    s = max(0, int(time.time() - started_t))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def cmd_ls(args: argparse.Namespace) -> int:
    from jaxtop import client, paths

    agents = client.list_agents()
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
    rows += [(str(a.pid), _uptime(a.started_t), a.command, str(a.socket_path)) for a in agents]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print(f"{r[0]:>{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}")
    return 0


# -- log -------------------------------------------------------------------------

def cmd_log(args: argparse.Namespace) -> int:
    from jaxtop import client

    stop = {"flag": False}

    def on_signal(signum, frame):
        stop["flag"] = True

    if args.inject and not client.paths.socket_path(args.pid).exists():
        if not _inject(args.pid, args.inject_timeout, "log"):
            return 1
    on_record = None
    if args.prometheus is not None:
        from jaxtop import prometheus

        state = prometheus.StreamState()
        try:
            prometheus.serve(state, args.prometheus, args.prometheus_addr)
        except (ImportError, OSError) as exc:
            print(f"jaxtop log: cannot serve Prometheus metrics: {exc}", file=sys.stderr)
            return EXIT_USAGE
        on_record = state.update
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        out = open(args.output, "wb") if args.output else sys.stdout.buffer
    except OSError as exc:
        print(f"jaxtop log: cannot write {args.output}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    try:
        client.record(args.pid, out, duration_s=args.duration, should_stop=lambda: stop["flag"], on_record=on_record)
    except client.AgentNotFound as exc:
        print(f"jaxtop log: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if args.output:
            out.close()
        else:
            try:
                out.flush()
            except OSError:
                pass
    return 0
