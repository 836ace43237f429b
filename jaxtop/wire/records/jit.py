"""The sample's ``jit``: the jit ledger's changes (or whole table). Not yet
typed field by field: a JSON object whose reader
(:mod:`jaxtop.dashboard.ledger`) takes its keys."""

from __future__ import annotations

from typing import Any

__all__ = ["Jit"]

Jit = dict[str, Any]
