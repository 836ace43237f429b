"""``jaxtop log``: record a running agent's stream as JSON lines, plain or
gzip-compressed as written."""

from __future__ import annotations

import argparse
import errno
import signal
import sys
import time

from jaxtop.cli.attach import inject_agent
from jaxtop.cli.exits import EXIT_BROKEN_PIPE, EXIT_USAGE
from jaxtop.cli.output import STDOUT_NAMES, stdout_gone
from jaxtop.wire import paths
from jaxtop.wire.paths import SocketDirError


def cmd_log(args: argparse.Namespace) -> int:
    """``jaxtop log PID``: record until the target exits, the duration ends, or SIGINT/SIGTERM;
    returns the exit status."""
    from jaxtop.wire import client

    stop = {"flag": False}

    def on_signal(signum, frame):
        stop["flag"] = True

    client.paths.check_socket_dir()  # SocketDirError: main() says so, exit 2
    if args.inject and not client.paths.socket_path(args.pid).exists():
        if not inject_agent(args.pid, args.inject_timeout, "log"):
            return 1
    on_record = None
    if args.prometheus is not None:
        from jaxtop.wire import prometheus

        state = prometheus.StreamState(job=args.job)
        try:
            prometheus.serve(state, args.prometheus, args.prometheus_addr)
        except (ImportError, OSError) as exc:
            print(f"jaxtop log: cannot serve Prometheus metrics: {exc}", file=sys.stderr)
            return EXIT_USAGE
        on_record = state.update
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    to_stdout = args.output is None or args.output in STDOUT_NAMES
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
        return stdout_gone() if to_stdout else EXIT_BROKEN_PIPE
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
        from jaxtop.wire import protocol

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
    A path ending in ``.gz`` is compressed as it is written. The file is made
    new (:func:`jaxtop.wire.paths.create_output`): a link someone else
    planted at its name is replaced, never written through."""
    if path is not None:
        raw = paths.create_output(path, "wb", buffering=0)
        return _GzipOutput(raw) if path.endswith(".gz") else raw
    try:
        sys.stdout.flush()  # anything printed before comes first
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError) as exc:  # stdout closed (None) or detached
        raise OSError(f"stdout is not open ({exc})") from None
    return open(fd, "wb", buffering=0, closefd=False)
