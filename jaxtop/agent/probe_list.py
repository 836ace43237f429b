"""The agent's probes, in one list, driven through one interface.

Every field of a sample but the agent's own (``t``, ``seq``, ``events``,
``agent``, ``final``) comes from a probe of this list, in the list's order
(see ``jaxtop.probes.base.Probe``). The list starts, ticks and stops each
probe the same way, and no probe can break the others: an exception while
starting becomes the probe's ``reason``, one while ticking becomes the
field's ``{"error": ...}`` for that sample, one while stopping is dropped.

A probe added under the name of one already listed replaces it (a test or
a user swapping in a faster holders probe): the old one is stopped first, so
that the new one can take the hooks only one probe of a process may hold.

Standard library only (the agent imports it inside the user's job).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from jaxtop.probes.base import HandBack, Probe, Tick
from jaxtop.probes.forksafe import ForkLock

__all__ = ["FieldProbe", "ProbeList"]


class FieldProbe:
    """A sample field given as a function (``Agent.register_sample_field``):
    a probe with nothing to install."""

    needs_jax = False
    reason: str | None = None

    def __init__(self, name: str, fn: Callable[[], Any]) -> None:
        self.name = name
        self.fn = fn

    def start(self) -> None:
        """Nothing to install."""

    def on_tick(self, tick: Tick) -> Any:
        return self.fn()

    def stop(self) -> None:
        """Nothing to uninstall."""


class ProbeList:
    """Probes in sample order, each started, ticked and stopped once."""

    def __init__(self) -> None:
        self._probes: tuple[Any, ...] = ()  # replaced whole: the agent thread iterates a snapshot
        self._started: set[int] = set()  # id() of the probes whose start() ran
        self._jax = False  # jax is imported: probes added now start at once
        self._running = False  # between start_early() and stop()
        self._lock = ForkLock()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._probes)

    def __len__(self) -> int:
        return len(self._probes)

    def get(self, name: str) -> Any:
        """The listed probe filling ``name``, or None."""
        return next((p for p in self._probes if p.name == name), None)

    def add(self, probe: Probe) -> None:
        """List ``probe`` (after the others, or in place of the one of its
        name); started at once if the agent already runs and, for a probe
        that needs jax, jax is imported."""
        with self._lock:
            probes = list(self._probes)
            replaced = None
            for i, old in enumerate(probes):
                if old.name == probe.name:
                    replaced = old if old is not probe else None
                    probes[i] = probe
                    break
            else:
                probes.append(probe)
            self._probes = tuple(probes)
            due = self._running and (self._jax or not getattr(probe, "needs_jax", True))
        if replaced is not None:
            _stop_quietly(replaced)
            self._started.discard(id(replaced))
        if due:
            self._start(probe)

    def start_early(self) -> None:
        """Start the probes that need nothing from jax (the agent starts)."""
        self._running = True
        for probe in self._probes:
            if not getattr(probe, "needs_jax", True):
                self._start(probe)

    def jax_imported(self) -> None:
        """``import jax`` just finished: start the probes waiting for it and
        tell the early ones that want to know."""
        self._jax = True
        if not self._running:
            return
        for probe in self._probes:
            if id(probe) not in self._started:
                self._start(probe)
            else:
                hook = getattr(probe, "on_jax_imported", None)
                if hook is not None:
                    try:
                        hook()
                    except Exception as exc:
                        probe.reason = f"{type(exc).__name__}: {exc}"

    def _start(self, probe: Any) -> None:
        if id(probe) in self._started:
            return
        self._started.add(id(probe))
        try:
            probe.start()
        except Exception as exc:
            probe.reason = f"could not start: {type(exc).__name__}: {exc}"

    def tick(self, tick: Tick, record: dict[str, Any]) -> None:
        """Each probe's field for this tick into ``record`` (None: left out).

        The probes run on the agent's thread holding the interpreter, one
        after the other: a thread of the program that wants it meanwhile
        would wait for the whole run (up to Python's 5 ms switch interval).
        The interpreter is handed back between probes once they have held it
        :data:`~jaxtop.probes.base.HAND_BACK_AFTER_S`, so it waits for about
        one probe at most."""
        hand_back = HandBack()
        for probe in self._probes:
            try:
                value = probe.on_tick(tick)
            except Exception as exc:  # one probe, never the sample
                value = {"error": f"{type(exc).__name__}: {exc}"}
            if value is not None:
                record[probe.name] = value
            hand_back()

    def shift_deadlines(self, gap: float) -> None:
        """The process was stopped for ``gap`` seconds: tell every probe that has deadlines."""
        for probe in self._probes:
            shift = getattr(probe, "shift_deadlines", None)
            if shift is not None:
                try:
                    shift(gap)
                except Exception:
                    pass

    def commands(self) -> Iterator[tuple[str, Callable[[dict[str, Any]], Any]]]:
        """Every ``(name, handler)`` the listed probes serve."""
        for probe in self._probes:
            yield from (getattr(probe, "commands", None) or {}).items()

    def stop(self) -> None:
        """Stop every probe, the last listed first (idempotent)."""
        self._running = False
        for probe in reversed(self._probes):
            _stop_quietly(probe)
        self._started.clear()


def _stop_quietly(probe: Any) -> None:
    try:
        probe.stop()
    except Exception:
        pass
