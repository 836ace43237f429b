"""What the main screen says where its figures would mislead: a compile
storm folded into one line, one device not called "devices", a run shorter
than the window named by its length, a map of a few placed bytes not drawn
as a full bar. Pure: the model fed records, panels and renderables drawn as
text."""

from __future__ import annotations

import io

from rich.console import Console

from jaxtop.dashboard.model import Model


def _text(renderable, width=80) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def _storm(model: Model, n: int, start: float = 2.0) -> None:
    for i in range(n):
        model.feed(1, {"type": "sample", "t": start + i * 0.5, "seq": i + 1, "devices": [],
                       "compile": {"count": 1, "count_total": i + 1, "seconds_total": 0.1 * (i + 1)}})


def test_a_compile_storm_is_one_line_that_counts():
    model = Model(clock=lambda: 0.0)
    model.feed(1, {"type": "hello", "t": 1.0, "pid": 1, "argv": ["x.py"], "interval_s": 0.1})
    _storm(model, 500)
    compiles = [e for e in model.snapshot(now=0.0).events if e.kind == "compile"]
    assert len(compiles) == 1 and compiles[0].text.startswith("500 backend compiles since"), compiles[-3:]
    assert "500 total" in compiles[0].text


def test_a_pause_or_another_event_starts_a_new_compile_line():
    model = Model(clock=lambda: 0.0)
    model.feed(1, {"type": "hello", "t": 1.0, "pid": 1, "argv": ["x.py"], "interval_s": 0.1})
    _storm(model, 3)
    model.feed(1, {"type": "sample", "t": 5.0, "seq": 10, "devices": [], "events": [{"kind": "info", "text": "hi"}]})
    _storm(model, 2, start=6.0)
    _storm(model, 1, start=60.0)  # 50 s later: a new line
    kinds = [(e.kind, e.text.split(";")[0]) for e in model.snapshot(now=0.0).events]
    assert kinds == [("compile", "3 backend compiles since " + kinds[0][1].rsplit(" ", 1)[-1]), ("info", "hi"),
                     ("compile", kinds[2][1]), ("compile", "1 backend compile(s)")], kinds
    assert kinds[2][1].startswith("2 backend compiles since")


def test_one_device_is_not_devices():
    from jaxtop.testing import synthetic
    from jaxtop.widgets.panels import HeaderBar

    model = Model(clock=lambda: 0.0)
    model.feed(1, synthetic.hello(1, 1, 1000.0))
    for rec in synthetic.samples(1, 1, 1000.0, 5):
        model.feed(1, rec)
    text = _text(HeaderBar().draw(model.snapshot(selected=-1, now=1001.0), 120, 2), 120)
    assert "overview: 1 device " in text + " " and "1 devices" not in text


def test_a_run_shorter_than_the_window_is_named_by_its_length():
    from jaxtop.testing import synthetic
    from jaxtop.widgets.panels import TimelinePanel

    model = Model(clock=lambda: 0.0)
    model.feed(1, synthetic.hello(1, 1, 1000.0))
    for rec in synthetic.samples(1, 1, 1000.0, 240):  # 24 s at 0.1 s
        model.feed(1, rec)
    text = _text(TimelinePanel().draw(model.snapshot(window_s=600.0, now=1030.0), 80, 12))
    title = text.splitlines()[0]
    assert "so far" in title and "10 min" not in title, title


def test_a_map_of_one_shard_of_a_sharded_array_is_not_a_full_bar():
    """1 of 19 buffers placed, 8 B of 12 MiB: the strip would be all █."""
    from jaxtop.widgets.render import MemoryMap

    text = _text(MemoryMap([(0x1000, 8)], rows=2, count=19, total_hint=12 << 20, unmapped={"sharded": 18}), 60)
    assert "█" not in text and "no map" in text and "1 of 19 buffers placed" in text, text
    full = _text(MemoryMap([(0x1000, 8 << 20), (0x1000 + (9 << 20), 3 << 20)], rows=2, count=2, total_hint=11 << 20), 60)
    assert "█" in full


def test_an_axis_of_one_byte_has_no_repeated_labels():
    import numpy as np

    from jaxtop.widgets.plot import Series
    from jaxtop.widgets.render import Strip, TimelineStack

    t = np.arange(10, dtype=float)
    ones = np.ones(10)
    text = _text(TimelineStack([Strip("known bytes/s", [Series("h2d", t, ones, ones, "cyan", "fill")], unit="bytes")],
                              0.0, 9.0, height=6), 60)
    assert text.count("0 B") <= 1, text


def test_cpu_percent_reads_one_decimal_whatever_the_source():
    from jaxtop.testing import synthetic
    from jaxtop.widgets.panels import HostPanel

    model = Model(clock=lambda: 0.0)
    model.feed(1, synthetic.hello(1, 1, 1000.0))
    rec = next(iter(synthetic.samples(1, 1, 1000.0, 1)))
    rec["process"] = dict(rec.get("process") or {}, cpu_percent=3.3000000000000003)
    model.feed(1, rec)
    text = _text(HostPanel().draw(model.snapshot(now=1001.0), 120, 4), 120)
    assert "CPU 3.3%" in text, text


async def test_help_lists_the_screens_above_the_fold_at_80x24():
    """J, H, O come before the navigation and window keys; the four windows
    are one row; keys that do nothing with this source (live-only ones in a
    replay) come last."""
    from pathlib import Path

    from jaxtop.dashboard.app import make_app
    from jaxtop.dashboard.sources.replay import ReplaySource

    source = ReplaySource(str(Path(__file__).parent / "fixtures" / "tpu" / "training-loop.jsonl.gz"))
    app = make_app(source)
    async with app.run_test(size=(80, 24)):
        rows = app.help_rows()
    keys = [k for k, _, _ in rows]
    assert keys.index("J") < keys.index("tab d") and keys.index("O") < 8, keys
    assert sum(k.startswith("1") for k in keys) == 1 and any("1 2 3 4" == k for k in keys), keys
    actives = [active for _, _, active in rows]
    assert actives == sorted(actives, reverse=True)  # the inactive ones last
