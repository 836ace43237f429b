"""The measured parts of a census: the host's memory and limits, the live
arrays grouped by (shape, dtype, placement), and the recent climb from the
agent's samples.

Stdlib only at import time: jax and the other probes are imported inside
the functions that need them.
"""

from __future__ import annotations

import os
import time

# The stderr relay imports this package without ``site``: no ``typing`` at
# run time. Type checkers read the import; Python skips it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable

__all__ = [
    "TIMELINE_POINTS",
    "TIMELINE_SPAN_S",
    "TOP_GROUPS",
    "group_live_arrays",
    "host_memory",
    "timeline_from_records",
]

#: How many array groups a census keeps.
TOP_GROUPS = 20
#: How many timeline points a census keeps, and how far back they go.
TIMELINE_POINTS = 120
TIMELINE_SPAN_S = 60.0


def _read_kv(path: str, keys: tuple[str, ...]) -> dict[str, int]:
    """``Key:   123 kB`` lines of a /proc file, in bytes ({} where it cannot be read)."""
    from jaxtop.probes.procfs import proc_fields  # here: the relay imports this package with no jaxtop on its path

    try:
        with open(path, "rb") as f:
            return proc_fields(f.read(), keys)
    except OSError:
        return {}


def _cgroup_memory() -> dict[str, int | None]:
    """The cgroup v2 memory limit and use of this process, where there is one."""
    try:
        with open("/proc/self/cgroup", "rb") as f:
            entries = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return {}
    rel = next((e.split(":", 2)[2] for e in entries if e.startswith("0::")), None)
    if rel is None:
        return {}
    out: dict[str, int | None] = {}
    base = "/sys/fs/cgroup" + rel.rstrip("/")
    for name, key in (("memory.max", "cgroup_limit_bytes"), ("memory.current", "cgroup_current_bytes")):
        try:
            with open(os.path.join(base, name), "rb") as f:
                text = f.read().strip()
        except OSError:
            continue
        out[key] = int(text) if text.isdigit() else None  # "max": no limit
    return out


def host_memory() -> dict[str, Any]:
    """The process's memory as the OS sees it, and its limits.

    Returns:
        ``rss_bytes``, ``vms_bytes`` (address space: what ``RLIMIT_AS``
        counts), ``peak_rss_bytes``, ``rlimit_as_bytes`` and
        ``rlimit_data_bytes`` (None: unlimited), ``mem_total_bytes``,
        ``mem_available_bytes`` and, in a cgroup v2 with a limit,
        ``cgroup_limit_bytes`` / ``cgroup_current_bytes``. Missing where
        the OS does not say.
    """
    out: dict[str, Any] = {}
    status = _read_kv("/proc/self/status", ("VmRSS", "VmSize", "VmHWM"))
    for src, dst in (("VmRSS", "rss_bytes"), ("VmSize", "vms_bytes"), ("VmHWM", "peak_rss_bytes")):
        if src in status:
            out[dst] = status[src]
    try:
        import resource

        for name, key in (("RLIMIT_AS", "rlimit_as_bytes"), ("RLIMIT_DATA", "rlimit_data_bytes")):
            soft = resource.getrlimit(getattr(resource, name))[0]
            out[key] = None if soft == resource.RLIM_INFINITY else int(soft)
        if "peak_rss_bytes" not in out:
            out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except (ImportError, OSError, ValueError, AttributeError):
        pass
    meminfo = _read_kv("/proc/meminfo", ("MemTotal", "MemAvailable"))
    if "MemTotal" in meminfo:
        out["mem_total_bytes"] = meminfo["MemTotal"]
    if "MemAvailable" in meminfo:
        out["mem_available_bytes"] = meminfo["MemAvailable"]
    cgroup = _cgroup_memory()
    if cgroup.get("cgroup_limit_bytes") is not None:
        out.update(cgroup)
    return out


def _placement(sharding: Any, devices: Any) -> str:
    """A short name for where an array lives: ``cpu:0``, or for a sharded
    array its partition spec and device count."""
    if len(devices) == 1:
        (dev,) = devices
        return f"{dev.platform}:{dev.id}"
    n = len(devices)
    try:
        if getattr(sharding, "is_fully_replicated", False):
            return f"replicated on {n} devices"
    except Exception:
        pass
    spec = getattr(sharding, "spec", None)
    if spec is not None:
        return f"{spec} on {n} devices"
    return f"{type(sharding).__name__} on {n} devices"


