#!/usr/bin/env python
"""Read a terminal program's screen where there is no tmux (a TPU machine).

Runs COMMAND in a pseudo-terminal of COLS x ROWS, feeds what it writes to a
terminal emulator (pyte: pure Python, carried as a wheel with wcwidth) and
prints the emulated screen at the moments the steps name:

    N      wait N seconds (reading the program's output), then print the screen
    k:X    type X (``k:esc`` types escape)

At the end it types ``q`` and stops the program.

    python tools/tpu/screen.py 120 40 8 k:H 3 -- jaxtop attach 1234
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import sys
import termios
import time

import pyte


def main(argv: list[str]) -> int:
    if "--" not in argv or len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    cut = argv.index("--")
    cols, rows = int(argv[0]), int(argv[1])
    steps, command = argv[2:cut], argv[cut + 1:]
    pid, fd = pty.fork()
    if pid == 0:  # the child: the terminal's size before the program asks for it
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        os.environ.update(TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows))
        os.execvp(command[0], command)
    screen = pyte.Screen(cols, rows)
    stream = pyte.ByteStream(screen)

    def read_for(seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            ready, _, _ = select.select([fd], [], [], min(left, 0.1))
            if ready:
                try:
                    stream.feed(os.read(fd, 1 << 16))
                except OSError:  # the program ended
                    return

    for step in steps:
        if step.startswith("k:"):
            key = step[2:]
            os.write(fd, b"\x1b" if key == "esc" else key.encode())
            read_for(0.3)
        else:
            read_for(float(step))
            print(f"----- {cols}x{rows} after {step} s -----")
            print("\n".join(line.rstrip() for line in screen.display), flush=True)
    os.write(fd, b"q")
    read_for(1.5)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
