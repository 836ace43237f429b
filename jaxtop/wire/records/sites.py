"""The sample's ``transfer_sites``: which line made each implicit transfer.
Not yet typed field by field: a JSON object whose reader
(:mod:`jaxtop.dashboard.transfer_sites`) takes its keys."""

from __future__ import annotations

from typing import Any

__all__ = ["TransferSites"]

TransferSites = dict[str, Any]
