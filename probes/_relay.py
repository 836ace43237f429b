"""The stderr relay: a tiny child process that owns the read end of fd 2.

It is started by :mod:`jaxtop.probes.stderr_capture` as
``python -S -E _relay.py ORIG_FD REPORT_FD TOKEN SHOWN|SILENCED KIND``, with
the capture pipe as its stdin (KIND ``pty`` when that is a pseudo-terminal's
master standing in for the terminal ORIG_FD: the relay then keeps its size
equal to the real one's). It forwards every byte the target writes to stderr
to the original stderr, unchanged and in order, except transfer-guard lines
that only jaxtop asked for (directions not in SHOWN, e.g. ``h2d,d2d``) and
other log lines of the severities in SILENCED (e.g. ``IW``). Every guard line
is reported to the agent on REPORT_FD, counted per distinct message, as
``G <n> <message>`` (the line without its log header), and when and on
which thread each was written as ``T dir,thread,HEX`` (Unix times as
doubles, a run of lines of one thread per token); sync markers written
by the agent are removed from the stream and acknowledged as ``S <n>``. When
writing to the original stderr fails (its reader went away) it reports
``B`` once and goes on draining, so the capture can give the program its
stderr back and the program's own writes fail as they would without jaxtop.

Guard lines are found wherever they start, not only at line starts: jaxlib
writes each log line with one ``write()`` (atomic on a pipe below PIPE_BUF),
so a guard line lands whole, but possibly right after a partial line of the
program's own, e.g. a progress bar redrawn with ``\\r`` that has not written
its newline yet. Two header forms are recognised: abseil's
``W1202 18:34:30.919532    2146 guard_lib.cc:125] `` (jaxlib 0.7 and later)
and TSL's ``2026-12-03 19:09:21.852989: W external/xla/...cc:108] `` (older
jaxlib, logging through XLA/TSL).

Why a process and not a thread: a reader thread dies with the target, so the
last lines before ``os._exit``, an abort or a segfault (OOM reports, XLA
fatal checks) were lost. This process drains the pipe to EOF, which only
comes when every writer (the target and any children holding fd 2) is gone.

Stdlib only and started without ``site`` so it costs a few milliseconds.
"""

import errno
import os
import re
import select
import signal
import sys
import time
from array import array
from itertools import groupby
from operator import itemgetter

# Out-of-memory lines (XLA's allocator on GPU) are reported to the agent as
# "O <line>", so it takes a census even when the program catches the error.
if __package__:
    from ._relay_lines import (
        GUARD_RE, LINE_START_GUARD_RE, GUARD_AT_END_RE, LOG_LINE_RE, UNKNOWN_GUARD_RE,
        UNKNOWN_REPORTS_MAX, STAMP_RE, LINE_START_STAMP_RE, _STAMP_DIRECTION, STAMPS_PER_READ_MAX, _GUARD_MARK,
        _HEADER_END, PARTIAL_GUARD_RE, PARTIAL_LOG_RE, PARTIAL_HEADER_MAX, PARTIAL_MAX,
        DIRECTION_KEYS, LINE_START_ABSEIL_GUARD_RE, WORDS_DIRECTION)
    from .oom import OomLineScanner
else:  # run as a script (python -S): this file's directory is sys.path[0]
    from _relay_lines import (
        GUARD_RE, LINE_START_GUARD_RE, GUARD_AT_END_RE, LOG_LINE_RE, UNKNOWN_GUARD_RE,
        UNKNOWN_REPORTS_MAX, STAMP_RE, LINE_START_STAMP_RE, _STAMP_DIRECTION, STAMPS_PER_READ_MAX, _GUARD_MARK,
        _HEADER_END, PARTIAL_GUARD_RE, PARTIAL_LOG_RE, PARTIAL_HEADER_MAX, PARTIAL_MAX,
        DIRECTION_KEYS, LINE_START_ABSEIL_GUARD_RE, WORDS_DIRECTION)
    from oom import OomLineScanner

