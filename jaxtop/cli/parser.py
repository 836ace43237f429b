"""``jaxtop``'s argument parser, and the split of ``run``'s own options
from the program's."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from typing import NoReturn

from jaxtop.cli.exits import ENVIRONMENT_HELP, EXAMPLES_HELP, EXIT_STATUS_HELP
from jaxtop.inject import DEFAULT_TIMEOUT_S as DEFAULT_INJECT_TIMEOUT_S
from jaxtop.wire.prometheus import DEFAULT_ADDR as DEFAULT_PROMETHEUS_ADDR
from jaxtop.wire.protocol import JAXTOP_VERSION


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


class Parser(argparse.ArgumentParser):
    """argparse, with "did you mean" on a mistyped command or option."""

    def error(self, message: str) -> NoReturn:
        hint = self._did_you_mean(message)
        super().error(message + (f"\n  did you mean {hint}?" if hint else ""))

    def _did_you_mean(self, message: str) -> str | None:
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            options = re.findall(r"'([^']*)'", choice.group(2)) or [c.strip() for c in choice.group(2).split(",")]
            found = difflib.get_close_matches(choice.group(1), options, n=1, cutoff=0.5)
            return f"'{found[0]}'" if found else None
        unknown = re.search(r"unrecognized arguments: (.*)", message)
        if unknown:
            known = [o for o in self._option_string_actions if o.startswith("--")]
            for word in unknown.group(1).split():
                if word.startswith("--"):
                    found = difflib.get_close_matches(word.split("=", 1)[0], known, n=1, cutoff=0.6)
                    if found:
                        return found[0]
        return None


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command (``oom`` reads its own arguments).

    Its ``commands`` attribute maps each command to its own parser, whose
    usage a mistake in that command's arguments prints.
    """
    parser = Parser(
        prog="jaxtop",
        description="top for JAX memory: device memory, fragmentation and host<->device transfers.",
        epilog="\n\n".join((EXAMPLES_HELP, ENVIRONMENT_HELP, EXIT_STATUS_HELP)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-V", "--version", action="version", version=f"jaxtop {JAXTOP_VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

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
    run.add_argument("--budget-report", metavar="FILE", help="also write the budget report as JSON to FILE (- for stdout)")
    _prometheus_options(run, "also serve Prometheus metrics on PORT (docs/cluster.md)")
    run.add_argument("--prometheus-push", metavar="URL",
                     help="push the last metrics to this Prometheus Pushgateway at exit (a run shorter than a scrape "
                          "interval is seen too; env JAXTOP_PROMETHEUS_PUSH)")
    run.add_argument("--job", metavar="NAME",
                     help="the run's name: the `job` label of its metrics (env JAXTOP_JOB; default: the "
                          "jax.distributed coordinator's address, else the program's name)")
    run.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script")
    run.add_argument("-c", dest="code", metavar="CODE", help="run the program passed as a string (as python -c)")
    run.add_argument("target", nargs="*", metavar="SCRIPT [ARGS...]",
                     help="the program and its arguments (`python SCRIPT`, `python -m MODULE`, "
                          "`python -c CODE` and `python - < SCRIPT` are read the same way)")
    # python's own options (`jaxtop run python -u x.py`), put here by split_python_argv.
    run.add_argument("--python-option", dest="python_options", action="append", default=[], metavar="OPT",
                     help=argparse.SUPPRESS)

    ls = sub.add_parser("ls", help="list instrumented processes of this user",
                        description="One line per process with a jaxtop agent: pid, uptime, command. "
                                    "Sockets of processes that are gone are removed.")
    ls.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    ls.add_argument("--pids", action="store_true", help="print the pids only, one per line (for scripts, completion)")

    log = sub.add_parser(
        "log",
        help="record a running agent's stream as JSON lines",
        description="Record until the target exits, the duration ends, or SIGINT/SIGTERM; then exit 0.",
    )
    log.add_argument("pid", type=_pid, help="the process to record (jaxtop ls lists them)")
    log.add_argument("-o", "--output", metavar="FILE",
                     help="write here instead of stdout; a FILE ending in .gz is gzip-compressed as it is written "
                          "(about 20 times smaller: ~5 MB an hour at 10 Hz for 8 devices and 10,000 arrays)")
    log.add_argument("--duration", type=_positive_float, metavar="S", help="stop after S seconds")
    _prometheus_options(log, "re-export the stream as Prometheus metrics on PORT")
    log.add_argument("--job", metavar="NAME", help="with --prometheus: the `job` label (default: the agent's)")
    log.add_argument("--inject", action="store_true", help="no agent in PID: inject one first (docs/attach.md)")
    _inject_timeout_option(log)

    attach = sub.add_parser(
        "attach",
        help="open the dashboard on running agents",
        description="Open the live dashboard on one or more instrumented processes, or with --prometheus on "
        "every process of a job on every host, read from a Prometheus server (docs/cluster.md).",
    )
    attach.add_argument("pids", type=_pid, nargs="*", metavar="PID", help="processes on this machine")
    attach.add_argument("--prometheus", metavar="URL",
                        help="read every process of the job from this Prometheus server (http://host:9090) instead")
    attach.add_argument("--job", metavar="NAME",
                        help="with --prometheus: the job's name, a regular expression (default: every job)")
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
    detach.add_argument("pid", type=_pid, help="the process whose agent stops")

    export = sub.add_parser(
        "export",
        help="turn a recording into CSV or a Perfetto trace",
        description="CSV: one row per sample and device (columns in docs/protocol.md). perfetto: Chrome "
        "trace-event JSON for ui.perfetto.dev (counter tracks for memory and transfers, instants for compiles "
        "and failed donations).",
    )
    export.add_argument("file", help="a JSON-lines recording (plain or .gz)")
    export.add_argument("--format", choices=("csv", "perfetto", "holders-csv", "labels-csv", "host-syncs-csv",
                                             "transfer-sites-csv"),
                        required=True,
                        help="csv: a row per sample and device; perfetto: a trace; holders-csv, labels-csv, "
                             "host-syncs-csv: a row per allocation site, labelled tree or reading line of each "
                             "record that carried one; transfer-sites-csv: a row per line whose implicit "
                             "transfers grew, and per change of the unattributed ones")
    export.add_argument("-o", "--output", metavar="OUT", help="where to write (default: FILE with .csv / .perfetto.json; - for stdout)")
    export.add_argument("--with-jax-profile", metavar="DIR",
                        help="perfetto: merge the newest jax.profiler trace under DIR (jax.profiler.trace(DIR)) on "
                             "jaxtop's clock")
    export.add_argument("-j", "--jobs", type=int, metavar="N",
                        help="processes for a big uncompressed recording (default: the CPUs this process may use, at most 8)")

    oom = sub.add_parser("oom", help="print an out-of-memory census: what held the memory when a program ran out",
                         add_help=False)
    oom.add_argument("rest", nargs=argparse.REMAINDER, help="FILE: jaxtop-oom-PID-TIME.json or a recording")
    replay = sub.add_parser("replay", help="open the dashboard on a recording",
                            description="The dashboard on a recording (jaxtop run --log, jaxtop log, w in the "
                                        "dashboard): space play/pause, . step, left/right seek 10 s, +/- speed.")
    replay.add_argument("file", help="a JSON-lines recording, plain or .gz (jaxtop run --log / jaxtop log / w in the dashboard)")
    replay.add_argument("--speed", type=_positive_float, default=1.0, help="playback speed (default 1)")
    replay.add_argument("--refresh", type=_positive_float, default=0.25, metavar="S",
                        help="seconds between redraws while playing (default 0.25)")
    snapshot = sub.add_parser(
        "snapshot", help="print every panel's figures once, for scripts and bug reports",
        description="Connect to the agent in PID, read its present state (the latest sample, with the latest "
                    "buffer map, holders and jit ledger) and print it: a summary, or with --json one JSON document.")
    snapshot.add_argument("pid", type=_pid, help="the process (jaxtop ls lists them)")
    snapshot.add_argument("--json", action="store_true", help="one JSON document instead of text")
    snapshot.add_argument("--timeout", type=_positive_float, default=10.0, metavar="S",
                          help="how long to wait for the agent (default 10)")

    advise = sub.add_parser(
        "advise", help="the memory strategies a program misses, line by line (evidence, gain, fix)",
        description="Read a running program's agent (its history, then live samples) or a recording, and say "
                    "which line misses which strategy (placement, donation, in-place updates, batching, jit, "
                    "host syncs, run-ahead, checkpointing, the transfer guard, leaks, fragmentation): the "
                    "evidence measured over the window, the gain to expect and the change as code; highest "
                    "expected gain first (docs/advice.md).")
    advise.add_argument("target", metavar="PID|RECORDING", help="a process (jaxtop ls lists them) or a recording")
    advise.add_argument("--json", action="store_true", help="one JSON document instead of text")
    advise.add_argument("--window", type=_positive_float, default=60.0, metavar="S",
                        help="the evidence window: the last S seconds of samples (default 60; the advisor keeps 300 s of each line)")
    advise.add_argument("--timeout", type=_positive_float, default=15.0, metavar="S",
                        help="PID: how long to read the agent at most (default 15)")

    serve = sub.add_parser(
        "serve", help="the dashboard in a browser (textual-serve): replay FILE or attach PID",
        description="Serve the dashboard over HTTP on 127.0.0.1 (by default) with a token in its URL: one "
                    "dashboard at a time; w and s download their files to the browser. Needs textual-serve "
                    "(pip install 'jaxtop[serve]').")
    serve.add_argument("what", choices=("replay", "attach"), help="replay a recording, or attach to processes")
    serve.add_argument("targets", nargs="+", metavar="FILE|PID", help="the recording, or the pids")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8000, help="port (default 8000)")
    serve.add_argument("--token-file", metavar="FILE",
                       help="the URL's token, from the first line of FILE, a file only you can read "
                            "(default: a random one, printed in the URL; docs/security.md)")

    completions = sub.add_parser(
        "completions", help="print a shell completion script (bash, zsh or fish)",
        description='Print a completion script: eval "$(jaxtop completions bash)" in ~/.bashrc, '
                    'eval "$(jaxtop completions zsh)" in ~/.zshrc, '
                    "jaxtop completions fish > ~/.config/fish/completions/jaxtop.fish.")
    completions.add_argument("shell", choices=("bash", "zsh", "fish"), help="the shell")
    parser.commands = dict(sub.choices)  # type: ignore[attr-defined]
    return parser


_RUN_OPTIONS_WITH_VALUE = {"--log", "--interval", "--prometheus", "--prometheus-addr", "--budget", "--budget-report",
                           "--prometheus-push", "--job"}


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
        if arg == "-c" and i + 1 < len(argv):
            return argv[: i + 2], argv[i + 2 :]
        if arg == "-":  # the script on stdin, as `python -` reads it
            return argv[:i], argv[i:]
        if arg in _RUN_OPTIONS_WITH_VALUE:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return argv[:i], argv[i:]
    return argv, []


def is_python(word: str) -> bool:
    """``python``, ``python3``, ``python3.11``, or this interpreter's path:
    the interpreter named before the program, as ``py-spy record -- python
    train.py`` users type it."""
    name = word.rsplit("/", 1)[-1]
    return bool(re.fullmatch(r"python(\d+(\.\d+)*)?", name)) or word == sys.executable


#: python's options that ``jaxtop run python`` passes on to the interpreter
#: that runs the program: flags (``-OO``, ``-bb``, ``-vv`` repeat) ...
PYTHON_FLAGS = "bBdOPqRuv"
#: ... and the ones that take a value (``-W error``, ``-Wd``, ``-X dev``).
PYTHON_VALUE_OPTIONS = "WX"


def split_python_argv(run: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """What follows ``python`` in ``jaxtop run python ...``: python's own
    options that change how the program runs (:data:`PYTHON_FLAGS`, ``-W``,
    ``-X``, grouped as python groups them: ``-uB``, ``-Wd``), then ``-m
    MODULE``, ``-c CODE`` (as jaxtop run's own options), ``-`` or a script;
    the program's arguments. python's options go to jaxtop run as
    ``--python-option``; the ones that change where python finds modules
    (``-E``, ``-I``, ``-s``, ``-S``: jaxtop itself must import) or what it
    does besides the program (``-i``, ``-x``, ``-h``, ``-V``) are refused
    with what to do instead."""
    if not argv:
        run.error("run python: give a script, -m MODULE, -c CODE or -")
    options: list[str] = []
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-":
        word = argv[i]
        if word == "--":
            i += 1
            break
        j = 1
        while j < len(word):
            letter, rest = word[j], word[j + 1:]
            if letter in "mc" or letter in PYTHON_VALUE_OPTIONS:
                if not rest and i + 1 >= len(argv):
                    run.error(f"run python -{letter}: argument expected")
                value = rest or argv[i + 1]
                i += 1 if rest else 2
                if letter in "mc":
                    return [f"-{letter}", value, *(f"--python-option={o}" for o in options)], argv[i:]
                options += [f"-{letter}", value]
                break
            if letter not in PYTHON_FLAGS or word.startswith("--"):
                run.error(f"run python {word}: python's {word if word.startswith('--') else '-' + letter} is not "
                          f"one jaxtop run passes on; start the interpreter yourself: python {word} -m jaxtop run SCRIPT")
            options.append(f"-{letter}")
            j += 1
        else:
            i += 1
    return [f"--python-option={o}" for o in options], argv[i:]
