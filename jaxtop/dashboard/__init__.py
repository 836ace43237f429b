"""The viewer: where records come from (:mod:`.sources`: live agents, a
recording, records pushed by code), the UI-free model with its history
(:mod:`.model`, :mod:`.history`), and the Textual app (:mod:`.app`,
:mod:`.picker`, :mod:`.messages`) that draws it with ``jaxtop.widgets``."""
