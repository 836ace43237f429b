"""Pure layer: the stderr relay (probes/_relay.py), driven through its Relay class.

The relay stands between the user's program and their terminal, so the main
promise is byte-exactness: everything that is not a guard line jaxtop caused
comes out unchanged and in order. One test runs it as the real child process.
"""

from __future__ import annotations

import os
import random
import threading

from jaxtop.probes import _relay
from jaxtop.probes._relay import Relay
from relay_rig import (G, GUARD_CACHED, GUARD_D2D, GUARD_H2D, GUARD_OLD, GUARD_TSL, GUARD_TSL_TID, OTHER_ERROR,
                       OTHER_WARNING, TOKEN, marker, reported_runs)


# -- plain bytes -------------------------------------------------------------------


def test_plain_lines_pass_through_unchanged(rig):
    r = rig().feed(b"hello\n", b"world\nand more\n")
    assert r.out == b"hello\nworld\nand more\n"
    assert r.reports == b""


def test_partial_line_is_forwarded_at_once_and_completed_later(rig):
    r = rig()
    r.feed(b"Loading model")
    assert r.out == b"Loading model"  # a prompt without newline is not held
    r.feed(b"... done\n")
    assert r.out == b"Loading model... done\n"


def test_binary_and_invalid_utf8_bytes_are_byte_identical(rig):
    blob = bytes(range(256)).replace(b"\n", b"") + b"\xff\xfe\xc3(\x80\n" + b"\x00\x00tail"
    r = rig().feed(blob)
    r.relay.finish()
    assert r.out == blob
    assert r.reports == b""


