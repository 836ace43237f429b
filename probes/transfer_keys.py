"""The transfer notes' keys, and the code objects they name.

A fast-path call's note is keyed ``(id(function), id(code), instruction
offset)``: the line is worked out only when a transfer is tied to the note
(:mod:`jaxtop.probes.transfer_sites`), once per site. The key's code object
is kept meanwhile, so that its id is no other code's; a program that makes
code at run time (``exec`` in a loop, a function made, called once and
dropped, thousands a second) would then grow the process without end, so
what is kept is bounded here:

* code objects no filed note names are let go (:meth:`NoteKeys.forget`);
* where the notes of the last seconds alone name more than half of
  :data:`MAX_CODES`, each fast-path key becomes its settled place
  ``("w", id(function), (file, line, function name))``, worked out while
  its code is still held, and no code object is kept for them (a code
  object is ~1 KB: holding each for the notes' seconds grew the program by
  ~110 MB at 19,000 new functions a second);
* lines worked out are cached, at most :data:`MAX_LINES_CACHED`.

Standard library, and NumPy through the key table (the agent's side).
"""

from __future__ import annotations

from typing import Any, Iterable

from jaxtop.probes.transfer_notes import SEALED
from jaxtop.probes.transfer_timeline import KeyTable, Timeline

__all__ = ["MAX_CODES", "MAX_LINES_CACHED", "NoteKeys", "line_at"]

#: Code objects kept for the notes' keys before those no note needs are let go.
MAX_CODES = 10_000
#: Lines of code objects worked out and kept (each entry keeps its code alive).
MAX_LINES_CACHED = 4_000


def line_at(code: Any, lasti: int) -> int:
    """The line of instruction offset ``lasti`` in ``code``: what a frame's
    f_lineno would have said."""
    for start, end, number in code.co_lines():
        if start <= lasti < end and number is not None:
            return number
    return code.co_firstlineno


class NoteKeys:
    """The key table the timelines share, and the code objects its keys name."""

    def __init__(self) -> None:
        self.table = KeyTable()  # the notes' keys as small codes, shared by the timelines
        self.codes: dict[int, Any] = {}  # id(code) -> code (kept: no other code has its id meanwhile)
        self._lines: dict[tuple[int, int], tuple[Any, int]] = {}  # (id(code), lasti) -> (code, line)
        self._compact_at = MAX_CODES  # the table's size at which it is next compacted

    def due(self) -> bool:
        """Whether :meth:`forget` should run before more notes are filed."""
        return len(self.codes) > MAX_CODES or len(self.table) > self._compact_at

    def add(self, code_objects: dict[int, Any]) -> None:
        """The code objects of notes just filed, by id."""
        self.codes.update(code_objects)

    def forget(self, timelines: Iterable[Timeline]) -> None:
        """Keep only the code objects a note of ``timelines`` still names,
        settling every fast-path key where those alone are too many."""
        self.table.compact(timelines)
        needed = {key[1] for key in self.table.keys if type(key[0]) is int}
        if len(needed) > MAX_CODES // 2:
            # A later code object given a freed one's id gets a key of its
            # own: the old key is no longer in the table.
            self.table.rewrite(self.settled)
            self.codes = {}
            self._lines.clear()
        else:
            self.codes = {cid: code for cid, code in self.codes.items() if cid in needed}
        # Compacted again once the table has doubled: a window of notes
        # larger than MAX_CODES is not compacted on every drain.
        self._compact_at = max(MAX_CODES, 2 * len(self.table))

    def settled(self, key: Any) -> Any:
        """A fast-path note's key ``(id(function), id(code), offset)`` as
        ``("w", id(function), (file, line, function name))``; others as they are."""
        if type(key) is not tuple or type(key[0]) is not int or key[2] == SEALED:
            return key
        fun_id, code_id, lasti = key
        code = self.codes.get(code_id)
        where = (code.co_filename, line_at(code, lasti), code.co_name) if code is not None else ("", 0, "<no user frame>")
        return ("w", fun_id, where)

    def line_of(self, code: Any, lasti: int) -> int:
        """The line of instruction offset ``lasti`` in ``code``, cached."""
        key = (id(code), lasti)
        kept = self._lines.get(key)
        if kept is not None and kept[0] is code:  # the code itself is kept: its id is not another's
            return kept[1]
        line = line_at(code, lasti)
        if len(self._lines) > MAX_LINES_CACHED:
            self._lines.clear()  # it holds the code objects: generated code must not pile them up
        self._lines[key] = (code, line)
        return line
