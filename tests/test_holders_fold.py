"""The Holders fold (jaxtop/dashboard/holders.py), its report and the Holders screen in the app."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from jaxtop.dashboard.holders import HoldersFold, fold_records
from jaxtop.dashboard.holders_screen import HoldersScreen
from jaxtop.widgets.holders import HoldersReport, render_holders, sparkline
from jaxtop.wire.records import Sample, from_dict
from test_holders import USER, leak_profiles, make_probe
from test_holders import MiB, T0  # helpers shared with that module


# -- fold and report ----------------------------------------------------------------------------------------

def typed(records):
    """The records as the fold takes them: decoded, as the model feeds it."""
    return [from_dict(rec) for rec in records]


def stream(n=24, pid=4242, mark_at=12):
    """A recorded-looking stream: hello, then samples every second with a
    profile every 5th, labels and host syncs, made by the real probe on
    synthetic profiles so that the records are the agent's own."""
    probe, clock, mono = make_probe(leak_profiles(n + 2, leak_per_step=16), interval_s=5.0)
    records = [{"type": "hello", "t": T0, "protocol": 1, "pid": pid, "argv": ["train.py"], "started_t": T0,
                "versions": {"jax": "0.10.2"}, "backend": "cpu", "devices": [{"id": 0, "platform": "cpu"}],
                "interval_s": 1.0, "slow_interval_s": 1.0, "transfer_capture": {"available": True},
                "nvml": {"available": False, "reason": "no driver"}}]
    for k in range(n * 5):
        t = T0 + 1 + k
        clock.t, mono.t = t, float(k)
        if k == mark_at * 5:
            probe.cmd_mark({})
        rec = {"type": "sample", "t": t, "seq": k + 1, "devices": [
            {"id": 0, "platform": "cpu", "source": "live_arrays", "bytes_in_use": 1300 * MiB,
             "live_arrays": {"bytes": 1300 * MiB, "count": 140}}], "process": {"rss_bytes": 2 << 30}}
        holders = probe.sample()
        if holders is not None:
            rec["holders"] = holders
        if k % 5 == 2:
            rec["labels"] = {"t": t, "trees": [
                {"name": "opt_state", "bytes": 2400 * MiB, "arrays": 260, "alive": 260, "leaves": 261, "labelled_t": T0},
                {"name": "params", "bytes": 1200 * MiB, "arrays": 130, "alive": 130, "leaves": 130, "labelled_t": T0},
                {"name": "batch", "bytes": 64 * MiB, "arrays": 2, "alive": 1, "leaves": 2, "labelled_t": t - 1}]}
            rec["host_syncs"] = {"t": t, "available": True, "count": 13 * (k + 1), "by_kind": {"float": 10 * (k + 1), "item": 2 * (k + 1), "asarray": k + 1},
                                 "sites_total": 2, "numpy_hooks": True, "sites": [
                                     {"site": "train.py:131", "function": "train_step", "file": USER, "line": 131, "count": 12 * (k + 1),
                                      "kinds": {"float": 10 * (k + 1), "item": 2 * (k + 1)}, "last_t": t},
                                     {"site": "eval.py:40", "function": "evaluate", "file": "/home/me/proj/eval.py", "line": 40, "count": k + 1,
                                      "kinds": {"asarray": k + 1}, "last_t": t}]}
        records.append(rec)
    return records


def test_fold_keeps_history_mark_suspects_labels_and_syncs():
    view = fold_records(typed(stream()))
    assert view.profiles == 24 and view.t == T0 + 116  # every 5 s; the mark's profile took #12's turn
    by_site = {s.site: s for s in view.sites}
    leak = by_site["train.py:120"]
    assert leak.suspect and leak.growth.count_per_min == pytest.approx(16 * 12)
    assert leak.history[-3:] == (21 * 16 * 32768.0, 22 * 16 * 32768.0, 23 * 16 * 32768.0)
    assert len(leak.history) == 24 and leak.history[0] == 0.0
    assert view.suspects == (leak,)
    assert leak.mark_count == 16 * (23 - 12) and by_site["train.py:10"].mark_bytes == 0
    assert view.mark_t == T0 + 61 and view.mark_bytes == 32 * MiB + 16 * 11 * 32768  # one more batch in flight
    assert by_site["train.py:10"].share == pytest.approx(1200 * MiB / view.bytes)
    assert [t.name for t in view.labels] == ["opt_state", "params", "batch"]
    sync = view.syncs[0]
    assert (sync.site, sync.count, sync.per_s) == ("train.py:131", 12 * 118, pytest.approx(12.0))
    assert view.syncs_total == 13 * 118 and view.syncs_by_kind["float"] == 1180