def test_carriage_return_progress_bars(rig):
    r = rig()
    frames = [b"\r  %3d%%|%s|" % (p, b"#" * (p // 10)) for p in range(0, 101, 10)]
    for f in frames:
        r.feed(f)
    # Each frame reaches the terminal as soon as it is written, not at the newline.
    assert r.out == b"".join(frames)
    r.feed(b"\n")
    assert r.out == b"".join(frames) + b"\n"


def test_progress_bar_ending_in_digits_waits_for_the_next_write(rig):
    # "30" could be the year of an older jaxlib's log header (2026-12-03 ...):
    # it waits for the next bytes, or for the relay's timer (release).
    r = rig().feed(b"\r 3/30")
    assert r.out == b"\r 3/"
    r.feed(b"\r 4/30")
    assert r.out == b"\r 3/30\r 4/"
    r.relay.release()
    assert r.out == b"\r 3/30\r 4/30"


def test_a_long_line_without_newline_is_fast(rig):
    # A bar redrawn with \r for a long time never writes a newline: only the
    # end of each read may be held, and only that is scanned for a header.
    import time

    r = rig()
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        r.relay.out_fd = devnull
        frames = b"".join(b"\r%d/1000000 [%s]" % (i, b"#" * (i % 30)) for i in range(40000))
        t0 = time.perf_counter()
        for i in range(0, len(frames), 65536):
            r.feed(frames[i : i + 65536])
        elapsed = time.perf_counter() - t0
    finally:
        os.close(devnull)
    assert elapsed < 0.5, elapsed


def test_progress_bar_starting_like_a_severity_letter_still_flows(rig):
    r = rig().feed(b"Epoch 1  10%\r", b"Working...\r")
    assert r.out == b"Epoch 1  10%\rWorking...\r"


# -- guard lines --------------------------------------------------------------------


def test_guard_lines_are_reported_and_hidden(rig):
    r = rig().feed(b"before\n" + GUARD_H2D + b"middle\n" + GUARD_CACHED + GUARD_D2D + b"after\n")
    assert r.out == b"before\nmiddle\nafter\n"
    assert r.reports == G(GUARD_H2D) + G(GUARD_CACHED) + G(GUARD_D2D)


def test_guard_lines_of_passed_directions_still_reach_the_user(rig):
    r = rig(passed={"h2d"}).feed(GUARD_H2D, GUARD_D2D, GUARD_CACHED)
    assert r.out == GUARD_H2D + GUARD_CACHED
    assert r.reports == G(GUARD_H2D) + G(GUARD_D2D) + G(GUARD_CACHED)


def test_old_jaxlib_prefix_is_recognised(rig):
    r = rig().feed(b"x\n" + GUARD_OLD)
    assert r.out == b"x\n"
    assert r.reports == G(GUARD_OLD)


def test_tsl_header_of_older_jaxlib_is_recognised(rig):
    r = rig().feed(b"x\n" + GUARD_TSL + b"y\n" + GUARD_TSL_TID)
    assert r.out == b"x\ny\n"
    assert r.reports == G(GUARD_TSL) + G(GUARD_TSL_TID)


def test_guard_message_without_a_header_is_user_text(rig):
    line = b"user printed: host-to-device transfer: aval=ShapedArray(float32[2])\n"
    r = rig().feed(line, b"host-to-device transfer: at a line start\n")
    assert r.out == line + b"host-to-device transfer: at a line start\n"
    assert r.reports == b""


def test_guard_line_after_a_partial_line_is_found(rig):
    # jaxlib writes each log line with one write(): one that comes while the
    # program's line is unfinished (a progress bar) starts mid-line.
    r = rig().feed(b"\r 3/30 [###", GUARD_H2D, b"   ]", GUARD_TSL + b"\r 4/30")
    assert r.out == b"\r 3/30 [###   ]\r 4/"  # "30" may still become a TSL date
    assert r.reports == G(GUARD_H2D) + G(GUARD_TSL)
    r.relay.finish()
    assert r.out == b"\r 3/30 [###   ]\r 4/30"


def test_guard_line_split_byte_by_byte_is_still_caught(rig):
    r = rig()
    stream = b"a\n" + GUARD_H2D + b"b\n"
    for i in range(len(stream)):
        r.feed(stream[i : i + 1])
    assert r.out == b"a\nb\n"
    assert r.reports == G(GUARD_H2D)


# What a program's stderr is made of, as separate write()s: the program's
# own (lines, partial lines, progress bars) and jaxlib's log lines, each one
# write. None of the program's writes can complete a log header together
# with the next one, so the expected bytes are unambiguous.
USER_WRITES = [
    b"hello\n", b"partial ", b"\r 45%|####5     | 45/100 [00:03<00:04]", b"\r12/30", b"2026", b"1",
    b"W", b"E1202 18:3", b"Epoch 3 \r 50%\n", b"\n", b"\r\n", b"\xff\xfe", b"]", b" x ", b"W1202 ",
    b"user printed: host-to-device transfer: bare\n", b"Warning: not abseil\n",
]
LOG_WRITES = [
    GUARD_H2D, GUARD_CACHED, GUARD_D2D, GUARD_OLD, GUARD_TSL, GUARD_TSL_TID, OTHER_WARNING, OTHER_ERROR,
    b"I1202 18:34:31.000003    2146 service.cc:1] XLA service initialized\n",
    b"F1202 18:34:31.5 7 check.cc:9] Check failed: device-to-host transfer: no\n",
    b"W1202 18:34:31.5\t7\ta.cc:1] host-to-device transfer: tabs\r\n",
    b"2026-12-03 19:09:21.1: I b.cc:3] info of an older jaxlib\n",
]


def _direction(line: bytes) -> str | None:
    for text, key in _relay.DIRECTION_KEYS.items():
        if b"] " + text + b" transfer:" in line:
            return key
    return None


def _severity(line: bytes) -> bytes:
    return line[:1] if line[:1].isalpha() else line.split(b": ", 1)[1][:1]


def _random_stream(rng, n):
    """Writes, markers among them, and what the relay must make of them."""
    passed, silenced = set(), b""
    stream, expected, messages, syncs = [], bytearray(), {}, 0
    for _ in range(n):
        roll = rng.random()
        if roll < 0.03:
            passed = set(rng.sample(["h2d", "d2d", "d2h"], rng.randint(0, 3)))
            silenced = rng.choice([b"", b"IW", b"W", b"IWEF"])
            stream.append(marker("show", ",".join(sorted(passed)) + "|" + silenced.decode()))
        elif roll < 0.08:
            syncs += 1
            stream.append(marker("sync", str(syncs)))
        elif roll < 0.5:
            line = rng.choice(LOG_WRITES)
            stream.append(line)
            key = _direction(line)
            if key is not None:
                message = line.split(b"] ", 1)[1].rstrip(b"\n")
                messages[message] = messages.get(message, 0) + 1
                if key in passed:
                    expected += line
            elif _severity(line) not in silenced:
                expected += line
        else:
            write = rng.choice(USER_WRITES)
            stream.append(write)
            expected += write
    return b"".join(stream), bytes(expected), messages, syncs


def _run(data, cuts):
    """Feed data cut at these offsets (read boundaries), then EOF."""
    relay = Relay(None, None, TOKEN, set())
    relay.report_fd = -1  # collect reports in report_backlog without writing
    relay.flush_out = lambda: None
    relay.flush_reports = lambda: None
    start = 0
    for cut in [*cuts, len(data)]:
        relay.feed(data[start:cut])
        start = cut
    relay.finish()
    counts, syncs, stamps = {}, [], 0
    for report in bytes(relay.report_backlog).split(b"\n")[:-1]:
        if report.startswith(b"T "):
            stamps += len(reported_runs(report[2:]))
            continue
        kind, n, *rest = report.split(b" ", 2)
        if kind == b"G":
            counts[rest[0]] = counts.get(rest[0], 0) + int(n)
        else:
            syncs.append(int(n))
    # One stamp per guard line counted, whatever the cuts.
    assert stamps == sum(counts.values())
    return bytes(relay.out), counts, syncs


def test_random_writes_any_read_boundaries_exact_bytes_and_counts():
    # Log lines land anywhere between the program's writes (mid-line too),
    # markers change what the user sees, and reads end anywhere (inside a log
    # line, inside a header, inside a marker): the user's bytes and the counts
    # must come out the same as the writes say, whatever the cuts.
    rng = random.Random(7)
    for trial in range(150):
        data, expected, messages, syncs = _random_stream(rng, rng.randint(1, 80))
        if trial % 3 == 0:
            cuts = []  # one read
        elif trial % 3 == 1:
            cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 40))))
        else:
            cuts = list(range(1, len(data)))  # byte by byte
        out, counts, acked = _run(data, cuts)
        assert out == expected, (trial, data)
        assert counts == messages, trial
        assert acked == list(range(1, syncs + 1)), trial


