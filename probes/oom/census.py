"""Taking a census: what held the memory at the moment it ran out.

:func:`build_census` puts the parts together within a time budget: the
failed request (the error's text, completed by the allocator's log), each
device's statistics and the host's memory first (cheap, and the most exact
now), then the live arrays, the allocation sites when the memory profile's
estimated cost fits what is left, the timeline, and the verdicts.

Stdlib only at import time: jax and the other probes are imported inside
the functions that need them.
"""

from __future__ import annotations

import os
import sys
import time

from .lines import parse_oom_message
from .parts import group_live_arrays, host_memory, timeline_from_records
from .sites import allocation_sites
from .verdict import device_verdict, host_verdict

# The stderr relay imports this package without ``site``: no ``typing`` at
# run time. Type checkers read the import; Python skips it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable

__all__ = ["CENSUS_VERSION", "DEFAULT_BUDGET_S", "OOM_CENSUS", "build_census"]

#: The record type of a census on the stream (and in its file).
OOM_CENSUS = "oom_census"
#: Version of the census layout (docs/protocol.md, "oom_census").
CENSUS_VERSION = 1
#: Wall-clock seconds one census may take. Measured on a 2-core CPU machine
#: (benchmarks/oom_census.py): 10,000 live arrays ~0.05 s (worst of 5 runs
#: 0.09 s), 100,000 ~0.7 s. Past the budget only ``jax.live_arrays()``
#: itself (~0.2 us an array) and the cheap parts still run.
DEFAULT_BUDGET_S = 2.0

def _local_devices() -> list[Any]:
    from jaxtop.probes.jax_memory import backend_ready

    if not backend_ready():
        return []
    import jax

    return list(jax.local_devices())


def _device_for(request: dict[str, Any] | None, devices: list[Any]) -> Any:
    """The jax device a request names (by local ordinal), else the only one."""
    request = request or {}
    ordinal = request.get("device_ordinal")
    if ordinal is not None:
        # An ordinal from a GPU allocator or executor names a GPU, never a CPU device.
        if str(request.get("form", "")).startswith("gpu") or str(request.get("allocator") or "").startswith("GPU"):
            candidates = [d for d in devices if d.platform in ("gpu", "cuda", "rocm")]
        else:
            candidates = list(devices)
        for d in candidates:
            if getattr(d, "local_hardware_id", None) == ordinal:
                return d
        for d in candidates:
            if d.id == ordinal:
                return d
        return None
    if len(devices) == 1:
        return devices[0]
    return None


def _same_request(request: dict[str, Any] | None, logged: dict[str, Any]) -> bool:
    """Whether an allocator line can be about the same failure as an error:
    the sizes agree where both are known (the error may give the rounded
    size, the log line the requested one, or a human-rounded one)."""
    if request is None or request.get("bytes") is None or logged.get("bytes") is None:
        return True
    mine = request["bytes"]
    theirs = {logged.get("bytes"), logged.get("rounded_bytes")}
    if mine in theirs:
        return True
    # "1.00GiB" in the log stands for anything that prints so: within 1 %.
    return any(v and abs(v - mine) <= 0.01 * max(v, mine) for v in theirs)


def build_census(
    *,
    message: str | None = None,
    trigger: dict[str, Any] | None = None,
    allocator: dict[str, Any] | None = None,
    records: Iterable[dict[str, Any]] | Callable[[], Iterable[dict[str, Any]]] | None = None,
    budget_s: float = DEFAULT_BUDGET_S,
    profile: bool = True,
    census_id: str | None = None,
) -> dict[str, Any]:
    """Take a census of this process's memory now.

    Never raises (``KeyboardInterrupt`` aside): a part that fails says so
    under ``errors`` and the rest is still taken. Creates no JAX backend.

    Args:
        message: the error's text; the failed request is parsed from it.
        trigger: how the OOM was seen (``how``, ``exception``, ``thread``…),
            stored as given.
        allocator: the allocator's latest event (:meth:`AllocatorLog.latest`),
            whose request, op and statistics complete the exception's.
        records: the agent's recent records (or a callable returning them)
            for the timeline.
        budget_s: wall-clock seconds this census may take.
        profile: take the device memory profile for the allocation sites.
        census_id: the census's ``id``.

    Returns:
        The census (a ``type: "oom_census"`` record; docs/protocol.md).
    """
    try:
        return _build_census(message, trigger, allocator, records, budget_s, profile, census_id)
    except Exception as exc:  # a bug here must not take the census's file and event with it
        now = time.time()
        return {"type": OOM_CENSUS, "t": now, "version": CENSUS_VERSION,
                "id": census_id or f"{os.getpid()}-{int(now * 1000)}", "pid": os.getpid(),
                "argv": list(getattr(sys, "argv", None) or [])[:16], "trigger": dict(trigger or {}),
                "request": parse_oom_message(message) if message else None, "verdict": None,
                "errors": [f"census: {type(exc).__name__}: {exc}"], "skipped": [], "complete": False}


