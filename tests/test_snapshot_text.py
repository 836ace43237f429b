"""What a process's view says beside its figures: the time axis of the
timelines, and jaxtop's own cost where it outgrows its ceiling (model →
snapshot text and the Host panel)."""

from __future__ import annotations

import io

from rich.console import Console

from test_transfer_sites_dashboard import model_of, stream


def test_the_time_axis_starts_at_the_first_sample_not_its_bucket():
    """A coarse level stamps its rows with the bucket's start, up to 10 s
    before the first sample: the axis (and its "so far") starts at the
    sample (the chip's screens read "24s so far" beside "up 20s")."""
    import numpy as np

    from jaxtop.dashboard.history import Window
    from jaxtop.dashboard.snapshot import _span

    rows = np.zeros((3, 1))
    coarse = Window(np.array([1000.0, 1010.0, 1020.0]), rows, rows, 10.0)
    assert _span(coarse, 600.0, 1024.3, first_t=1004.3) == (1004.3, 1024.3)
    assert _span(coarse, 600.0, 1024.3) == (1000.0, 1024.3)  # no first sample known: the bucket's
    assert _span(coarse, 10.0, 1024.3, first_t=1004.3) == (1014.3, 1024.3)  # the window still bounds it


def test_an_agent_over_its_ceiling_says_so_with_the_figure():
    """Tying 61,000 transfers a second to lines cost the agent 3 % of a
    core, over its 0.5 % ceiling, and the screen said nothing of it."""
    from jaxtop.dashboard.snapshot_text import snapshot_text
    from jaxtop.widgets.panels import HostPanel

    records = stream()
    records[-1]["agent"] = {"cpu_share": 0.031, "ceiling_share": 0.005, "tick_s": 0.2, "budget_share": 0.004}
    snap = model_of(records).snapshot(now=0.0)
    text = snapshot_text(snap)
    assert "jaxtop's agent thread 3.10% of a core, over its 0.5% ceiling" in text
    console = Console(width=100, record=True, file=io.StringIO(), color_system=None)
    console.print(HostPanel().draw(snap, 100, 6))
    assert "jaxtop 3.1% of a core, over its 0.5% ceiling" in console.export_text()
    records[-1]["agent"]["cpu_share"] = 0.0045  # under it: nothing said
    assert "over its" not in snapshot_text(model_of(records).snapshot(now=0.0))
