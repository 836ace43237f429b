"""A synthetic agent stream with GPU-shaped records, for benchmarks, demos of
the dashboard and tests. Every record says ``synthetic: true`` in ``hello``;
nothing here pretends to be a measurement."""

from __future__ import annotations

import math
import random
from typing import Any, Iterator

from jaxtop.wire import protocol
from jaxtop.wire.protocol import D2D, D2H, H2D

GIB = 1 << 30


def hello(pid: int, n_devices: int, t: float, interval_s: float = 0.1) -> dict[str, Any]:
    return {
        "type": protocol.HELLO, "t": t, "protocol": protocol.PROTOCOL_VERSION, "pid": pid, "argv": ["synthetic-train.py", "--devices", str(n_devices)],
        "started_t": t, "synthetic": True,
        "versions": {"jaxtop": protocol.JAXTOP_VERSION, "python": "3.11", "jax": "0.10.2", "jaxlib": "0.10.2"},
        "backend": "gpu",
        "devices": [{"id": i, "platform": "gpu", "kind": "Synthetic GPU", "process_index": 0} for i in range(n_devices)],
        "interval_s": interval_s, "slow_interval_s": 1.0, "backfill_s": 600.0,
        "transfer_capture": {"available": True, "guard": {d: "allow" for d in protocol.DIRECTIONS}},
        "nvml": {"available": True, "devices": [{"index": i, "name": "Synthetic GPU", "uuid": f"GPU-synthetic-{i}", "jax_id": i} for i in range(n_devices)]},
        "host": "synthetic",
    }


def samples(pid: int, n_devices: int, t0: float, count: int, interval_s: float = 0.1, seed: int = 0,
            map_every: int = 10) -> Iterator[dict[str, Any]]:
    """``count`` samples: a training loop whose memory saws up and down, with
    occasional spikes, steady h2d transfers and a compile now and then."""
    rng = random.Random(seed)
    limit = 60 * GIB
    totals = {d: [0, 0] for d in protocol.DIRECTIONS}
    peak = [0] * n_devices
    allocs = [0] * n_devices
    live_bytes, live_count = [0] * n_devices, [0] * n_devices  # from the last scan
    compiles = 0
    for k in range(count):
        t = t0 + (k + 1) * interval_s
        devices = []
        for i in range(n_devices):
            phase = (k % 600) / 600.0
            in_use = int((8 + 10 * phase + 0.5 * i) * GIB)
            if rng.random() < 0.002:
                in_use += 12 * GIB  # a spike a 0.1 s poll could miss: peak shows it
            pool = int(max(in_use, 30 * GIB))
            free_block = int((pool - in_use) * (0.4 + 0.5 * math.cos(k / 50.0) ** 2))
            old_peak = peak[i]
            peak[i] = max(peak[i], in_use)
            allocs[i] += rng.randint(50, 150)
            frag = 1 - free_block / (pool - in_use) if pool > in_use else 0.0
            dev = {
                "id": i, "platform": "gpu", "source": "memory_stats",
                "num_allocs": allocs[i], "bytes_in_use": in_use, "peak_bytes_in_use": peak[i],
                "largest_alloc_size": 2 * GIB, "bytes_limit": limit, "bytes_reserved": 0, "peak_bytes_reserved": 0,
                "largest_free_block_bytes": free_block, "pool_bytes": pool, "peak_pool_bytes": pool,
                "peak_rise_bytes": peak[i] - old_peak, "fragmentation": frag,
                "live_arrays": {"bytes": live_bytes[i], "count": live_count[i], "largest_bytes": 2 * GIB, "scanned_t": t},
            }
            if k % map_every == 0:
                # A fresh scan: the map lists every live buffer, so the count
                # and bytes are the map's own (the agent's scan works so).
                base = 0x7F0000000000 + i * (1 << 36)
                offs, bufs = 0, []
                for j in range(200):
                    size = rng.choice([1 << 20, 4 << 20, 64 << 20, 256 << 20])
                    bufs.append([base + offs, size])
                    offs += size + rng.choice([0, 0, 0, 1 << 20, 32 << 20])
                live_bytes[i], live_count[i] = sum(n for _, n in bufs), len(bufs)
                dev["live_arrays"].update({"bytes": live_bytes[i], "count": live_count[i], "map": bufs,
                                           "map_complete": True, "top": [
                    {"nbytes": 2 * GIB, "dtype": "float32", "shape": "[32768, 16384]", "ptr": base},
                    {"nbytes": 256 << 20, "dtype": "bfloat16", "shape": "[8192, 16384]", "ptr": base + (1 << 31)},
                ]})
            devices.append(dev)
        transfers: dict[str, Any] = {}
        for d, rate in ((H2D, 20), (D2H, 2), (D2D, 0)):
            n = rng.randint(0, rate)
            b = n * 4 * 1024 * 1024
            totals[d][0] += n
            totals[d][1] += b
            transfers[d] = {"count": n, "bytes_known": b, "count_bytes_unknown": 0,
                            "count_total": totals[d][0], "bytes_known_total": totals[d][1], "count_bytes_unknown_total": 0}
        transfers["top_shapes"] = [{"direction": H2D, "shape": "float32[1024,1024]", "count": totals[H2D][0]}]
        new_compiles = 1 if rng.random() < 0.001 else 0
        compiles += new_compiles
        yield {
            "type": protocol.SAMPLE, "t": t, "seq": k + 1, "devices": devices, "transfers": transfers,
            "process": {"rss_bytes": 6 * GIB, "vms_bytes": 40 * GIB, "cpu_percent": 95.0, "threads": 48, "peak_rss_bytes": 7 * GIB},
            "compile": {"count": new_compiles, "count_total": compiles, "seconds_total": compiles * 2.5, "cache_hits_total": 0},
            "donation": {"failed": 0, "failed_total": 0, "last_message": None},
            "nvml": {"available": True, "t": t, "devices": [
                {"index": i, "memory_used_bytes": int(limit * 0.8) + 500 * (1 << 20), "memory_total_bytes": 80 * GIB,
                 "gpu_util_percent": 87, "mem_util_percent": 40, "temperature_c": 61, "power_w": 310.5,
                 "pcie_tx_bytes_per_s": 1.2e9, "pcie_rx_bytes_per_s": 3.4e8, "process_memory_bytes": int(limit * 0.8)}
                for i in range(n_devices)]},
            "agent": {"cpu_s_total": 0.0, "thread_cpu_s_total": 0.0},
        }
