"""``jaxtop snapshot PID [--json]``: every panel's figures, once.

For scripts and bug reports, as ``nvitop --once`` or ``py-spy dump``: the
agent's greeting (hello, then the present: the newest sample with the last
buffer map and sparse fields) goes through the dashboard's own model, and
the views the panels draw are printed, as text or as one JSON document.
The history that follows the present is not waited for. Nothing is sent to
the agent; the program is not paused.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from typing import Any

from jaxtop.cli.exits import EXIT_USAGE

__all__ = ["cmd_snapshot", "snapshot_of", "to_json"]

#: Seconds after which the text says when the live arrays were scanned.
STALE_S = 3.0

#: Fields of a view left out of the JSON: drawing data, not figures.
SKIP = {"history", "timeline", "buffer_map", "span"}


def snapshot_of(pid: int, timeout_s: float = 10.0) -> Any:
    """The dashboard's snapshot of ``pid`` once its present is in.

    Raises:
        jaxtop.wire.client.AgentNotFound: no agent.
        TimeoutError: no sample within ``timeout_s``.
    """
    from jaxtop.dashboard.model import Model
    from jaxtop.wire import client, protocol

    model = Model()
    deadline = time.monotonic() + timeout_s
    seen_sample = False
    with client.AgentConnection.open(pid, timeout_s=min(timeout_s, 5.0)) as conn:
        for line in conn.lines(should_stop=lambda: time.monotonic() > deadline):
            try:
                record = protocol.decode(line)
            except protocol.ProtocolError:
                continue
            model.feed(pid, record)
            kind = record.get("type")
            # The present comes first after hello (present_first); an older
            # agent sends its history first: then the first live sample.
            if kind in ("sample", "backfill") and (record.get("present") or kind == "sample"):
                seen_sample = True
            if seen_sample or kind == "history_end":
                break
    if not seen_sample:
        raise TimeoutError(f"no sample from pid {pid} within {timeout_s:g} s")
    return model.snapshot()


def to_json(value: Any) -> Any:
    """A view as plain JSON: dataclasses by field, no drawing data, n/a as null."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name not in SKIP}
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "item"):  # a numpy scalar
        return to_json(value.item())
    return str(value)


def _text(snap: Any) -> str:
    from jaxtop.wire.units import fmt_bytes, na

    out = []
    for p in snap.processes:
        out.append(f"{p.who}  {' '.join(p.argv) or '?'}")
        uptime = na() if p.uptime_s is None else f"{p.uptime_s:.0f} s"
        out.append(f"  backend {p.backend or na('not started')}  jax {p.jax_version or na()}  state {p.state}  "
                   f"seq {p.seq}  uptime {uptime}")
        host = p.process
        out.append(f"  host RSS {fmt_bytes(host.rss_bytes)}  CPU {na() if host.cpu_percent is None else f'{host.cpu_percent:.1f}%'}"
                   f"  threads {na() if host.threads is None else host.threads}")
        for d, t in p.transfers.items():
            out.append(f"  {d} transfers {t.count_total}  bytes >= {fmt_bytes(t.bytes_known_total)}")
        if not p.capture.available:
            out.append(f"  transfers: {na(p.capture.reason)}")
        out.append(f"  compiles {p.compile.count_total}  failed donations {p.donation.failed_total}")
        for dev in (d for d in snap.devices if d.pid == p.pid):
            out.extend(_device_lines(dev, p))
    return "\n".join(out) + "\n"


def _device_lines(dev: Any, proc: Any) -> list[str]:
    """A device's figures; the live arrays' age where their scan is not
    this moment's, and the memory no live array holds."""
    from jaxtop.wire.units import fmt_bytes, na

    frag = na(dev.fragmentation_reason) if dev.fragmentation is None else f"{dev.fragmentation:.1%}"
    live = f"live arrays {fmt_bytes(dev.live_bytes)}"
    if dev.live_age_s is not None and dev.live_age_s >= STALE_S:
        live += f" (scanned {dev.live_age_s:.1f} s ago)"
    lines = [f"  {dev.label:<8} in use {fmt_bytes(dev.bytes_in_use)}  pool {fmt_bytes(dev.pool_bytes)}  "
             f"limit {fmt_bytes(dev.bytes_limit)}  peak {fmt_bytes(dev.peak_bytes_in_use)}  "
             f"{live}  fragmentation {frag}"]
    if dev.unheld_bytes is not None:
        text = f"           not in arrays {'≈' if not dev.unheld_exact else ''}{fmt_bytes(dev.unheld_bytes)}"
        text += " (in use that no live array holds: on an accelerator, work queued ahead by async dispatch)"
        if dev.not_ready_count:
            text += f"; {dev.not_ready_count} arrays still computing ({fmt_bytes(dev.not_ready_bytes)})"
        call = proc.largest_call
        if call is not None:
            text += f"; one {call.name} call holds {fmt_bytes(call.call_held_bytes)}"
        lines.append(text)
    return lines


def cmd_snapshot(args: argparse.Namespace) -> int:
    """``jaxtop snapshot PID [--json]``; returns the exit status."""
    from jaxtop.wire import client

    try:
        snap = snapshot_of(args.pid, args.timeout)
    except client.AgentNotFound:
        print(f"jaxtop snapshot: {client.no_agent_message(args.pid)}", file=sys.stderr)
        return EXIT_USAGE
    except (TimeoutError, OSError) as exc:
        print(f"jaxtop snapshot: {exc}", file=sys.stderr)
        return 1
    if args.json:
        document = {"t": time.time(), "processes": to_json(snap.processes), "devices": to_json(snap.devices)}
        sys.stdout.write(json.dumps(document, indent=1, sort_keys=True) + "\n")
    else:
        sys.stdout.write(_text(snap))
    return 0
