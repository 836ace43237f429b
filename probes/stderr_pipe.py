"""What stands in for fd 2 while jaxtop captures it, and how it compares
with the stderr the program had: a pipe grown to hold what the program
writes while the relay batches, or a pseudo-terminal where the program had
a terminal (so that ``isatty`` and the size stay true), and whether two
descriptors are one stream or a pipe nobody reads.

Standard library only (the agent imports it inside the user's job).
"""

from __future__ import annotations

import os
import select
import stat

__all__ = ["PIPE_BYTES", "copy_terminal_size", "grow_pipe", "nobody_reads", "open_terminal_like", "same_stream"]

#: The relay sleeps up to BATCH_S after a read that held guard lines, so it
#: wakes less often; the pipe must hold what the program writes meanwhile, or
#: the program's write to stderr would wait for the relay.
PIPE_BYTES = 1 << 20


def grow_pipe(fd: int) -> None:
    try:
        import fcntl

        setsize = getattr(fcntl, "F_SETPIPE_SZ", None)
        if setsize is not None:
            fcntl.fcntl(fd, setsize, PIPE_BYTES)
    except OSError:
        pass  # over the system's limit: the default size, and the relay reads sooner


def same_stream(a: int, b: int) -> bool:
    """True when fds ``a`` and ``b`` write to one stream, so the order of
    writes between them is visible (``2>&1``, both the terminal, one pipe)."""
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    if (sa.st_dev, sa.st_ino) != (sb.st_dev, sb.st_ino):
        return False
    if stat.S_ISREG(sa.st_mode):
        # One file opened twice (`>f 2>f`) has two offsets: the program's
        # writes overwrite each other there, and merging them would change
        # where bytes land. Only one open file (same offset, same flags) is
        # one stream.
        try:
            import fcntl

            return (os.lseek(a, 0, os.SEEK_CUR) == os.lseek(b, 0, os.SEEK_CUR)
                    and fcntl.fcntl(a, fcntl.F_GETFL) == fcntl.fcntl(b, fcntl.F_GETFL))
        except (OSError, ImportError):
            return False
    return True


def copy_terminal_size(src: int, dst: int) -> None:
    """Give terminal ``dst`` the size of terminal ``src`` (rows, columns and
    pixels); nothing when either is not a terminal."""
    try:
        import fcntl
        import termios

        size = fcntl.ioctl(src, termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(dst, termios.TIOCSWINSZ, size)
    except (OSError, ImportError, AttributeError):
        pass


def open_terminal_like(real: int) -> tuple[int, int] | None:
    """A pseudo-terminal standing in for terminal ``real``: (master, slave),
    or None where none can be opened (then a pipe is used)."""
    try:
        import termios

        master, slave = os.openpty()
    except (OSError, ImportError, AttributeError):
        return None
    try:
        attrs = termios.tcgetattr(real)
        attrs[1] &= ~termios.OPOST  # the real terminal processes output; ours passes bytes as written
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
    except (OSError, termios.error):
        pass  # a pty's defaults: still a terminal to the program
    try:
        attrs = termios.tcgetattr(slave)
        if attrs[1] & termios.OPOST:
            attrs[1] &= ~termios.OPOST
            termios.tcsetattr(slave, termios.TCSANOW, attrs)
    except (OSError, termios.error):
        for fd in (master, slave):
            os.close(fd)
        return None  # bytes would be changed on the way: a pipe instead
    copy_terminal_size(real, slave)
    return master, slave


def nobody_reads(fd: int) -> bool:
    """True when ``fd`` is a pipe or socket whose reading end is closed.

    Writes to it fail (EPIPE): a program run plainly sees that on its first
    write to stderr, and with its stderr captured it would not.
    """
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            return False
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, AttributeError, ValueError):
        return False
