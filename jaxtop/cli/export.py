"""``jaxtop export``: a recording as CSV or a Perfetto trace, written whole
or not at all."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from jaxtop.cli.exits import EXIT_BROKEN_PIPE, EXIT_TERMINATED, EXIT_USAGE
from jaxtop.cli.output import STDOUT_NAMES, stdout_gone


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
        return stdout_gone() if to_stdout else EXIT_BROKEN_PIPE
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

class _Terminated(Exception):
    """SIGTERM during an export: unwinds like Ctrl-C, so no temporary file stays."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated()


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
