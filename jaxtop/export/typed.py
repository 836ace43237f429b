"""The parts of the wire's records an export writes, as lean types.

A demo sample is about 2 KB of JSON, an 8-device GPU sample 11 KB on
average (50 KB with its devices' buffer maps), of which the CSV writes some
40 numbers a device. msgspec decodes
a line straight into a lean type that names only the fields a format
writes, and skips the rest without building Python objects for it; the
writers then read attributes.

Each lean type is a cut of the wire's own type of that part
(:mod:`jaxtop.wire.records`): :func:`cut_of` checks, when this module is
imported, that every field it names is a field of the wire's type, and that
each part inside it is a cut of the part the wire's type has there. A field
renamed on the wire fails here, not as an empty column.

Two things differ from the wire's types, on purpose:

* An export writes what the recording holds, exactly: an integer beyond 64
  bits as its digits, a string where a number belongs as that string (the
  wire's decoder reads the first as a float and the second as n/a). So a
  cell's field is ``Any``. Only the trace's counters and its sample time,
  which take finite numbers alone, are the wire's
  :data:`~jaxtop.wire.records.base.Num`.
* No string is made terminal-safe: a file gets the recording's text as it
  is (``jaxtop export`` to a terminal shows it safely: jaxtop.cli.export).

Two paths make a lean record, and they agree (``tests/test_export_paths.py``
holds them to the same bytes on real and hostile recordings):

* fast: msgspec decodes the line into the lean type. It reads every value
  as json.loads does (big integers exactly, duplicate keys: the last wins,
  floats correctly rounded); where the two differ it refuses the line
  (``NaN``, a number beyond a float's range, a lone surrogate, a byte order
  mark, deep nesting), and it refuses a part of the wrong shape;
* careful (:func:`from_dict`): the line decoded whole (orjson, or json.loads:
  :func:`jaxtop.export.convert.decode`), then each field taken as its lean
  type takes it: a part that is not an object reads None, a list's items
  that are not objects are left out (or read None where the list allows
  None), a ``Num`` that is not a finite number reads None.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar, Union

import msgspec

from jaxtop.wire import protocol
from jaxtop.wire.records import core, holders, sites
from jaxtop.wire.records.base import Num

__all__ = [
    "ERRORS", "UNSET", "CsvSample", "HoldersSample", "HostSyncsSample", "LabelsSample", "Other", "TraceSample",
    "TransferSitesSample", "cut_of", "finite", "from_dict", "is_int", "record",
]

#: What makes the fast decoding leave a line to the careful path.
ERRORS: tuple[type[BaseException], ...] = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)
#: The default of a field whose absence means something else than null.
UNSET: Any = msgspec.UNSET

class Lean(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The base of every lean type: frozen, fields by name."""


C = TypeVar("C", bound=type)
L = TypeVar("L", bound=Lean)


# -- each lean type is a cut of the wire's ------------------------------------------------------

_NONE = type(None)
_UNIONS = (Union, types.UnionType)
#: Each lean type's wire type.
WIRE: dict[type, type] = {}


def _members(tp: Any) -> tuple[Any, ...]:
    """The types a field may hold: a union's members (None left out),
    ``Annotated[X, ...]`` as X."""
    if typing.get_origin(tp) in _UNIONS:
        out = tuple(m for m in typing.get_args(tp) if m is not _NONE)
    else:
        out = (tp,)
    return tuple(typing.get_args(m)[0] if typing.get_origin(m) is typing.Annotated else m for m in out)


def _structs(tp: Any) -> set[type]:
    """The Struct types a field's type holds, inside lists and dicts too."""
    found: set[type] = set()
    for m in _members(tp):
        if isinstance(m, type) and issubclass(m, msgspec.Struct):
            found.add(m)
        else:
            for arg in typing.get_args(m):
                found |= _structs(arg)
    return found


def cut_of(wire: type) -> Callable[[C], C]:
    """A class decorator: the lean type is a cut of ``wire``.

    Raises:
        TypeError: the lean type names a field ``wire`` has not, or holds a
            part that is not a cut of the part ``wire`` holds there.
    """

    def check(cls: C) -> C:
        have = {f.encode_name: f for f in msgspec.structs.fields(wire)}
        tag = wire.__struct_config__.tag_field
        for f in msgspec.structs.fields(cls):
            if f.encode_name == tag:  # a record's ``type``: read here to route the record
                continue
            theirs = have.get(f.encode_name)
            if theirs is None:
                raise TypeError(f"{cls.__name__}.{f.name}: {wire.__module__}.{wire.__name__} has no such field")
            for part in _structs(f.type):
                if WIRE.get(part) not in _structs(theirs.type):
                    raise TypeError(f"{cls.__name__}.{f.name}: {part.__name__} is no cut of what "
                                    f"{wire.__name__}.{theirs.name} holds")
        WIRE[cls] = wire
        return cls

    return check


# -- the CSV table (one row per sample and device) -----------------------------------------------
# Fields in the table's column order.

@cut_of(core.LiveArrays)
class CsvLive(Lean):
    bytes: Any = None
    count: Any = None
    largest_bytes: Any = None


