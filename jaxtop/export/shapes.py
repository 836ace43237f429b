"""Text made once per shape of sample, then filled in.

A recording's samples repeat their neighbours' shape (the same devices, the
same figures numbers or n/a): the CSV rows and the trace's counter events
of one shape are one %-format and a getter of the values it takes, made
once (by the writer's ``make``) and kept here.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["MAX_SHAPES", "Format", "ShapeFormats"]

#: Formats kept: a recording whose every sample differs gains nothing from
#: more, and must not grow the cache without bound.
MAX_SHAPES = 256

#: A %-format and what picks its values from a sample's list.
Format = tuple[str, Callable[[list[Any]], tuple[Any, ...]]]


class ShapeFormats:
    """The formats made so far, by shape (at most :data:`MAX_SHAPES`)."""

    def __init__(self, make: Callable[[tuple[Any, ...]], Format]) -> None:
        self._make = make
        self._formats: dict[tuple[Any, ...], Format] = {}

    def get(self, key: tuple[Any, ...]) -> Format:
        shape = self._formats.get(key)
        if shape is None:
            if len(self._formats) >= MAX_SHAPES:
                self._formats.clear()
            shape = self._formats[key] = self._make(key)
        return shape
