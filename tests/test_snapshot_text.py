"""What a process's view says beside its figures: the timelines' title
against the header's uptime, and jaxtop's own cost where it outgrows its
ceiling (model → snapshot text and the panels)."""

from __future__ import annotations

import io

from rich.console import Console

from test_transfer_sites_dashboard import model_of, stream


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


def test_the_timelines_never_say_the_run_is_longer_than_its_uptime():
    """A coarse level's first row is stamped with its bucket's start, before
    the run began: the title said "24s so far" beside the header's "up 20s"."""
    import dataclasses

    from jaxtop.widgets.panels import TimelinePanel

    snap = model_of(stream()).snapshot(now=0.0)
    (proc,) = snap.processes
    start, end = proc.span
    early = dataclasses.replace(proc, span=(start - 4.0, end), uptime_s=end - start)
    snap = dataclasses.replace(snap, processes=(early,))
    console = Console(width=120, record=True, file=io.StringIO(), color_system=None)
    console.print(TimelinePanel().draw(snap, 120, 12))
    title = console.export_text().splitlines()[0]
    from jaxtop.widgets.fmt import fmt_duration

    assert f"{fmt_duration(end - start)} so far" in title, title
