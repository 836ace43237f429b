"""The cyclic garbage collector, tuned for a process whose main job is a dashboard.

Only for jaxtop's own processes (``jaxtop attach``, ``replay``, ``demo``):
the agent lives inside the user's job, and the collector there is theirs.
"""

from __future__ import annotations

import gc

# The collector's first threshold in a dashboard's process. Decoding a
# backlog makes a dict or list per JSON object (about 80 per 8-device
# sample): at Python's default of 700 new containers the young generation is
# collected every nine samples, and every hundredth of those collections walks
# every object of Textual, Rich and numpy. Decoding and feeding a 6,000-sample
# backfill went from 6,600-7,900 to 10,800-14,300 samples/s with this and
# gc.freeze() (2-core VM, 4 Dec); a young generation of 10,000 containers is
# a few MB at most.
GC_GEN0 = 10_000


def tune_gc() -> None:
    """Tune the cyclic collector for a process whose main job is a dashboard.

    Freezes what exists now (modules, the app's widgets once mounted: they
    live as long as the process, so collections stop walking them) and makes
    young collections rarer. Only for jaxtop's own processes: the agent,
    which lives inside the user's job, never touches the collector. A
    collector the user turned off (threshold 0) stays off.
    """
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    if 0 < gen0 < GC_GEN0:
        gc.set_threshold(GC_GEN0, gen1, gen2)
