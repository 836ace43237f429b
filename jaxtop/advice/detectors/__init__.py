"""The detectors: each reads :class:`~jaxtop.advice.evidence.Evidence` over
a window and returns its advice, or says why it could not judge.

- :mod:`.transfers`: placement, batching, jit (eager ops), host syncs, the
  transfer guard: lines that move data or dispatch work every step;
- :mod:`.calls`: donation, in-place updates, gradient checkpointing: what
  the jit ledger says of each jitted function;
- :mod:`.memory`: run-ahead, leaks, fragmentation: the devices and the
  memory profiles.
"""

from jaxtop.advice.detectors.base import Window
from jaxtop.advice.detectors.calls import checkpointing, donation, in_place
from jaxtop.advice.detectors.memory import fragmentation, leak, runahead
from jaxtop.advice.detectors.transfers import batching, guard, host_sync, jit_ops, placement

__all__ = ["DETECTORS", "Window"]

#: Each strategy's detector, in :data:`jaxtop.advice.types.STRATEGIES` order.
DETECTORS = (
    ("placement", placement), ("donation", donation), ("in_place", in_place), ("batching", batching),
    ("jit", jit_ops), ("host_sync", host_sync), ("runahead", runahead), ("checkpointing", checkpointing),
    ("guard", guard), ("leak", leak), ("fragmentation", fragmentation),
)
