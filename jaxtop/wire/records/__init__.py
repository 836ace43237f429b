"""The wire's records as types, and the one decoder that makes them.

:mod:`~jaxtop.wire.records.core` names every field of every record once
(the sparse parts in :mod:`~jaxtop.wire.records.holders`,
:mod:`~jaxtop.wire.records.sites` and :mod:`~jaxtop.wire.records.jit`, the OOM
census's in :mod:`~jaxtop.wire.records.oom`);
:mod:`~jaxtop.wire.records.decoder` turns a line (or a dict) into one,
checking bounds and terminal safety there and nowhere else. The dashboard,
``snapshot``, ``export``, budgets and the Prometheus view read attributes.

msgspec only: the agent side (stdlib + jax) never imports this package; it
writes the same names from plain dicts, and ``tests/test_records.py``
decodes a real agent's stream with unknown keys reported.
"""

from jaxtop.wire.records.core import *  # noqa: F403
from jaxtop.wire.records.core import __all__ as _core_all
from jaxtop.wire.records.decoder import buffer_map, decode, from_dict, is_clean, reply_result
from jaxtop.wire.records.holders import *  # noqa: F403
from jaxtop.wire.records.holders import __all__ as _holders_all
from jaxtop.wire.records.jit import *  # noqa: F403
from jaxtop.wire.records.jit import __all__ as _jit_all
from jaxtop.wire.records.oom import *  # noqa: F403
from jaxtop.wire.records.oom import __all__ as _oom_all
from jaxtop.wire.records.sites import *  # noqa: F403
from jaxtop.wire.records.sites import __all__ as _sites_all

__all__ = [*_core_all, *_holders_all, *_jit_all, *_oom_all, *_sites_all, "buffer_map", "decode", "from_dict", "is_clean", "reply_result"]
