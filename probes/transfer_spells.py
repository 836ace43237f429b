"""When jaxtop's post-call hook is in the program's jitted calls, and the
spans it was out, whose transfers cannot be tied to a call.

While in, the hook costs every jitted call of the program 1-3 us (jaxlib
calls it with the call's arguments): 2-5 % of a 70 us step. It leaves for a
*spell* in two cases, and the lines made during one are given up with the
spell's reason (counted, never guessed):

* **quiet**: no implicit transfer for ``quiet_s`` while the program calls
  jitted functions faster than :data:`QUIET_CALLS_PER_S`. A thread of
  jaxtop's waits on the relay's reports meanwhile and puts the hook back
  with the first one: only the calls before it lose their lines (the first
  call's, as a rule). A program whose transfers come back soon after each
  spell doubles ``quiet_s``, up to :data:`QUIET_MAX_S`.
* **sealed**: the table of lines is full (``MAX_SITES``) and nearly all the
  lines of the last seconds came from lines beyond it (generated code: a
  function, and a file, per call). The hook then notes each call only for
  its line to be given up as "not kept apart": it leaves for
  :data:`SEALED_SPELL_S`, comes back to look again, and leaves for twice as
  long while that holds (up to :data:`SEALED_SPELL_MAX_S`). The kept
  lines' calls meanwhile are not tied either, which the reason says. With
  400,000 generated functions the hook cost more than JAX's own guard
  logging did (+13-18 % over it); during a spell the program's calls cost
  what counting alone costs (``JAXTOP_TRANSFER_SITES=0``).

Standard library and NumPy (jax's own dependency) only: this runs inside
the user's job.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxtop.probes.base import Tick
from jaxtop.probes.transfer_notes import CallNotes

#: The hook is taken out after this long without an implicit transfer (seconds).
QUIET_S = 2.0
QUIET_MAX_S = 32.0
#: A quiet spell shorter than this doubles the wait before the next one.
QUIET_BACKOFF_SPELL_S = 60.0
#: ... when the program calls jitted functions faster than this (calls a
#: second): below it the hook costs nothing worth a lost line.
QUIET_CALLS_PER_S = 100.0
#: A sealed spell begins after this many slow ticks (seconds) in a row whose
#: lines were at least SEALED_SHARE beyond the kept ones, and at least
#: SEALED_MIN_PER_S of them a second.
SEALED_AFTER_TICKS = 5
SEALED_SHARE = 0.9
SEALED_MIN_PER_S = 100.0
SEALED_SPELL_S = 30.0
SEALED_SPELL_MAX_S = 480.0

QUIET = "quiet"
SEALED_OUT = "sealed"


def spell_reason(kind: str, max_sites: int) -> str:
    """Why the lines of a spell have no line."""
    if kind == SEALED_OUT:
        return (f"made while jaxtop's hook was out: nearly every transfer came from lines beyond the {max_sites} "
                "kept (generated code?), so calls were not noted for a while; the kept lines' calls meanwhile "
                "were not tied either")
    return ("made while jaxtop's hook was out (no implicit transfer for a few seconds before it); the next ones "
            "are tied to lines again")


class HookSpells(CallNotes):
    """The hook's spells out, on top of the notes the hook takes (the
    agent's thread runs all of this, at its ticks). The probe names its
    table's size and the reason its lines beyond it are given up for."""

    MAX_SITES = 0
    BEYOND_REASON = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_stamp_t = -1e18
        self._hook_out: list[tuple[float, float, str]] = []  # (out since, back at, kind)
        self._out_kind = QUIET
        self.quiet_s = QUIET_S  # seconds without a transfer before the hook leaves (grows: QUIET_BACKOFF_SPELL_S)
        self.sealed_spell_s = SEALED_SPELL_S
        self._noted = 0  # call notes taken from the hook's deque, ever (for the call rate)
        self._rate_mark: tuple[float, int] | None = None
        # Lines tied to a kept line, ever (those given up as beyond them are
        # counted under BEYOND_REASON); both at the last slow tick.
        self.lines_kept = 0
        self._lines_mark: tuple[float, int, int] | None = None
        self._sealed_streak = 0
        self._unattributed: dict[str, int] = {}  # direction -> lines without a line
        self._reasons: dict[str, int] = {}  # why -> lines
        self._changed = True

    def _spell_tick(self, tick: Tick, stamps: list[bytes]) -> None:
        """Put the hook back or take it out, as this tick says."""
        if stamps:
            self._last_stamp_t = tick.now
        if self._out_since is not None:
            if self._out_kind == SEALED_OUT:
                if tick.now - self._out_since >= self.sealed_spell_s:
                    self._back_in(tick.now)
            elif stamps or self._back_at is not None:
                # Transfers again: the hook back in, from the moment the waker
                # put it back (a report came), else from now. Lines before that
                # moment had no call to be tied to.
                self._back_in(self._back_at if self._back_at is not None else tick.now)
                since, back, _ = self._hook_out[-1]
                if back - since < QUIET_BACKOFF_SPELL_S:
                    self.quiet_s = min(QUIET_MAX_S, 2 * self.quiet_s)  # transfers come back soon: wait longer
        if not tick.slow or self._out_since is not None:
            return
        self._install_hook()  # jax_debug_nans switched on or off sets the hook anew
        rate = self._call_rate(tick.now)
        if self._sealed(tick.now):
            self._out_kind = SEALED_OUT
            self._take_hook_out(tick.now, wake=False)
        elif (self._hook_in_t is not None and tick.now - max(self._last_stamp_t, self._hook_in_t) > self.quiet_s
                and rate is not None and rate > QUIET_CALLS_PER_S):
            self._out_kind = QUIET
            self._take_hook_out(tick.now)

    def _back_in(self, back: float) -> float:
        """End the spell at ``back``: the hook in again."""
        self._hook_out.append((self._out_since, back, self._out_kind))
        del self._hook_out[:-16]  # only the last spans are looked at (_drop_while_out)
        self._out_since = None
        self._back_at = None
        self._lines_mark = None  # the next look at the lines starts from here
        self._sealed_streak = 0
        self._install_hook()

    def _sealed(self, now: float) -> bool:
        """Were the lines of the last SEALED_AFTER_TICKS slow ticks nearly
        all beyond the kept ones (the table of lines being full)? A long
        sealed spell doubles the next when it still holds."""
        beyond_now = self._reasons.get(self.BEYOND_REASON, 0)
        mark, self._lines_mark = self._lines_mark, (now, self.lines_kept, beyond_now)
        if self.kept_files is None or mark is None or now <= mark[0]:
            self._sealed_streak = 0
            return False
        kept, beyond = self.lines_kept - mark[1], beyond_now - mark[2]
        if kept == 0 and beyond == 0:
            return False  # no tie since the last look (ties come a second apart): no news
        if beyond >= SEALED_SHARE * (kept + beyond) and beyond >= SEALED_MIN_PER_S * (now - mark[0]):
            self._sealed_streak += 1
        else:
            self._sealed_streak = 0
            self.sealed_spell_s = SEALED_SPELL_S
        if self._sealed_streak < SEALED_AFTER_TICKS:
            return False
        # Back from a sealed spell no more than two looks ago (a slow tick is a second): still sealed.
        if self._hook_out and self._hook_out[-1][2] == SEALED_OUT and now - self._hook_out[-1][1] < 2 * SEALED_AFTER_TICKS:
            self.sealed_spell_s = min(SEALED_SPELL_MAX_S, 2 * self.sealed_spell_s)  # back, and still sealed
        return True

    def _call_rate(self, now: float) -> float | None:
        """Jitted calls a second the hook noted since the last slow tick (None at the first)."""
        total = self._noted + len(self._calls)
        last, self._rate_mark = self._rate_mark, (now, total)
        if last is None or now <= last[0]:
            return None
        return (total - last[1]) / (now - last[0])

    def _spells(self) -> list[tuple[float, float, str]]:
        """The spans the hook was out, the current one last (open-ended)."""
        spans = list(self._hook_out)
        if self._out_since is not None:
            spans.append((self._out_since, float("inf"), self._out_kind))
        return spans

    def _drop_while_out(self, direction: str, lines: np.ndarray) -> np.ndarray:
        """The lines made while the hook was out (their calls left no note), given up."""
        for since, back, kind in self._spells():
            lo, hi = np.searchsorted(lines, (since - 1.0, back)).tolist()
            if hi > lo:
                self._give_up(direction, spell_reason(kind, self.MAX_SITES), hi - lo)
                lines = np.concatenate((lines[:lo], lines[hi:]))
        return lines

    def _give_up(self, direction: str, reason: str, n: int = 1) -> None:
        """Count ``n`` lines of ``direction`` as unattributed, for ``reason``."""
        if n <= 0:
            return
        self._unattributed[direction] = self._unattributed.get(direction, 0) + n
        self._reasons[reason] = self._reasons.get(reason, 0) + n
        self._changed = True
