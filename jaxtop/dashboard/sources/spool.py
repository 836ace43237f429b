"""A live session's spool on disk: compressed segments of the raw lines,
written as they come and copied back out when the session is saved.

Compressing is the spool's whole cost. zlib's level 1 takes ~50 µs a line
of an 8-device sample (11 KB) on a 2-core VM, about as long as decoding the
line and feeding it to the model; ISA-L's gzip (the ``isal`` package, same
format) takes ~14 µs and compresses better (6.7x against 6.1x), so it is
used where it is installed, zlib where not. And a segment compresses on a
writer thread (one for the process, shared by every segment): both let go
of the interpreter while they compress, so a backlog's reading and its
compression run on two cores instead of one after the other. At most
:data:`MAX_PENDING_BYTES` wait to be compressed; past that a write waits
(the reader then goes at the compressor's pace, and memory stays bounded).
"""

from __future__ import annotations

import gzip
import queue
import threading
from typing import IO

from jaxtop.wire import paths


def _gzip_writer(raw: IO[bytes]) -> gzip.GzipFile:
    """Level 1 gzip onto ``raw``: ISA-L's where the ``isal`` package is
    installed (a dependency), zlib's where it is missing."""
    try:
        from isal.igzip import GzipFile
    except ImportError:
        return gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1)
    return GzipFile(fileobj=raw, mode="wb", compresslevel=1)

__all__ = ["MAX_PENDING_BYTES", "Spool", "copy_gzip_lines"]

#: Bytes written to a segment and not yet compressed, at most.
MAX_PENDING_BYTES = 8 << 20


class _Writer:
    """The one thread that compresses every segment's writes, in the order
    they were made (FIFO: a segment's bytes stay in order)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[Spool, bytes]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def put(self, spool: Spool, data: bytes) -> None:
        self._queue.put((spool, data))
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="jaxtop-spool", daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        while True:
            spool, data = self._queue.get()
            spool._compress(data)


_WRITER = _Writer()


class Spool:
    """One spool segment: gzip (level 1, cheap) on a new file made as every
    file jaxtop writes (:func:`jaxtop.wire.paths.create_output`).

    :meth:`write` queues; :meth:`flush`, :meth:`close` and
    :meth:`size_over` see every byte written before them. A write
    that fails on disk (full, gone) ends the segment's writing quietly: the
    spool serves `w`, and the session on screen must not stop for it.
    """

    def __init__(self, path: str) -> None:
        self._raw = paths.create_output(path)
        try:
            self._gz = _gzip_writer(self._raw)
        except BaseException:
            self._raw.close()
            raise
        self._cond = threading.Condition()
        self._pending = 0
        self._held = 0  # bytes given to the compressor since its last flush (their output may still be in it)
        self._closed = False
        self._dropping = False
        self.failed: OSError | ValueError | None = None

    def write(self, data: bytes) -> None:
        """Queue ``data`` (whole lines) for the segment.

        Raises:
            ValueError: the segment is closed.
        """
        if self._closed:
            raise ValueError("spool segment is closed")
        if self.failed is not None or not data:
            return
        with self._cond:
            while self._pending > MAX_PENDING_BYTES and not self._dropping:
                self._cond.wait()
            self._pending += len(data)
        _WRITER.put(self, data)

    def _compress(self, data: bytes) -> None:  # on the writer thread
        try:
            if not self._dropping and self.failed is None:
                self._gz.write(data)
                self._held += len(data)
        except (OSError, ValueError) as exc:
            self.failed = exc
        finally:
            with self._cond:
                self._pending -= len(data)
                self._cond.notify_all()

    def _drain(self, timeout_s: float | None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._pending <= 0, timeout=timeout_s)

    def flush(self) -> None:
        """Every byte written so far compressed and on disk (its complete
        lines readable by :func:`copy_gzip_lines`)."""
        self._drain(None)
        if not self._closed and self.failed is None:
            try:
                self._gz.flush()
            except OSError as exc:
                self.failed = exc
            self._held = 0

    def size_over(self, over: int) -> bool:
        """Whether the segment, with what is queued, is bigger than ``over``
        bytes on disk. The bound first: the file so far, plus what is queued
        and what the compressor holds, uncompressed (ISA-L's holds tens of
        KiB of output before it writes any); only where that reaches
        ``over`` is the queue waited for and the compressor flushed, and the
        file's size read exactly."""
        if self._raw.tell() + self._pending + self._held <= over:
            return False
        self._drain(None)
        if self._closed or self.failed is not None:
            return self._raw.tell() > over
        try:
            self._gz.flush()  # its held output written: the size is exact
        except OSError as exc:
            self.failed = exc
        self._held = 0
        return self._raw.tell() > over

    def close(self, wait: bool = True) -> None:
        """Compress what is queued (``wait``) or drop it (not: a signal
        handler's close, which must not wait on a thread), then close the
        segment and its file."""
        if self._closed:
            return
        if not wait:
            self._dropping = True
        drained = self._drain(None if wait else 0.2)
        self._closed = True
        try:
            if drained:
                self._gz.close()  # after a failure too: it is marked closed, and its trailer's write fails here
        except (OSError, ValueError) as exc:
            self.failed = self.failed or exc
        finally:
            try:
                self._raw.close()
            except OSError as exc:  # its buffer's last write: the disk is full
                self.failed = self.failed or exc


def copy_gzip_lines(src: str, out: IO[bytes], skip: int = 0) -> None:
    """Copy the complete lines of a (possibly still open) gzip spool, after
    the first ``skip`` ones."""
    try:
        with gzip.open(src, "rb") as f:
            while True:
                try:
                    line = f.readline()
                except (EOFError, OSError):
                    break  # the unfinished tail of a stream still being written
                if not line or not line.endswith(b"\n"):
                    break
                if skip:
                    skip -= 1
                    continue
                out.write(line)
    except OSError:
        pass
