"""The stderr relay: a tiny child process that owns the read end of fd 2.

It is started by :mod:`jaxtop.probes.stderr_capture` as
``python -S -E _relay.py ORIG_FD REPORT_FD TOKEN PASS``, with the capture pipe
as its stdin. It forwards every byte the target writes to stderr to the
original stderr, unchanged and in order, except transfer-guard lines that only
jaxtop asked for (directions not in PASS). Every guard line is reported to the
agent on REPORT_FD, counted per distinct message, as ``G <n> <message>``
(the line without its abseil header); sync markers written by the agent are
removed from the stream and acknowledged as ``S <n>``.

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

# The abseil header after its severity letter: date, time, thread id, file:line.
# [^\S\n] (a space that is not a newline) keeps a match inside one line when
# the same pattern runs over a block of lines.
_HEADER = rb"\d{4} \d\d:\d\d:\d\d\.\d+[^\S\n]+\d+[^\S\n]+[^\s]+:\d+\] "
_DIRECTIONS = rb"(?:host-to-device|device-to-device|device-to-host) transfer:"
# Group 1: the message, which is what the agent parses and counts.
GUARD_RE = re.compile(rb"^[IWEF]" + _HEADER + rb"(" + _DIRECTIONS + rb"[^\n]*)")
ABSEIL_RE = re.compile(rb"^[IWEF]" + _HEADER)
# The same over a block of whole lines (the fast path of Relay.feed).
BLOCK_GUARD_RE = re.compile(GUARD_RE.pattern + rb"\n", re.M)
# A partial line that may still turn into an abseil header: hold it briefly.
HEADER_PREFIX_RE = re.compile(rb"[IWEF](\d{0,4}|\d{4} [\d:.]*|\d{4} \d\d:\d\d:\d\d\.\d+\s.*)", re.S)
DIRECTION_KEYS = {
    b"host-to-device": "h2d",
    b"device-to-device": "d2d",
    b"device-to-host": "d2h",
}


def drop_pattern(passed, silenced):
    """The lines a block loses on its way to the terminal, as one pattern.

    Guard lines of the directions not in ``passed`` (only jaxtop wanted them),
    and other abseil lines whose severity letter is in ``silenced``. None when
    nothing is dropped.
    """
    parts = []
    hidden = [text for text, key in DIRECTION_KEYS.items() if key not in passed]
    if hidden:
        alts = b"|".join(re.escape(text) for text in hidden)
        parts.append(rb"[IWEF]" + _HEADER + rb"(?:" + alts + rb") transfer:[^\n]*\n")
    letters = bytes(sorted({c for c in silenced if c in b"IWEF"}))
    if letters:
        parts.append(rb"[" + letters + rb"]" + _HEADER + rb"(?!" + _DIRECTIONS + rb")[^\n]*\n")
    if not parts:
        return None
    return re.compile(rb"^(?:" + rb"|".join(parts) + rb")", re.M)


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
BIG_PIPE_BYTES = 1 << 20


def batch_seconds(fd=0):
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
    def __init__(self, out_fd, report_fd, token, passed):
        self.out_fd = out_fd
        self.report_fd = report_fd
        self.mark_prefix = b"\x00jaxtop:" + token + b":"
        self.mark_re = re.compile(re.escape(self.mark_prefix) + rb"(sync|show) ([^\x00\n]*)\x00")
        self.set_visibility(passed, b"")
        self.counts = {}  # guard message -> lines since the last report
        self.buf = b""
        self.midline = False  # part of the current line was already forwarded
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
            except OSError:
                # The terminal is gone. Keep draining so the target never sees
                # a full pipe, but there is nowhere to write.
                self.out_broken = True
                return
            view = view[n:]

    def report(self, data):
        self.report_counts()  # what came before data in the stream goes first
        if self.report_fd is None:
            return
        if len(self.report_backlog) < REPORT_BACKLOG_MAX:
            self.report_backlog += data

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
        if not counts or self.report_fd is None:
            return
        if len(self.report_backlog) < REPORT_BACKLOG_MAX:
            self.report_backlog += b"".join(b"G %d %s\n" % (n, message) for message, n in counts.items())

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

    # -- parsing --------------------------------------------------------------
    def set_visibility(self, passed, silenced):
        """The guard directions the user sees, the abseil severities they
        silenced, and the one pattern of lines that both drop."""
        self.passed = passed
        self.silenced = silenced
        self.drop_re = drop_pattern(passed, silenced)

    def strip_markers(self, data):
        if b"\x00" not in data:
            return data
        def handle(match):
            verb, arg = match.group(1), match.group(2)
            if verb == b"sync":
                self.report(b"S " + arg + b"\n")
            else:  # "show h2d,d2d|IW": what the user sees, what they silenced
                shown, _, silenced = arg.decode("ascii", "replace").partition("|")
                self.set_visibility(set(filter(None, shown.split(","))), silenced.encode())
            return b""

        return self.mark_re.sub(handle, data)

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

    def line(self, line):
        if self.midline:
            self.midline = False
            self.forward(line)
            return
        match = GUARD_RE.match(line)
        if match is None:
            if self.silenced and line[:1] in self.silenced and ABSEIL_RE.match(line):
                return  # an abseil warning the user had silenced
            self.forward(line)
            return
        message = match.group(1)
        self.count((message,))
        if DIRECTION_KEYS[message[: message.index(b" ")]] in self.passed:
            self.forward(line)

    def block(self, data):
        """Whole lines, no marker, not continuing a forwarded line: the same
        as :meth:`line` on each, in one or two regex passes over all of them."""
        if not self.passed and not self.silenced:
            # The usual case (the user's guard is off): every guard line goes,
            # and one split yields both the bytes to forward and the messages.
            parts = BLOCK_GUARD_RE.split(data)
            found = parts[1::2]
            if found:
                data = b"".join(parts[0::2])
        else:
            found = BLOCK_GUARD_RE.findall(data)
            if self.drop_re is not None and (found or self.silenced):
                data = self.drop_re.sub(b"", data)
        self.count(found)
        self.forward(data)

    def feed(self, data):
        self.saw_guard = False
        buf = self.buf + data
        start = 0
        if b"\x00" not in buf:
            if self.midline:  # the rest of a line already partly forwarded
                start = buf.find(b"\n") + 1
                if start:
                    self.line(buf[:start])
            end = buf.rfind(b"\n") + 1
            if end > start:
                self.block(buf[start:end])
                start = end
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            self.line(self.strip_markers(buf[start : nl + 1]))
            start = nl + 1
        self.buf = self.strip_markers(buf[start:])
        cut = self.partial_marker_at(self.buf)
        head, tail = self.buf[:cut], self.buf[cut:]
        if head and (self.midline or not HEADER_PREFIX_RE.fullmatch(head)):
            self.forward(head)
            self.midline = True
            self.buf = tail
        self.report_counts()
        self.flush_out()
        self.flush_reports()

    def holding(self):
        return bool(self.buf)

    def release(self):
        """Give up waiting for the rest of a held partial line."""
        cut = self.partial_marker_at(self.buf)
        head, self.buf = self.buf[:cut], self.buf[cut:]
        if head:
            self.forward(head)
            self.midline = True
        self.flush_out()

    def finish(self):
        if self.buf:
            data = self.strip_markers(self.buf)
            self.buf = b""
            if self.midline or not GUARD_RE.match(data):
                self.forward(data)
            else:
                self.line(data)
        self.report_counts()
        self.flush_out()
        self.flush_reports()


def main(argv):
    out_fd, report_fd = int(argv[1]), int(argv[2])
    token, passed = argv[3].encode(), set(filter(None, argv[4].split(",")))
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        # The target's process group gets Ctrl-C too; this process must live
        # until the target is gone, so it waits for EOF instead.
        signal.signal(sig, signal.SIG_IGN)
    if report_fd >= 0:
        os.set_blocking(report_fd, False)
    relay = Relay(out_fd, report_fd if report_fd >= 0 else None, token, passed)
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
            data = os.read(0, 65536)
        except InterruptedError:
            continue
        except OSError as exc:
            if exc.errno == errno.EAGAIN:
                continue
            break
        if not data:
            break
        relay.feed(data)
        if relay.saw_guard and len(data) < 65536:
            time.sleep(batch_s)
    relay.finish()
    # Give the agent a moment to take the last reports, without hanging.
    if relay.report_fd is not None and relay.report_backlog:
        os.set_blocking(relay.report_fd, True)
        relay.flush_reports()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
