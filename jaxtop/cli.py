"""``jaxtop`` command line: argument checks and wiring, nothing more."""

from __future__ import annotations

import argparse
import errno
import os
import runpy
import signal
import sys
import time
from typing import Sequence

from jaxtop.paths import SocketDirError
from jaxtop.protocol import JAXTOP_VERSION
from jaxtop.inject import DEFAULT_TIMEOUT_S as DEFAULT_INJECT_TIMEOUT_S
from jaxtop.prometheus import DEFAULT_ADDR as DEFAULT_PROMETHEUS_ADDR

EXIT_USAGE = 2
EXIT_BUDGET = 3  # jaxtop.budget.EXIT_BUDGET: `run --budget`, over budget

# Shown by `jaxtop --help`; the one place the exit statuses are listed.
EXIT_STATUS_HELP = """\
exit status:
  0    done (for `run`: the program's own status, as `python SCRIPT` would give)
  1    the action failed: injection or detach did not work, an export could not be written,
       a recording could not be written (`log`: a full disk, a size limit; one line says so)
  2    bad usage, or nothing to act on: no such process, no agent, the agent could not
       start (`run`), or a socket directory or socket that is not safe to trust (not a
       directory of yours that only you can write, or served by another uid); the
       message names the path and its owner
  3    `run --budget`: the program succeeded but went over its budget (the report is on
       stderr; docs/budgets.md). A program that fails keeps its own status and traceback
  130  interrupted (export)
  141  the reader of the output went away (`log` or `export -o -` into `| head`), quietly
  143  terminated by SIGTERM (export; its temporary file removed)"""


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
        epilog=EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"jaxtop {JAXTOP_VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="run a Python program with the jaxtop agent started first",
        description="Run SCRIPT (or -m MODULE) like `python`, with the agent started first. "
        "Same sys.argv, __main__, exit code and exceptions as a plain run.",
    )
    run.add_argument("--log", metavar="FILE", help="also record the stream to FILE (JSON lines; gzip-compressed as written when FILE ends in .gz)")
    run.add_argument("--interval", type=_positive_float, default=0.1, metavar="S", help="sample period in seconds (default 0.1)")
    run.add_argument("--no-capture", action="store_true", help="do not capture stderr (no transfer counts)")
    run.add_argument("--budget", metavar="SPEC",
                     help="limits checked at exit, e.g. h2d=0,recompiles=0,peak=2GiB, or a pyproject.toml with "
                     "[tool.jaxtop.budget]; over budget: a report on stderr, exit 3 (docs/budgets.md)")
    run.add_argument("--budget-report", metavar="FILE", help="also write the budget report as JSON to FILE")
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
    log.add_argument("-o", "--output", metavar="FILE",
                     help="write here instead of stdout; a FILE ending in .gz is gzip-compressed as it is written "
                          "(about 20 times smaller: ~5 MB an hour at 10 Hz for 8 devices and 10,000 arrays)")
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
    export.add_argument("--format", choices=("csv", "perfetto", "holders-csv", "labels-csv", "host-syncs-csv"),
                        required=True,
                        help="csv: a row per sample and device; perfetto: a trace; holders-csv, labels-csv, "
                             "host-syncs-csv: a row per allocation site, labelled tree or reading line of each "
                             "record that carried one")
    export.add_argument("-o", "--output", metavar="OUT", help="where to write (default: FILE with .csv / .perfetto.json; - for stdout)")
    export.add_argument("-j", "--jobs", type=int, metavar="N",
                        help="processes for a big uncompressed recording (default: the CPUs this process may use, at most 8)")

    oom = sub.add_parser("oom", help="print an out-of-memory census: what held the memory when a program ran out",
                         add_help=False)
    oom.add_argument("rest", nargs=argparse.REMAINDER, help="FILE: jaxtop-oom-PID-TIME.json or a recording")
    replay = sub.add_parser("replay", help="open the dashboard on a recording")
    replay.add_argument("file", help="a JSON-lines recording, plain or .gz (jaxtop run --log / jaxtop log / w in the dashboard)")
    replay.add_argument("--speed", type=_positive_float, default=1.0, help="playback speed (default 1)")
    replay.add_argument("--refresh", type=_positive_float, default=0.25, metavar="S",
                        help="seconds between redraws while playing (default 0.25)")
    return parser


