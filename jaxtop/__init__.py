"""jaxtop: ``top`` for JAX memory.

``import jaxtop; jaxtop.instrument()`` starts the agent in this process; then
``jaxtop attach PID`` (or ``jaxtop log PID``) reads it. Importing this package
imports neither jax nor Textual.

The package follows the data, one way: ``jaxtop.probes`` read jax, stderr,
psutil and NVML inside the user's process; ``jaxtop.agent`` samples them and
serves the stream; ``jaxtop.protocol`` (the wire) and ``jaxtop.client`` (the
one socket client) carry it; ``jaxtop.dashboard`` turns it into a model and
the Textual app with ``jaxtop.widgets``; ``jaxtop.export`` converts
recordings offline. ``jaxtop.cli`` wires them to commands, ``jaxtop.inject``
starts an agent in a running process, ``jaxtop.demo`` is the demo workload.
"""

from __future__ import annotations

from jaxtop.agent.handle import Handle, instrument
from jaxtop.labels import label
from jaxtop.protocol import JAXTOP_VERSION as __version__

__all__ = ["instrument", "label", "Handle", "__version__"]
