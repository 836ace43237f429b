"""The census's verdict: one line on why the allocation failed, from a
device's allocator statistics or, without them (CPU), from the host's
memory and the limit that applies.

Sizes read as on every panel (:func:`jaxtop.wire.units.fmt_bytes`). The
formatter is imported inside each function: the stderr relay imports this
package with only the probes folder on its path, where ``jaxtop`` is not.
"""

from __future__ import annotations

# The stderr relay imports this package without ``site``: no ``typing`` at
# run time. Type checkers read the import; Python skips it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["device_verdict", "host_verdict", "unheld_clause"]

#: Memory no live array holds is named in a verdict from this size, and
#: from a tenth of what is in use: a runtime's few MiB of its own are not
#: a finding.
UNHELD_MIN_BYTES = 64 << 20


def unheld_clause(in_use: int | None, live_bytes: int | None) -> str:
    """``"; 7.81 GiB of the in-use memory belonged to no live array (…)"`` or
    "" when that part is small or unknown.

    On an accelerator jax dispatches asynchronously: the program can be many
    steps ahead of the device, each queued step holding its outputs and
    temporaries and the inputs it still reads (a TPU v5e MLP loop: 10-11 GiB
    in use against 2.4 GiB of live arrays). A program can run out of memory
    "for no reason" that way: no array of its own explains the use.
    """
    from jaxtop.wire.units import fmt_bytes

    if in_use is None or live_bytes is None:
        return ""
    unheld = in_use - live_bytes
    if unheld < UNHELD_MIN_BYTES or unheld < in_use / 10:
        return ""
    return (f"; {fmt_bytes(unheld)} of the in-use memory belonged to no live array (work queued ahead by "
            "async dispatch: outputs and temporaries of steps not yet run; block_until_ready bounds it)")


def device_verdict(stats: dict[str, Any] | None, request_bytes: int | None = None,
                   live_bytes: int | None = None) -> str | None:
    """One line on why an allocation failed on a device with allocator stats.

    Fragmentation when the free bytes would hold the request but no free
    block does ("fragmentation: 3.10 GiB free in the pool but the largest free
    block is 410 MiB"), else a full pool ("the pool is full: 78.2 of 79.1 GiB
    in use"). Without a known request, fragmentation when BFC's measure is
    at least 0.5 and a fiftieth of the limit is free.

    Args:
        stats: the device's allocator statistics.
        request_bytes: the failed request, when known.
        live_bytes: the live arrays' bytes on the device from a complete
            scan (None: not known); names what no live array holds
            (:func:`unheld_clause`).

    Returns:
        The sentence, or None without ``bytes_in_use``.
    """
    from jaxtop.wire.units import fmt_bytes, fmt_bytes_pair

    if not stats:
        return None
    in_use = stats.get("bytes_in_use")
    if in_use is None:
        return None
    limit = stats.get("bytes_limit")
    pool = stats.get("pool_bytes")
    largest = stats.get("largest_free_block_bytes")
    free_pool = pool - in_use if pool is not None else None
    free_total = (limit - in_use) if limit is not None else free_pool
    fragmented = False
    if largest is not None and free_pool is not None and free_pool > 0:
        if request_bytes is not None:
            fragmented = free_total is not None and free_total >= request_bytes and largest < request_bytes
        else:
            frac = 1 - largest / free_pool
            fragmented = frac >= 0.5 and limit is not None and free_pool >= limit / 50
    request = f"; the request was {fmt_bytes(request_bytes)}" if request_bytes is not None else ""
    request += unheld_clause(in_use, live_bytes)
    if fragmented:
        text = f"fragmentation: {fmt_bytes(free_pool)} free in the pool but the largest free block is {fmt_bytes(largest)}"
        if limit is not None and pool is not None and limit - pool > 0:
            text += f" ({fmt_bytes(limit - pool)} not yet in the pool)"
        return text + request
    if limit is not None:
        text = f"the pool is full: {fmt_bytes_pair(in_use, limit)} in use"
        if request_bytes is not None and free_total is not None and request_bytes > free_total:
            text += f"; the request of {fmt_bytes(request_bytes)} needed {fmt_bytes(request_bytes - free_total)} more"
            return text + unheld_clause(in_use, live_bytes)
        return text + request
    return f"{fmt_bytes(in_use)} in use (the allocator reports no limit){request}"


def host_verdict(host: dict[str, Any], live_bytes: int | None, request_bytes: int | None = None) -> str:
    """One line for a backend without allocator statistics (CPU): live
    arrays against the process's RSS and the limit that applies."""
    from jaxtop.wire.units import fmt_bytes

    parts = [f"live arrays hold {fmt_bytes(live_bytes)} of the process's RSS {fmt_bytes(host.get('rss_bytes'))}"]
    if host.get("rlimit_as_bytes") is not None:
        parts.append(f"limit {fmt_bytes(host['rlimit_as_bytes'])} (RLIMIT_AS; {fmt_bytes(host.get('vms_bytes'))} "
                     "of address space in use)")
    elif host.get("rlimit_data_bytes") is not None:
        parts.append(f"limit {fmt_bytes(host['rlimit_data_bytes'])} (RLIMIT_DATA)")
    elif host.get("cgroup_limit_bytes") is not None:
        parts.append(f"limit {fmt_bytes(host['cgroup_limit_bytes'])} (cgroup memory.max; "
                     f"{fmt_bytes(host.get('cgroup_current_bytes'))} in use)")
    elif host.get("mem_total_bytes") is not None:
        parts.append(f"limit {fmt_bytes(host['mem_total_bytes'])} (MemTotal; "
                     f"{fmt_bytes(host.get('mem_available_bytes'))} available)")
    text = "; ".join(parts)
    if request_bytes is not None:
        text += f"; the request was {fmt_bytes(request_bytes)}"
    return text