_RUN_OPTIONS_WITH_VALUE = {"--log", "--interval", "--prometheus", "--prometheus-addr", "--budget", "--budget-report"}


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
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except SocketDirError as exc:
        # An unsafe socket directory, or a socket served by another uid: one
        # line naming the path and owner, exit 2 (EXIT_STATUS_HELP).
        command = next((arg for arg in argv if not arg.startswith("-")), "")
        print(f"jaxtop{' ' + command if command else ''}: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _main(argv: list[str]) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "oom":
        from jaxtop.oom_report import main as oom_main

        return oom_main(argv[1:])
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
    from jaxtop import client, inject as injector

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
    from jaxtop import paths

    paths.check_socket_dir()  # SocketDirError: main() says so, exit 2
    external = _ensure_agents(pids, inject, no_inject, inject_timeout)
    if isinstance(external, int):
        return external
    from jaxtop.dashboard.app import DEFAULT_REFRESH_S, live_app

    live_app(pids, refresh_s=refresh_s or DEFAULT_REFRESH_S, external=external).run_as_main()
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from jaxtop import export

    if not os.path.isfile(args.file):
        print(f"jaxtop export: no such file: {args.file}", file=sys.stderr)
        return EXIT_USAGE
    if args.format in export.SPARSE_CSV:
        def write(path, out, jobs=1, kind=args.format):
            return export.write_sparse_csv(kind, path, out, jobs=jobs)
    else:
        write = export.write_csv if args.format == "csv" else export.write_perfetto
    jobs = args.jobs if args.jobs is not None else export.default_jobs()
    if jobs < 1:
        print("jaxtop export: --jobs must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    output = args.output
    if output is None:
        root = args.file[:-3] if args.file.endswith(".gz") else args.file
        root = os.path.splitext(root)[0]
        output = root + {"csv": ".csv", "perfetto": ".perfetto.json"}.get(args.format, f".{args.format[:-4]}.csv")
    to_stdout = output in _STDOUT_NAMES
    atomic = not to_stdout and _replaceable(output)
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread (cli.main called from one): no handler
        previous = None
    try:
        if to_stdout:
            stats = write(args.file, sys.stdout, jobs=jobs)
            sys.stdout.flush()  # a reader gone shows here, not at exit
        elif atomic:
            stats = _write_replacing(output, lambda out: write(args.file, out, jobs=jobs))
        else:
            # A device, a FIFO, a terminal, or a link to one: written through,
            # as a shell's `>` would; replacing it would break what it is.
            with open(output, "w", newline="", encoding="utf-8") as out:
                stats = write(args.file, out, jobs=jobs)
    except BrokenPipeError:
        return _stdout_gone() if to_stdout else EXIT_BROKEN_PIPE
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else f"{'stdout' if to_stdout else output}: "
        print(f"jaxtop export: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, _Terminated) as exc:
        left = f"{output} left as it was" if atomic else "the output is incomplete"
        what = "interrupted" if isinstance(exc, KeyboardInterrupt) else "terminated"
        print(f"jaxtop export: {what}; {left}", file=sys.stderr)
        return 130 if isinstance(exc, KeyboardInterrupt) else EXIT_TERMINATED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    notes = []
    if stats.malformed:
        notes.append(f"{stats.malformed} malformed line(s) skipped (first: {stats.first_error})")
    if stats.stopped:
        notes.append(f"{stats.stopped}; what came before it was exported")
    elif stats.truncated:
        notes.append("the last line was truncated and skipped")
    where = "" if to_stdout else f" -> {output}"
    print(f"jaxtop export: {stats.records} records{where}" + ("; " + "; ".join(notes) if notes else ""), file=sys.stderr)
    return 0


#: ``-o`` names that mean standard output (``log`` and ``export``): written
#: to, never opened by name or replaced.
_STDOUT_NAMES = ("-", "/dev/stdout")
#: Exit status when the reader of the output went away (``| head``): what a
#: shell reports for a tool that SIGPIPE ended (128 + 13), reached quietly.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
#: Exit status of an export ended by SIGTERM (128 + 15), its temporary file removed.
EXIT_TERMINATED = 128 + signal.SIGTERM


class _Terminated(Exception):
    """SIGTERM during an export: unwinds like Ctrl-C, so no temporary file stays."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated()


def _stdout_gone() -> int:
    """Stdout's reader went away (``| head``): end quietly, as Unix tools do.

    Python flushes stdout once more at exit and would print a second
    BrokenPipeError there; stdout pointed at /dev/null has nothing to fail.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass
    return EXIT_BROKEN_PIPE


def _replaceable(path: str) -> bool:
    """Whether ``path`` is written through a temporary file renamed over it:
    a regular file or a new path (after following symlinks), not a device,
    a FIFO or anything else a rename would replace by a plain file."""
    import stat

    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return True  # a new path, or a symlink to one
    except OSError:
        return False  # let open() say what is wrong with it


def _write_replacing(path: str, write):
    """Run ``write(out)`` into a temporary file beside ``path``, then rename it
    over ``path``: readers see the old file or the whole new one, never half.

    A symlink is followed: its target is replaced and the link stays. The
    new file keeps the old one's mode (and owner, where allowed). On any
    failure or interrupt the temporary file is removed and ``path`` is left
    as it was.
    """
    import contextlib
    import tempfile

    target = os.path.realpath(path) if os.path.islink(path) else path
    try:
        old = os.stat(target)
    except FileNotFoundError:
        old = None
    folder, name = os.path.split(target)
    # Ctrl-C or SIGTERM between the file's creation and the `try` below
    # would leave it behind: they wait (blocked) until the `try` is entered.
    deferred = {signal.SIGINT, signal.SIGTERM}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, deferred)
    try:
        fd, tmp = tempfile.mkstemp(dir=folder or ".", prefix=f".{name}.", suffix=".tmp")
    except OSError as exc:  # say it of the output, not of a name the user never gave
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise OSError(exc.errno, exc.strerror, path) from None
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a signal that came meanwhile is handled here
        if old is not None:
            os.fchmod(fd, old.st_mode & 0o7777)
            with contextlib.suppress(OSError):
                os.fchown(fd, old.st_uid, old.st_gid)
        else:
            mask = os.umask(0)
            os.umask(mask)
            os.fchmod(fd, 0o666 & ~mask)  # as open() would have made it
        with open(fd, "w", newline="", encoding="utf-8") as out:
            result = write(out)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return result


def cmd_detach(pid: int) -> int:
    from jaxtop import client, inject as injector

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
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        # The dashboard reads keys from a terminal and draws on one: without
        # them it would wait for keys that never come, writing escape codes.
        print("jaxtop demo: needs a terminal for the dashboard; use `jaxtop demo --headless` "
              "(a table, or --json) without one", file=sys.stderr)
        return EXIT_USAGE
    from jaxtop.demo.app import run_demo

    return run_demo(small=args.small)


def cmd_replay(args: argparse.Namespace) -> int:
    from jaxtop.dashboard.app import make_app
    from jaxtop.dashboard.sources import ReplaySource

    if not os.path.isfile(args.file):
        print(f"jaxtop replay: no such file: {args.file}", file=sys.stderr)
        return EXIT_USAGE
    try:
        # A big recording opens at once; its index is built in the background
        # and the header says how far it is.
        source = ReplaySource(args.file, speed=args.speed)
    except (OSError, ValueError) as exc:
        print(f"jaxtop replay: {exc}", file=sys.stderr)
        return EXIT_USAGE
    make_app(source, refresh_s=args.refresh).run_as_main()
    return 0


def cmd_default() -> int:
    """Bare `jaxtop`: attach to the only agent, pick among several, or explain."""
    from jaxtop import client, paths

    agents = client.list_agents(on_refused=lambda why: print(f"jaxtop: {why}", file=sys.stderr))
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
    """Drop jaxtop's and runpy's frames so the traceback reads like `python SCRIPT`.

    ``tb`` may start above ``cmd_run`` (the interpreter's top level, through
    ``python -m jaxtop`` or the ``jaxtop`` script): everything up to
    ``cmd_run`` goes too.
    """
    node = tb
    while node is not None:
        if node.tb_frame.f_code is cmd_run.__code__:
            tb = node
            break
        node = node.tb_next
    ours = {__file__, runpy.__file__, "<frozen runpy>"}
    while tb is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    return tb


def _hook_without_our_frames(exc: BaseException) -> None:
    """Have the interpreter print ``exc`` (about to leave ``main``) with
    the program's frames only.

    A KeyboardInterrupt must reach the top level itself: the interpreter
    then ends the process with SIGINT after the usual clean-up, as for
    `python SCRIPT`, which no exit status can imitate. Its traceback is
    printed there through ``sys.excepthook`` (the program's own, if it set
    one), so that hook is wrapped once to trim it.
    """
    hook = sys.excepthook

    def excepthook(etype, value, tb):
        sys.excepthook = hook
        if value is exc:
            tb = _trim_traceback(tb)
            value = value.with_traceback(tb)  # what the default hook prints
        hook(etype, value, tb)

    sys.excepthook = excepthook


def _script_path(script: str) -> str:
    """``__file__`` of the script as `python SCRIPT` (3.9+) sets it: the
    working directory joined with the path as given, not normalized."""
    return script if os.path.isabs(script) else os.path.join(os.getcwd(), script)


def _run_script(script: str) -> dict:
    """Run a script file as `python SCRIPT` does; returns its globals.

    ``__file__`` and the code's file name are absolute while ``sys.argv[0]``
    stays as given (runpy.run_path would set it to the path it runs), and
    the new ``__main__`` module stays in ``sys.modules`` until exit, as the
    interpreter's own does. A directory or zip file with a ``__main__.py``,
    or a ``.pyc``, goes through runpy as before.
    """
    import zipfile

    path = _script_path(script)
    if os.path.isdir(path) or path.endswith((".pyc", ".pyo")) or zipfile.is_zipfile(path):
        return runpy.run_path(script, run_name="__main__")
    import builtins
    import io
    import types
    from importlib.machinery import SourceFileLoader

    with io.open_code(path) as f:
        source = f.read()
    # dont_inherit: this module's `from __future__` imports are not the program's.
    code = compile(source, path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __loader__=SourceFileLoader("__main__", path),
                         __package__=None, __spec__=None, __builtins__=builtins)
    sys.modules["__main__"] = main
    exec(code, main.__dict__)
    return main.__dict__


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
    budget = _run_budget(parser, args)
    if isinstance(budget, int):
        return budget
    import jaxtop

    try:
        handle = jaxtop.instrument(interval_s=args.interval, log_path=args.log, capture_stderr=not args.no_capture,
                                   prometheus_port=args.prometheus, prometheus_addr=args.prometheus_addr)
    except (OSError, ImportError, ValueError) as exc:
        print(f"jaxtop run: cannot start the agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if budget is not None:
        budget.start(handle.agent)
    global _program_globals
    # With -P or PYTHONSAFEPATH, python puts no directory first on sys.path,
    # and jaxtop's own sys.path[0] is then the standard library's.
    set_path0 = not getattr(sys.flags, "safe_path", False)
    try:
        if args.module is not None:
            sys.argv = [args.module, *args.target]
            if set_path0:
                sys.path[0] = os.getcwd()  # as `python -m` does
            _program_globals = runpy.run_module(args.module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args.target)  # argv[0] exactly as given, as python keeps it
            if set_path0:
                # The script's real directory (symlinks resolved), as python does.
                sys.path[0] = os.path.dirname(os.path.realpath(script))
            _program_globals = _run_script(script)
    except SystemExit as exc:
        # `sys.exit(0)` is a success like a return: the budget still counts.
        if budget is not None and budget.finish(program_ok=exc.code in (None, 0)):
            return EXIT_BUDGET
        raise
    except KeyboardInterrupt as exc:
        _hook_without_our_frames(exc)
        raise
    except BaseException as exc:
        # Report it as the interpreter would (through the user's own
        # excepthook, if their program installed one), exit status 1.
        tb = _trim_traceback(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        if budget is not None:
            budget.finish(program_ok=False)  # its status and traceback win: only the JSON report
        return 1
    if budget is not None and budget.finish(program_ok=True):
        return EXIT_BUDGET
    return 0


def _run_budget(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """``--budget``, read before the program starts: a RunBudget, None
    without one, or an exit status (a budget that cannot be read)."""
    if args.budget is None:
        if args.budget_report:
            parser.error("run: --budget-report needs --budget")
        return None
    from jaxtop import budget as budgets

    try:
        limits = budgets.resolve(args.budget)
    except budgets.BudgetError as exc:
        print(f"jaxtop run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    counted = limits.names() & budgets.TRANSFER_NAMES
    if args.no_capture and counted:
        print(f"jaxtop run: --budget limits {', '.join(sorted(counted))}, but --no-capture turns transfer "
              "counting off", file=sys.stderr)
        return EXIT_USAGE
    return budgets.RunBudget(limits, report_path=args.budget_report)


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

    client.paths.check_socket_dir()  # SocketDirError: main() says so, exit 2
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
    to_stdout = args.output is None or args.output in _STDOUT_NAMES
    name = "stdout" if to_stdout else args.output
    try:
        out = _log_output(None if to_stdout else args.output)
    except OSError as exc:
        print(f"jaxtop log: cannot write {name}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        try:
            client.record(args.pid, out, duration_s=args.duration, should_stop=lambda: stop["flag"],
                          on_record=on_record)
        finally:
            out.close()
    except (client.AgentNotFound, SocketDirError) as exc:
        # SocketDirError (an OSError): a socket served by another uid, not a write failure.
        print(f"jaxtop log: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (`| head -1`): it has what it wanted.
        return _stdout_gone() if to_stdout else EXIT_BROKEN_PIPE
    except OSError as exc:
        # A full disk, a size limit, an I/O error: once, on one line. What is
        # in the file are whole lines (record() cuts back a partial one).
        print(f"jaxtop log: cannot write {name}: {exc.strerror or exc}; recording stopped", file=sys.stderr)
        return 1
    return 0


class _GzipOutput:
    """A recording compressed as ``jaxtop log`` writes it (FILE.gz): each
    batch goes to the file at once, made readable (a zlib sync flush) at
    least every :data:`protocol.GZIP_SYNC_S`, so a recorder that is killed
    leaves a file that reads to within a second of its end."""

    def __init__(self, raw) -> None:
        from jaxtop import protocol

        self._protocol = protocol
        self._raw = raw
        self._gz = protocol.GzipLines()
        self._sync_t = time.monotonic()

    def _put(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = self._raw.write(view)
            if not n:
                raise OSError(errno.EIO, "the file took no bytes")
            view = view[n:]

    def write(self, data) -> int:
        self._put(self._gz.compress(bytes(data)))
        return len(data)

    def flush(self) -> None:
        now = time.monotonic()
        if now - self._sync_t >= self._protocol.GZIP_SYNC_S:
            self._sync_t = now
            self._put(self._gz.sync())

    def close(self) -> None:
        try:
            self._put(self._gz.finish())
        finally:
            self._raw.close()


def _log_output(path: str | None):
    """Where ``jaxtop log`` writes: ``path``, or stdout for None; unbuffered,
    so a failed write is seen at once and record() knows what reached the file.
    A path ending in ``.gz`` is compressed as it is written."""
    if path is not None:
        raw = open(path, "wb", buffering=0)
        return _GzipOutput(raw) if path.endswith(".gz") else raw
    try:
        sys.stdout.flush()  # anything printed before comes first
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError) as exc:  # stdout closed (None) or detached
        raise OSError(f"stdout is not open ({exc})") from None
    return open(fd, "wb", buffering=0, closefd=False)
