"""Learned line layouts: a fast path for JSON lines that differ only in numbers.

An agent writes every sample with the same keys in the same order; from one
sample to the next only the numbers change. A :class:`Layout` is learned from
one line that the JSON decoder has already accepted: the line's exact text,
with each number value replaced by a hole of that number's type (integer or
float). A later line that fully matches the layout is, by construction, the
same JSON document with other numbers in the holes, so a reader can take those
numbers from the match without decoding the line. ``jaxtop export`` uses this
to skip building a dict per sample, the bulk of its time.

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
from typing import Any, Callable

#: An integer as Python's json writes it: no leading zeros, no "-0"; at most
#: 300 digits, so every integer a hole takes also fits in a float.
INT_HOLE = r"(0|-?[1-9][0-9]{0,299})"
#: A JSON number with a fraction or an exponent (json.loads makes it a float).
FLOAT_HOLE = r"(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+(?:[eE][-+]?[0-9]+)?|[eE][-+]?[0-9]+))"

_TOKEN = re.compile(
    r'[ \t\n\r]*(?:(?P<s>"(?:[^"\\]|\\.)*")'
    r"|(?P<n>-?(?:0|[1-9][0-9]*)(?P<f>(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?))"
    r"|(?P<p>[{}\[\]:,])|true|false|null|NaN|-?Infinity)"
)
# A line's bucket: its text without the characters numbers are made of.
_NUMBER_CHARS = str.maketrans("", "", "0123456789.eE+-")

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
    """One learned line shape: a compiled pattern and where each number is.

    Attributes:
        pattern: Matches exactly the lines of this shape; group ``i + 1`` is
            the ``i``-th number.
        index: Path of each number value to its position in ``match.groups()``.
        floats: Positions whose tokens are floats (read with ``float``); the
            others are integers (read with ``int``).
        emit: What the reader attached for this shape (see
            :meth:`Layouts.learn`).
    """

    __slots__ = ("pattern", "index", "floats", "emit")

    def __init__(self, text: str, record: Any) -> None:
        """Learn from ``text`` and ``record = json.loads(text)``.

        Raises:
            ValueError: ``record`` does not hold, at each number's path, that
                number (an object with a repeated key can do that); such a
                line is not learned.
        """
        numbers = number_paths(text)
        pieces: list[str] = []
        self.index: dict[Path, int] = {}
        self.floats: set[int] = set()
        pos = 0
        for i, (path, start, end, is_float) in enumerate(numbers):
            pieces.append(re.escape(text[pos:start]))
            pieces.append(FLOAT_HOLE if is_float else INT_HOLE)
            self.index[path] = i  # a repeated key: the last one wins, as in json.loads
            if is_float:
                self.floats.add(i)
            pos = end
        pieces.append(re.escape(text[pos:]))
        for path, i in self.index.items():
            start, end = numbers[i][1], numbers[i][2]
            token = text[start:end]
            expected = float(token) if i in self.floats else int(token)
            value = lookup(record, path)
            if type(value) is not type(expected) or value != expected:
                raise ValueError(f"the value at {path} is not the number at {start}")
        self.pattern = re.compile("".join(pieces))
        self.emit: Any = None


class Layouts:
    """A small cache of learned layouts, tried most recent first.

    ``match`` tries the few most recently matched layouts first (one pattern
    match when the line has the previous line's shape, the common case), then
    the candidates found by the line's text without the characters of numbers. Learning is bounded: after ``free_learns``
    layouts, a new one is learned only while matches outnumber learned
    layouts by ``min_hits_per_learn`` to one, so a file whose every line has
    its own shape costs little more than decoding it.
    """

    #: Layouts tried before the bucket lookup: samples alternate between a
    #: few shapes (e.g. with and without the 1 s live-array scan).
    RECENT = 3

    def __init__(self, limit: int = 64, free_learns: int = 16, min_hits_per_learn: int = 1000) -> None:
        self.limit = limit
        self.free_learns = free_learns
        self.min_hits_per_learn = min_hits_per_learn
        self.hits = 0
        self.learned = 0
        self._recent: list[Layout] = []
        self._by_key: dict[str, list[Layout]] = {}
        self._count = 0

    def clear(self) -> None:
        self._recent.clear()
        self._by_key.clear()
        self._count = 0

    def match(self, text: str) -> tuple[Layout, tuple[str, ...]] | None:
        """The layout ``text`` has and its number tokens, or None."""
        recent = self._recent
        for layout in recent:
            m = layout.pattern.fullmatch(text)
            if m is not None:
                self.hits += 1
                if layout is not recent[0]:
                    recent.remove(layout)
                    recent.insert(0, layout)
                return layout, m.groups()
        for layout in self._by_key.get(text.translate(_NUMBER_CHARS), ()):
            if layout in recent:
                continue
            m = layout.pattern.fullmatch(text)
            if m is not None:
                self.hits += 1
                self._remember(layout)
                return layout, m.groups()
        return None

    def _remember(self, layout: Layout) -> None:
        self._recent.insert(0, layout)
        del self._recent[self.RECENT:]

    def learn(self, text: str, record: Any, attach: Callable[[Layout], Any]) -> Layout | None:
        """Learn the layout of ``text``, which json.loads decoded to ``record``.

        ``attach(layout)`` returns what to keep as ``layout.emit``, or None
        when the caller cannot serve lines of this shape from their numbers
        alone (then nothing is kept).
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
        emit = attach(layout)
        if emit is None:
            return None
        layout.emit = emit
        if self._count >= self.limit:
            self.clear()
        self._by_key.setdefault(text.translate(_NUMBER_CHARS), []).append(layout)
        self._count += 1
        self._remember(layout)
        return layout
