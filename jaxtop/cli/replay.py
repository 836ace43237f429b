"""``jaxtop replay``: the dashboard on a recording."""

from __future__ import annotations

import argparse
import os
import sys

from jaxtop.cli.exits import EXIT_USAGE


def cmd_replay(args: argparse.Namespace) -> int:
    """``jaxtop replay FILE``; returns the exit status."""
    from jaxtop.dashboard.app import make_app
    from jaxtop.dashboard.sources import ReplaySource

    if not os.path.isfile(args.file):
        print(f"jaxtop replay: no such file: {args.file}", file=sys.stderr)
        return EXIT_USAGE
    try:
        # A big recording opens at once; its index is built in the background
        # and the header says how far it is.
        source = ReplaySource(args.file, speed=args.speed)
    except (OSError, ValueError) as exc:
        print(f"jaxtop replay: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not sys.stdout.isatty() and "web_driver" not in os.environ.get("TEXTUAL_DRIVER", ""):
        source.stop()
        print("jaxtop replay: stdout is not a terminal, and the dashboard needs one; for scripts: "
              "jaxtop export FILE --format csv|perfetto", file=sys.stderr)
        return EXIT_USAGE
    make_app(source, refresh_s=args.refresh).run_as_main()
    return 0