@cut_of(core.Device)
class CsvDevice(Lean):
    id: Any = None
    platform: Any = None
    source: Any = None
    bytes_in_use: Any = None
    peak_bytes_in_use: Any = None
    peak_rise_bytes: Any = None
    pool_bytes: Any = None
    bytes_limit: Any = None
    largest_free_block_bytes: Any = None
    fragmentation: Any = None
    num_allocs: Any = None
    live_arrays: CsvLive | None = None


@cut_of(core.Transfer)
class CsvTransfer(Lean):
    count: Any = None
    bytes_known: Any = None
    count_total: Any = None
    bytes_known_total: Any = None


@cut_of(core.Transfers)
class CsvTransfers(Lean):
    h2d: CsvTransfer | None = None
    d2h: CsvTransfer | None = None
    d2d: CsvTransfer | None = None


@cut_of(core.Process)
class CsvProcess(Lean):
    rss_bytes: Any = None
    cpu_percent: Any = None


@cut_of(core.Compile)
class CsvCompile(Lean):
    count_total: Any = None
    seconds_total: Any = None


@cut_of(core.Donation)
class CsvDonation(Lean):
    failed_total: Any = None


@cut_of(core.Sample)
class CsvSample(Lean):
    type: str
    t: Any = None
    seq: Any = None
    devices: list[CsvDevice] | None = None
    transfers: CsvTransfers | None = None
    process: CsvProcess | None = None
    compile: CsvCompile | None = None
    donation: CsvDonation | None = None


# -- the sparse parts: the long tables, and the trace's counters of them ---------------------------

@cut_of(holders.SiteGrowth)
class Growth(Lean):
    rises: Any = None
    bytes_per_min: Any = None
    count_per_min: Any = None


@cut_of(holders.BytesCount)
class BytesCount(Lean):
    bytes: Any = None
    count: Any = None


@cut_of(holders.HolderSite)
class HolderSite(Lean):
    site: Any = None
    function: Any = None
    file: Any = None
    line: Any = None
    bytes: Any = None
    count: Any = None
    suspect: Any = None
    growth: Growth | None = None
    mark: BytesCount | None = None


@cut_of(holders.OtherSites)
class OtherSites(Lean):
    bytes: Any = None
    count: Any = None
    sites: Any = None


@cut_of(holders.Holders)
class Holders(Lean):
    t: Any = UNSET  # absent: the sample's time
    seq: Any = None
    sites: list[HolderSite] | None = None
    other: OtherSites | None = None


@cut_of(holders.LabelledTree)
class LabelledTree(Lean):
    name: Any = None
    bytes: Any = None
    arrays: Any = None
    alive: Any = None
    leaves: Any = None
    labelled_t: Any = None


@cut_of(holders.Labels)
class Labels(Lean):
    t: Any = UNSET  # absent: the sample's time
    trees: list[LabelledTree] | None = None


@cut_of(holders.SyncSite)
class SyncSite(Lean):
    site: Any = None
    function: Any = None
    file: Any = None
    line: Any = None
    count: Any = None
    kinds: dict[str, Any] | None = None
    last_t: Any = None


@cut_of(holders.HostSyncs)
class HostSyncs(Lean):
    t: Any = UNSET  # absent: the sample's time
    count: Any = None
    sites: list[SyncSite] | None = None


@cut_of(sites.TransferArg)
class TransferArg(Lean):
    name: Any = None
    kind: Any = None
    shape: Any = None
    bytes: Any = None


@cut_of(sites.TransferSite)
class TransferSite(Lean):
    direction: Any = None
    file: Any = None
    line: Any = None
    function: Any = None
    callee: Any = None
    count: Any = None
    count_total: Any = None
    calls_total: Any = None
    bytes_total: Any = None
    args: list[TransferArg | None] | None = None  # None: an item that is no object (an empty cell)
    args_seen: Any = None
    scalar: Any = None


@cut_of(sites.TransferSites)
class TransferSites(Lean):
    sites: list[TransferSite] | None = None
    unattributed: dict[str, Any] | None = None
    unattributed_reasons: dict[str, Any] | None = None


# One sample type per long table: a sample without its part (nearly every
# one) is skipped whole, whatever its other parts hold.

@cut_of(core.Sample)
class HoldersSample(Lean):
    type: str
    t: Any = None
    holders: Holders | None = None


@cut_of(core.Sample)
class LabelsSample(Lean):
    type: str
    t: Any = None
    labels: Labels | None = None


@cut_of(core.Sample)
class HostSyncsSample(Lean):
    type: str
    t: Any = None
    host_syncs: HostSyncs | None = None


@cut_of(core.Sample)
class TransferSitesSample(Lean):
    type: str
    t: Any = None
    transfer_sites: TransferSites | None = None


# -- the trace -----------------------------------------------------------------------------------
# Counters take finite numbers only: their fields are Num, a number beyond
# 64 bits goes the careful way, which keeps it if it is finite as a float.

