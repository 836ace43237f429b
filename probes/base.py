"""The one interface every probe implements, and what a tick hands it.

The agent keeps its probes in one list, in the order their fields appear in
a sample, and drives each the same way (``jaxtop.agent.probe_list``):

* ``start()`` once: when the agent starts for a probe that needs nothing
  from jax (``needs_jax`` False), right after ``import jax`` finishes for
  the others. A probe that cannot start sets ``reason`` (or raises: the
  agent keeps the exception as the reason) and its samples say
  ``available: false`` with it.
* ``on_tick(tick)`` on every tick of the agent thread: the value of the
  sample field ``name``, or None to leave the field out of this sample
  (a sparse field with no news). Records that travel apart from the sample
  (an out-of-memory census, the backend's description) go to
  ``tick.emit`` before the sample is sent.
* ``stop()`` at shutdown: idempotent, and leaves nothing of the probe
  installed in the program (listeners, filters, wrapped functions, hooks).

Optional members, used where a probe has them:

* ``commands``: ``{name: handler}`` requests the probe serves on the socket.
* ``on_jax_imported()``: a probe started early that has more to do once jax
  is imported (the transfer guard, the OOM monitor's patch).
* ``shift_deadlines(gap)``: the process was stopped (SIGSTOP, a debugger)
  for ``gap`` seconds; costly passes move on by as much.

Standard library only (the agent imports it inside the user's job).
"""

from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable

__all__ = ["HAND_BACK_AFTER_S", "HAND_BACK_S", "HandBack", "Probe", "Tick", "hand_back"]

#: How long a thread of jaxtop sleeps to hand the interpreter to a thread of
#: the program that waits for it. jaxtop's work runs on its own threads
#: holding the interpreter (Python code, and calls into jaxlib or libtpu,
#: which keep it), and a thread of the program that wants it waits until
#: it is let go, up to Python's switch interval (5 ms) before it may take
#: it. ``time.sleep(0)`` lets go and takes it straight back, before the
#: waiting thread wakes; half a millisecond lets it wake and run (measured:
#: a thread waiting behind eight 4 ms calls waited 13 ms with ``sleep(0)``
#: between them, 4.3 ms with this).
HAND_BACK_S = 0.0005


#: Work in pieces hands the interpreter back once its pieces have held it
#: this long (:class:`HandBack`): a thread of the program waits about this
#: long at most, and short pieces do not each pay a sleep.
HAND_BACK_AFTER_S = 0.0005


def hand_back() -> float:
    """Let the interpreter go for HAND_BACK_S; the seconds it took."""
    started = time.perf_counter()
    time.sleep(HAND_BACK_S)
    return time.perf_counter() - started


class HandBack:
    """Called between two pieces of work on one of jaxtop's threads: hands
    the interpreter back (:func:`hand_back`) once the pieces since the last
    time held it :data:`HAND_BACK_AFTER_S`. Its argument is ignored (it
    stands where ``time.sleep`` stood)."""

    __slots__ = ("after_s", "since", "slept_s")

    def __init__(self, after_s: float = HAND_BACK_AFTER_S) -> None:
        self.after_s = after_s
        self.since = time.perf_counter()
        #: Seconds slept so far: not the work's cost (a cadence that follows
        #: the work's wall time leaves them out).
        self.slept_s = 0.0

    def __call__(self, _seconds: float = 0.0) -> float:
        """The seconds slept (0: the pieces have not held it long enough)."""
        if time.perf_counter() - self.since < self.after_s:
            return 0.0
        slept = hand_back()
        self.slept_s += slept
        self.since = time.perf_counter()
        return slept


def _drop(record: dict[str, Any]) -> None:
    """A tick's ``emit`` when nobody takes records (a probe driven by hand)."""


class Tick(NamedTuple):
    """One tick of the agent thread.

    Attributes:
        now: the sample's time (Unix seconds).
        slow: the once-a-second tick (slow readings are refreshed on it).
        final: the last sample, at exit: every counter read in full.
        emit: sends a record of its own (not a sample field) on the stream.
    """

    now: float
    slow: bool = False
    final: bool = False
    emit: Callable[[dict[str, Any]], None] = _drop


@runtime_checkable
class Probe(Protocol):
    """What the agent asks of a probe (see the module docstring)."""

    #: The sample field this probe fills.
    name: str
    #: Why the probe is not available (None while it is, or not started yet).
    reason: str | None
    #: Started once jax is imported (True), or with the agent (False).
    needs_jax: bool

    def start(self) -> None:
        """Install what the probe needs; may raise (the agent keeps the reason)."""

    def on_tick(self, tick: Tick) -> Any:
        """The field's value for this tick, or None to leave it out."""

    def stop(self) -> None:
        """Uninstall everything; safe to call twice, or before start."""
