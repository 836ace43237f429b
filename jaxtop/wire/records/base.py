"""What every wire record's fields are made of: numbers, times, names.

A figure is a JSON number or ``null`` (not measured): :data:`Num`. Its
integers are bounded to 64 bits, the agent's byte counts and addresses fit
there; a bigger one fails the fast decode and the decoder's careful path
reads it as a float, as orjson would (:mod:`jaxtop.wire.records.decoder`).
JSON has no NaN or infinity, and a number beyond a float's range (``1e400``)
fails the fast decode too: the careful path reads it as n/a.

A time (:data:`Time`) is Unix seconds within 1e11 s of 0 (about the year
5138): beyond that it is no time a program ran at, and ``time.localtime``
and the timelines' int64 bucket numbers would fail on it.

Every struct is frozen: a record is decoded once and read as it is from
then on, by every view, from any thread.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

import msgspec

__all__ = ["INT64_MAX", "INT64_MIN", "MAX_TIME_S", "DeviceId", "Num", "Raw", "Rec", "Time"]

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
#: The largest time a record may carry (Unix seconds).
MAX_TIME_S = 1e11

#: A figure: a number, or None where it was not measured.
Num = Union[Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)], float, None]
#: A time, Unix seconds.
Time = Union[Annotated[float, msgspec.Meta(ge=-MAX_TIME_S, le=MAX_TIME_S)], None]
#: A device's id: the agent's jax id (an integer), or a name (a Prometheus
#: label that is not a number). A bool, a float (``0.0`` would be device 0
#: as a key) or a container names no device.
DeviceId = Union[Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)],
                 Annotated[str, msgspec.Meta(min_length=1, max_length=200)]]
#: A part of a record kept as decoded JSON (an object): its readers take
#: its keys themselves. Its strings are terminal-safe like every other.
Raw = Union[dict[str, Any], None]


class Rec(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The base of every part of a record: frozen, fields by name."""
