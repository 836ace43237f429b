"""Time keys to the screen drawn after them, as a user sees them answered.

Used by ``benchmarks/tui.py`` and the tests. A typist thread posts each key
the way the terminal driver's thread does, then waits for a callback that
the UI runs once the key is handled and the screen refreshed after it
(``call_after_refresh``). Nothing polls on the UI thread: a Pilot's
``pause`` forces a full refresh each time it is called, and ``press`` waits
for an idle screen, which a streaming backlog never gives; either would be
measured as the app's own latency.
"""

from __future__ import annotations

import threading
import time

from textual import events
from textual.app import App


class KeyNotAnswered(RuntimeError):
    """A key was not answered in time, or did not do what it should."""


def type_keys(app: App, stop: threading.Event, key: str = "tab", limit: int | None = None,
              timeout_s: float = 10.0, changes: str | None = "selected") -> list[float]:
    """Press ``key`` back to back until ``stop`` is set (or ``limit`` keys).

    Call from a thread other than the app's. Each key is posted only after
    the one before it was answered.

    Args:
        app: A running app.
        stop: Set by whoever decides the keys should end (a backlog loaded).
        key: The key to press, as Textual names it.
        limit: At most this many keys.
        timeout_s: The longest a key may take.
        changes: An attribute of ``app`` each key must change, or None.

    Returns:
        Seconds from each key to the screen drawn after it.

    Raises:
        KeyNotAnswered: a key took longer than ``timeout_s``, or left
            ``changes`` as it was.
    """
    out: list[float] = []
    answered = threading.Event()
    while not stop.is_set() and (limit is None or len(out) < limit):
        answered.clear()
        before = getattr(app, changes) if changes else None
        start = time.monotonic()
        app.post_message(events.Key(key, None))
        app.call_later(app.call_after_refresh, answered.set)
        if not answered.wait(timeout_s):
            raise KeyNotAnswered(f"{key!r} was not answered within {timeout_s:g} s")
        out.append(time.monotonic() - start)
        if changes and getattr(app, changes) == before:
            raise KeyNotAnswered(f"{key!r} left app.{changes} at {before!r}")
    return out
