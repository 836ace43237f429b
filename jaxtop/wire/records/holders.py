"""The sparse parts the Holders screen reads: ``holders`` (memory by
allocation site), ``labels`` (named pytrees) and ``host_syncs`` (lines that
read device arrays on the host). Not yet typed field by field: each is a
JSON object whose readers (:mod:`jaxtop.dashboard.holders`) take its keys."""

from __future__ import annotations

from typing import Any

__all__ = ["Holders", "HostSyncs", "Labels"]

Holders = dict[str, Any]
Labels = dict[str, Any]
HostSyncs = dict[str, Any]
