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
import contextlib
import dataclasses
import json
import math
import sys
import time
from typing import Any

import msgspec

from jaxtop.cli.exits import EXIT_USAGE

__all__ = ["cmd_snapshot", "snapshot_of", "to_json"]

#: Fields of a view left out of the JSON: drawing data, not figures.
SKIP = {"history", "timeline", "buffer_map", "span"}


#: Seconds the history after the present is read for at most: its fine
#: samples are what the advice section is judged on (an agent sends its
#: ten minutes in well under a second); the panels' figures are the
#: present's, whether or not it all came.
HISTORY_WAIT_S = 3.0


def snapshot_of(pid: int, timeout_s: float = 10.0) -> tuple[Any, dict[int, Any]]:
    """The dashboard's snapshot of ``pid`` once its present and history are
    in (the history for at most :data:`HISTORY_WAIT_S`), and its jit ledger
    (``{pid: LedgerView}``; empty without one).

    Raises:
        jaxtop.wire.client.AgentNotFound: no agent.
        TimeoutError: no sample within ``timeout_s``.
    """
    from jaxtop.cli.agent_records import agent_records
    from jaxtop.dashboard.model import Model
    from jaxtop.wire.records import HistoryEnd, Sample

    model = Model()
    deadline = [time.monotonic() + timeout_s]  # shortened once the present is in
    seen_sample = False
    with contextlib.closing(agent_records(pid, timeout_s, lambda: time.monotonic() > deadline[0])) as records:
        for record in records:
            model.feed(pid, record)
            # The present comes first after hello (present_first), then the
            # history, then live samples; an older agent sends its history
            # first, then live samples.
            if isinstance(record, Sample) and not seen_sample and (record.present or record.__class__ is Sample):
                seen_sample = True
                deadline[0] = min(deadline[0], time.monotonic() + HISTORY_WAIT_S)
            if isinstance(record, HistoryEnd) or (seen_sample and record.__class__ is Sample and not record.present):
                break
    if not seen_sample:
        raise TimeoutError(f"no sample from pid {pid} within {timeout_s:g} s")
    ledger = model.ledgers.view(pid)
    return model.snapshot(), ({pid: ledger} if ledger is not None else {})


def to_json(value: Any) -> Any:
    """A view as plain JSON: dataclasses by field, no drawing data, n/a as null."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name not in SKIP}
    if isinstance(value, msgspec.Struct):  # a decoded part a view carries
        return {f: to_json(getattr(value, f)) for f in value.__struct_fields__ if f not in SKIP}
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


def cmd_snapshot(args: argparse.Namespace) -> int:
    """``jaxtop snapshot PID [--json]``; returns the exit status."""
    from jaxtop.wire import client

    try:
        snap, ledgers = snapshot_of(args.pid, args.timeout)
    except client.AgentNotFound:
        print(f"jaxtop snapshot: {client.no_agent_message(args.pid)}", file=sys.stderr)
        return EXIT_USAGE
    except (TimeoutError, OSError) as exc:
        print(f"jaxtop snapshot: {exc}", file=sys.stderr)
        return 1
    if args.json:
        document = {"t": time.time(), "processes": to_json(snap.processes), "devices": to_json(snap.devices),
                    "jit": {str(pid): to_json(v) for pid, v in ledgers.items()}}
        sys.stdout.write(json.dumps(document, indent=1, sort_keys=True) + "\n")
    else:
        from jaxtop.dashboard.snapshot_text import snapshot_text

        sys.stdout.write(snapshot_text(snap, ledgers))
    return 0
