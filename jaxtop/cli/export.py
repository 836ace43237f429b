"""``jaxtop export``: a recording as CSV or a Perfetto trace, written whole
or not at all."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from jaxtop.cli.exits import EXIT_BROKEN_PIPE, EXIT_TERMINATED, EXIT_USAGE
from jaxtop.cli.output import STDOUT_NAMES, stdout_gone
from jaxtop.wire import paths
from jaxtop.wire.safe_text import terminal_safe


def cmd_export(args: argparse.Namespace) -> int:
    """``jaxtop export FILE --format F``; returns the exit status."""
    from jaxtop import export

    if not os.path.isfile(args.file):
        print(f"jaxtop export: no such file: {args.file}", file=sys.stderr)
        return EXIT_USAGE
    if args.format in export.SPARSE_CSV:
        def write(path, out, jobs=1, kind=args.format):
            return export.write_sparse_csv(kind, path, out, jobs=jobs)
    else:
        write = export.write_csv if args.format == "csv" else export.write_perfetto
    if args.with_jax_profile:
        if args.format != "perfetto":
            print("jaxtop export: --with-jax-profile goes with --format perfetto", file=sys.stderr)
            return EXIT_USAGE
        from jaxtop.export import jax_profile

        try:
            profile = jax_profile.load(args.with_jax_profile)
        except (jax_profile.JaxProfileError, OSError) as exc:
            print(f"jaxtop export: --with-jax-profile: {exc}", file=sys.stderr)
            return EXIT_USAGE
        plain = write

        def write(path, out, jobs=1):  # the whole trace in memory, then the profile's events added
            import io

            buffer = io.StringIO()
            stats = plain(path, buffer, jobs=jobs)
            out.write(jax_profile.merge(buffer.getvalue(), profile))
            return stats
    jobs = args.jobs if args.jobs is not None else export.default_jobs()
    if jobs < 1:
        print("jaxtop export: --jobs must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    output = args.output
    if output is None:
        root = args.file[:-3] if args.file.endswith(".gz") else args.file
        root = os.path.splitext(root)[0]
        output = root + {"csv": ".csv", "perfetto": ".perfetto.json"}.get(args.format, f".{args.format[:-4]}.csv")
    to_stdout = output in STDOUT_NAMES
    # A regular OUT (or a new one) is written beside and renamed over it,
    # whole or not at all; a device, a FIFO or a terminal is written through,
    # as a shell's `>` would. A link someone else planted at OUT is replaced,
    # never followed (paths.replacing).
    target = None if to_stdout else paths.replacing(output, "w", newline="", encoding="utf-8")
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread (cli.main called from one): no handler
        previous = None
    try:
        if target is None:
            out = _TerminalSafe(sys.stdout) if _isatty(sys.stdout) else sys.stdout
            stats = write(args.file, out, jobs=jobs)
            sys.stdout.flush()  # a reader gone shows here, not at exit
        else:
            with target as out:
                stats = write(args.file, out, jobs=jobs)
    except BrokenPipeError:
        return stdout_gone() if to_stdout else EXIT_BROKEN_PIPE
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else f"{'stdout' if to_stdout else output}: "
        print(f"jaxtop export: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, _Terminated) as exc:
        through = target is None or bool(target.through)
        left = "the output is incomplete" if through else f"{output} left as it was"
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

def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):
        return False


class _TerminalSafe:
    """Writes to a terminal with the recording's control characters shown,
    not obeyed (its strings are the program's: jaxtop.wire.safe_text). CSV's
    own line ends (``\\r\\n``) stay; into a file or a pipe nothing changes."""

    def __init__(self, stream: object) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write("\r\n".join(terminal_safe(part) for part in text.split("\r\n")))  # type: ignore[attr-defined]
        return len(text)

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


class _Terminated(BaseException):
    """SIGTERM during an export: unwinds like Ctrl-C, so no temporary file
    stays (a BaseException, as KeyboardInterrupt: the writers' backstop for
    a record that cannot be exported, ``except Exception``, lets it pass)."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated()