def test_fold_ignores_other_records_and_bad_fields():
    assert fold_records(typed([{"type": "hello", "t": 1.0}])).empty
    fold = HoldersFold()
    assert not fold.feed(from_dict({"type": "sample", "t": 1.0}))
    assert fold.feed(from_dict({"type": "sample", "t": 2.0, "holders": {"error": "no profiler", "t": 2.0}}))
    assert fold.view().error == "no profiler" and fold.view().t is None
    fold.feed(from_dict({"type": "sample", "t": 3.0,
                         "holders": {"t": 3.0, "sites": ["junk", {"site": "x.py:1"}], "bytes": "?"},
                         "labels": {"trees": [None, {"name": "p"}]},
                         "host_syncs": {"sites": [1], "available": False, "reason": "r"}}))
    view = fold.view()
    assert [s.site for s in view.sites] == ["x.py:1"] and view.labels[0].name == "p" and view.syncs_reason == "r"
    assert fold.view() is view  # cached until the next change


def test_the_streams_parts_decode_whole():
    from test_holders import assert_decoded_whole

    seen = set()
    for raw in stream():
        rec = from_dict(raw)
        assert rec.odd == ()
        for part in ("holders", "labels", "host_syncs"):
            if part in raw:
                assert_decoded_whole(raw[part], getattr(rec, part), part)
                seen.add(part)
    assert seen == {"holders", "labels", "host_syncs"}


def test_wrong_typed_parts_read_n_a_and_are_noted_never_raise():
    rec = from_dict({"type": "sample", "t": 5.0, "holders": {
        "t": 5.0, "seq": True, "bytes": 100, "in_use_bytes": "lots", "by_device": {"cpu:0": [100, 2], "x": [1, 2, 3]},
        "other": [], "mark": {"t": "then", "bytes": 5}, "sites": [
            {"site": "a.py:3", "function": "f", "file": "/a.py", "line": "3", "bytes": 60, "count": 1,
             "devices": {"cpu:0": "60"}, "growth": {"rises": "many", "for_s": 30}, "suspect": "yes", "mark": 7},
            {"site": "b.py:9", "function": "g", "file": "/b.py", "line": 9, "bytes": [40], "count": 1}]},
        "labels": {"t": 5.0, "trees": [{"name": 3, "bytes": 10, "alive": None, "followed": 1}]},
        "host_syncs": {"t": 5.0, "available": "yes", "count": 4, "by_kind": {"float": "4", "item": 1},
                       "sites": [{"site": "c.py:1", "line": 1, "count": 4, "kinds": [], "last_t": 1e200}]}})
    assert {o.where for o in rec.odd} >= {
        "holders.seq", "holders.in_use_bytes", "holders.by_device.x", "holders.other", "holders.mark.t",
        "holders.sites[].line", "holders.sites[].devices.cpu:0", "holders.sites[].growth.rises",
        "holders.sites[].suspect", "holders.sites[].mark", "holders.sites[].bytes", "labels.trees[].name",
        "host_syncs.available", "host_syncs.by_kind.float", "host_syncs.sites[].kinds", "host_syncs.sites[].last_t"}
    view = fold_records([rec])
    assert view.seq == 0 and view.in_use_bytes is None and view.by_device == {"cpu:0": (100, 2)}
    assert view.other_bytes == 0 and view.mark_t is None and view.mark_bytes == 5
    a, b = sorted(view.sites, key=lambda s: s.site)
    assert (a.site, a.line, a.bytes, a.devices, a.suspect, a.mark_bytes) == ("a.py:3", 0, 60, {}, False, None)
    assert a.growth.rises == 0 and a.growth.for_s == 30.0
    assert b.bytes == 0 and b.history == (None,)  # n/a: unknown in the sparkline, not gone
    assert a.share == pytest.approx(0.6)  # of the profile's bytes: the allocator's read n/a
    tree = view.labels[0]
    assert (tree.name, tree.bytes, tree.alive, tree.followed) == ("?", 10, 0, False)
    assert view.syncs_available is False and view.syncs_by_kind == {"item": 1}
    assert view.syncs[0].kinds == {} and view.syncs[0].last_t is None and view.syncs_total == 4


def test_a_probe_that_raised_says_so_where_its_part_shows():
    fold = HoldersFold()
    for part in ("holders", "labels", "host_syncs"):
        rec = from_dict({"type": "sample", "t": 7.0, part: {"error": "ValueError: boom"}})
        assert rec.odd == () and getattr(rec, part).error == "ValueError: boom"
        assert fold.feed(rec)
    view = fold.view()
    assert view.error == "ValueError: boom" and view.t is None and view.labels == ()
    assert view.syncs_available is False and view.syncs_reason == "ValueError: boom"


