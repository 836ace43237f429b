"""Device memory: ``Device.memory_stats()`` where the backend has it, live
arrays where it does not (CPU).

Pure helpers (:func:`normalize_stats`, :func:`fragmentation`,
:func:`summarize_live_arrays`) take plain dicts and are tested against
recorded GPU dicts; :class:`JaxMemoryProbe` calls into jax.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from typing import Any, Iterable

BUFFER_MAP_MAX = 2000
TOP_BUFFERS = 10

#: A gap between two address neighbours this wide or wider is taken for the
#: distance between two memory regions (on CPU another mapping or malloc
#: arena; on a GPU another pool chunk), not a hole among live buffers.
REGION_GAP_BYTES = 4 << 20
#: Narrower gaps are the allocator's own headers and alignment, not holes.
MIN_HOLE_BYTES = 4096


def hole_ratio(spans: list[tuple[int, int]] | list[list[int]]) -> float | None:
    """Share of holes in the address range of some buffers: where the
    allocator reports no fragmentation (CPU), the one fragmentation measure
    left, read from live buffers' addresses.

    Args:
        spans: (address, bytes) of each buffer, in any order.

    Returns:
        holes / (holes + buffer bytes), where a hole is a gap between
        address neighbours of at least :data:`MIN_HOLE_BYTES` and under
        :data:`REGION_GAP_BYTES`; None for fewer than two buffers.
    """
    if len(spans) < 2:
        return None
    spans = sorted(spans)
    holes = 0
    for (p, n), (q, _) in zip(spans, spans[1:]):
        gap = q - (p + n)
        if MIN_HOLE_BYTES <= gap < REGION_GAP_BYTES:
            holes += gap
    used = sum(n for _, n in spans)
    return holes / (holes + used) if holes + used else None


def normalize_stats(raw: dict[str, Any] | None) -> dict[str, Any] | None:
    """Pass ``memory_stats()`` through, mapping the PJRT C API's -1 to None.

    jaxlib builds the dict from the device allocator's stats
    (``PyDevice::MemoryStats``): ``num_allocs``, ``bytes_in_use``,
    ``peak_bytes_in_use``, ``largest_alloc_size``, ``bytes_reserved``,
    ``peak_bytes_reserved`` and ``largest_free_block_bytes`` are always
    there; ``bytes_limit``, ``bytes_reservable_limit``, ``pool_bytes`` and
    ``peak_pool_bytes`` only when the allocator sets them (BFC on GPU sets
    all, ``cuda_async`` no pool fields; CPU returns None altogether). Through
    the PJRT C API an unset field can come back as -1.
    """
    if raw is None:
        return None
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(value, (int, float)) and value == -1:
            out[key] = None
        else:
            out[key] = value
    return out


def fragmentation(stats: dict[str, Any] | None, platform: str = "") -> tuple[float | None, str | None]:
    """BFC's own fragmentation: ``1 - largest_free_block / (pool - in_use)``.

    Returns:
        (value in [0, 1], None), or (None, reason) when the allocator does not
        report what the formula needs.
    """
    if stats is None:
        return None, f"memory_stats() is None on {platform or 'this'} backend: the allocator reports no pool"
    pool = stats.get("pool_bytes")
    free_block = stats.get("largest_free_block_bytes")
    in_use = stats.get("bytes_in_use")
    if pool is None or free_block is None or in_use is None:
        return None, "allocator reports no pool_bytes/largest_free_block_bytes (e.g. cuda_async or platform allocator)"
    free = pool - in_use
    if free <= 0:
        return 0.0, None  # nothing free in the pool: nothing to fragment
    value = 1.0 - free_block / free
    return min(1.0, max(0.0, value)), None


def summarize_live_arrays(buffers: Iterable[tuple[int, int, int | None, str, str]]) -> dict[int, dict[str, Any]]:
    """Per-device accounting from ``(device_id, nbytes, ptr, dtype, shape)`` rows.

    Returns:
        ``{device_id: {"bytes", "count", "largest_bytes", "top", "map", "holes"}}``
        where ``top`` lists the largest buffers, ``map`` is ``[[ptr, nbytes], …]``
        in address order (the largest ``BUFFER_MAP_MAX`` when there are more)
        and ``holes`` is :func:`hole_ratio` of the map, only when every buffer
        on the device is in it (a buffer left out could sit in a "hole").
    """
    per: dict[int, dict[str, Any]] = {}
    rows: dict[int, list] = {}
    for dev, nbytes, ptr, dtype, shape in buffers:
        entry = per.setdefault(dev, {"bytes": 0, "count": 0, "largest_bytes": 0})
        entry["bytes"] += nbytes
        entry["count"] += 1
        if nbytes > entry["largest_bytes"]:
            entry["largest_bytes"] = nbytes
        rows.setdefault(dev, []).append((nbytes, ptr, dtype, shape))
    for dev, items in rows.items():
        items.sort(key=lambda r: r[0], reverse=True)
        per[dev]["top"] = [
            {"nbytes": n, "dtype": dt, "shape": sh, "ptr": p} for n, p, dt, sh in items[:TOP_BUFFERS]
        ]
        mapped = [[p, n] for n, p, _, _ in items[:BUFFER_MAP_MAX] if p is not None]
        mapped.sort()
        per[dev]["map"] = mapped
        per[dev]["map_complete"] = len(items) <= BUFFER_MAP_MAX
        if len(mapped) == len(items):
            per[dev]["holes"] = hole_ratio(mapped)
    return per


# -- asking an Array for its address without crashing the program ---------------
#
# jaxlib's ``Array.is_ready()`` on an array that ``Array.delete()`` has freed
# dereferences a null pointer: a segfault, not an exception (measured on
# jaxlib 0.4.30, 0.6.2 and 0.10.2, CPU, with one thread: ``a.delete();
# a.is_ready()``). ``jax.live_arrays()`` hands the agent arrays that are alive
# at that moment, and the program's own thread may delete one before the agent
# asks it anything: within seconds in a loop that frees its buffers with
# ``delete()``. (A donated array raises as it should; only ``delete()`` leaves
# the null behind.) So ``delete()`` goes through a lock, and the agent asks
# ``is_deleted()`` and then ``is_ready()`` holding it: no delete can come
# between. The program's delete waits at most one such question (microseconds).
# Without the lock in place (the class would not take it) the agent asks no
# array whether it is ready, and buffers get no address.

_delete_lock = threading.RLock()  # re-entrant: a finaliser on the agent's thread may delete
_guard: tuple[Any, Any, Any] | None = None  # (class, its own delete, ours)
_guard_lock = threading.Lock()  # the agent and an agent-less OOM census may install at once


def _renew_lock_in_child() -> None:
    # The agent's thread may have held the lock when the program forked: the
    # child's deletes must not wait for a thread it does not have.
    global _delete_lock, _guard_lock
    _delete_lock = threading.RLock()
    _guard_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_lock_in_child)


def guard_deletes() -> bool:
    """Route ``jax.Array.delete`` through the lock; True when in place."""
    global _guard
    if _guard is not None:
        return True
    with _guard_lock:
        return _install_guard()


def _install_guard() -> bool:
    global _guard
    if _guard is not None:
        return True
    try:
        from jax._src.array import ArrayImpl

        original = ArrayImpl.delete

        def delete(self):
            with _delete_lock:
                return original(self)

        delete.__qualname__ = "ArrayImpl.delete"
        doc = getattr(original, "__doc__", None)
        delete.__doc__ = doc if isinstance(doc, str) else None
        delete.__wrapped__ = original  # type: ignore[attr-defined]
        ArrayImpl.delete = delete
        _guard = (ArrayImpl, original, delete)
        return True
    except Exception:
        return False


def unguard_deletes() -> None:
    """Put ``jax.Array.delete`` back, unless someone replaced ours since."""
    global _guard
    with _guard_lock:
        if _guard is None:
            return
        cls, original, ours = _guard
        _guard = None
        try:
            if cls.__dict__.get("delete") is ours:
                cls.delete = original
        except Exception:
            pass


def ready_address(arr: Any) -> int | None:
    """The buffer's device address, or None: still being computed, deleted,
    or no safe way to ask (see above).

    ``unsafe_buffer_pointer()`` on a buffer that an in-flight step is still
    producing waits for it while holding the GIL: one forced host-device sync
    per scan, stalling the user's threads for up to a step (measured 50-150
    ms). A pending buffer simply has no place in this scan's memory map.
    """
    if _guard is None:
        return None
    try:
        with _delete_lock:
            if arr.is_deleted() or not arr.is_ready():
                return None
            return arr.unsafe_buffer_pointer()
    except Exception:
        return None



def _itemsize(dtype: Any) -> int:
    itemsize = getattr(dtype, "itemsize", None)
    if itemsize is None:
        import numpy as np

        itemsize = np.dtype(dtype).itemsize
    return int(itemsize)


def _addressable(sharding: Any, devices: Any) -> Iterable[Any]:
    """The devices of this process that hold a shard (``addressable_devices``
    where the sharding has it, else ``device_set`` filtered by process)."""
    found = getattr(sharding, "addressable_devices", None)
    if found is not None:
        return found
    import jax

    here = jax.process_index()
    return [d for d in devices if getattr(d, "process_index", 0) == here]


def backend_ready() -> bool:
    """True once the user's program has imported jax and created a backend.

    The agent must not create the backend itself: allocator settings
    (``XLA_PYTHON_CLIENT_*``, ``XLA_FLAGS``) are read at that moment, and a
    program may still be setting them.
    """
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge

        if hasattr(xla_bridge, "backends_are_initialized"):
            return bool(xla_bridge.backends_are_initialized())
        return bool(getattr(xla_bridge, "_backends", None))
    except Exception:
        return False


class JaxMemoryProbe:
    """Samples every local device. Call only after :func:`backend_ready`."""

    def __init__(self) -> None:
        import jax

        self._jax = jax
        guard_deletes()  # before the first address is asked for; undone by close()
        self.devices = list(jax.local_devices())
        self.backend = jax.default_backend()
        self._prev_peak: dict[int, int] = {}
        self._live: dict[int, dict[str, Any]] = {}
        self._live_t: float | None = None
        # (id, device, shape, dtype) -> the buffer address last seen ready.
        self._last_ptr: dict[tuple[Any, ...], int] = {}

    def close(self) -> None:
        """Give ``jax.Array.delete`` back as it was; addresses are no longer
        asked for (the OOM census too then gives them up)."""
        unguard_deletes()

    def describe(self) -> list[dict[str, Any]]:
        """Static facts about each device, for ``hello``."""
        out = []
        for d in self.devices:
            out.append({
                "id": d.id,
                "platform": d.platform,
                "kind": getattr(d, "device_kind", d.platform),
                "process_index": getattr(d, "process_index", 0),
            })
        return out

    def scan_live_arrays(self, now: float) -> None:
        """The slow-cadence scan of ``jax.live_arrays()`` (all devices).

        Each device buffer is counted once, and nothing the program can see
        is created or kept alive:

        * Two Arrays can share one buffer (an output aliased to an input, a
          shard the program took out of a sharded array): single-device
          arrays are deduplicated by ``(device, buffer address)``.
        * A sharded array's per-device bytes come from its sharding
          (``shard_shape`` x itemsize on each addressable device; a
          replicated array holds a full copy on each). Reading
          ``addressable_shards`` or ``.data`` instead would materialise one
          new single-device Array per shard, which then lives as long as
          the parent and shows up in the program's own ``jax.live_arrays()``
          (measured: 15 arrays became 127 on an 8-device program). Such
          shards have no address in the map, and the map says so.
        * A buffer still being computed has no address yet (asking would
          block); one seen ready in an earlier scan keeps its last address.
        """
        rows = []
        seen: set[tuple[int, int]] = set()
        last_ptr, self._last_ptr = self._last_ptr, {}
        unmapped: dict[int, dict[str, int]] = {}

        def skipped(dev_id: int, why: str) -> None:
            counts = unmapped.setdefault(dev_id, {})
            counts[why] = counts.get(why, 0) + 1

        for arr in self._jax.live_arrays():
            try:
                dtype, shape = arr.dtype, tuple(arr.shape)
                sharding = arr.sharding
                devs = sharding.device_set
                if len(devs) == 1:
                    (dev,) = devs
                    # id() alone can be reused by a new object: the key also
                    # names what the buffer holds.
                    key = (id(arr), dev.id, shape, str(dtype))
                    ptr = ready_address(arr)
                    if ptr is None:
                        ptr = last_ptr.get(key)
                        skipped(dev.id, "not_ready" if ptr is None else "last_address")
                    if ptr is not None:
                        self._last_ptr[key] = ptr
                        if (dev.id, ptr) in seen:
                            continue  # another Array on the same buffer
                        seen.add((dev.id, ptr))
                    rows.append((dev.id, int(arr.nbytes), ptr, str(dtype), str(list(shape))))
                    continue
                shard_shape = tuple(sharding.shard_shape(shape))
                nbytes = math.prod(shard_shape) * _itemsize(dtype)
                for dev in _addressable(sharding, devs):
                    rows.append((dev.id, nbytes, None, str(dtype), str(list(shard_shape))))
                    skipped(dev.id, "sharded")
            except Exception:
                continue  # deleted or donated while we looked
        self._live = summarize_live_arrays(rows)
        for dev_id, counts in unmapped.items():
            if dev_id in self._live:
                self._live[dev_id]["unmapped"] = counts
        self._live_t = now

    def sample(self, include_map: bool) -> list[dict[str, Any]]:
        """One record per device for a sample."""
        out = []
        for d in self.devices:
            try:
                raw = d.memory_stats()
            except Exception:
                raw = None
            stats = normalize_stats(raw)
            live = self._live.get(d.id, {"bytes": 0, "count": 0, "largest_bytes": 0, "top": [], "map": []})
            rec: dict[str, Any] = {"id": d.id, "platform": d.platform}
            live_summary = {
                "bytes": live["bytes"],
                "count": live["count"],
                "largest_bytes": live["largest_bytes"],
                "scanned_t": self._live_t,
            }
            if live.get("holes") is not None:
                live_summary["holes"] = live["holes"]
            if include_map:
                live_summary["top"] = live.get("top", [])
                live_summary["map"] = live.get("map", [])
                live_summary["map_complete"] = live.get("map_complete", True)
                if live.get("unmapped"):
                    live_summary["unmapped"] = live["unmapped"]
            if stats is not None:
                rec["source"] = "memory_stats"
                rec.update(stats)
                peak = stats.get("peak_bytes_in_use")
                prev = self._prev_peak.get(d.id)
                rec["peak_rise_bytes"] = (peak - prev) if (peak is not None and prev is not None) else None
                if peak is not None:
                    self._prev_peak[d.id] = peak
            else:
                rec["source"] = "live_arrays"
                rec["bytes_in_use"] = live["bytes"]
                rec["peak_rise_bytes"] = None
            frag, reason = fragmentation(stats, d.platform)
            rec["fragmentation"] = frag
            if reason:
                rec["fragmentation_reason"] = reason
            rec["live_arrays"] = live_summary
            out.append(rec)
        return out
