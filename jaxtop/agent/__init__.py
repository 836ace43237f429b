"""Everything that runs inside the monitored process: the agent thread
(lifecycle and sampling, :mod:`.agent`), its client connections
(:mod:`.clients`), the import hook that arms the transfer guard at the end of
``import jax`` (:mod:`.import_hook`) and ``instrument()``'s handle
(:mod:`.handle`).

This side imports only the standard library, jax (lazily, once the program
has imported it), ``jaxtop.probes`` and the wire (``jaxtop.protocol``,
``jaxtop.paths``): it must run in a training job that has nothing else
installed, and never imports Textual or rich (a test holds it to that).
"""

from jaxtop.agent.agent import Agent

__all__ = ["Agent"]
