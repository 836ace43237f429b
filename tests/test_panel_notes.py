"""Pure layer: what the panels say beside their numbers (the overview's
per-process rate, rates after exit, the in-use asterisk and the map's glyphs),
drawn from a model fed synthetic records."""

from __future__ import annotations

import io

from rich.console import Console

from test_render import MiB, render
from test_render_memory_map import SEVEN
from jaxtop.widgets.render import MemoryMap



def _two_device_snapshot(exit_: bool):
    from jaxtop.dashboard.model import Model
    from jaxtop.testing import synthetic

    model = Model(clock=lambda: 0.0)
    model.feed(1, synthetic.hello(1, 2, 1000.0))
    for rec in synthetic.samples(1, 2, 1000.0, 30):
        model.feed(1, rec)
    if exit_:
        model.feed(1, {"type": "exit", "t": 1004.0, "pid": 1})
    return model.snapshot(selected=0, window_s=60.0, now=1004.0)


def _panel_text(panel, snap, width=120, height=12) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(panel.draw(snap, width, height))
    return console.export_text()


def test_overview_shows_the_process_rate_once_not_on_every_device():
    """The guard's h2d/s is the process's: one row says it, the others ditto."""
    from jaxtop.widgets.panels import OverviewPanel

    snap = _two_device_snapshot(exit_=False)
    rows = [line for line in _panel_text(OverviewPanel(), snap).splitlines() if "gpu:" in line or "cpu:" in line]
    assert len(rows) == 2
    assert "/s" in rows[0] and "↑" in rows[1] and "/s" not in rows[1]


def test_rates_leave_the_screen_when_the_process_exits():
    from jaxtop.widgets.panels import OverviewPanel, TransfersPanel

    live = _panel_text(TransfersPanel(), _two_device_snapshot(exit_=False))
    assert "/s" in live.split("h2d", 1)[1].splitlines()[0]
    snap = _two_device_snapshot(exit_=True)
    assert snap.processes[0].transfers["h2d"].count_per_s is None  # not a current rate any more
    assert snap.processes[0].transfers["h2d"].count_total  # the totals stand
    ended = _panel_text(TransfersPanel(), snap)
    assert "exited: totals only" in ended
    h2d_row = ended.split("h2d", 1)[1].splitlines()[0]
    assert "–" in h2d_row and "/s" not in h2d_row
    overview = _panel_text(OverviewPanel(), snap)
    assert "/s" not in [line for line in overview.splitlines() if "exited" in line][0]


def test_in_use_asterisk_and_map_glyphs_are_explained_at_any_height():
    """`in use*` on CPU comes with what the * means even when the panel has
    no line for the note; the map's glyphs are named beside it and in help."""
    from jaxtop.dashboard.modals import HELP_NOTES
    from jaxtop.dashboard.model import Model
    from jaxtop.testing import synthetic
    from jaxtop.widgets.panels import MemoryMapPanel, MemoryPanel

    model = Model(clock=lambda: 0.0)
    model.feed(1, synthetic.hello(1, 1, 1000.0))
    for rec in synthetic.samples(1, 1, 1000.0, 5):
        for dev in rec.get("devices", ()):
            dev["source"] = "live_arrays"  # as on CPU: in use from jax.live_arrays()
        model.feed(1, rec)
    snap = model.snapshot(selected=0, window_s=60.0, now=1001.0)
    assert snap.device.source == "live_arrays"
    for height in (3, 5, 8):
        text = _panel_text(MemoryPanel(), snap, width=100, height=height)
        assert "in use*" in text and "from live arrays" in text, (height, text)
    assert "█ used" in _panel_text(MemoryMapPanel(), snap, width=100, height=8)
    assert "in use*" in HELP_NOTES and "· free (a hole)" in HELP_NOTES and "≈ a long gap" in HELP_NOTES


