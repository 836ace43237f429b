"""``jaxtop demo``: the built-in workload, with the dashboard or headless."""

from __future__ import annotations

import argparse
import sys

from jaxtop.cli.exits import EXIT_USAGE


def cmd_demo(args: argparse.Namespace) -> int:
    """``jaxtop demo``: the dashboard (a terminal needed) or ``--headless``; returns the exit status."""
    if args.steps < 1:
        print("jaxtop demo: --steps must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    if args.headless:
        from jaxtop.demo.headless import run

        return run(steps=args.steps, as_json=args.json, small=args.small)
    if args.json:
        print("jaxtop demo: --json needs --headless", file=sys.stderr)
        return EXIT_USAGE
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        # The dashboard reads keys from a terminal and draws on one: without
        # them it would wait for keys that never come, writing escape codes.
        print("jaxtop demo: needs a terminal for the dashboard; use `jaxtop demo --headless` "
              "(a table, or --json) without one", file=sys.stderr)
        return EXIT_USAGE
    from jaxtop.demo.app import run_demo

    return run_demo(small=args.small)
