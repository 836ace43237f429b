"""The one interface every probe implements, and what a tick hands it.

The agent keeps its probes in a list, in the order their fields appear in a
sample, and drives each the same way:

* ``start()`` once jax is imported (a probe that needs nothing from jax may
  have started earlier: ``start`` is then a no-op). A probe that cannot
  start sets ``reason`` and its samples say ``available: false`` with it.
* ``on_tick(tick)`` on every tick of the agent thread: the value of the
  sample field ``name``, or None to leave the field out of this sample
  (a sparse field with no news).
* ``stop()`` at shutdown: idempotent, and leaves nothing of the probe
  installed in the program (listeners, filters, wrapped functions).

Standard library only (the agent imports it inside the user's job).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

__all__ = ["Probe", "Tick"]


class Tick(NamedTuple):
    """One tick of the agent thread.

    Attributes:
        now: the sample's time (Unix seconds).
        slow: the once-a-second tick (slow readings are refreshed on it).
        final: the last sample, at exit: every counter read in full.
    """

    now: float
    slow: bool = False
    final: bool = False


@runtime_checkable
class Probe(Protocol):
    """What the agent asks of a probe (see the module docstring)."""

    #: The sample field this probe fills.
    name: str
    #: Why the probe is not available (None while it is, or not started yet).
    reason: str | None

    def start(self) -> None:
        """Install what the probe needs; may raise (the agent keeps the reason)."""

    def on_tick(self, tick: Tick) -> Any:
        """The field's value for this tick, or None to leave it out."""

    def stop(self) -> None:
        """Uninstall everything; safe to call twice, or before start."""
