"""The sparse parts the Holders screen reads: ``holders`` (memory by
allocation site), ``labels`` (named pytrees) and ``host_syncs`` (lines that
read device arrays on the host).

Each is sent only on the samples that carry news of it (docs/protocol.md,
"Memory holders, named pytrees and host syncs"); the producers are
``probes/holders.py``, ``jaxtop/agent/labels.py`` and ``probes/host_sync.py``.
A site is named by ``site`` (``train.py:120``), ``function``, ``file`` (full
path) and ``line``; ``(file, line, function)`` identifies it.
"""

from __future__ import annotations

from jaxtop.wire.records.base import Num, Rec, Time

__all__ = [
    "BytesCount", "BytesCountPair", "HolderSite", "Holders", "HoldersMark", "HostSyncs", "LabelledTree", "Labels",
    "OtherSites", "SiteGrowth", "SyncSite", "WhoHolds", "WhoSite",
]

#: ``[bytes, count]`` of one device (``by_device``, a site's ``devices``).
BytesCountPair = tuple[Num, Num]


# -- holders -------------------------------------------------------------------------------------

class BytesCount(Rec):
    """Bytes and buffers: ``executables``, or a site's ``mark`` (its change
    since the mark; negative where freed)."""

    bytes: Num = None
    count: Num = None


class OtherSites(BytesCount):
    """``holders.other``: the sites of the profile not listed."""

    sites: Num = None  # how many


class HoldersMark(BytesCount):
    """``holders.mark`` (only after ``holders_mark``): the mark, and the
    change of the totals since it in ``bytes``, ``count``."""

    t: Time = None  # when the mark's profile was taken
    seq: Num = None  # the mark's profile


class SiteGrowth(Rec):
    """A site's current run of rises (``sites[].growth``)."""

    rises: Num = None
    since_t: Time = None  # the level before the first rise
    last_rise_t: Time = None
    for_s: Num = None  # from the level before the first rise to the last rise
    bytes_per_min: Num = None  # None: the bytes are not rising now
    count_per_min: Num = None  # buffers per minute; None: the count is not rising now


class HolderSite(Rec):
    """One allocation site of a profile (``holders.sites[]``)."""

    site: str | None = None  # train.py:120
    function: str | None = None
    file: str | None = None  # the full path
    line: Num = None
    bytes: Num = None  # its live buffers' bytes (0: gone since the mark)
    count: Num = None  # its live buffers
    devices: dict[str, BytesCountPair] | None = None  # the profile's device label -> [bytes, count]
    library: bool | None = None  # no frame of the user's code: a library's site
    labels: dict[str, dict[str, Num]] | None = None  # a profile label other than kind/device -> value -> buffers
    growth: SiteGrowth | None = None  # only while it rises
    watching: bool | None = None  # rising, not (yet) a suspect
    suspect: bool | None = None  # a leak suspect
    mark: BytesCount | None = None  # only with a mark: its change since it


class Holders(Rec):
    """``holders``: one device memory profile, by allocation site; or only
    ``error`` (and ``t``, ``interval_s``) when the profile failed."""

    t: Time = None
    seq: Num = None  # the profile's number: 1, 2, 3… per agent
    reason: str | None = None  # cadence, demand (holders_profile) or mark (holders_mark)
    seconds: Num = None  # what the profile cost, wall seconds
    interval_s: Num = None  # the period until the next one, after back-off
    cadence: str | None = None  # what set interval_s: base, young, climbing or marked
    bytes: Num = None  # live buffer bytes in the profile, all devices
    count: Num = None  # live buffers
    in_use_bytes: Num = None  # the allocator's, over the local devices (None on CPU: shares are of bytes)
    by_device: dict[str, BytesCountPair] | None = None  # the profile's device label -> [bytes, count]
    executables: BytesCount | None = None  # loaded executables, totalled apart; None: n/a (method "arrays")
    # How the sites were read: "profile" (jaxlib's device memory profile) or
    # "arrays" (the live arrays' own tracebacks, a few hundred at a time:
    # from 1,000 arrays on); None from an older agent (a profile).
    method: str | None = None
    sites_total: Num = None  # sites in the profile
    sites: list[HolderSite] | None = None  # the largest, every suspect and watched one, the mark's changes
    other: OtherSites | None = None
    suspects: Num = None  # how many sites are leak suspects
    watching: Num = None  # how many sites are watched
    mark: HoldersMark | None = None
    cpu_s_total: Num = None  # CPU seconds spent profiling so far
    error: str | None = None  # instead of the above: why the profile failed (or the probe raised)


# -- labels --------------------------------------------------------------------------------------

class LabelledTree(Rec):
    """One name given to ``jaxtop.label`` (``labels.trees[]``)."""

    name: str | None = None
    bytes: Num = None  # sum(x.nbytes) of its jax.Array leaves still alive and not deleted
    arrays: Num = None  # array leaves
    alive: Num = None  # array leaves still alive
    leaves: Num = None  # all leaves
    labelled_t: Time = None  # when label() was last called for the name
    followed: bool | None = None  # its leaves are listed again as the object changes


class Labels(Rec):
    """``labels``: the named pytrees, largest first."""

    t: Time = None  # when read
    trees: list[LabelledTree] | None = None
    dropped_names: Num = None  # names ignored: more than 256 were labelled
    error: str | None = None  # instead of the above: the probe raised


# -- host syncs ----------------------------------------------------------------------------------

class SyncSite(Rec):
    """One line that read device arrays on the host (``host_syncs.sites[]``)."""

    site: str | None = None  # train.py:131
    function: str | None = None
    file: str | None = None  # the full path
    line: Num = None
    count: Num = None  # reads counted
    kinds: dict[str, Num] | None = None  # kind (float, item, asarray…) -> reads
    last_t: Time = None  # its latest read


class HostSyncs(Rec):
    """``host_syncs``: host reads of device arrays since the probe started."""

    t: Time = None  # when read
    available: bool | None = None  # False: the hooks are not in, ``reason`` says why
    reason: str | None = None
    count: Num = None  # reads counted
    by_kind: dict[str, Num] | None = None  # kind -> reads
    sites_total: Num = None  # call sites seen
    sites: list[SyncSite] | None = None  # the sites with the most reads
    numpy_hooks: bool | None = None  # numpy's asarray/array/asanyarray are wrapped
    uncounted: str | None = None  # which reads cannot be seen, and why
    error: str | None = None  # instead of the above: the probe raised
    # Host syncs in the worst step: a budget's figure (host_syncs_per_step)
    # that no probe sends yet; budgets read it n/a until one does.
    per_step_max: Num = None


# -- who holds (the ``holders_who`` command's reply) ------------------------------------------

class WhoSite(Rec):
    """One site searched: the program's names that keep a few of its arrays
    alive (``paths``: an expression, ``__main__.metrics[…]``, -> how many of
    the ``arrays`` searched for it holds)."""

    file: str | None = None
    line: Num = None
    arrays: Num = None  # found at the site in the last scan, searched for
    paths: dict[str, Num] | None = None
    unnamed: Num = None  # of them no name of the program's reaches
    objects: Num = None  # objects the search looked at
    complete: bool | None = None  # the search ended within its bounds


class WhoHolds(Rec):
    """The ``holders_who`` command's result, or the ``error`` that stopped it."""

    who: list[WhoSite] | None = None
    seconds: Num = None
    longest_piece_s: Num = None  # the longest the search held the interpreter at once
    error: str | None = None
