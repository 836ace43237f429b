"""What one counted device buffer is, and what is derived from a device's
buffers when asked: the largest ones, the address map and the holes among
them.

A buffer is one flat tuple of atoms: ``(device id, nbytes, ptr, dtype,
shape, why unmapped)``. The live-array accounting
(:mod:`jaxtop.probes.live_arrays`) keeps one per array, up to date arrival
by arrival; this module reads them. The detail is derived only when asked
for (the agent does so at a lower, budgeted cadence than its scans): the
largest :data:`TOP_BUFFERS`, the map of the largest :data:`BUFFER_MAP_MAX`
in address order, and the share of holes among them.

Stdlib only.
"""

from __future__ import annotations

import heapq
from operator import itemgetter
from typing import Any, Iterable

__all__ = ["BUFFER_MAP_MAX", "DEV", "DTYPE", "MIN_HOLE_BUFFER", "MIN_HOLE_BYTES", "NBYTES", "NOT_READY", "PTR",
           "REGION_GAP_BYTES", "SHAPE", "SHARDED", "TOP_BUFFERS", "UNMAPPED", "WHY", "detail_of", "hole_ratio",
           "summarize_live_arrays"]

#: Buffers a device's map lists at most (the largest ones).
BUFFER_MAP_MAX = 2000
#: Largest buffers listed per device.
TOP_BUFFERS = 10
#: A gap between two address neighbours this wide or wider is taken for the
#: distance between two memory regions (on CPU another mapping or malloc
#: arena; on a GPU another pool chunk), not a hole among live buffers.
REGION_GAP_BYTES = 4 << 20
#: Narrower gaps are the allocator's own headers and alignment, not holes.
MIN_HOLE_BYTES = 4096
#: Holes are read only between buffers this large or larger. On CPU a small
#: buffer comes from malloc's bins, among the program's other heap objects:
#: the space around it is theirs, not a hole (5 float32 scalars alive read
#: 99.9996 % holes). Large ones are mmap'd or come from the top of the heap.
MIN_HOLE_BUFFER = 64 << 10

# Why a counted buffer has no place in the map: still being computed; a
# shard of a sharded array; an address only a new Array would tell.
NOT_READY, SHARDED, UNMAPPED = "not_ready", "sharded", "no_address"

# A buffer is one flat tuple of atoms: (device id, nbytes, ptr, dtype,
# shape, why unmapped). One object per array, which the cyclic collector
# stops following after its first pass (a tuple of atoms is untracked).
DEV, NBYTES, PTR, DTYPE, SHAPE, WHY = range(6)
_nbytes = itemgetter(NBYTES)


def hole_ratio(spans: list[tuple[int, int]] | list[list[int]], fill: int = 0) -> float | None:
    """Share of holes in the address range of some buffers: where the
    allocator reports no fragmentation (CPU), the one fragmentation measure
    left, read from live buffers' addresses.

    Args:
        spans: (address, bytes) of each buffer, in any order.

        fill: bytes of buffers whose place is unknown, each smaller than
            :data:`MIN_HOLE_BUFFER`: they may sit in the holes, so the holes
            are counted less that much (a lower bound).

    Returns:
        holes / (holes + buffer bytes), where a hole is a gap between
        address neighbours of at least :data:`MIN_HOLE_BYTES` and under
        :data:`REGION_GAP_BYTES`, among the buffers of at least
        :data:`MIN_HOLE_BUFFER`; None for fewer than two such buffers.
    """
    spans = sorted((p, n) for p, n in spans if n >= MIN_HOLE_BUFFER)
    if len(spans) < 2:
        return None
    holes = 0
    for (p, n), (q, _) in zip(spans, spans[1:]):
        gap = q - (p + n)
        if MIN_HOLE_BYTES <= gap < REGION_GAP_BYTES:
            holes += gap
    holes = max(0, holes - fill)
    used = sum(n for _, n in spans)
    return holes / (holes + used) if holes + used else None


def detail_of(rows: list[tuple]) -> dict[str, Any]:
    """Top buffers, address map and holes of one device's counted buffers.

    Args:
        rows: ``(device, nbytes, ptr, dtype, shape, why)`` per buffer, any
            order; ``ptr`` None for a buffer without an address.

    Returns:
        ``{"top", "map", "map_complete"}`` and ``"holes"`` when every buffer
        is in the map (a buffer left out could sit in a "hole"): ``top``
        lists the largest buffers, ``map`` is ``[[ptr, nbytes], …]`` in
        address order (the largest :data:`BUFFER_MAP_MAX` when there are
        more).
    """
    if len(rows) > BUFFER_MAP_MAX:
        largest = heapq.nlargest(BUFFER_MAP_MAX, rows, key=_nbytes)
    else:
        largest = sorted(rows, key=_nbytes, reverse=True)
    top = [{"nbytes": r[NBYTES], "dtype": r[DTYPE], "shape": r[SHAPE], "ptr": r[PTR]} for r in largest[:TOP_BUFFERS]]
    mapped = sorted([r[PTR], r[NBYTES]] for r in largest if r[PTR] is not None)
    out: dict[str, Any] = {"top": top, "map": mapped, "map_complete": len(rows) <= BUFFER_MAP_MAX}
    # A buffer left out of the map (no address yet, or beyond its length)
    # could sit in a hole: with every large one in, the small ones left out
    # count as filling holes by their size; one large one left out, and the
    # holes are not known.
    listed = {id(r) for r in largest}
    left_out = [r for r in rows if r[PTR] is None or id(r) not in listed]
    if all(r[NBYTES] < MIN_HOLE_BUFFER for r in left_out):
        out["holes"] = hole_ratio(mapped, fill=sum(r[NBYTES] for r in left_out))
    return out


def summarize_live_arrays(buffers: Iterable[tuple[int, int, int | None, str, str]]) -> dict[int, dict[str, Any]]:
    """Per-device accounting from ``(device_id, nbytes, ptr, dtype, shape)``
    rows, each buffer once (the reference
    :class:`~jaxtop.probes.live_arrays.LiveArrays` keeps up to date).

    Returns:
        ``{device_id: {"bytes", "count", "largest_bytes"}}`` plus
        :func:`detail_of` for each device.
    """
    rows: dict[int, list] = {}
    for dev, nbytes, ptr, dtype, shape in buffers:
        rows.setdefault(dev, []).append((dev, nbytes, ptr, dtype, shape, None))
    per: dict[int, dict[str, Any]] = {}
    for dev, items in rows.items():
        per[dev] = {"bytes": sum(map(_nbytes, items)), "count": len(items),
                    "largest_bytes": max(map(_nbytes, items)), **detail_of(items)}
    return per