# -- sync and show markers ------------------------------------------------------------


def test_sync_marker_between_lines_is_stripped_and_acknowledged(rig):
    r = rig().feed(b"one\n" + marker("sync", "1") + b"two\n")
    assert r.out == b"one\ntwo\n"
    assert r.reports == b"S 1\n"


def test_sync_marker_mid_line_is_stripped(rig):
    r = rig().feed(b"abc" + marker("sync", "7") + b"def\n")
    assert r.out == b"abcdef\n"
    assert r.reports == b"S 7\n"


def test_sync_marker_inside_a_partial_line(rig):
    r = rig().feed(b"abc" + marker("sync", "8"))
    assert r.out == b"abc"
    assert r.reports == b"S 8\n"


def test_sync_marker_split_across_two_feeds(rig):
    m = marker("sync", "5")
    for cut in range(1, len(m)):
        r = rig().feed(b"abc" + m[:cut])
        assert b"\x00" not in r.out, cut  # the partial marker is held back
        r.feed(m[cut:] + b"def\n")
        assert r.out == b"abcdef\n", cut
        assert r.reports == b"S 5\n", cut


def test_sync_after_a_guard_line_is_acknowledged_after_its_report(rig):
    # The agent's sync() relies on this order: "S n" means every guard line
    # written before the marker has been reported.
    r = rig().feed(GUARD_H2D + marker("sync", "3") + GUARD_D2D + marker("sync", "4"))
    assert r.reports == G(GUARD_H2D) + b"S 3\n" + G(GUARD_D2D) + b"S 4\n"
    assert r.out == b""


def test_marker_with_another_token_is_not_ours(rig):
    foreign = marker("sync", "9", token=b"deadbeef") + b"\n"
    r = rig().feed(foreign)
    assert r.out == foreign
    assert r.reports == b""


def test_show_marker_sets_passed_and_silenced(rig):
    r = rig()
    r.feed(marker("show", "h2d|IW"))
    assert r.relay.passed == {"h2d"}
    assert r.relay.silenced == b"IW"
    r.feed(GUARD_H2D, GUARD_D2D, OTHER_WARNING, OTHER_ERROR, b"Warning: not abseil\n")
    assert r.out == GUARD_H2D + OTHER_ERROR + b"Warning: not abseil\n"
    assert r.reports == G(GUARD_H2D) + G(GUARD_D2D)

    r.feed(marker("show", "d2d,d2h|"))
    assert r.relay.passed == {"d2d", "d2h"}
    assert r.relay.silenced == b""
    r.feed(GUARD_H2D, GUARD_D2D, OTHER_WARNING)
    assert r.out.endswith(GUARD_D2D + OTHER_WARNING)
    assert r.out.count(GUARD_H2D) == 1


