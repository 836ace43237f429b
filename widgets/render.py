"""Pure Rich renderables for the dashboard: data and a width in, text out.

Each class takes plain data (numbers, lists, numpy arrays) and draws it into
the width Rich offers (``options.max_width``), never wider and never wrapped.
Nothing here knows about Textual, sockets or the model: the widgets hold
reactive attributes and hand their data to these classes, and the tests render
them to strings without an app (the pattern of Textual's own ``Sparkline``).

A missing value is drawn as "n/a", with a reason where one is given, never as
zero (docs/protocol.md: values that cannot be measured are ``null``); a value
too large for a float (a hostile recording) is drawn as the largest there is,
never raised.

This module gathers them under one name; each lives in a module of its own:

* :mod:`jaxtop.widgets.fmt`: sizes (:func:`fmt_bytes`, the one formatter of
  :mod:`jaxtop.wire.units`), rates, durations, counts, percents.
* :mod:`jaxtop.widgets.bars`: :class:`LayersBar`, :class:`Gauge`, :class:`MiniBars`.
* :mod:`jaxtop.widgets.timelines`: :class:`Timeline`, :class:`TimelineStack`
  and its :class:`Strip`; :mod:`jaxtop.widgets.plot` draws their cells and
  holds :class:`Series`.
* :mod:`jaxtop.widgets.memory_map`: :class:`MemoryMap`.
* :mod:`jaxtop.widgets.cells`: the drawing primitives they share.
"""

from __future__ import annotations

from jaxtop.widgets.bars import Gauge, LayersBar, MiniBars
from jaxtop.widgets.cells import H_EIGHTHS, V_EIGHTHS
from jaxtop.widgets.fmt import fmt_bytes, fmt_duration, fmt_rate
from jaxtop.widgets.memory_map import REGION_GAP_BYTES, MemoryMap
from jaxtop.widgets.plot import Series
from jaxtop.widgets.timelines import Strip, Timeline, TimelineStack

__all__ = [
    "Gauge", "LayersBar", "MemoryMap", "MiniBars", "Series", "Strip", "Timeline", "TimelineStack",
    "fmt_bytes", "fmt_duration", "fmt_rate",
    "H_EIGHTHS", "REGION_GAP_BYTES", "V_EIGHTHS",
]
