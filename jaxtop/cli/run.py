"""``jaxtop run``: a Python program run as `python` runs it (same
``sys.argv``, ``__main__``, exit status and traceback), with the agent
started first and ``--budget`` checked at its end.

A script file, ``-m MODULE``, ``-c CODE`` or ``-`` (the script on stdin).
``jaxtop run python -u -X dev train.py``: python's own options that change
how the program runs are applied by starting this interpreter again with
them (:func:`_restart_with_python_options`: same pid, nothing of the agent
started yet), since most cannot be set once it runs (``-O`` compiles
without asserts, ``-X dev`` installs its hooks at start-up, ``sys.flags``
is read-only).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import types

from jaxtop.cli.exits import EXIT_BUDGET, EXIT_USAGE


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


def _new_main(**fields) -> types.ModuleType:
    """A new ``__main__`` module with what python gives its own (a
    ``BuiltinImporter`` loader where no file loads it, an ``__annotations__``
    dict), plus ``fields``; it replaces the interpreter's (jaxtop's)."""
    import builtins
    from importlib.machinery import BuiltinImporter

    main = types.ModuleType("__main__")
    main.__dict__.update(__annotations__={}, __loader__=BuiltinImporter, __package__=None, __spec__=None,
                         __builtins__=builtins)
    main.__dict__.update(fields)
    sys.modules["__main__"] = main
    return main


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
    import io
    from importlib.machinery import SourceFileLoader

    with io.open_code(path) as f:
        source = f.read()
    # dont_inherit: this module's `from __future__` imports are not the program's.
    code = compile(source, path, "exec", dont_inherit=True)
    main = _new_main(__file__=path, __cached__=None, __loader__=SourceFileLoader("__main__", path))
    exec(code, main.__dict__)
    return main.__dict__


def _run_code(code_text: str) -> dict:
    """Run a program given as a string, as ``python -c CODE`` does: in a new
    ``__main__`` without ``__file__``, its code named ``<string>``."""
    code = compile(code_text, "<string>", "exec", dont_inherit=True)
    main = _new_main()
    exec(code, main.__dict__)
    return main.__dict__


def _run_stdin() -> dict:
    """Run the script read from stdin, as ``python -`` does: all of it read
    first (the program then finds stdin at its end), compiled from its bytes
    (a coding cookie or BOM is honoured) as ``<stdin>``, in a ``__main__``
    whose ``__file__`` is ``<stdin>``. A terminal on stdin is read up to
    Ctrl-D, then run: there is no interactive prompt."""
    source = sys.stdin.buffer.read() if sys.stdin is not None else b""
    code = compile(source, "<stdin>", "exec", dont_inherit=True)
    main = _new_main(__file__="<stdin>", __cached__=None)
    exec(code, main.__dict__)
    return main.__dict__


def _restart_with_python_options(args: argparse.Namespace) -> int:
    """Start this interpreter again with python's options in
    ``args.python_options`` (``-u``, ``-X dev``, ``-W error``, ``-O``...),
    to run ``jaxtop run`` with the rest of ``args`` there.

    ``exec``: the same process (a pid, a terminal, signals as the user
    started them), replaced before the agent or anything of the program
    started. The options travel as JSON; the new interpreter imports jaxtop
    from where this one did (the same ``sys.path``) before it puts the
    program's in place, so ``-c`` never imports from the working directory.

    Returns:
        :data:`EXIT_USAGE` when the interpreter cannot be started (it does
        not return otherwise).
    """
    state = dict(vars(args), python_options=[])
    # This interpreter's sys.path less what python put first for jaxtop
    # itself (its script's directory), which the program's replaces.
    program_path = sys.path[0 if getattr(sys.flags, "safe_path", False) else 1:]
    boot = (f"import sys; sys.path[:] = {sys.path!r}; from jaxtop.cli.run import resume; "
            f"sys.exit(resume({program_path!r}))")
    argv = [sys.executable, *args.python_options, "-c", boot, json.dumps(state)]
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    try:
        os.execv(sys.executable, argv)
    except OSError as exc:
        print(f"jaxtop run: cannot start {sys.executable} {' '.join(args.python_options)}: {exc}", file=sys.stderr)
    return EXIT_USAGE


def resume(program_path: list[str]) -> int:
    """``jaxtop run`` in the interpreter :func:`_restart_with_python_options`
    started: its options from ``sys.argv[1]``.

    Args:
        program_path: ``sys.path`` for the program, but for the entry python
            puts first (``''`` here, replaced by the script's directory as
            ``cmd_run`` does; none with ``-P``).

    Returns:
        :func:`cmd_run`'s exit status.
    """
    from jaxtop.cli.parser import build_parser

    args = argparse.Namespace(**json.loads(sys.argv[1]))
    sys.path[:] = ([] if getattr(sys.flags, "safe_path", False) else [""]) + list(program_path)
    return cmd_run(build_parser().commands["run"], args)


# The program's globals live until interpreter exit, as a plain `python
# SCRIPT`'s __main__ does, so the final sample sees the arrays it still holds.
_program_globals: dict | None = None


def cmd_run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``jaxtop run [OPTIONS] SCRIPT|-m MODULE|-c CODE|- [ARGS...]``.

    Args:
        parser: the parser, for its usage errors.
        args: ``run``'s parsed options, with ``target`` the program's argv
            (see :func:`jaxtop.cli.parser.split_run_argv`) and
            ``python_options`` python's own (``jaxtop run python -u ...``).

    Returns:
        The program's exit status, or :data:`EXIT_BUDGET` / :data:`EXIT_USAGE`.
    """
    if args.module is None and args.code is None and not args.target:
        parser.error("run: give a SCRIPT to run, -m MODULE, -c CODE or - (the script on stdin)")
    if args.module is not None and args.code is not None:
        parser.error("run: -m MODULE and -c CODE are two programs: give one")
    script = None
    if args.module is None and args.code is None:
        script = args.target[0]
        if script != "-" and not os.path.exists(script):
            print(f"jaxtop run: can't open file {script!r}: no such file", file=sys.stderr)
            return EXIT_USAGE
    if getattr(args, "python_options", None):
        return _restart_with_python_options(args)
    budget = _run_budget(parser, args)
    if isinstance(budget, int):
        return budget
    import jaxtop

    # The program's argv before the agent starts: its hello (the recording's
    # and the dashboard's header) names the program, not jaxtop's options.
    if args.code is not None:
        sys.argv = ["-c", *args.target]  # as python -c sets it
    elif args.module is not None:
        sys.argv = [args.module, *args.target]
    else:
        sys.argv = list(args.target)  # argv[0] exactly as given, as python keeps it
    try:
        handle = jaxtop.instrument(interval_s=args.interval, log_path=args.log, capture_stderr=not args.no_capture,
                                   prometheus_port=args.prometheus, prometheus_addr=args.prometheus_addr,
                                   job=args.job, prometheus_push=args.prometheus_push)
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
        if args.code is not None:
            if set_path0:
                sys.path[0] = ""  # as python -c does: the working directory, looked up at each import
            _program_globals = _run_code(args.code)
        elif args.module is not None:
            if set_path0:
                sys.path[0] = os.getcwd()  # as `python -m` does
            _program_globals = runpy.run_module(args.module, run_name="__main__", alter_sys=True)
        elif script == "-":
            if set_path0:
                sys.path[0] = ""  # as python - does: the working directory, looked up at each import
            _program_globals = _run_stdin()
        else:
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
        from jaxtop.probes.frames import without_hooks

        tb = without_hooks(_trim_traceback(exc.__traceback__))
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
    from jaxtop import budgets

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