#: A stamp's run: minute, thread, the direction's letters (see ``stamp``);
#: and its seconds.
_RUN_KEY = itemgetter(0, 2, 3)
_SECONDS = itemgetter(1)

HOLD_S = 0.05
# After a read that held guard lines, wait this long before the next read so
# the next one takes a batch: jax writes each log line with its own write(),
# and waking per line cost ~55 us of CPU per implicit transfer. Every wake-up
# still costs ~150 us of CPU on a small VM, whatever it then does, so the
# relay wakes at most as often as the agent samples (0.1 s). The user's own
# bytes are still forwarded in order, at most this much later. The longer
# wait only when the pipe holds 1 MiB (Linux, set by the capture): what the
# program writes meanwhile must fit, or its write() would wait for us.
BATCH_S = 0.02
BATCH_BIG_PIPE_S = 0.1
BATCH_PTY_S = 0.004
BIG_PIPE_BYTES = 1 << 20
READ_BYTES = 65536


def batch_seconds(fd=0):
    if os.isatty(fd):
        # A pseudo-terminal holds about 18 KiB, not a pipe's 1 MiB: a short
        # wait, so the program's writes seldom find it full.
        return BATCH_PTY_S
    try:
        import fcntl

        getsize = getattr(fcntl, "F_GETPIPE_SZ", None)
        if getsize is not None and fcntl.fcntl(fd, getsize) >= BIG_PIPE_BYTES:
            return BATCH_BIG_PIPE_S
    except (ImportError, OSError):
        pass
    return BATCH_S


REPORT_BACKLOG_MAX = 64 * 1024 * 1024


