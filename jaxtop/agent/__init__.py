"""Everything that runs inside the monitored process: the agent thread
(lifecycle and sampling, :mod:`.agent`), its client connections
(:mod:`.clients`), the import hook that arms the transfer guard at the end of
``import jax`` (:mod:`.import_hook`) and ``instrument()``'s handle
(:mod:`.handle`).

This side imports only the standard library, jax (lazily, once the program
has imported it), ``jaxtop.probes`` and the wire (``jaxtop.wire.protocol``,
``jaxtop.wire.paths``): it must run in a training job that has nothing else
installed, and never imports Textual or rich (a test holds it to that).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jaxtop.agent.agent import Agent

__all__ = ["Agent"]


def __getattr__(name: str) -> Any:
    # Imported when asked for: ``jaxtop.label`` (jaxtop.agent.labels) is called
    # from the program's step and needs none of the agent's probes.
    if name == "Agent":
        from jaxtop.agent.agent import Agent

        return Agent
    raise AttributeError(f"module 'jaxtop.agent' has no attribute {name!r}")
