"""Capture fd 2 so transfer-guard lines can be counted, losing no byte.

fd 2 is pointed at a pipe whose read end belongs to a relay child process
(:mod:`jaxtop.probes._relay`). The relay forwards every byte to the original
stderr and reports guard lines back on a second pipe, which the agent reads
through :meth:`StderrCapture.read_reports`. Because the relay is a separate
process it drains the pipe even after the target dies (``os._exit``, abort,
segfault), so the last words of a crashing job still reach the terminal.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time
from typing import Callable

_RELAY_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_relay.py")


#: The capture pipe's size where Linux lets us set it (its default is 64 KiB).
#: The relay sleeps up to BATCH_S after a read that held guard lines, so it
#: wakes less often; the pipe must hold what the program writes meanwhile, or
#: the program's write to stderr would wait for the relay.
PIPE_BYTES = 1 << 20


def _grow_pipe(fd: int) -> None:
    try:
        import fcntl

        setsize = getattr(fcntl, "F_SETPIPE_SZ", None)
        if setsize is not None:
            fcntl.fcntl(fd, setsize, PIPE_BYTES)
    except OSError:
        pass  # over the system's limit: the default size, and the relay reads sooner


class CaptureError(RuntimeError):
    """fd 2 could not be captured; stderr is left as it was."""


class StderrCapture:
    """Owns the fd-2 pipe and the relay process.

    Args:
        on_guard_lines: called (from the agent thread) with each distinct
            guard message (the line without its abseil header) and how many
            lines carried it since the last call, in order of first
            appearance within each read of the relay's pipe. A training
            loop logs a few messages over and over, so the agent's work is
            per distinct message, not per line.
    """

    def __init__(self, on_guard_lines: Callable[[str, int], None]) -> None:
        self._on_guard_lines = on_guard_lines
        self._token = secrets.token_hex(8)
        self._saved_fd: int | None = None
        self._report_r: int | None = None
        self._relay: subprocess.Popen | None = None
        self._pending = b""
        self._read_lock = threading.Lock()  # the agent thread and sync() both read
        self._sync_n = 0
        self._acked = 0
        self.active = False

    @property
    def report_fd(self) -> int | None:
        """The fd the agent's selector waits on."""
        return self._report_r

    def start(self) -> None:
        """Start the relay and point fd 2 at it.

        Raises:
            CaptureError: no usable Python to run the relay, or fd 2 is closed.
        """
        if self.active:
            return
        exe = sys.executable
        if not exe or not os.access(exe, os.X_OK):
            raise CaptureError("sys.executable is not a runnable Python; cannot start the stderr relay")
        try:
            os.fstat(2)
        except OSError:
            raise CaptureError("fd 2 is closed") from None
        saved = os.dup(2)  # non-inheritable
        data_r, data_w = os.pipe()
        _grow_pipe(data_w)
        report_r, report_w = os.pipe()
        try:
            relay = subprocess.Popen(
                [exe, "-S", "-E", "-s", _RELAY_PATH, str(saved), str(report_w), self._token, ""],
                stdin=data_r,
                stdout=subprocess.DEVNULL,
                stderr=saved,
                pass_fds=(saved, report_w),
                close_fds=True,
                start_new_session=False,
            )
        except OSError as exc:
            for fd in (saved, data_r, data_w, report_r, report_w):
                os.close(fd)
            raise CaptureError(f"cannot start the stderr relay: {exc}") from None
        os.close(data_r)
        os.close(report_w)
        try:
            sys.stderr.flush()
        except Exception:
            pass
        os.dup2(data_w, 2)  # the new fd 2 is inheritable, as the old one was
        os.close(data_w)
        os.set_blocking(report_r, False)
        self._saved_fd, self._report_r, self._relay = saved, report_r, relay
        self.active = True

    def _write_marker(self, verb: str, arg: str) -> None:
        marker = f"\x00jaxtop:{self._token}:{verb} {arg}\x00".encode()
        os.write(2, marker)  # one write under PIPE_BUF: atomic

    def set_visibility(self, shown: set[str], silenced: str) -> None:
        """Tell the relay which guard directions the user sees and which
        abseil severities they silenced. Ordered with the stream itself."""
        if self.active:
            self._write_marker("show", ",".join(sorted(shown)) + "|" + silenced)

    def read_reports(self) -> None:
        """Consume whatever the relay reported so far (non-blocking)."""
        with self._read_lock:
            self._read_reports()

    def _read_reports(self) -> None:
        fd = self._report_r
        if fd is None:
            return
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                # The relay is gone: nothing more will be reported.
                self._close_reports()
                break
            self._pending += chunk
            if len(chunk) < 65536:
                break  # drained for now: spare the read that would say so
        if b"\n" not in self._pending:
            return
        *lines, self._pending = self._pending.split(b"\n")
        # In stream order, so a sync acknowledged here has seen every guard
        # line written before its marker.
        for line in lines:
            if line.startswith(b"G "):  # G <n> <message>: the relay counted them
                n, _, message = line[2:].partition(b" ")
                try:
                    count = int(n)
                except ValueError:
                    continue
                self._on_guard_lines(message.decode("utf-8", "replace"), count)
            elif line.startswith(b"S "):
                try:
                    self._acked = max(self._acked, int(line[2:]))
                except ValueError:
                    pass

    def sync(self, timeout_s: float = 1.0) -> bool:
        """Wait until every guard line written to fd 2 so far was reported.

        Returns:
            True when the relay acknowledged in time.
        """
        if not self.active or self._report_r is None:
            return False
        with self._read_lock:
            self._sync_n += 1
            want = self._sync_n
        try:
            self._write_marker("sync", str(want))
        except OSError:
            return False
        deadline = time.monotonic() + timeout_s
        import select

        while self._acked < want and self._report_r is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            select.select([self._report_r], [], [], min(left, 0.05))
            self.read_reports()
        return self._acked >= want

    def _close_reports(self) -> None:
        if self._report_r is not None:
            try:
                os.close(self._report_r)
            except OSError:
                pass
            self._report_r = None

    def stop(self) -> None:
        """Give fd 2 back to the original stderr; the relay drains and exits."""
        if not self.active:
            return
        self.sync(0.5)  # so bytes written before stop come out before later ones
        try:
            sys.stderr.flush()
        except Exception:
            pass
        if self._saved_fd is not None:
            os.dup2(self._saved_fd, 2)
            os.close(self._saved_fd)
            self._saved_fd = None
        self.read_reports()
        self._close_reports()
        self.active = False
        relay = self._relay
        if relay is not None:
            try:
                relay.wait(timeout=0.5)  # exits at EOF unless a child holds fd 2
            except subprocess.TimeoutExpired:
                pass  # keeps draining for the children still writing
