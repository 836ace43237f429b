"""Capture fd 2 so transfer-guard lines can be counted, losing no byte.

fd 2 is pointed at a pipe whose read end belongs to a relay child process
(:mod:`jaxtop.probes._relay`). The relay forwards every byte to the original
stderr and reports guard lines back on a second pipe, which the agent reads
through :meth:`StderrCapture.read_reports`. Because the relay is a separate
process it drains the pipe even after the target dies (``os._exit``, abort,
segfault), so the last words of a crashing job still reach the terminal.

The capture keeps a read end of the pipe too, and never reads it while a
relay runs: if the relay dies (the OOM killer, a stray ``kill -9``), the
program's writes to stderr still land in the pipe instead of failing with
EPIPE, and a new relay started on the same pipe forwards them.

The program must not notice any of this:

* When stderr is a terminal, the "pipe" is a pseudo-terminal, so
  ``isatty(2)``, ``os.get_terminal_size(2)`` and colour detection (rich,
  abseil, tqdm) read as before. Its size is copied from the real terminal at
  start and again by the relay on every SIGWINCH (the relay is in the
  program's process group, so the terminal signals it too). A program that
  asks for the size inside its own SIGWINCH handler may, for a moment, still
  read the old size: the relay updates the pseudo-terminal when its own copy
  of the signal arrives. Output processing (``\n`` → ``\r\n``) is left to
  the real terminal and switched off on ours, so bytes are not changed twice.
* When fd 1 and fd 2 are the same stream (``2>&1``, or both the terminal),
  fd 1 goes through the same pipe: the program's writes to both reach the
  relay in the order it made them, and come out in that order. Without this
  the relay's small delay moved stderr lines after later stdout lines. The
  price: on that one stream, a line of the program's *stdout* that is a
  complete JAX log line which jaxtop hides (a transfer-guard line only jaxtop
  asked for) is hidden too, as it would be on stderr.
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import subprocess
import sys
import time
import weakref
from typing import Any, Callable
from jaxtop.probes.forksafe import ForkLock
from jaxtop.probes.stderr_pipe import grow_pipe, nobody_reads, open_terminal_like, same_stream

_RELAY_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_relay.py")

# Every capture made in this process, for the fork handler below.
_captures: "weakref.WeakSet[StderrCapture]" = weakref.WeakSet()


def _forget_in_child() -> None:
    """In a child made by ``os.fork()``: let go of each capture's descriptors.

    The child keeps fd 2 (its writes still reach the relay while one runs)
    but none of the capture's other descriptors: they are the parent's, and
    the child, whose agent is inert, restarts no relay and reads no report.
    Kept, they did harm as long as the child lived: its copy of the spare
    read end kept the fd-2 pipe open after the relay was gone, so that the
    child's writes to stderr waited forever on a full pipe instead of failing
    as they would without jaxtop; its copy of the report pipe's read end,
    never read, kept the relay waiting to hand over its last reports, and
    the relay holds the original stderr; a copy of the relay's own end,
    taken while a relay was being started, hid that relay's death from the
    parent, which then never started another.
    """
    for capture in list(_captures):
        try:
            capture._forget_in_child()
        except Exception:
            pass  # never disturb the child


#: The capture pipe's size where Linux lets us set it (its default is 64 KiB).
#: New relays started after one died, at most, before the capture gives up.
MAX_RESTARTS = 3


def _how_it_ended(code: int | None) -> str:
    if code is None:
        return "closed its pipe"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class CaptureError(RuntimeError):
    """fd 2 could not be captured; stderr is left as it was."""


class StderrCapture:
    """Owns the fd-2 pipe and the relay process.

    Args:
        on_guard_lines: called (from the agent thread) with each distinct
            guard message (the line without its log header) and how many
            lines carried it since the last call, in order of first
            appearance within each read of the relay's pipe. A training
            loop logs a few messages over and over, so the agent's work is
            per distinct message, not per line.
        on_notice: called (from the thread reading reports) with one line of
            text when something happened to the capture that the user
            should hear of: the relay died and was restarted, or the
            capture ended early (then :attr:`active` is already False and
            guard lines reach fd 2 unfiltered).
    """

    def __init__(
        self,
        on_guard_lines: Callable[[str, int], None],
        on_notice: Callable[[str], None] | None = None,
        on_oom_line: Callable[[str], None] | None = None,
        on_guard_stamps: Callable[[bytes], None] | None = None,
    ) -> None:
        self._on_guard_lines = on_guard_lines
        # When and on which thread each guard line was written: the relay's
        # ``T dir,thread,HEX ...`` reports (a run's Unix times as doubles), passed on raw.
        self._on_guard_stamps = on_guard_stamps
        self._on_notice = on_notice
        self._on_oom_line = on_oom_line  # an allocator's out-of-memory line (O <line>)
        #: The first guard-like line the relay could not parse (None: none seen).
        self.unrecognised: str | None = None
        self._token = secrets.token_hex(8)
        self._saved_fd: int | None = None
        self._saved_fd1: int | None = None  # fd 1 as it was, when it shares our pipe
        #: "pty" when fd 2 is a terminal and the program writes to a
        #: pseudo-terminal, "pipe" otherwise (None before start).
        self.kind: str | None = None
        #: True when fd 1 goes through the relay too (it is fd 2's stream).
        self.merged_stdout = False
        self._data_r: int | None = None  # our own read end of the fd-2 pipe
        self._report_r: int | None = None
        # Write end of the relay's kick pipe: a sync writes a byte there so
        # that a relay waiting between batches reads the marker at once.
        self._kick_w: int | None = None
        self._relay: subprocess.Popen | None = None
        # Descriptors made but not yet in their place: start()'s, then the
        # new relay's pipe ends while it is being started. A fork meanwhile
        # must not leave them to the child (see _forget_in_child).
        self._opening: tuple[int, ...] = ()
        self._spawning: tuple[int, ...] = ()
        self._restarts = 0
        self._shown: set[str] = set()
        self._silenced = ""
        self._pending = b""
        self._poller: tuple[int, Any] | None = None  # (fd, select.poll on it)
        self._flowing = False  # the last read found reports: read without polling first
        # The agent thread and sync() both read reports, and a relay's death
        # found by either changes the fds: one lock, re-entrant for stop().
        self._read_lock = ForkLock(reentrant=True)
        self._sync_n = 0
        self._acked = 0
        self.active = False
        self.reason: str | None = None  # why the capture ended early
        _captures.add(self)

    @property
    def relay_pid(self) -> int | None:
        """The running relay's process id."""
        return self._relay.pid if self._relay is not None else None

    @property
    def report_fd(self) -> int | None:
        """The fd the agent's selector waits on."""
        return self._report_r

    def start(self) -> None:
        """Start the relay and point fd 2 at it.

        Raises:
            CaptureError: no usable Python to run the relay, fd 2 is closed,
                or nobody reads it (the program's writes must fail as they
                would without jaxtop).
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
        if nobody_reads(2):
            raise CaptureError("stderr is a pipe nobody reads; left as it is, so writes to it fail as without jaxtop")
        saved = os.dup(2)  # non-inheritable
        self._opening = (saved,)  # listed for a fork meanwhile, as in _spawn
        pty = open_terminal_like(saved) if os.isatty(saved) else None
        if pty is not None:
            data_r, data_w = pty
            self.kind = "pty"
        else:
            data_r, data_w = os.pipe()
            self._opening = (saved, data_r, data_w)
            grow_pipe(data_w)
            self.kind = "pipe"
        self._opening = (saved, data_r, data_w)
        merge = same_stream(1, 2)
        try:
            self._relay, self._report_r = self._spawn(saved, data_r)
        except CaptureError:
            self._opening = ()
            for fd in (saved, data_r, data_w):
                os.close(fd)
            raise
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()  # what the program wrote before goes first
            except Exception:
                pass
        if merge:
            try:
                self._saved_fd1 = os.dup(1)
                os.dup2(data_w, 1)
                self.merged_stdout = True
            except OSError:
                self._saved_fd1 = None
        os.dup2(data_w, 2)  # the new fd 2 is inheritable, as the old one was
        self._saved_fd, self._data_r = saved, data_r
        self._opening = (data_w,)
        os.close(data_w)
        self._opening = ()
        self.active = True

    def _spawn(self, saved: int, data_r: int) -> tuple[subprocess.Popen, int]:
        """A relay reading ``data_r`` and writing to ``saved``; with its report fd."""
        # Every descriptor is first recorded, then closed, never the other
        # way round: a fork in between must find each open one listed (the
        # child closes its copies: _forget_in_child) and no closed one, whose
        # number another thread may already have been given.
        report_r, report_w = os.pipe()
        self._spawning = (report_r, report_w)
        kick_r, kick_w = os.pipe()
        self._spawning = (report_r, report_w, kick_r, kick_w)
        visibility = ",".join(sorted(self._shown)) + "|" + self._silenced
        try:
            # A script path, not -m or -c: sys.path[0] is then the script's
            # own directory (jaxtop's probes, where `oom` is found), never the
            # program's working directory; -E and -s keep PYTHONPATH and user
            # site-packages out, -S site's .pth files. Not -I: that would drop
            # the script's directory too.
            relay = subprocess.Popen(
                [sys.executable, "-S", "-E", "-s", _RELAY_PATH, str(saved), str(report_w), self._token, visibility,
                 self.kind or "pipe", str(kick_r)],
                stdin=data_r,
                stdout=subprocess.DEVNULL,
                stderr=saved,
                pass_fds=(saved, report_w, kick_r),
                close_fds=True,
                start_new_session=False,
            )
        except OSError as exc:
            self._spawning = ()
            for fd in (report_r, report_w, kick_r, kick_w):
                os.close(fd)
            raise CaptureError(f"cannot start the stderr relay: {exc}") from None
        self._spawning = (report_r, kick_r, kick_w)
        os.close(report_w)
        self._spawning = (report_r, kick_w)
        os.close(kick_r)
        os.set_blocking(report_r, False)
        os.set_blocking(kick_w, False)
        old, self._kick_w = self._kick_w, kick_w
        self._report_r = report_r  # (the caller sets it too)
        self._spawning = ()
        if old is not None:
            _close_quietly(old)
        return relay, report_r

    def _write_marker(self, verb: str, arg: str) -> None:
        marker = f"\x00jaxtop:{self._token}:{verb} {arg}\x00".encode()
        with self._read_lock:  # never onto the original stderr, once given back
            if self.active:
                os.write(2, marker)  # one write under PIPE_BUF: atomic

    def set_visibility(self, shown: set[str], silenced: str) -> None:
        """Tell the relay which guard directions the user sees and which
        log severities they silenced. Ordered with the stream itself."""
        self._shown, self._silenced = set(shown), silenced  # for a relay started later
        if self.active:
            self._write_marker("show", ",".join(sorted(shown)) + "|" + silenced)

    def wait_report(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` until the relay has a report to read
        (not read here: the agent's next tick reads it). False when the
        relay is gone or nothing came."""
        fd = self._report_r
        if fd is None:
            return False
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        try:
            return bool(poller.poll(max(0, int(timeout_s * 1000))))
        except OSError:
            return False

    def read_reports(self) -> None:
        """Consume whatever the relay reported so far (non-blocking)."""
        with self._read_lock:
            self._read_reports()

    def _read_reports(self) -> None:
        fd = self._report_r
        if fd is None:
            return
        # A quiet program's ticks find nothing to read. Asking first with
        # poll(0) costs ~9 us on a 2-core VM beside a busy jitted loop; a read
        # that fails with EAGAIN raises BlockingIOError, ~45 us with cold
        # caches, ten times a second. poll reports a closed relay (POLLHUP)
        # as ready too. While the relay reports every tick (transfers flow)
        # the read is tried at once: the poll would say yes.
        if not self._flowing:
            if self._poller is None or self._poller[0] != fd:
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                self._poller = (fd, poller)
            try:
                if not self._poller[1].poll(0):
                    return
            except OSError:
                pass  # let the read below say what is wrong
        self._flowing = True
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                self._flowing = False  # nothing this time: poll first again
                break
            except OSError:
                chunk = b""
            if not chunk:
                # The relay closed its end: it is gone (it only exits at EOF
                # of the fd-2 pipe, which stop() brings about).
                self._close_reports()
                if self.active:
                    self._relay_gone()
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
            elif line.startswith(b"T "):  # T dir,thread,HEX ...: when and where the lines above were written
                if self._on_guard_stamps is not None:
                    self._on_guard_stamps(line[2:])
            elif line.startswith(b"U "):  # U <line>: guard-like text in a form not recognised
                if self.unrecognised is None:
                    self.unrecognised = line[2:].decode("utf-8", "replace")
                    if self._on_notice is not None:
                        self._on_notice("a transfer-guard line in a form jaxtop does not recognise reached stderr; "
                                        f"transfer counts are n/a: {self.unrecognised[:200]}")
            elif line.startswith(b"O "):  # O <line>: an out-of-memory line the relay passed on
                if self._on_oom_line is not None:
                    self._on_oom_line(line[2:].decode("utf-8", "replace"))
            elif line.startswith(b"S "):
                try:
                    self._acked = max(self._acked, int(line[2:]))
                except ValueError:
                    pass
            elif line == b"B" and self.active:
                # The original stderr's reader went away. Give the program
                # its stderr back, so its next write fails as it would have
                # without jaxtop (a program run with `2>&1 | head` must see
                # the EPIPE, and exit as it would).
                self._end_early(
                    "stderr's reader went away (a closed pipe); jaxtop gave the program its stderr back, "
                    "so its writes fail as they would without jaxtop, and stopped counting transfers"
                )

    def _relay_gone(self) -> None:
        """The relay died while fd 2 still points at its pipe: start another
        on the same pipe. Meanwhile the program's writes wait in the pipe
        (our own read end keeps it open, so they did not fail)."""
        old = self._relay
        code = None
        if old is not None:
            try:
                code = old.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                old.kill()  # it closed its report pipe but lives on: it cannot report
                code = old.wait()
        how = f"stderr relay (pid {old.pid if old else '?'}) {_how_it_ended(code)}"
        # Its last report may have been cut short: what it completed still counts.
        self._pending = self._pending[: self._pending.rfind(b"\n") + 1]
        if self._restarts >= MAX_RESTARTS:
            self._end_early(f"{how}, after {self._restarts} restarts; jaxtop stopped capturing stderr "
                            "and counting transfers")
            return
        self._restarts += 1
        try:
            self._relay, self._report_r = self._spawn(self._saved_fd, self._data_r)
        except CaptureError as exc:
            self._end_early(f"{how}; {exc}; jaxtop stopped capturing stderr and counting transfers")
            return
        self._notice(f"{how}; restarted it as pid {self._relay.pid}: stderr goes on as before. What it had "
                     "read but not yet passed on (usually nothing) is lost, and its guard lines not counted")

    def _notice(self, text: str) -> None:
        if self._on_notice is not None:
            try:
                self._on_notice(text)
            except Exception:
                pass

    def _end_early(self, reason: str) -> None:
        """Give fd 2 back now, for good, and say why."""
        self.reason = reason
        self._release_fd2()
        self._notice(reason)

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
        kick = self._kick_w
        if kick is not None:
            try:
                os.write(kick, b"k")  # a full kick pipe already says "now"
            except OSError:
                pass
        deadline = time.monotonic() + timeout_s
        while self._acked < want:
            fd = self._report_r  # another thread may replace it (a new relay)
            left = deadline - time.monotonic()
            if fd is None or left <= 0:
                return False
            try:
                select.select([fd], [], [], min(left, 0.05))
            except (OSError, ValueError):
                pass
            self.read_reports()
        return True

    def _close_reports(self) -> None:
        # Forgotten before closed, as in _spawn: a fork in between must not
        # have the child close a number that is no longer ours.
        kick, self._kick_w = self._kick_w, None
        if kick is not None:
            _close_quietly(kick)
        report, self._report_r = self._report_r, None
        if report is not None:
            _close_quietly(report)

    def _forget_in_child(self) -> None:
        """This copy is a fork child's (see :func:`_forget_in_child`): close
        every descriptor it holds but fd 2 (and fd 1 where it shares the
        pipe), and never act on the parent's relay. fd 2 stays the pipe: the
        child's writes reach the relay as long as it runs, and fail (EPIPE)
        once no process reads the pipe any more."""
        fds = {self._data_r, self._report_r, self._kick_w, self._saved_fd, self._saved_fd1,
               *self._opening, *self._spawning}
        self._data_r = self._report_r = self._kick_w = self._saved_fd = self._saved_fd1 = None
        self._opening = self._spawning = ()
        self._poller = None
        # Never gives fd 2 back, writes no marker, waits for no sync, and so
        # never waits for the relay (the parent's child) nor starts one.
        # _relay stays: dropped here, its Popen's finaliser would run inside
        # os.fork() and warn (a ResourceWarning) through sys.stderr, whose
        # lock another thread of the parent may have held at the fork.
        self.active = False
        self.reason = "a forked child's copy of the capture: the relay and its reports are the parent's"
        for fd in fds:
            if fd is not None:
                _close_quietly(fd)

    def _release_fd2(self) -> None:
        """Point fd 2 at the original stderr again and close our pipe ends.

        A relay still running sees EOF once every other writer (children
        that inherited fd 2) is gone, and exits after forwarding the rest.
        Without one, what is still in the pipe is forwarded from here.
        """
        with self._read_lock:
            if not self.active:
                return
            self.active = False
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            saved, data_r, saved1 = self._saved_fd, self._data_r, self._saved_fd1
            self._saved_fd = self._data_r = self._saved_fd1 = None
            if saved1 is not None:
                os.dup2(saved1, 1)
                os.close(saved1)
                self.merged_stdout = False
            if saved is not None:
                os.dup2(saved, 2)
            relay = self._relay
            if data_r is not None:
                if relay is None or relay.poll() is not None:
                    self._drain_here(data_r, saved)
                os.close(data_r)
            if saved is not None:
                os.close(saved)

    def _drain_here(self, data_r: int, out_fd: int | None) -> None:
        """Forward what waits in the pipe, without a relay (it died): with
        the relay's own rules, so jaxtop's guard lines stay hidden."""
        from jaxtop.probes._relay import Relay

        relay = Relay(out_fd, None, self._token.encode(), self._shown)
        relay.set_visibility(self._shown, self._silenced.encode())
        counts: dict[bytes, int] = {}

        def keep_counts() -> None:  # no report pipe: count here instead
            for message, n in relay.counts.items():
                counts[message] = counts.get(message, 0) + n
            relay.counts = {}

        relay.report_counts = keep_counts
        os.set_blocking(data_r, False)
        while True:
            try:
                data = os.read(data_r, 65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            if not data:
                break
            relay.feed(data)
        relay.finish()
        for message, n in counts.items():
            self._on_guard_lines(message.decode("utf-8", "replace"), n)

    def stop(self) -> None:
        """Give fd 2 back to the original stderr; the relay drains and exits."""
        if not self.active:
            self._close_reports()
            return
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()  # into the pipe, before the sync marker: forwarded in order
            except Exception:
                pass
        try:
            # From here the relay forwards each read at once: what the program
            # writes between the sync and the fds' return is out before its
            # next write lands directly (a program writing all the while, as
            # at a detach, would otherwise see lines reordered).
            self._write_marker("final", "")
        except OSError:
            pass
        self.sync(0.5)  # so bytes written before stop come out before later ones
        with self._read_lock:
            self._release_fd2()
            self.read_reports()
            self._close_reports()
        relay = self._relay
        if relay is not None:
            try:
                relay.wait(timeout=0.5)  # exits at EOF unless a child holds fd 2
            except subprocess.TimeoutExpired:
                pass  # keeps draining for the children still writing


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
