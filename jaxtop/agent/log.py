"""The agent's recording: the stream, written to a JSON-lines file.

Samples are written together once a second: a write is a system call that
lets the GIL go, and takes it back from the user's thread. Any other record
(an OOM census, the exit) goes out at once, with the samples before it. A
file named ``*.gz`` is compressed as written (about 20 times smaller) and
flushed to a whole gzip member each second, so it reads up to the last
second if the program is killed.

A failed write (a full disk, a file system gone) stops the recording, never
the program: the file is cut back to its last whole line, one notice says
so, and the live stream goes on.

Standard library only (the agent imports it inside the user's job).
"""

from __future__ import annotations

import errno
import os
import stat
import time
from typing import Any, Callable

from jaxtop.wire import paths, protocol

__all__ = ["LOG_FLUSH_S", "RecordLog"]

#: Seconds of samples the log holds before writing them (other records go at once).
LOG_FLUSH_S = 1.0


class RecordLog:
    """One recording file, open from construction to :meth:`close`.

    Args:
        path: the file (made new, replacing one that was there, or a device
            written through: :func:`jaxtop.wire.paths.create_output`; gzip
            when it ends in ``.gz``).
        on_failure: called once with a one-line message when a write fails.

    Raises:
        OSError: the file cannot be opened.
    """

    def __init__(self, path: str, on_failure: Callable[[str], None]) -> None:
        self.path = path
        self._on_failure = on_failure
        # Unbuffered: each line goes to the file in whole writes of our own,
        # so a failed write leaves no buffer behind for a later flush (or the
        # garbage collector) to fail on again.
        self.file: Any = paths.create_output(path, "wb", buffering=0)
        self._gz = protocol.GzipLines() if path.endswith(".gz") else None
        self._pending: list[bytes] = []  # samples not written yet (at most LOG_FLUSH_S of them)
        self._flush_t = time.monotonic()
        self.bytes = 0  # bytes of whole lines in the file so far
        self.lines_bytes = 0  # bytes of lines logged (before compression)

    @property
    def open(self) -> bool:
        return self.file is not None

    def add(self, line: bytes) -> None:
        """Hold a sample's line until the next write."""
        if self.file is not None:
            self._pending.append(line)

    def write(self, line: bytes = b"", urgent: bool = False, final: bool = False) -> None:
        """Log ``line``: at once when ``urgent`` (with the samples before it),
        else with the others of its second. ``final``: the last write."""
        if self.file is None:
            return
        if line:
            self._pending.append(line)
        mono = time.monotonic()
        if urgent or final or mono - self._flush_t >= LOG_FLUSH_S:
            self._flush_t = mono
            data = b"".join(self._pending)
            self._pending.clear()
            self._write(data, final)

    def close(self) -> None:
        """Write what is held (and the gzip trailer), close the file."""
        if self.file is not None:
            self.write(final=True)
        log, self.file = self.file, None
        self._gz = None
        if log is not None:
            try:
                log.close()
            except (OSError, ValueError):
                pass

    def close_in_child(self) -> None:
        """In a fork child: close this copy of the descriptor, write nothing."""
        log, self.file = self.file, None
        self._pending = []
        if log is not None:
            try:
                log.close()  # unbuffered: nothing is flushed, the fd is closed
            except (OSError, ValueError):
                pass

    def _write(self, data: bytes, final: bool) -> None:
        log = self.file
        lines = data
        if self._gz is not None:
            data = self._gz.compress(data) + (self._gz.finish() if final else self._gz.sync())
            if final:
                self._gz = None
        written = 0
        try:
            view = memoryview(data)
            while view:
                n = log.write(view)
                if not n:
                    raise OSError(errno.EIO, "the log file took no bytes")
                view = view[n:]
                written += n
        except (OSError, ValueError) as exc:
            if self._gz is None:  # keep the whole lines of a batch cut short
                self.bytes += data.rfind(b"\n", 0, written) + 1
            self._failed(exc)
        else:
            self.bytes += len(data)
            self.lines_bytes += len(lines)

    def _failed(self, exc: BaseException) -> None:
        """Stop recording after a failed write; say so once, never raise."""
        log, self.file = self.file, None
        self._pending = []
        try:
            # A write cut short left part of a line: cut the file back to
            # the last whole one, so that what was recorded reads cleanly.
            if stat.S_ISREG(os.fstat(log.fileno()).st_mode):
                os.ftruncate(log.fileno(), self.bytes)
        except (OSError, ValueError):
            pass
        try:
            log.close()
        except (OSError, ValueError):
            pass
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        self._on_failure(f"jaxtop: cannot write the log {self.path}: {reason}; "
                         f"recording stopped after {self.bytes} bytes (the program and the live stream go on)")
