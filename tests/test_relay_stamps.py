"""Pure layer: the stderr relay's stamps (probes/_relay.py): when and on which
thread each guard line was written, as the agent needs them to tell which
call of the program made a line (tests/test_transfer_sites.py reads them
back on the agent's side).
"""

from __future__ import annotations

import time

import pytest

from jaxtop.probes import _relay
from relay_rig import G, GUARD_CACHED, GUARD_D2D, GUARD_H2D, GUARD_OLD, GUARD_TSL, GUARD_TSL_TID


def test_each_guard_line_is_stamped_with_its_thread_and_time(rig):
    # What the agent needs to tell which call of the program made a line: a
    # run of one direction and thread is one token, its times doubles in hex.
    r = rig().feed(b"before\n" + GUARD_H2D + GUARD_CACHED + b"x " + GUARD_D2D + GUARD_TSL + GUARD_TSL_TID + GUARD_OLD)
    assert r.stamps == ["h2d,2146,18:34:30.919532", "h2d,2146,18:34:30.920001", "d2d,6082,19:10:03.642390",
                        "h2d,0,19:09:21.852989", "d2d,4242,19:09:21.900001", "d2h,31337,09:01:02.000017"]
    [report] = [line for line in r.all_reports.splitlines() if line.startswith(b"T ")]
    assert len(report.split()) == 6  # the first two lines: one run


def test_a_run_of_stamps_crosses_minutes_and_stops_at_the_cap(rig, monkeypatch):
    # A thread's run of lines is one token however many minutes it spans
    # (each line's own minute gives its time); past the stamps a read may
    # keep, the lines are still counted, not stamped.
    late = GUARD_CACHED.replace(b"18:34:30.920001", b"18:34:59.999999")
    next_minute = GUARD_CACHED.replace(b"18:34:30.920001", b"18:35:00.000002")
    r = rig().feed(GUARD_H2D + late + next_minute + GUARD_D2D)
    assert r.stamps == ["h2d,2146,18:34:30.919532", "h2d,2146,18:34:59.999999", "h2d,2146,18:35:00.000002",
                        "d2d,6082,19:10:03.642390"]
    [report] = [line for line in r.all_reports.splitlines() if line.startswith(b"T ")]
    assert len(report.split()) == 3  # "T", the h2d run, the d2d run
    monkeypatch.setattr(_relay, "STAMPS_PER_READ_MAX", 3)
    capped = rig().feed(GUARD_H2D + late + next_minute + GUARD_D2D + GUARD_H2D)
    assert capped.stamps == ["h2d,2146,18:34:30.919532", "h2d,2146,18:34:59.999999", "h2d,2146,18:35:00.000002"]
    assert capped.reports == G(GUARD_H2D, 2) + G(late, 2) + G(GUARD_D2D)  # by message, as always


def test_stamps_are_the_same_whichever_scan_finds_them(rig):
    # Guard lines at line starts (the rule) are stamped by an anchored scan;
    # anything else in the read (the program's own text holding the guard's
    # mark, a guard line after a partial line) sends the whole read through
    # the general one. Both give each guard line's stamp, in order.
    at_starts = GUARD_H2D + GUARD_CACHED + GUARD_D2D
    expected = ["h2d,2146,18:34:30.919532", "h2d,2146,18:34:30.920001", "d2d,6082,19:10:03.642390"]
    # The rule's one scan also takes the messages and what the user sees:
    # the same as the two scans of any other read.
    counted = G(GUARD_H2D) + G(GUARD_CACHED) + G(GUARD_D2D)
    ruled = rig().feed(b"step 1\n" + at_starts + b"step 2\n")
    assert (ruled.stamps, ruled.reports, ruled.out) == (expected, counted, b"step 1\nstep 2\n")
    other = rig().feed(b"file transfer: done\n" + at_starts + b"step 2\n")
    assert (other.stamps, other.reports, other.out) == (expected, counted, b"file transfer: done\nstep 2\n")
    assert rig().feed(GUARD_H2D + b"50% |#####" + GUARD_CACHED + GUARD_D2D).stamps == expected


def test_a_stamp_is_the_latest_moment_of_its_time_of_day():
    """The header has the local time of day; the relay reads a line at most a
    batch after it was written, so the day is today's, or yesterday's for a
    time still ahead (a line of 23:59:59 read just after midnight)."""
    now = time.time()
    lt = time.localtime(now)
    assert _relay.minute_start(b"%02d:%02d:" % (lt.tm_hour, lt.tm_min)) == pytest.approx(now - lt.tm_sec - now % 1,
                                                                                          abs=1e-3)
    ahead = time.localtime(now + 3600)
    start = _relay.minute_start(b"%02d:%02d:" % (ahead.tm_hour, ahead.tm_min))
    assert now - 86400 - 60 < start < now - 86400 + 3600
