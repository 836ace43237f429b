"""The wire's records as types, and the one decoder that makes them.

:mod:`~jaxtop.wire.records.core` names every field of every record once;
:mod:`~jaxtop.wire.records.decoder` turns a line (or a dict) into one,
checking bounds and terminal safety there and nowhere else. The dashboard,
``snapshot``, ``export``, budgets and the Prometheus view read attributes.

msgspec only: the agent side (stdlib + jax) never imports this package; it
writes the same names from plain dicts, and ``tests/test_records.py``
decodes a real agent's stream with unknown keys reported.
"""

from jaxtop.wire.records.core import *  # noqa: F403
from jaxtop.wire.records.core import __all__ as _core_all
from jaxtop.wire.records.decoder import decode, from_dict, is_clean

__all__ = [*_core_all, "decode", "from_dict", "is_clean"]