def test_memory_map_says_why_device_put_buffers_are_unplaced():
    (_, caption) = render(MemoryMap(SEVEN, rows=1, count=10, total_hint=15 * MiB, unmapped={"no_address": 3}), 160)
    assert "3 buffers not asked (asking adds arrays to the program's live_arrays)" in caption
    (_, short) = render(MemoryMap(SEVEN, rows=1, count=10, total_hint=15 * MiB, unmapped={"no_address": 3}), 60)
    assert "3 not asked" in short

    from jaxtop.dashboard.modals import HELP_NOTES

    assert "(device_put buffers; every buffer before jaxlib 0.10.1)" in HELP_NOTES.replace("\n", " ")
    assert '"not asked": buffers whose address only a new Array would tell' in HELP_NOTES
    assert "without an address" not in caption  # all 10 accounted for: 7 placed, 3 explained



def test_the_host_panel_says_when_jaxtop_samples_less_often_than_asked():
    """At its CPU ceiling the agent stretches its interval: the screen says
    so (the timelines would otherwise just look coarse), at every width."""
    from jaxtop.dashboard.model import Model
    from jaxtop.testing import synthetic
    from jaxtop.widgets.panels import HostPanel

    def host_lines(tick_s, width):
        model = Model(clock=lambda: 0.0)
        model.feed(1, synthetic.hello(1, 1, 1000.0))
        for rec in synthetic.samples(1, 1, 1000.0, 10):
            model.feed(1, rec)
        model.feed(1, {"type": "sample", "t": 1001.2, "seq": 11, "agent": {
            "cpu_share": 0.0046, "ceiling_share": 0.005, "tick_s": tick_s}})
        return _panel_text(HostPanel(), model.snapshot(selected=0, window_s=60.0, now=1001.2), width=width)

    assert "sampled every" not in host_lines(0.1, 120)  # as asked: nothing to say
    assert "sampled every 0.25 s (jaxtop at its 0.5% CPU ceiling)" in host_lines(0.25, 120)
    assert "sampled every 0.25 s" in host_lines(0.25, 40)


def test_the_host_panel_and_snapshot_say_the_resident_set_s_parts_where_they_fit():
    """A TPU host read RSS 14.5 GiB for a program of 176 MiB of arrays: the
    parts say what it is (here a runtime's shared memory), in the panel
    where the width allows and in ``snapshot``; an older agent's samples
    (no parts) read as before."""
    from jaxtop.dashboard.model import Model
    from jaxtop.dashboard.readings import HostView
    from jaxtop.dashboard.snapshot_text import snapshot_text
    from jaxtop.testing import synthetic
    from jaxtop.widgets.panels import HostPanel
    from jaxtop.wire.records import Process

    host = HostView.from_wire(Process(rss_bytes=14 << 30, rss_anon_bytes=1 << 30, rss_file_bytes=400 << 20,
                                      rss_shmem_bytes=(12 << 30) + (624 << 20)))
    assert host.rss_parts() == "shm 12.6 GiB, anon 1.00 GiB, files 400 MiB"
    assert HostView.from_wire(Process(rss_bytes=1 << 30)).rss_parts() is None
    assert HostView.from_wire(Process(rss_bytes=3 << 20, rss_anon_bytes=2 << 20, rss_file_bytes=1 << 20,
                                      rss_shmem_bytes=0)).rss_parts() == "anon 2.00 MiB, files 1.00 MiB"

    def snap(parts):
        model = Model(clock=lambda: 0.0)
        model.feed(1, synthetic.hello(1, 1, 1000.0))
        for rec in synthetic.samples(1, 1, 1000.0, 10):
            if parts:
                rec["process"].update(rss_anon_bytes=1 << 30, rss_file_bytes=400 << 20, rss_shmem_bytes=5 << 30)
            model.feed(1, rec)
        return model.snapshot(selected=0, window_s=60.0, now=1001.0)

    wide = _panel_text(HostPanel(), snap(True), width=120)
    assert "; shm 5.00 GiB, anon 1.00 GiB, files 400 MiB)" in wide
    narrow = _panel_text(HostPanel(), snap(True), width=44)
    assert "RSS 6.00 GiB" in narrow and "shm" not in narrow
    assert "shm" not in _panel_text(HostPanel(), snap(False), width=120)
    assert "host RSS 6.00 GiB (shm 5.00 GiB, anon 1.00 GiB, files 400 MiB)" in snapshot_text(snap(True))
