"""The sample's ``transfer_sites``: which line of the program made each
implicit transfer, as the agent writes it
(:meth:`jaxtop.probes.transfer_sites.TransferSitesProbe.field`;
docs/protocol.md, "transfer_sites"; docs/transfer-sites.md has how lines
are tied to calls).

Sent only when it changed: a sample without it means no line counted a
transfer since the last one. Its reader is
:mod:`jaxtop.dashboard.transfer_sites`.
"""

from __future__ import annotations

from typing import Annotated, Union

import msgspec

from jaxtop.wire.records.base import INT64_MAX, Num, Rec

__all__ = ["Line", "TransferArg", "TransferSite", "TransferSites", "TransferSitesOther"]

#: A line number of the program's source (0: no frame of the user's was found).
Line = Union[Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)], None]


class TransferArg(Rec):
    """One value a call at a site copies to the device (``sites[].args[]``)."""

    name: str | None = None  # as the call names it ("batch['x']", "lr"); "" where jax's slow path gave none
    # NumPy array, NumPy scalar, Python scalar, "list of …" (inside a list), another device's array.
    kind: str | None = None
    shape: str | None = None  # dtype and dimensions: "float32[512,4096]", "float[]"
    bytes: Num = None  # what jax copies (64-bit values as 32-bit without jax_enable_x64); None: unknown
    # Whether it was the same value as at the call read before it (a NumPy
    # array: the same object with the same contents; a scalar: the same
    # value); None: unknown (one call read, or an older agent).
    same: bool | None = None


class TransferSite(Rec):
    """One line of the program and the transfers it made in one direction
    (``sites[]``)."""

    direction: str | None = None  # h2d, d2h or d2d
    file: str | None = None  # the user's file, its full path
    line: Line = None
    function: str | None = None  # the user's function at that line ("<module>" at the top level)
    # The jitted function or jax op called there: "step", "sin (op)"; "host read (float)" for d2h.
    callee: str | None = None
    count_total: Num = None  # transfers made there since the agent started
    count: Num = None  # transfers since the previous sample that carried the field
    calls_total: Num = None  # the calls (or host reads) that made them: one call can log several
    bytes_total: Num = None  # from the arguments' sizes (inferred); None where one size is unknown
    args: list[TransferArg] | None = None  # the values a call there copies
    # "transfer": seen passing to the device (jax's slow path); "call": read
    # from a call's arguments at that line (inferred); None: not described.
    args_seen: str | None = None
    # The callee whose call ``args`` describe, where it is another than
    # ``callee`` (a line that calls two things); None: ``callee``'s, or an
    # older agent that did not say.
    args_of: str | None = None
    scalar: bool | None = None  # every value it copies is a Python scalar
    # Transfers per batch of ``history_ticks`` agent ticks (``history_s``
    # seconds), oldest first: the last 30 batches.
    history: list[Num] | None = None


class TransferSitesOther(Rec):
    """``other``: the lines beyond the ones sent, together."""

    count_total: Num = None  # their transfers since the agent started


class TransferSites(Rec):
    """``transfer_sites``: the busiest lines, and the transfers tied to none.

    The sum of ``count_total`` over one direction's sites, plus that
    direction's ``unattributed``, plus ``pending``, is the sample's
    ``transfers.<direction>.count_total``.
    """

    sites: list[TransferSite] | None = None  # the 50 lines with the most transfers, most first
    sites_total: Num = None  # lines seen since the agent started
    other: TransferSitesOther | None = None  # None: every line seen is in ``sites``
    # Guard lines that could not be tied to a line, since the agent started:
    # direction -> count; and reason -> count.
    unattributed: dict[str, Num] | None = None
    unattributed_reasons: dict[str, Num] | None = None
    pending: Num = None  # lines waiting for the call they belong to (it had not returned)
    history_ticks: Num = None  # agent ticks per ``history`` entry; absent from older agents (one)
    # The seconds one ``history`` entry spanned, measured between the last
    # two (longer than history_ticks x interval_s while the agent is at its
    # CPU ceiling); None until two were made, absent from older agents.
    history_s: Num = None
    error: str | None = None  # the probe raised while taking this sample: why (alone; jaxtop.agent.probe_list)