def test_abseil_warnings_are_kept_unless_silenced(rig):
    r = rig().feed(OTHER_WARNING, OTHER_ERROR)
    assert r.out == OTHER_WARNING + OTHER_ERROR


def test_info_lines_dropped_when_info_is_silenced(rig):
    info = b"I1202 18:34:31.000003    2146 service.cc:1] XLA service initialized\n"
    r = rig().feed(marker("show", "|IW"), info, OTHER_WARNING, OTHER_ERROR)
    assert r.out == OTHER_ERROR


# -- holding, release, finish --------------------------------------------------------


def test_possible_header_is_held_then_released(rig):
    r = rig()
    r.feed(b"W1202 18:34")
    assert r.out == b""  # it may become a guard line
    assert r.relay.holding()
    r.relay.release()  # the relay's timer gave up waiting
    assert r.out == b"W1202 18:34"
    assert not r.relay.holding()
    # The rest of that line belongs to what was already forwarded.
    r.feed(b":30.1 1 guard_lib.cc:1] host-to-device transfer: \n")
    assert r.out == b"W1202 18:34:30.1 1 guard_lib.cc:1] host-to-device transfer: \n"
    # Not counted, but not hidden from the agent either: a guard message it
    # could not take as one is reported as unrecognised (counts become n/a).
    assert r.reports == b"U :30.1 1 guard_lib.cc:1] host-to-device transfer: \n"
    r.feed(GUARD_H2D)  # the next line is judged afresh
    assert r.reports.endswith(G(GUARD_H2D))


def test_release_keeps_a_partial_marker(rig):
    r = rig().feed(b"abc" + marker("sync", "9")[:10])
    assert r.out == b"abc"
    r.relay.release()
    assert r.out == b"abc"
    r.feed(marker("sync", "9")[10:] + b"\n")
    assert r.out == b"abc\n"
    assert r.reports == b"S 9\n"


def test_finish_flushes_a_held_partial_line(rig):
    r = rig().feed(b"ok\n", b"E1202 18:3")
    assert r.out == b"ok\n"
    r.relay.finish()
    assert r.out == b"ok\nE1202 18:3"


def test_finish_reports_and_hides_an_unterminated_guard_line(rig):
    r = rig().feed(GUARD_H2D.rstrip(b"\n"))
    assert r.out == b""
    r.relay.finish()
    assert r.out == b""
    assert r.reports == G(GUARD_H2D)


def test_finish_with_nothing_held_writes_nothing(rig):
    r = rig().feed(b"done\n")
    r.relay.finish()
    assert r.out == b"done\n"


# -- broken ends --------------------------------------------------------------------


def test_without_a_report_fd_guard_lines_are_still_hidden(rig):
    r = rig()
    r.relay.report_fd = None
    r.feed(b"a\n" + GUARD_H2D + marker("sync", "1") + b"b\n")
    assert r.out == b"a\nb\n"


def test_agent_gone_does_not_stop_forwarding(rig):
    r = rig()
    os.close(r.rep_r)
    r.feed(GUARD_H2D, b"still here\n")
    assert r.relay.report_fd is None
    assert r.out == b"still here\n"


def test_terminal_gone_keeps_draining(rig):
    r = rig()
    os.close(r.out_r)
    r.feed(b"x" * 10 + b"\n", GUARD_H2D, b"y\n")  # EPIPE, not an exception
    assert r.relay.out_broken
    # "B" once, so the capture gives the program its stderr back.
    assert r.reports == b"B\n" + G(GUARD_H2D)


def test_a_non_blocking_terminal_is_waited_for_not_dropped(rig):
    r = rig()
    os.set_blocking(r.out_w, False)  # as another process sharing the tty may do
    big = b"z" * (1 << 20) + b"\n"
    reader = threading.Thread(target=lambda: [r.out for _ in iter(lambda: len(r._out) >= len(big), True)])
    reader.start()
    r.feed(big)
    reader.join(timeout=20)
    assert not r.relay.out_broken
    assert r._out == big


def test_many_short_lines_are_fast(rig):
    # The relay is in the path of every byte of stderr: a flood of short
    # lines must not throttle the user's program.
    import time

    r = rig()
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        r.relay.out_fd = devnull
        chunk = b"ab\n" * (65536 // 3)
        t0 = time.perf_counter()
        r.feed(chunk, chunk)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(devnull)
    assert elapsed < 1.0, elapsed