def _build_census(message: str | None, trigger: dict[str, Any] | None, allocator: dict[str, Any] | None,
                  records: Any, budget_s: float, profile: bool, census_id: str | None) -> dict[str, Any]:
    """:func:`build_census`'s work, which may raise."""
    started = time.perf_counter()
    deadline = started + max(0.0, budget_s)
    now = time.time()
    steps: dict[str, float] = {}
    skipped: list[dict[str, str]] = []
    errors: list[str] = []

    def lap(name: str, since: float) -> float:
        t = time.perf_counter()
        steps[name] = round(t - since, 6)
        return t

    census: dict[str, Any] = {
        "type": OOM_CENSUS,
        "t": now,
        "version": CENSUS_VERSION,
        "id": census_id or f"{os.getpid()}-{int(now * 1000)}",
        "pid": os.getpid(),
        "argv": list(getattr(sys, "argv", None) or [])[:16],
        "trigger": dict(trigger or {}),
    }
    # 1. The request: the exception's text, completed by the allocator's line.
    t = time.perf_counter()
    request = parse_oom_message(message) if message else None
    if allocator and allocator.get("request") and _same_request(request, allocator["request"]):
        alloc_req = allocator["request"]
        if request is None or request.get("bytes") is None:
            request = dict(alloc_req)
        else:
            for key in ("rounded_bytes", "allocator", "device_ordinal", "op"):
                if request.get(key) is None and alloc_req.get(key) is not None:
                    request[key] = alloc_req[key]
        census["allocator_log"] = allocator
    census["request"] = request
    t = lap("request", t)

    # 2. Device statistics and host memory: cheap, and the most exact now.
    devices: list[Any] = []
    try:
        devices = _local_devices()
    except Exception as exc:
        errors.append(f"devices: {type(exc).__name__}: {exc}")
    from jaxtop.probes.jax_memory import fragmentation, normalize_stats

    dev_records = []
    for d in devices:
        rec: dict[str, Any] = {"id": d.id, "platform": d.platform, "kind": getattr(d, "device_kind", d.platform)}
        try:
            stats = normalize_stats(d.memory_stats())
        except Exception as exc:
            stats = None
            rec["stats_error"] = f"{type(exc).__name__}: {exc}"
        if stats:
            rec["source"] = "memory_stats"
            for key in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit", "pool_bytes", "largest_free_block_bytes",
                        "bytes_reserved", "num_allocs", "largest_alloc_size"):
                if key in stats:
                    rec[key] = stats[key]
        else:
            rec["source"] = "live_arrays"
        frag, reason = fragmentation(stats, d.platform)
        rec["fragmentation"] = frag
        if reason:
            rec["fragmentation_reason"] = reason
        rec["_stats"] = stats
        dev_records.append(rec)
    target = _device_for(request, devices)
    if request is not None and target is not None:
        request["device"] = f"{target.platform}:{target.id}"
        request["device_id"] = target.id
    try:
        census["host"] = host_memory()
    except Exception as exc:
        census["host"] = {}
        errors.append(f"host: {type(exc).__name__}: {exc}")
    t = lap("stats", t)

    # 3. Live arrays: the clock is checked every 256 arrays.
    n_live = 0
    arrays_part: dict[str, Any] | None = None
    if devices:
        try:
            import jax

            live = jax.live_arrays()
            n_live = len(live)
            # The arrays get most of what is left; the profile and the
            # timeline share the rest.
            share = deadline - (deadline - time.perf_counter()) * 0.35
            arrays_part = group_live_arrays(live, deadline=share)
            del live
            if arrays_part["not_scanned"]:
                skipped.append({"part": "arrays", "reason": f"time budget: {arrays_part['not_scanned']} of {n_live} "
                                "live arrays not grouped"})
        except Exception as exc:
            errors.append(f"arrays: {type(exc).__name__}: {exc}")
    census["arrays"] = arrays_part
    t = lap("arrays", t)

    # 4. Allocation sites, when the profile's estimated cost fits.
    sites = None
    if devices and profile:
        estimate = 0.02 + 4e-6 * n_live
        left = deadline - time.perf_counter()
        if estimate > left:
            skipped.append({"part": "sites", "reason": f"time budget: {max(0.0, left):.3f} s left, the memory profile "
                            f"of {n_live} arrays needs ~{estimate:.3f} s"})
        else:
            try:
                import jax.profiler as jax_profiler

                raw = jax_profiler.device_memory_profile()
                sites = allocation_sites(bytes(raw))
            except Exception as exc:
                errors.append(f"sites: {type(exc).__name__}: {str(exc)[:300]}")
    census["sites"] = sites
    t = lap("sites", t)

    # 5. The timeline from the agent's recent samples.
    timeline = None
    if records is not None:
        if time.perf_counter() >= deadline:
            skipped.append({"part": "timeline", "reason": "time budget: none left"})
        else:
            try:
                got = records() if callable(records) else records
                timeline = timeline_from_records(got, until=now)
            except Exception as exc:
                errors.append(f"timeline: {type(exc).__name__}: {exc}")
    census["timeline"] = timeline
    t = lap("timeline", t)

    # 6. Verdicts.
    request_bytes = (request or {}).get("rounded_bytes") or (request or {}).get("bytes")
    per_device = (arrays_part or {}).get("per_device") or {}
    overall = None
    for rec in dev_records:
        stats = rec.pop("_stats")
        # A device the complete scan found no array on holds none.
        none_held = 0 if (arrays_part or {}).get("complete") else None
        rec["live_array_bytes"] = per_device.get(str(rec["id"]), none_held)
        if rec["source"] == "live_arrays":
            rec["bytes_in_use"] = rec["live_array_bytes"]
        failed = target is not None and rec["id"] == target.id
        rec["failed"] = failed
        # None on CPU (no allocator statistics): the host verdict speaks for it.
        complete = bool((arrays_part or {}).get("complete"))
        if rec["source"] == "memory_stats" and complete and rec.get("bytes_in_use") is not None:
            # In use that no live array holds (work queued ahead on an accelerator).
            rec["unheld_bytes"] = max(0, rec["bytes_in_use"] - rec["live_array_bytes"])
        verdict = device_verdict(stats, request_bytes if failed or target is None else None,
                                 rec["live_array_bytes"] if complete else None)
        rec["verdict"] = verdict
        if failed and verdict:
            overall = verdict
    census["devices"] = dev_records
    if timeline is not None:
        # The census's own moment ends the climb: on CPU the samples' sizes
        # come from a scan once a second, which can miss the last second.
        timeline["t"].append(now)
        for rec in dev_records:
            key = str(rec["id"])
            for series, value in (("bytes_in_use", rec.get("bytes_in_use")), ("live_bytes", rec.get("live_array_bytes"))):
                column = timeline[series].setdefault(key, [None] * (len(timeline["t"]) - 1))
                column.append(value)
        timeline["rss_bytes"].append((census.get("host") or {}).get("rss_bytes"))
        for series in ("bytes_in_use", "live_bytes"):
            for column in timeline[series].values():
                column.extend([None] * (len(timeline["t"]) - len(column)))
        timeline["last_is_census"] = True
    if overall is None:
        with_stats = [r for r in dev_records if r.get("verdict")]
        if with_stats:
            def fill(r: dict[str, Any]) -> float:
                limit = r.get("bytes_limit") or 0
                return (r.get("bytes_in_use") or 0) / limit if limit else 0.0
            overall = max(with_stats, key=fill)["verdict"]
        else:
            live_total = (arrays_part or {}).get("bytes")
            overall = host_verdict(census.get("host") or {}, live_total, request_bytes)
    log_stats = (census.get("allocator_log") or {}).get("stats") or {}
    if log_stats.get("bytes_in_use") is not None:
        # The allocator's own account at the failure: exact even when the
        # census comes later (the agent waited for an exception), and there
        # when the device's statistics are not (a failed memory_stats()).
        stats = dict(log_stats)
        pool = ((census.get("allocator_log") or {}).get("summary") or {}).get("pool")
        stats.setdefault("pool_bytes", pool)
        census["allocator_log"]["verdict"] = device_verdict(stats, request_bytes)
        if not any(r.get("failed") and r.get("verdict") for r in dev_records):
            overall = census["allocator_log"]["verdict"] or overall
    census["verdict"] = overall
    lap("verdict", t)
    elapsed = time.perf_counter() - started
    census["timing"] = {"seconds": round(elapsed, 6), "budget_s": budget_s, "steps": steps, "live_arrays": n_live}
    census["skipped"] = skipped
    census["errors"] = errors
    census["complete"] = not skipped
    return census

