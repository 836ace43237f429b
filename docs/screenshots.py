"""Regenerate the README's screenshots (SVG, from Textual's save_screenshot).

    .venv/bin/python docs/screenshots.py            # all three, 120x40
    .venv/bin/python docs/screenshots.py demo       # one of: demo attach replay

* ``demo.svg``: ``jaxtop demo``'s app on its real workload child, after a few
  strategies were toggled so the panel shows measured effects.
* ``attach-cpu.svg``: the dashboard attached to ``jaxtop run -m
  jaxtop.demo.train_loop`` (a real CPU JAX process over its socket).
* ``replay-cpu.svg``: ``jaxtop replay tests/fixtures/cpu_train_loop.jsonl``.

Nothing is faked: each screen is what a user sees at that moment.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
IMG = HERE / "img"
FIXTURES = HERE.parent / "tests" / "fixtures"
SIZE = (120, 40)


async def _wait(pilot, app, cond, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not cond():
        await pilot.pause(0.2)


async def shot_attach() -> None:
    from jaxtop.wire import paths
    from jaxtop.dashboard.app import live_app

    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxtop", "run", "-m", "jaxtop.demo.train_loop", "--steps", "100000", "--sleep", "0.004"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        sock = paths.socket_path(proc.pid)
        deadline = time.monotonic() + 60
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        app = live_app([proc.pid])
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(12.0)  # some history for the timeline
            app.refresh_now()
            await pilot.pause(0.5)
            app.save_screenshot(str(IMG / "attach-cpu.svg"))
    finally:
        proc.terminate()
        proc.wait(timeout=20)


async def shot_replay() -> None:
    from jaxtop.dashboard.app import make_app
    from jaxtop.dashboard.sources import ReplaySource

    src = ReplaySource(str(FIXTURES / "cpu_train_loop.jsonl"), start_playing=False)
    app = make_app(src)
    async with app.run_test(size=SIZE) as pilot:
        src.seek(src._times[-1])
        await _wait(pilot, app, lambda: app.snapshot is not None and app.snapshot.processes[0].seq, 10)
        app.refresh_now()
        await pilot.pause(0.3)
        app.save_screenshot(str(IMG / "replay-cpu.svg"))


async def shot_demo() -> None:
    from jaxtop.demo.app import DemoApp, Worker
    from jaxtop.demo.panel import demo_state

    worker = Worker(small=True)
    pid = worker.start()
    try:
        app = DemoApp(worker, pid)
        async with app.run_test(size=SIZE) as pilot:
            await _wait(pilot, app, lambda: app.snapshot is not None and demo_state(app.snapshot), 120)
            # Enter measures the selected strategy's first variant, enter
            # again the other: placement, then donation, batching and
            # checkpointing, so both sides of every effect shown are measured.
            await pilot.pause(3.0)
            await pilot.press("enter")
            await pilot.pause(3.5)
            for index in (1, 3, 7):
                app.query_one("#strategies").cursor = index
                await pilot.press("enter")
                await pilot.pause(3.5)
                await pilot.press("enter")
                await pilot.pause(3.5)
            app.query_one("#strategies").cursor = 0
            app.refresh_now()
            await pilot.pause(0.5)
            app.save_screenshot(str(IMG / "demo.svg"))
    finally:
        worker.stop()


SHOTS = {"demo": shot_demo, "attach": shot_attach, "replay": shot_replay}


def main(argv: list[str]) -> int:
    os.environ.setdefault("TZ", "UTC")
    time.tzset()
    IMG.mkdir(exist_ok=True)
    for name in argv or list(SHOTS):
        if name not in SHOTS:
            print(f"unknown screenshot {name!r}; one of {', '.join(SHOTS)}", file=sys.stderr)
            return 2
        asyncio.run(SHOTS[name]())
        print(f"wrote {IMG}/{'attach-cpu' if name == 'attach' else 'replay-cpu' if name == 'replay' else 'demo'}.svg")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
