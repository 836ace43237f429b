"""Standard output as ``log`` and ``export`` write to it: the names that
mean it, and a quiet end when its reader goes away."""

from __future__ import annotations

import os
import sys

from jaxtop.cli.exits import EXIT_BROKEN_PIPE

#: ``-o`` names that mean standard output (``log`` and ``export``): written
#: to, never opened by name or replaced.
STDOUT_NAMES = ("-", "/dev/stdout")


def stdout_gone() -> int:
    """Stdout's reader went away (``| head``): end quietly, as Unix tools do.

    Python flushes stdout once more at exit and would print a second
    BrokenPipeError there; stdout pointed at /dev/null has nothing to fail.

    Returns:
        :data:`EXIT_BROKEN_PIPE`.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass
    return EXIT_BROKEN_PIPE