def render(renderable, width=120) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def test_report_shows_sites_suspects_mark_labels_and_syncs_at_any_width():
    view = fold_records(typed(stream()))
    text = render(HoldersReport(view), 140)
    assert "⚠ leak suspect train.py:120 log_metrics: +192 arrays/min, +6.00 MiB/min, for 1m45s" in text
    assert "since mark (59s ago): +37.5 MiB, +177 buffers" in text
    lines = text.splitlines()
    rows = [l for l in lines if l.strip().startswith(("train.py", "data.py", "⚠")) and "leak suspect" not in l]
    assert rows[0].lstrip().startswith("train.py:14") and "init_opt_state" in rows[0] and "2.34 GiB" in rows[0]
    assert "train.py:120" in rows[3] and "+6.00 MiB/min" in rows[3] and "+5.50 MiB" in rows[3]
    assert "opt_state" in text and "2.34 GiB" in text and "1/2" in text  # batch: one of two arrays alive
    assert "train.py:131" in text and "float 1,180, item 236" in text
    for width in (60, 80, 200):
        narrow = render_holders(view, width)
        assert "train.py:120" in narrow and "leak suspect" in narrow and "Named pytrees" in narrow
        assert max(len(l) for l in narrow.splitlines()) <= width
    assert "No holders data yet" in render(HoldersReport(None))
    one = render(HoldersReport(view, device="cpu:0"), 120)
    assert "on cpu:0" in one


def test_sparkline_tells_gone_from_unknown():
    assert sparkline([0, 1, 2, 4, 8], 5).plain == "▁▁▂▄█"
    assert sparkline([None, 4, 0], 4).plain == " ·█▁"


# -- the Holders screen in the app ------------------------------------------------------------------------

try:
    from jaxtop.dashboard.state import ProcessModel

    MODEL_FOLDS = hasattr(ProcessModel(1), "holders")  # the model folds holders itself once wired
except Exception:  # pragma: no cover
    MODEL_FOLDS = False


def app_with_holders():
    from jaxtop.dashboard.app import make_app
    from jaxtop.dashboard.sources import PushSource

    src = PushSource()
    app = make_app(src, refresh_s=0.05)
    return src, app


def feed_app(src, records, pid=4242):
    fold = HoldersFold()
    for rec in records:
        src.push(pid, rec, update=False)
        decoded = from_dict(rec)
        if isinstance(decoded, Sample):
            fold.feed(decoded)
    src.on_update()
    return fold


async def open_holders(pilot, app, src, fold):
    await pilot.press("H")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the view arrives with the app's next snapshot
        await pilot.pause(0.05)
        if isinstance(app.screen, HoldersScreen):
            app.screen.refresh_view()
            if app.screen.view is not None and app.screen.view.profiles == 24:
                break
    assert isinstance(app.screen, HoldersScreen) and app.screen.view.profiles == 24
    return app.screen


async def test_holders_screen_keys_send_commands_and_filter_devices():
    src, app = app_with_holders()
    async with app.run_test(size=(120, 40)) as pilot:
        fold = feed_app(src, stream())
        screen = await open_holders(pilot, app, src, fold)
        body = render(screen.query_one("#holders-body").content, 118)
        assert "train.py:120" in body and "leak suspect" in body and "opt_state" in body
        await pilot.press("m")
        assert src.commands[-1][1:] == ("holders_mark", {})
        await pilot.press("M")
        assert src.commands[-1][1:] == ("holders_mark", {"clear": True})
        await pilot.press("r")
        assert src.commands[-1][1] == "holders_profile"
        await pilot.press("v")
        assert screen.device == "cpu:0"
        assert "on cpu:0" in render(screen.query_one("#holders-body").content, 118)
        await pilot.press("v")
        assert screen.device is None
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, HoldersScreen)


def test_holders_screen_snapshot(snap_compare, utc):
    src, app = app_with_holders()

    async def run_before(pilot):
        fold = feed_app(src, stream())
        await open_holders(pilot, app, src, fold)
        app.screen.refresh_view()
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=(120, 40), run_before=run_before)


def test_reads_the_agent_cannot_see_are_said_under_the_syncs_at_any_width():
    records = stream(n=6)
    note = ("np.asarray/np.array of CPU arrays not counted: numpy reads them in C "
            "(JAXTOP_NUMPY_HOOKS=1 counts them, at ~120 ns on every numpy call)")
    for rec in records:
        if "host_syncs" in rec:
            rec["host_syncs"] = dict(rec["host_syncs"], numpy_hooks=False, uncounted=note)
    view = fold_records(typed(records))
    assert view.syncs_uncounted == note
    assert "np.asarray/np.array of CPU arrays not counted" in render(HoldersReport(view), 200).replace("\n", " ")
    for width in (60, 80):
        assert "np.asarray/np.array of CPU" in render_holders(view, width)
    # A recording whose note is not text shows none (and does not fail);
    # one whose note is a number no float holds is no record at all (the
    # decoder refuses such a line: tests/test_records.py).
    for rec in records:
        if "host_syncs" in rec:
            rec["host_syncs"]["uncounted"] = [10 ** 300, {"not": "text"}]
    assert fold_records(typed(records)).syncs_uncounted is None
