"""``jaxtop`` command line: argument checks and wiring, nothing more.

:func:`main` is the console entry point (``jaxtop``, ``python -m jaxtop``):
it parses with :mod:`.parser` and hands each command to its module
(:mod:`.run`, :mod:`.attach`, :mod:`.log`, :mod:`.export`, ...). The exit
statuses are listed once, in :mod:`.exits`.
"""

from __future__ import annotations

import sys
from typing import Sequence

from jaxtop.cli.attach import INJECT_EXPLAINED, cmd_attach, cmd_attach_prometheus, cmd_default
from jaxtop.cli.demo import cmd_demo
from jaxtop.cli.detach import cmd_detach
from jaxtop.cli.exits import EXIT_BROKEN_PIPE, EXIT_BUDGET, EXIT_STATUS_HELP, EXIT_TERMINATED, EXIT_USAGE
from jaxtop.cli.export import cmd_export
from jaxtop.cli.log import cmd_log
from jaxtop.cli.ls import cmd_ls
from jaxtop.cli.parser import build_parser, is_python, split_python_argv, split_run_argv
from jaxtop.cli.replay import cmd_replay
from jaxtop.cli.run import cmd_run
from jaxtop.wire.paths import SocketDirError

__all__ = [
    "EXIT_BROKEN_PIPE", "EXIT_BUDGET", "EXIT_STATUS_HELP", "EXIT_TERMINATED", "EXIT_USAGE", "INJECT_EXPLAINED",
    "build_parser", "cmd_attach", "cmd_attach_prometheus", "cmd_default", "cmd_demo", "cmd_detach", "cmd_export", "cmd_log", "cmd_ls",
    "cmd_replay", "cmd_run", "main", "split_run_argv",
]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``jaxtop`` command.

    Args:
        argv: the arguments after ``jaxtop``; ``sys.argv[1:]`` when None.

    Returns:
        The exit status (:data:`~jaxtop.cli.exits.EXIT_STATUS_HELP`).
    """
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
        from jaxtop.dashboard.oom_report import main as oom_main

        return oom_main(argv[1:])
    if argv and argv[0] == "run":
        own, program = split_run_argv(argv[1:])
        if program and is_python(program[0]):
            # `jaxtop run python train.py`, as py-spy and nsys users type it.
            more, program = split_python_argv(parser.commands["run"], program[1:])
            own += more
        args = parser.commands["run"].parse_args(own)
        args.command, args.target = "run", program
        return cmd_run(parser.commands["run"], args)
    args, extra = parser.parse_known_args(argv)
    if extra:
        # The command's own usage, not the top level's, and a suggestion.
        (parser.commands.get(args.command) or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "run":
        return cmd_run(parser, args)
    if args.command == "ls":
        return cmd_ls(args)
    if args.command == "log":
        return cmd_log(args)
    if args.command == "attach":
        if args.prometheus is not None:
            if args.pids:
                parser.error("attach: give PIDs or --prometheus URL, not both")
            return cmd_attach_prometheus(args.prometheus, args.job, args.refresh)
        if not args.pids:
            parser.error("attach: give one or more PIDs (or --prometheus URL)")
        return cmd_attach(args.pids, args.refresh, inject=args.inject, no_inject=args.no_inject,
                          inject_timeout=args.inject_timeout)
    if args.command == "completions":
        from jaxtop.cli.completions import script

        sys.stdout.write(script(parser, args.shell))
        return 0
    if args.command == "serve":
        from jaxtop.cli.serve import cmd_serve

        return cmd_serve(args)
    if args.command == "advise":
        from jaxtop.cli.advise import cmd_advise

        return cmd_advise(args)
    if args.command == "snapshot":
        from jaxtop.cli.snapshot import cmd_snapshot

        return cmd_snapshot(args)
    if args.command == "detach":
        return cmd_detach(args.pid)
    if args.command == "export":
        return cmd_export(args)
    if args.command == "replay":
        return cmd_replay(args)
    if args.command == "demo":
        return cmd_demo(args)
    return cmd_default()
