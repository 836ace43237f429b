"""How long a thread of the program waits for the interpreter while jaxtop
works: the rig of the hand-back tests.

A thread that sleeps 200 us in a loop records how late each wake-up is:
the time some other thread held the interpreter past its sleep. Python's
switch interval is set to 50 ms while it runs, so that work which never lets
the interpreter go shows as waits of tens of milliseconds, far out of a
loaded machine's scheduling noise; the cyclic collector is kept out of the
window (a full collection of a heap with jax imported holds it ~20 ms too).
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from typing import Callable

__all__ = ["adds_for", "long_waits", "waits_beside"]


def adds_for(seconds: float) -> int:
    """How many additions ``sum(range(n))`` makes in ``seconds``: one call
    into C that never lets the interpreter go, as a call into a runtime
    (pybind11 keeps it by default) or a long probe does."""
    started = time.perf_counter()
    sum(range(1_000_000))
    return int(1_000_000 * seconds / (time.perf_counter() - started))


def waits_beside(work: Callable[[], None], times: int) -> list[float]:
    """Run ``work`` ``times`` times, 5 ms apart, beside the sleeping thread;
    the lateness of each of its wake-ups (seconds)."""
    late: list[float] = []
    stop = threading.Event()

    def sleeper() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            time.sleep(0.0002)
            late.append(time.perf_counter() - started)

    old = sys.getswitchinterval()
    sys.setswitchinterval(0.05)
    thread = threading.Thread(target=sleeper)
    gc.collect()
    gc.disable()
    try:
        thread.start()
        time.sleep(0.01)
        for _ in range(times):
            work()
            time.sleep(0.005)
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(old)
        gc.enable()
    return late


def long_waits(late: list[float], over_s: float) -> list[float]:
    """The waits over ``over_s``, in milliseconds, for an assertion's message."""
    return sorted(round(x * 1e3, 1) for x in late if x > over_s)