class Relay:
    """The relay's state between reads: what to forward, count and hold.

    Args:
        out_fd: the original stderr.
        report_fd: where ``G``/``S`` reports go (None: nowhere).
        token: the agent's marker token.
        passed: guard directions (``h2d``, ``d2d``, ``d2h``) the user sees.
    """

    def __init__(self, out_fd, report_fd, token, passed):
        self.out_fd = out_fd
        self.report_fd = report_fd
        self.mark_prefix = b"\x00jaxtop:" + token + b":"
        self.mark_re = re.compile(re.escape(self.mark_prefix) + rb"(sync|show|final) ([^\x00\n]*)\x00")
        #: The capture is about to give the program its fds back: forward at
        #: once from now on (no batching wait), so that what is still in the
        #: pipe then comes out before the program's next direct write.
        self.final = False
        self.set_visibility(passed, b"")
        self.oom = OomLineScanner()
        self.unknown_reports = 0
        self.counts = {}  # guard message -> lines since the last report
        self.stamps = []  # [b"dir,thread", array of Unix times] per run of one direction and thread
        self.stamp_count = 0  # guard lines stamped since the last report
        self.stamp_minutes = {}  # b"HH:MM:" -> its Unix time (this read's)
        # Bytes not judged yet: the end of the last read when it may be the
        # start of a log line or of a marker.
        self.buf = b""
        self.report_backlog = bytearray()
        self.out_broken = False
        self.out = bytearray()  # forwarded bytes not yet written
        self.saw_guard = False  # the last feed() held a guard line

    # -- output ---------------------------------------------------------------
    # Bytes to forward and reports are gathered per read and written with one
    # write() each at the end of it, not one per line: the per-line syscalls
    # were most of the relay's cost under a stream of guard lines.
    def forward(self, data):
        if not self.out_broken:
            self.out += data

    def flush_out(self):
        data, self.out = self.out, bytearray()
        if self.out_broken or not data:
            return
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.out_fd, view)
            except InterruptedError:
                continue
            except BlockingIOError:
                # Someone else set the shared terminal non-blocking: wait as a
                # blocking write would have, rather than drop the bytes.
                try:
                    select.select([], [self.out_fd], [], 1.0)
                except (InterruptedError, ValueError, OSError):
                    pass
                continue
            except OSError:
                # The terminal is gone. Keep draining so the target never sees
                # a full pipe, but there is nowhere to write; the capture
                # hears of it and gives the program its stderr back.
                self.out_broken = True
                self.report(b"B\n")
                return
            view = view[n:]

    def report(self, data):
        self.report_counts()  # what came before data in the stream goes first
        if self.report_fd is None:
            return
        if len(self.report_backlog) < REPORT_BACKLOG_MAX:
            self.report_backlog += data

    def stamp(self, data):
        """Note when and on which thread each guard line in ``data`` was
        written, for the agent to tell which call of the program made it.
        The log header gives the local time of day to the microsecond; the
        relay, reading the line at most a batch later, knows the day: each
        line becomes a Unix time here, and a run of lines of one direction
        and thread is reported as ``dir,thread,HEX`` (their times as
        native doubles, in hex), which the agent reads with one
        ``unhexlify``, no parsing per line in the program's process.
        Thread 0 where the header names none.

        Every guard line holds the mark once: when abseil's header at line
        starts accounts for every mark in ``data`` (the rule), those are
        all its stamps, found by the anchored scan; else (a guard line after
        a partial line of the program's, TSL's header, the program's own
        text holding the mark) the general one runs."""
        if STAMPS_PER_READ_MAX <= self.stamp_count:
            return
        found = LINE_START_STAMP_RE.findall(data)
        if len(found) != data.count(_GUARD_MARK):
            found = [(w[:6], w[6:], m[1] or m[3] or b"0", _STAMP_DIRECTION.get((m[4], m[5])))
                     for m in STAMP_RE.findall(data) for w in (m[0] or m[2],)]
        else:
            found = [(m[0], m[1], m[2], _STAMP_DIRECTION.get((m[3], m[4]))) for m in found]
        self.file_stamps(found)

    def file_stamps(self, found):
        """File ``(HH:MM:, seconds, thread, direction code)`` per guard line
        (direction None: no transfer's) into the report's runs."""
        left = STAMPS_PER_READ_MAX - self.stamp_count
        if left <= 0:
            return
        if len(found) > left:
            found = found[:left]
        stamps = self.stamps
        minutes = self.stamp_minutes
        run = stamps[-1] if stamps else None
        # Lines come in runs of one minute, thread and direction (a step's
        # transfers): each run's times are made in C (map), not line by
        # line in Python (which was two thirds of the relay's cost a line).
        for (minute, thread, direction), lines in groupby(found, _RUN_KEY):
            if direction is None:
                continue
            base = minutes.get(minute)
            if base is None:
                base = minutes[minute] = minute_start(minute)
            head = direction + b"," + thread
            if run is None or run[0] != head:
                run = [head, array("d")]
                stamps.append(run)
            times = run[1]
            before = len(times)
            times.extend(map(base.__add__, map(float, map(_SECONDS, lines))))
            self.stamp_count += len(times) - before

    def count(self, messages):
        """Count guard lines by message until the next report."""
        if messages:
            self.saw_guard = True
        counts = self.counts
        for message in messages:
            counts[message] = counts.get(message, 0) + 1

    def report_counts(self):
        """``G <n> <message>`` per distinct guard message since the last
        report, in order of first appearance. A training loop logs the same
        few messages over and over, so one read of the pipe turns hundreds
        of lines into a handful of reports."""
        counts, self.counts = self.counts, {}
        stamps, self.stamps = self.stamps, []
        self.stamp_count = 0
        self.stamp_minutes = {}
        if not counts or self.report_fd is None:
            return
        if len(self.report_backlog) < REPORT_BACKLOG_MAX:
            self.report_backlog += b"".join(b"G %d %s\n" % (n, message) for message, n in counts.items())
            if stamps:
                self.report_backlog += b"T " + b" ".join(
                    head + b"," + times.tobytes().hex().encode() for head, times in stamps) + b"\n"

    def flush_reports(self):
        while self.report_backlog and self.report_fd is not None:
            try:
                n = os.write(self.report_fd, self.report_backlog)
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            except OSError:
                # The agent stopped listening (detached or exited).
                os.close(self.report_fd)
                self.report_fd = None
                self.report_backlog.clear()
                return
            del self.report_backlog[:n]

    # -- judging --------------------------------------------------------------
    def set_visibility(self, passed, silenced):
        """The guard directions the user sees and the log severities they
        silenced (other log lines of those are dropped too)."""
        self.passed = passed
        self.silenced = silenced
        self.keep_all = not passed and not silenced

    def marker(self, match):
        """Act on one of the agent's markers, in its place in the stream."""
        verb, arg = match.group(1), match.group(2)
        if verb == b"final":
            self.final = True
        elif verb == b"sync":
            self.report(b"S " + arg + b"\n")
        else:  # "show h2d,d2d|IW": what the user sees, what they silenced
            shown, _, silenced = arg.decode("ascii", "replace").partition("|")
            self.set_visibility(set(filter(None, shown.split(","))), silenced.encode())

    def partial_marker_at(self, data):
        """Index where an incomplete sync marker starts at the end, or len."""
        i = data.rfind(b"\x00")
        while i >= 0:
            tail = data[i:]
            if self.mark_prefix.startswith(tail) or (
                tail.startswith(self.mark_prefix) and len(tail) < 256
            ):
                return i
            i = data.rfind(b"\x00", 0, i)
        return len(data)

    def report_unknown(self, data):
        """Guard text left after every line of a known form was taken out:
        a log format this relay does not know. The bytes still go to the
        user; the agent is told, so it says n/a instead of counting 0."""
        for match in UNKNOWN_GUARD_RE.finditer(data):
            if self.unknown_reports >= UNKNOWN_REPORTS_MAX:
                break
            self.unknown_reports += 1
            self.report(b"U " + match.group(0)[:512] + b"\n")

    def block(self, data):
        """Judge marker-free bytes in which every log line is whole.

        The usual case (the user's guard is off, nothing silenced) takes one
        regex split for guard lines at line starts, and a second scan only
        when what is left still holds a guard message: a guard line that
        came in after a partial line of the program's.
        """
        if self.keep_all:
            if _GUARD_MARK not in data:
                self.forward(data)
                return
            # The rule: every guard line whole, with abseil's header, at a
            # line's start. One scan then gives the stamps, the messages and
            # what is left for the user.
            parts = LINE_START_ABSEIL_GUARD_RE.split(data)
            if len(parts) // 6 == data.count(_GUARD_MARK):
                self.file_stamps(list(zip(parts[1::6], parts[2::6], parts[3::6],
                                          map(WORDS_DIRECTION.get, parts[5::6]))))
                self.count(parts[4::6])
                self.forward(b"".join(parts[0::6]))
                return
            self.stamp(data)
            parts = LINE_START_GUARD_RE.split(data)
            found = parts[1::2]
            if found:
                data = b"".join(parts[0::2])
            if _GUARD_MARK in data:
                parts = GUARD_RE.split(data)
                if len(parts) > 1:
                    found += parts[1::2]
                    data = b"".join(parts[0::2])
            self.count(found)
            if _GUARD_MARK in data and self.unknown_reports < UNKNOWN_REPORTS_MAX:
                self.report_unknown(data)
            self.forward(data)
            return
        # The user sees some guard lines or silenced a severity: judge each
        # log line (found anywhere, as above).
        if _GUARD_MARK in data:
            self.stamp(data)
        if (_HEADER_END if self.silenced else _GUARD_MARK) not in data:
            self.forward(data)
            return
        found = []
        passed, silenced = self.passed, self.silenced

        def judge(match):
            message = match.group(3)
            if message is not None:
                found.append(message)
                return match.group(0) if DIRECTION_KEYS[message[: message.index(b" ")]] in passed else b""
            letter = match.group(1) or match.group(2)
            return b"" if letter in silenced else match.group(0)

        data = LOG_LINE_RE.sub(judge, data)
        self.count(found)
        self.forward(data)

    def partial_line_at(self, data):
        """Index where the end of ``data`` may be an unfinished log line
        (one this relay drops or counts), or len."""
        end = len(data)
        start = max(data.rfind(b"\n") + 1, end - PARTIAL_MAX)
        # Nor does a log line hold a \r before its end: a progress bar's
        # redraws before the last one are out of the question.
        start = max(start, data.rfind(b"\r", start, end - 1) + 1)
        if self.silenced:
            mark, pattern = _HEADER_END, PARTIAL_LOG_RE
        else:
            mark, pattern = _GUARD_MARK, PARTIAL_GUARD_RE
        if end - start > PARTIAL_HEADER_MAX and data.find(mark, start) < 0:
            start = end - PARTIAL_HEADER_MAX
        match = pattern.search(data, start)
        return match.start() if match else end

    def feed(self, data):
        """Take the next bytes read from the pipe."""
        for line in self.oom.feed(data):
            self.report(b"O " + line + b"\n")
        self.saw_guard = False
        buf = self.buf + data if self.buf else data
        self.buf = b""
        if b"\x00" in buf:
            # A marker is one write of its own, so whatever came before it is
            # whole: judge it with the visibility of its time, then the marker.
            start = 0
            for match in self.mark_re.finditer(buf):
                self.block(buf[start : match.start()])
                self.marker(match)
                start = match.end()
            buf = buf[start:]
            cut = self.partial_marker_at(buf)
            if cut < len(buf):
                self.block(buf[:cut])
                buf, self.buf = b"", buf[cut:]
        if buf:
            cut = self.partial_line_at(buf)
            self.block(buf[:cut])
            self.buf = buf[cut:]
        self.report_counts()
        self.flush_out()
        self.flush_reports()

    def holding(self):
        return bool(self.buf)

    def release(self):
        """Give up waiting for the rest of a held partial line.

        What it held was not a log line's start after all (or a writer died
        mid-line): it goes out as the user's bytes. A partial marker stays.
        """
        cut = self.partial_marker_at(self.buf)
        head, self.buf = self.buf[:cut], self.buf[cut:]
        if head:
            self.forward(head)
        self.flush_out()

    def finish(self):
        """At EOF: what is still held goes out, except a guard line cut short."""
        for line in self.oom.finish():
            self.report(b"O " + line + b"\n")
        data, self.buf = self.buf, b""
        if data:
            match = GUARD_AT_END_RE.search(data)
            if match is None:
                self.forward(data)
            else:
                message = match.group(1)
                self.count((message,))
                if DIRECTION_KEYS[message[: message.index(b" ")]] in self.passed:
                    self.forward(data)
                else:
                    self.forward(data[: match.start()])
        self.report_counts()
        self.flush_out()
        self.flush_reports()