@cut_of(core.Device)
class TraceDevice(Lean):
    id: Any = None  # an integer names a track; any other id none
    bytes_in_use: Num = None
    pool_bytes: Num = None
    peak_bytes_in_use: Num = None
    bytes_limit: Num = None
    fragmentation: Num = None


@cut_of(core.Transfer)
class TraceTransfer(Lean):
    count: Union[Num, msgspec.UnsetType] = UNSET  # absent: none counted (a rate of 0); null: not measured


@cut_of(core.Transfers)
class TraceTransfers(Lean):
    h2d: TraceTransfer | None = None
    d2h: TraceTransfer | None = None
    d2d: TraceTransfer | None = None


@cut_of(core.Process)
class TraceProcess(Lean):
    rss_bytes: Num = None


@cut_of(core.Compile)
class TraceCompile(Lean):
    count_total: Any = None  # an integer of any size: the compile instants' args carry it whole


@cut_of(core.Donation)
class TraceDonation(Lean):
    failed_total: Any = None  # as count_total
    last_message: Any = None


@cut_of(core.Sample)
class TraceSample(Lean):
    type: str
    t: Num = None
    devices: list[TraceDevice] | None = None
    transfers: TraceTransfers | None = None
    process: TraceProcess | None = None
    compile: TraceCompile | None = None
    donation: TraceDonation | None = None
    # Kept whole: an event's instant carries every field it has but kind and t, a newer agent's too.
    events: list[dict[str, Any]] | None = None
    holders: Holders | None = None
    labels: Labels | None = None
    host_syncs: HostSyncs | None = None


# -- every other record ----------------------------------------------------------------------------

@cut_of(core.Hello)
class Other(Lean):
    """A record that is not a sample: what a ``hello`` (or an ``exit``) gives an export."""

    type: str
    t: Any = None
    pid: Any = None
    argv: list[Any] | None = None


# -- the careful path ----------------------------------------------------------------------------

#: Integers this small convert to a finite float; bigger ones are checked.
_SAFE_INT = 1 << 1023


def is_int(value: Any) -> bool:
    """True for an integer of any size, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def finite(v: Any) -> bool:
    """True for a number (not a bool) that is finite as a float.

    Called for every value of every counter of a trace (a million times for
    100,000 samples): the exact types a decoder returns are tested first,
    None next, without a call."""
    t = type(v)
    if t is float:
        return v - v == 0.0  # inf - inf and nan - nan are nan
    if t is int and -_SAFE_INT < v < _SAFE_INT:
        return True
    if v is None:
        return False
    try:
        return protocol.is_number(v) and math.isfinite(v)
    except OverflowError:  # an integer beyond a float's range
        return False


def _keep(value: Any) -> Any:
    return value


def _finite_or_none(value: Any) -> Any:
    return value if finite(value) else None


def _converter(tp: Any) -> Callable[[Any], Any]:
    """How the careful path takes a value for a field of type ``tp``."""
    if tp is Any or tp is str:
        return _keep
    members = _members(tp)
    if float in members:  # Num
        return _finite_or_none
    (kind,) = (m for m in members if m is not msgspec.UnsetType)
    origin = typing.get_origin(kind)
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        part = kind
        return lambda v: from_dict(v, part) if v.__class__ is dict else None
    if origin is dict:
        return lambda v: v if v.__class__ is dict else None
    if origin is list:
        (item,) = typing.get_args(kind)
        item_members = _members(item)
        if item is Any:
            return lambda v: v if v.__class__ is list else None
        (item_kind,) = item_members
        none_ok = _NONE in typing.get_args(item)
        if isinstance(item_kind, type) and issubclass(item_kind, msgspec.Struct):
            if none_ok:
                return lambda v: ([from_dict(x, item_kind) if x.__class__ is dict else None for x in v]
                                  if v.__class__ is list else None)
            return lambda v: ([from_dict(x, item_kind) for x in v if x.__class__ is dict]
                              if v.__class__ is list else None)
        if typing.get_origin(item_kind) is dict:
            return lambda v: [x for x in v if x.__class__ is dict] if v.__class__ is list else None
    raise TypeError(f"no careful rule for {tp!r}")


_PLANS: dict[type, list[tuple[str, str, Callable[[Any], Any]]]] = {}


def _plan(cls: type) -> list[tuple[str, str, Callable[[Any], Any]]]:
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = [(f.name, f.encode_name, _converter(f.type)) for f in msgspec.structs.fields(cls)]
    return plan


def from_dict(obj: dict[str, Any], cls: type[L]) -> L:
    """A JSON object (as json.loads gives it) as the lean type ``cls``: the
    careful path. A field the object lacks keeps its default."""
    fields = {}
    for name, key, take in _plan(cls):
        if key in obj:
            fields[name] = take(obj[key])
    return cls(**fields)


def record(obj: dict[str, Any], sample: type[L]) -> L | Other:
    """A decoded record (an object with a string ``type``) as ``sample`` or,
    when it is no sample, as :class:`Other`."""
    return from_dict(obj, sample if obj["type"] == "sample" else Other)


for _cls in list(WIRE):  # every rule known at import: a type with none fails here, not on a hostile line
    _plan(_cls)