def _shard_bytes(shape: tuple[int, ...], dtype: Any, sharding: Any) -> int:
    import math

    shard_shape = tuple(sharding.shard_shape(shape))
    itemsize = getattr(dtype, "itemsize", None)
    if itemsize is None:
        import numpy as np

        itemsize = np.dtype(dtype).itemsize
    return math.prod(shard_shape) * int(itemsize)


def group_live_arrays(arrays: Iterable[Any], deadline: float | None = None, top: int = TOP_GROUPS) -> dict[str, Any]:
    """Live arrays grouped by (shape, dtype, placement), each buffer once.

    Like the sampling probe's scan, nothing is materialised: a single-device
    array is deduplicated by (device, buffer address) when its buffer is
    ready (two Arrays on one buffer count once), a sharded array's bytes
    come from its sharding (``shard_shape`` x itemsize on each device of
    this process), never from ``addressable_shards``. The per-shard Arrays
    that the program's host reads cache on a sharded array share its
    traceback object and are counted as that array's shards, as in
    :mod:`jaxtop.probes.live_arrays` (which says why): arrays are read
    oldest first (``jax.live_arrays()`` lists the newest first), so the
    sharded array comes before them.

    Args:
        arrays: ``jax.live_arrays()``.
        deadline: ``time.perf_counter()`` value at which to stop; the arrays
            not looked at are counted in ``not_scanned``.
        top: groups kept (the largest by bytes).

    Returns:
        ``{"groups": [{shape, dtype, placement, count, bytes, bytes_each}],
        "count", "bytes", "groups_total", "shown_bytes", "per_device":
        {device id (str): bytes}, "aliases", "errors", "not_scanned",
        "complete"}``.
    """
    from jaxtop.probes.jax_memory import UNASKED, _addressable, guard_deletes, ready_address

    guard_deletes()  # so that addresses can be asked for safely (a no-op under the agent, which did it)

    groups: dict[tuple[Any, ...], list[int]] = {}
    per_device: dict[str, int] = {}
    seen: set[tuple[int, int]] = set()
    # numpy's str(dtype) is Python code (~8 us): once per dtype, not per array.
    dtype_names: dict[Any, str] = {}
    device_names: dict[Any, str] = {}
    aliases = errors = count = total = failed = 0
    not_scanned = 0
    # (id of a sharded array's traceback, device, bytes, dtype, shape) ->
    # its shards not yet claimed by a per-shard Array.
    shards: dict[tuple[Any, ...], int] = {}
    parents: set[int] = set()  # ids of their tracebacks
    arrays = list(arrays)
    arrays.reverse()
    for i, arr in enumerate(arrays):
        if deadline is not None and not (i & 255) and time.perf_counter() > deadline:
            not_scanned = len(arrays) - i
            break
        try:
            shape = tuple(arr.shape)
            dtype = arr.dtype
            sharding = arr.sharding
            devices = sharding.device_set
            if len(devices) == 1:
                (dev,) = devices
                ptr = ready_address(arr)  # never is_ready() on an array deleted meanwhile
                nbytes = int(arr.nbytes)
                if ptr == UNASKED and shards and id(getattr(arr, "traceback", None)) in parents:
                    ptr = ready_address(arr, True)  # one of the Arrays a host read made on another's buffer
                if ptr == UNASKED:
                    # A buffer whose address only a new Array would tell:
                    # counted without one, as a sharded array's shard is.
                    ptr = None
                    tb = getattr(arr, "traceback", None)
                    if tb is not None:
                        parents.add(id(tb))
                        slot = (id(tb), dev.id, nbytes, dtype, shape)
                        shards[slot] = shards.get(slot, 0) + 1
                elif ptr is not None and ptr < 0:
                    failed += 1  # its computation failed: no buffer, no memory held
                    continue
                if ptr is not None:
                    if (dev.id, ptr) in seen:
                        aliases += 1
                        continue
                    seen.add((dev.id, ptr))
                    if shards:
                        tb = getattr(arr, "traceback", None)
                        slot = (id(tb), dev.id, nbytes, dtype, shape)
                        if tb is not None and shards.get(slot):
                            shards[slot] -= 1  # a shard of a sharded array counted already
                            aliases += 1
                            continue
                placement = device_names.get(dev)
                if placement is None:
                    placement = device_names[dev] = f"{dev.platform}:{dev.id}"
                key_dev = str(dev.id)
                per_device[key_dev] = per_device.get(key_dev, 0) + nbytes
            else:
                per = _shard_bytes(shape, dtype, sharding)
                local = list(_addressable(sharding, devices))
                tb = getattr(arr, "traceback", None)
                if tb is not None:
                    parents.add(id(tb))
                    shard_shape = tuple(sharding.shard_shape(shape))
                    for d in local:
                        slot = (id(tb), d.id, per, dtype, shard_shape)
                        shards[slot] = shards.get(slot, 0) + 1
                nbytes = per * len(local)
                for d in local:
                    per_device[str(d.id)] = per_device.get(str(d.id), 0) + per
                placement = _placement(sharding, devices)
            dtype_name = dtype_names.get(dtype)
            if dtype_name is None:
                dtype_name = dtype_names[dtype] = str(dtype)
        except Exception:
            errors += 1  # deleted or donated while we looked
            continue
        key = (shape, dtype_name, placement)
        entry = groups.get(key)
        if entry is None:
            groups[key] = [1, nbytes]
        else:
            entry[0] += 1
            entry[1] += nbytes
        count += 1
        total += nbytes
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1][1], -kv[1][0], str(kv[0])))
    shown = []
    for (shape, dtype, placement), (n, nbytes) in ordered[:max(0, top)]:
        shown.append({"shape": list(shape), "dtype": dtype, "placement": placement, "count": n, "bytes": nbytes,
                      "bytes_each": nbytes // n if n else 0})
    return {
        "groups": shown,
        "count": count,
        "bytes": total,
        "groups_total": len(groups),
        "shown_bytes": sum(g["bytes"] for g in shown),
        "per_device": per_device,
        "aliases": aliases,
        "errors": errors,
        "failed": failed,  # arrays whose computation failed (an allocation that failed asynchronously): no memory
        "not_scanned": not_scanned,
        "complete": not_scanned == 0,
    }



def timeline_from_records(records: Iterable[dict[str, Any]], until: float | None = None,
                          span_s: float = TIMELINE_SPAN_S, points: int = TIMELINE_POINTS) -> dict[str, Any] | None:
    """The recent climb from the agent's samples: bytes in use per device.

    Args:
        records: decoded stream records, oldest first (non-samples ignored).
        until: the census's time; samples after it are left out.
        span_s: how far back to go.
        points: at most this many points (evenly thinned, last one kept).

    Returns:
        ``{"t": [...], "bytes_in_use": {device id: [...]}, "rss_bytes": [...],
        "live_bytes": {device id: [...]}}`` (None where a sample lacks the
        value), or None without samples.
    """
    rows = []
    for rec in records:
        if not isinstance(rec, dict) or rec.get("type") != "sample":
            continue
        t = rec.get("t")
        if not isinstance(t, (int, float)) or (until is not None and t > until + 1.0):
            continue
        rows.append(rec)
    if not rows:
        return None
    end = rows[-1]["t"]
    rows = [r for r in rows if r["t"] >= end - span_s]
    if len(rows) > points:
        step = len(rows) / points
        picked = [rows[int(i * step)] for i in range(points - 1)] + [rows[-1]]
        rows = picked
    dev_ids: list[str] = []
    for r in rows:
        for d in r.get("devices") or []:
            if isinstance(d, dict) and str(d.get("id")) not in dev_ids:
                dev_ids.append(str(d.get("id")))
    out: dict[str, Any] = {"t": [], "bytes_in_use": {d: [] for d in dev_ids}, "live_bytes": {d: [] for d in dev_ids},
                           "rss_bytes": []}
    for r in rows:
        out["t"].append(r["t"])
        by_id = {str(d.get("id")): d for d in r.get("devices") or [] if isinstance(d, dict)}
        for d in dev_ids:
            dev = by_id.get(d) or {}
            out["bytes_in_use"][d].append(dev.get("bytes_in_use"))
            out["live_bytes"][d].append((dev.get("live_arrays") or {}).get("bytes"))
        out["rss_bytes"].append((r.get("process") or {}).get("rss_bytes"))
    return out