def minute_start(hh_mm):
    """The Unix time of the local minute ``b"HH:MM:"`` that is now or just
    past: today's, or yesterday's where today's is still ahead (a line of
    23:59 read just after midnight)."""
    now = time.time()
    local = time.localtime(now)
    midnight = now - (local.tm_hour * 3600 + local.tm_min * 60 + local.tm_sec + now % 1.0)
    start = midnight + int(hh_mm[0:2]) * 3600 + int(hh_mm[3:5]) * 60
    return start - 86400.0 if start > now + 300.0 else start


def follow_terminal_size(out_fd):
    """Copy the real terminal's size to the pseudo-terminal on stdin now and
    on every SIGWINCH: the program asks ours for its size."""

    def copy(*_):
        try:
            import fcntl
            import termios

            size = fcntl.ioctl(out_fd, termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(0, termios.TIOCSWINSZ, size)
        except (ImportError, OSError, AttributeError):
            pass

    copy()
    signal.signal(signal.SIGWINCH, copy)


def wait_between_batches(seconds, kick_fd):
    """Sleep ``seconds`` unless the agent kicks first (it waits on a sync).

    Returns:
        The kick fd to use next time: -1 once the agent closed its end
        (then plain sleeps, as before the kick existed).
    """
    if kick_fd < 0:
        time.sleep(seconds)
        return kick_fd
    try:
        readable, _, _ = select.select([kick_fd], [], [], seconds)
    except (InterruptedError, OSError, ValueError):
        return kick_fd
    if readable:
        try:
            while True:  # drained: the next wait sleeps again
                if not os.read(kick_fd, 4096):
                    os.close(kick_fd)  # EOF: the agent let go of it
                    return -1
        except OSError:  # EAGAIN: empty now
            pass
    return kick_fd


def main(argv):
    out_fd, report_fd = int(argv[1]), int(argv[2])
    shown, _, silenced = argv[4].partition("|")
    token, passed = argv[3].encode(), set(filter(None, shown.split(",")))
    on_pty = len(argv) > 5 and argv[5] == "pty"
    # The agent writes a byte here when it waits for a sync marker: the wait
    # between batches below ends at once, so a sync costs a round trip, not
    # a batch interval (pytest's budget windows sync several times a test).
    kick_fd = int(argv[6]) if len(argv) > 6 else -1
    if kick_fd >= 0:
        os.set_blocking(kick_fd, False)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        # The target's process group gets Ctrl-C too; this process must live
        # until the target is gone, so it waits for EOF instead.
        signal.signal(sig, signal.SIG_IGN)
    if on_pty:
        follow_terminal_size(out_fd)
    if report_fd >= 0:
        os.set_blocking(report_fd, False)
    relay = Relay(out_fd, report_fd if report_fd >= 0 else None, token, passed)
    relay.set_visibility(passed, silenced.encode("ascii", "replace"))
    batch_s = batch_seconds()
    while True:
        owed = relay.report_backlog and relay.report_fd is not None
        if owed or relay.holding():
            wanted_w = [relay.report_fd] if owed else []
            timeout = HOLD_S if relay.holding() else None
            try:
                readable, writable, _ = select.select([0], wanted_w, [], timeout)
            except InterruptedError:
                continue
            if writable:
                relay.flush_reports()
            if not readable:
                if relay.holding() and not writable:
                    relay.release()
                continue
        # Otherwise nothing is held and nothing owed to the agent: a blocking
        # read waits for data as select would, with one system call fewer
        # per wake-up.
        try:
            data = os.read(0, READ_BYTES)
        except InterruptedError:
            continue
        except OSError as exc:
            if exc.errno == errno.EAGAIN:
                continue
            break
        if not data:
            break
        relay.feed(data)
        if relay.saw_guard and len(data) < READ_BYTES and not relay.final:
            kick_fd = wait_between_batches(batch_s, kick_fd)
    relay.finish()
    hand_over_last_reports(relay)
    return 0


#: How long the relay, at the end of the stream, waits for the agent to take
#: the reports still owed to it.
LAST_REPORTS_S = 1.0


def hand_over_last_reports(relay, seconds=LAST_REPORTS_S):
    """Give the agent a moment to take the last reports, never more.

    A write that waits for room would wait as long as any process holds the
    report pipe's read end without reading it (a stopped agent; a forked
    child's copy, before the capture closed those), and this process holds
    the original stderr: whoever reads that to its end waited too.
    """
    deadline = time.monotonic() + seconds
    while relay.report_fd is not None and relay.report_backlog:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            select.select([], [relay.report_fd], [], left)
        except InterruptedError:
            continue
        except (OSError, ValueError):
            return
        relay.flush_reports()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
