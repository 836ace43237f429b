"""Learned line layouts: a fast path for JSON lines that differ only in numbers.

An agent writes every sample with the same keys in the same order; from one
sample to the next only the numbers change. A :class:`Layout` is learned from
one line that the JSON decoder has already accepted: the line's exact text,
with each number value replaced by a hole of that number's type (integer or
float). A later line that fully matches the layout is, by construction, the
same JSON document with other numbers in the holes, so a reader can take those
numbers from the match without decoding the line. ``jaxtop export`` uses this
to skip decoding each sample into dicts and formatting it field by field:
decoded with orjson instead, an export takes 1.5 to 1.7 times as long
(docs/benchmarks.md, "Export: learned layouts vs orjson").

Exactness: the holes accept only JSON's number grammar (an integer hole no
leading zeros and no ``-0``), the text between holes must match byte for byte
(keys, strings, ``null``, nesting, whitespace), and a path that occurs twice
in an object maps to its last occurrence, as :func:`json.loads` keeps it.
Integer tokens read back with ``int`` and float tokens with ``float`` are what
:func:`json.loads` returns for them.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Iterable

#: An integer as Python's json writes it: no leading zeros, no "-0"; at most
#: 300 digits, so every integer a hole takes also fits in a float.
INT_HOLE = r"0|-?[1-9][0-9]{0,299}+"
#: A JSON number with a fraction or an exponent (json.loads makes it a float).
FLOAT_HOLE = r"-?(?:0|[1-9][0-9]*+)(?:\.[0-9]++(?:[eE][-+]?[0-9]++)?|[eE][-+]?[0-9]++)"

_TOKEN = re.compile(
    r'[ \t\n\r]*(?:(?P<s>"(?:[^"\\]|\\.)*")'
    r"|(?P<n>-?(?:0|[1-9][0-9]*)(?P<f>(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?))"
    r"|(?P<p>[{}\[\]:,])|true|false|null|NaN|-?Infinity)"
)

Path = tuple[Any, ...]

#: Layouts beyond this many holes are not learned (a line that big is rare and
#: its pattern would cost more to build than it saves).
MAX_HOLES = 2000


def number_paths(text: str) -> list[tuple[Path, int, int, bool]]:
    """``(path, start, end, is_float)`` of every number value in ``text``.

    ``text`` must be valid JSON (decode it first). A path is the tuple of keys
    and list indexes from the top, e.g. ``("devices", 0, "bytes_in_use")``.
    Numbers inside strings are part of the string, not values.
    """
    found: list[tuple[Path, int, int, bool]] = []
    path: list[Any] = []
    in_object: list[bool] = []
    want_key = False
    for m in _TOKEN.finditer(text):
        punct = m.group("p")
        if punct is not None:
            if punct == "{":
                in_object.append(True)
                path.append(None)
                want_key = True
            elif punct == "[":
                in_object.append(False)
                path.append(0)
                want_key = False
            elif punct in "}]":
                in_object.pop()
                path.pop()
                want_key = False
            elif punct == ":":
                want_key = False
            elif in_object[-1]:  # a comma in an object: a key comes next
                want_key = True
            else:  # a comma in a list: the next element
                path[-1] += 1
        elif m.group("s") is not None:
            if want_key:
                path[-1] = json.loads(m.group("s"))
        elif m.group("n") is not None:
            found.append((tuple(path), m.start("n"), m.end("n"), bool(m.group("f"))))
    return found


def lookup(record: Any, path: Path) -> Any:
    """The value at ``path`` in a decoded record, or None where it is absent."""
    value = record
    for step in path:
        if isinstance(step, str):
            if not isinstance(value, dict):
                return None
            value = value.get(step)
        else:
            if not isinstance(value, list) or step >= len(value):
                return None
            value = value[step]
    return value


class Layout:
    """One learned line shape: where each number is, and a pattern for it.

    Attributes:
        index: Path of each number value to its hole (its rank among the
            line's numbers).
        floats: Holes whose tokens are floats (read with ``float``); the
            others are integers (read with ``int``).
        pattern: Matches exactly the lines of this shape. Built by
            :meth:`capture`, which says which holes it captures.
        emit: What the reader attached for this shape (see
            :meth:`Layouts.learn`).
        next: The layout that followed this one last time (tried first when
            a run of this shape ends).
    """

    __slots__ = ("_pieces", "emit", "floats", "index", "key", "next", "pattern")

    def __init__(self, text: str, record: Any) -> None:
        """Learn from ``text`` and ``record = json.loads(text)``.

        Raises:
            ValueError: ``record`` does not hold, at each number's path, that
                number (an object with a repeated key can do that); such a
                line is not learned.
        """
        numbers = number_paths(text)
        self._pieces: list[str] = []  # literal text around the holes, escaped
        self.index: dict[Path, int] = {}
        self.floats: set[int] = set()
        pos = 0
        for i, (path, start, end, is_float) in enumerate(numbers):
            self._pieces.append(re.escape(text[pos:start]))
            self.index[path] = i  # a repeated key: the last one wins, as in json.loads
            if is_float:
                self.floats.add(i)
            pos = end
        tail = re.escape(text[pos:])
        self._pieces.append(tail if text.endswith("\n") else tail + r"\Z")  # \Z: the text's end ends the line
        for path, i in self.index.items():
            start, end = numbers[i][1], numbers[i][2]
            token = text[start:end]
            expected = float(token) if i in self.floats else int(token)
            value = lookup(record, path)
            if type(value) is not type(expected) or value != expected:
                raise ValueError(f"the value at {path} is not the number at {start}")
        self.key = line_key(text)
        self.pattern: re.Pattern[str] | None = None
        self.emit: Any = None
        self.next: Layout | None = None

    def capture(self, holes: Iterable[int] | None = None) -> dict[int, int]:
        """Build the pattern, capturing only ``holes`` (all when None).

        Returns each captured hole's position in ``match.groups()``. Holes
        not captured are still matched exactly; capturing fewer is faster.
        """
        wanted = set(range(len(self._pieces) - 1) if holes is None else holes)
        parts = [self._pieces[0]]
        where: dict[int, int] = {}
        for i, piece in enumerate(self._pieces[1:]):
            hole = FLOAT_HOLE if i in self.floats else INT_HOLE
            if i in wanted:
                where[i] = len(where)
                parts.append(f"({hole})")
            else:
                parts.append(f"(?:{hole})")
            parts.append(piece)
        self.pattern = re.compile("".join(parts))
        return where


def line_key(text: str) -> tuple[int, int, int]:
    """What every line of one layout shares: its counts of quotes, commas
    and colons (numbers hold none of them). Cheap to take."""
    return text.count('"'), text.count(","), text.count(":")


class Layouts:
    """A small cache of learned layouts.

    ``match`` tries, in order: the layout that followed the caller's last
    one last time, the few layouts matched most recently, and the layouts
    whose lines share the line's :func:`line_key`. Learning is bounded: after
    ``free_learns`` layouts, a new one is learned only while matches
    outnumber learned layouts by ``min_hits_per_learn`` to one, so a file
    whose every line has its own shape costs little more than decoding it.
    """

    #: Layouts tried before the key lookup: samples alternate between a
    #: few shapes (e.g. with and without the 1 s live-array scan).
    RECENT = 3

    def __init__(self, limit: int = 64, free_learns: int = 16, min_hits_per_learn: int = 1000) -> None:
        self.limit = limit
        self.free_learns = free_learns
        self.min_hits_per_learn = min_hits_per_learn
        self.hits = 0
        self.learned = 0
        self._recent: list[Layout] = []
        self._by_key: dict[tuple[int, int, int], list[Layout]] = {}

    def clear(self) -> None:
        self._recent.clear()
        self._by_key.clear()

    def match(self, text: str, pos: int = 0, tried: Layout | None = None) -> tuple[Layout, re.Match[str]] | None:
        """The layout of the line at ``text[pos:]`` and its match, or None.

        The line runs to the end of ``text`` or, for layouts learned from
        lines that end with a newline, to the next newline (a JSON line has
        no other). ``tried``: the layout of the previous line, which the
        caller already found not to match this one.
        """
        guess = tried.next if tried is not None else None
        if guess is not None:  # shapes tend to follow each other in a cycle
            m = guess.pattern.match(text, pos)  # type: ignore[union-attr]
            if m is not None:
                self.hits += 1
                self._remember(guess)
                return guess, m
        seen = {id(tried), id(guess)}
        for layout in self._recent:
            if id(layout) in seen:
                continue
            seen.add(id(layout))
            m = layout.pattern.match(text, pos)  # type: ignore[union-attr]
            if m is not None:
                return self._hit(layout, m, tried)
        newline = text.find("\n", pos)
        line = text[pos:] if newline < 0 else text[pos:newline + 1]
        for layout in self._by_key.get(line_key(line), ()):
            if id(layout) in seen:
                continue
            m = layout.pattern.match(text, pos)  # type: ignore[union-attr]
            if m is not None:
                return self._hit(layout, m, tried)
        return None

    def _hit(self, layout: Layout, m: re.Match[str], tried: Layout | None) -> tuple[Layout, re.Match[str]]:
        self.hits += 1
        if tried is not None:
            tried.next = layout
        self._remember(layout)
        return layout, m

    def _remember(self, layout: Layout) -> None:
        recent = self._recent
        if recent and recent[0] is layout:
            return
        if layout in recent:
            recent.remove(layout)
        recent.insert(0, layout)
        del recent[self.RECENT:]

    @property
    def current(self) -> Layout | None:
        """The layout matched or learned last."""
        return self._recent[0] if self._recent else None

    def learn(self, text: str, record: Any, attach: Callable[[Layout, Any], Any]) -> Layout | None:
        """Learn the layout of ``text``, which json.loads decoded to ``record``.

        ``attach(layout, record)`` returns what to keep as ``layout.emit``
        (having called ``layout.capture``, or all holes are captured), or
        None when the caller cannot serve lines of this shape from their
        numbers alone (then nothing is kept).
        """
        if self.learned >= self.free_learns and self.learned * self.min_hits_per_learn > self.hits:
            return None
        if text.count(",") > 4 * MAX_HOLES:  # cheap bound before tokenizing
            return None
        self.learned += 1
        try:
            layout = Layout(text, record)
        except (ValueError, OverflowError):
            return None
        if len(layout.index) > MAX_HOLES:
            return None
        emit = attach(layout, record)
        if emit is None:
            return None
        if layout.pattern is None:
            layout.capture()
        layout.emit = emit
        if sum(map(len, self._by_key.values())) >= self.limit:
            self.clear()
        self._by_key.setdefault(layout.key, []).append(layout)
        self._remember(layout)
        return layout
