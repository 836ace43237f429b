"""A progress bar on stderr must not break transfer counting.

tqdm and hand-made bars redraw one line with ``\\r`` and write its newline
only at the end. jaxlib writes each guard line with one ``write()``, so one
that comes while the bar's line is unfinished lands right after the bar's
bytes, in the middle of a "line". The relay must still find, count and hide
it, and give the user exactly the bytes of a run without jaxtop.

Both log header forms are covered: abseil's (jaxlib 0.7 and later) and
TSL's (older jaxlib).
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from conftest import PY, TARGETS, jaxtop_cmd
from jaxtop.wire import protocol
from jaxtop.probes import transfer_guard as tg
from jaxtop.probes._relay import Relay

TOKEN = b"feedbeef"
ABSEIL = (
    b"W1203 19:57:01.063419   17029 guard_lib.cc:125] host-to-device transfer: "
    b"aval=ShapedArray(float32[8,4]), dst_sharding=SingleDeviceSharding(device=CpuDevice(id=0), memory_kind=device)\n"
)
ABSEIL_CACHED = b"W1203 19:57:01.063773   17029 guard_lib.cc:125] host-to-device transfer: \n"
TSL = (
    b"2026-12-03 19:09:21.852989: W external/xla/xla/python/transfer_guard_lib.cc:108] host-to-device transfer: "
    b"aval=ShapedArray(float32[8,4]), dst_sharding=SingleDeviceSharding(device=CpuDevice(id=0))\n"
)
TSL_TID = (
    b"2026-12-03 19:09:21.852990: W   31337 external/xla/xla/python/transfer_guard_lib.cc:140] "
    b"device-to-host transfer: shape=(2,3), dtype=F32, device=cuda:0\n"
)
GUARDS = [ABSEIL, ABSEIL_CACHED, TSL, TSL_TID]
GUARD_TEXT = re.compile(rb"\] (?:host-to-device|device-to-device|device-to-host) transfer:")
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "guard_lines"


def message(line: bytes) -> bytes:
    return line.split(b"] ", 1)[1].rstrip(b"\n")


def relay_run(chunks: list[bytes], passed=()) -> tuple[bytes, dict[bytes, int]]:
    """Feed these reads to a Relay, then EOF: (bytes forwarded, counts)."""
    relay = Relay(None, None, TOKEN, set(passed))
    relay.report_fd = -1  # keep reports in report_backlog
    relay.flush_out = lambda: None
    relay.flush_reports = lambda: None
    for chunk in chunks:
        relay.feed(chunk)
    relay.finish()
    counts: dict[bytes, int] = {}
    for report in bytes(relay.report_backlog).split(b"\n")[:-1]:
        if not report.startswith(b"G "):
            continue  # U: guard-like text of an unknown form (tested in test_jax_versions)
        _, n, msg = report.split(b" ", 2)
        counts[msg] = counts.get(msg, 0) + int(n)
    return bytes(relay.out), counts


# -- the relay, pure ------------------------------------------------------------------


def bar_stream(n: int, guards: list[bytes], newline_at_end: bool) -> tuple[list[bytes], bytes, dict[bytes, int]]:
    """A bar redrawn n times with guard lines between the redraws, as writes."""
    writes, user, counts = [], b"", {}
    for i in range(n):
        frame = b"\r%d/%d [%s]" % (i, n, b"#" * (i * 10 // n)) if i % 2 else b"\r%d/%d" % (i, n)
        writes.append(frame)
        user += frame
        for line in guards[i % len(guards) :][:2]:
            writes.append(line)
            counts[message(line)] = counts.get(message(line), 0) + 1
    if newline_at_end:
        writes.append(b"\n")
        user += b"\n"
    return writes, user, counts


@pytest.mark.parametrize("newline_at_end", [True, False])
@pytest.mark.parametrize("guards", [[ABSEIL, ABSEIL_CACHED], [TSL, TSL_TID], GUARDS], ids=["abseil", "tsl", "both"])
def test_guard_lines_between_progress_bar_redraws(guards, newline_at_end):
    writes, user, counts = bar_stream(40, guards, newline_at_end)
    data = b"".join(writes)
    # One read per write, one read for all, and reads cut at random places
    # (inside guard lines, inside headers, inside the bar).
    rng = random.Random(3)
    cut_sets = [None, [], sorted(rng.sample(range(1, len(data)), 60)), list(range(1, len(data), 7))]
    for cuts in cut_sets:
        if cuts is None:
            chunks = writes
        else:
            chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
        out, got = relay_run(chunks)
        assert out == user, cuts
        assert got == counts, cuts


def test_guard_line_while_a_partial_line_is_pending_is_not_glued_to_it():
    # The first version judged everything up to the next newline after a
    # forwarded partial line as the user's text.
    out, got = relay_run([b"Loading", ABSEIL, b"... done\n"])
    assert out == b"Loading... done\n"
    assert got == {message(ABSEIL): 1}


def test_read_boundary_inside_a_guard_line_after_a_partial_line():
    line = TSL
    for cut in range(1, len(line)):
        out, got = relay_run([b"\r 7/9" + line[:cut], line[cut:] + b"\r 8/9"])
        assert out == b"\r 7/9\r 8/9", cut
        assert got == {message(line): 1}, cut


def test_bar_without_a_trailing_newline_reaches_the_user_at_exit():
    out, got = relay_run([b"\r1/3", ABSEIL, b"\r2/3", TSL, b"\r3/3"])
    assert out == b"\r1/3\r2/3\r3/3"
    assert sum(got.values()) == 2


def test_user_seen_directions_stay_where_they_were_written():
    # The user's own guard at log for h2d: those lines stay in place, glued
    # to the bar as in a run without jaxtop; d2h is jaxtop's and goes.
    out, got = relay_run([b"\r1/2", ABSEIL, b"\r2/2", TSL_TID, b"\n"], passed={"h2d"})
    assert out == b"\r1/2" + ABSEIL + b"\r2/2\n"
    assert got == {message(ABSEIL): 1, message(TSL_TID): 1}


# -- the parser, pure --------------------------------------------------------------------


@pytest.mark.parametrize("line", GUARDS, ids=["abseil", "abseil-cached", "tsl", "tsl-thread-id"])
def test_parser_takes_both_header_forms_whole_glued_or_bare(line):
    text = line.decode()
    bare = message(line).decode()
    expected = tg.parse_line(bare)
    assert expected is not None
    assert tg.parse_line(text) == expected
    assert tg.parse_line("\r 3/30 [###" + text) == expected  # glued to a progress bar
    assert tg.guard_message(text) == bare
    assert tg.guard_message("\r 3/30 [###" + text) == bare


def test_parser_two_header_forms_same_result():
    payload = "host-to-device transfer: aval=ShapedArray(bfloat16[4,4]), dst_sharding=x"
    lines = [
        "W1203 19:57:01.063419   17029 guard_lib.cc:125] " + payload,
        "2026-12-03 19:09:21.852989: W external/xla/xla/python/transfer_guard_lib.cc:108] " + payload,
        "2026-12-03 19:09:21.852989: W 1234567 transfer_guard_lib.cc:108] " + payload,
    ]
    for line in lines:
        assert tg.parse_line(line) == tg.GuardLine("h2d", "bfloat16[4,4]", 32)
        assert tg.guard_message("epoch 1/3 " + line + "\n") == payload


@pytest.mark.parametrize(
    "line",
    [
        "user said: host-to-device transfer: aval=ShapedArray(float32[2])",  # no header: the program's text
        "2026-12-03 19:09:21.852989: W transfer_guard_lib.cc:108] host-to-device transfers are fine",
        "2026-12-03 19:09:21: W transfer_guard_lib.cc:108] host-to-device transfer: no fraction",
        "W1203 19:57:01.063419 guard_lib.cc:125] host-to-device transfer: no thread id",
    ],
)
def test_parser_rejects_guard_text_without_a_real_header(line):
    assert tg.parse_line(line) is None
    assert tg.guard_message(line) is None


def test_cached_parser_memoizes_whole_lines_by_message():
    parser = tg.CachedParser(capacity=8)
    lines = [
        f"2026-12-03 19:09:{i % 60:02d}.{i:06d}: W external/xla/transfer_guard_lib.cc:108] host-to-device transfer: "
        for i in range(50)
    ]
    assert {parser(line) for line in lines} == {tg.GuardLine("h2d", None, None)}
    # Every line differs in its time stamp but not in its message; a memo
    # keyed by the whole line would have been cleared at capacity 8.
    assert parser._memo == {"host-to-device transfer: ": tg.GuardLine("h2d", None, None)}
    assert parser("user said: host-to-device transfer: x") is None


def test_relay_and_parser_agree_on_what_is_a_guard_line():
    bar = b"\r 5/9 [##"
    pool = [(b"", line) for line in GUARDS] + [(bar, line) for line in GUARDS] + [
        (b"", b"W1203 19:57:01.063419   17029 cpu_client.cc:1] not a guard line\n"),
        (b"", b"user said: host-to-device transfer: no header\n"),
        (b"", b"2026-12-03 19:09:21.852989: I external/xla/service.cc:1] XLA service initialized\n"),
        (bar, b"2026-12-03 19:09:21: W transfer_guard_lib.cc:108] host-to-device transfer: no fraction\n"),
    ]
    for before, line in pool:
        out, got = relay_run([before + line])
        found = tg.guard_message((before + line).decode())
        if found is None:
            assert (out, got) == (before + line, {}), line
        else:
            assert (out, got) == (before, {found.encode(): 1}), line


def _fixtures() -> list[Path]:
    return sorted(FIXTURES.glob("*.stderr")) if FIXTURES.is_dir() else []


@pytest.mark.skipif(not _fixtures(), reason="no recorded guard lines of other jax versions")
@pytest.mark.parametrize("path", _fixtures(), ids=lambda p: p.stem)
def test_recorded_lines_of_each_jax_version(path):
    # Real stderr of one jax version with the guard at log (both header
    # forms across versions); the .json next to it says how many guard lines
    # of each direction it holds.
    expected = json.loads(path.with_suffix(".json").read_text())["expected"]
    data = path.read_bytes()
    parsed = [tg.parse_line(line) for line in data.decode("utf-8", "replace").splitlines()]
    by_parser = {d: sum(1 for p in parsed if p is not None and p.direction == d) for d in expected}
    assert by_parser == expected
    # The relay: whole, and with a progress bar redrawn before every line.
    keep = b"".join(line for line in data.splitlines(keepends=True) if not GUARD_TEXT.search(line))
    glued, user = b"", b""
    for i, line in enumerate(data.splitlines(keepends=True)):
        frame = b"\r%d/9" % (i % 10)
        glued += frame + line
        user += frame + (b"" if GUARD_TEXT.search(line) else line)
    rng = random.Random(len(data))
    for stream, want in ((data, keep), (glued, user)):
        cuts = sorted(rng.sample(range(1, len(stream)), 200))
        chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]
        out, got = relay_run(chunks)
        assert out == want
        by_relay = {d: 0 for d in expected}
        for msg, n in got.items():
            by_relay[tg.parse_line(msg.decode()).direction] += n
        assert by_relay == expected


# -- the capture with its real relay process, no JAX ----------------------------------------

CAPTURE_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from jaxtop.probes.stderr_capture import StderrCapture

    got = []
    cap = StderrCapture(lambda message, n: got.append([message, n]))
    cap.start()
    writes = json.loads(sys.argv[1])
    for w in writes:
        os.write(2, w.encode("latin-1"))
    assert cap.sync(10)
    cap.stop()
    print(json.dumps(got))
    """
)


def test_capture_counts_and_hides_glued_lines_of_both_forms():
    writes, user, counts = bar_stream(25, GUARDS, newline_at_end=False)
    res = subprocess.run(
        [PY, "-c", CAPTURE_SCRIPT, json.dumps([w.decode("latin-1") for w in writes])],
        capture_output=True, timeout=60,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stderr == user
    got: dict[bytes, int] = {}
    for msg, n in json.loads(res.stdout):
        got[msg.encode()] = got.get(msg.encode(), 0) + n
    assert got == counts


# -- real JAX programs under `jaxtop run` ----------------------------------------------------


def _final_h2d(log: Path) -> int:
    with open(log, "rb") as f:
        samples = [r for r in protocol.iter_records(f) if r["type"] == "sample"]
    assert samples and samples[-1].get("final") is True
    return samples[-1]["transfers"]["h2d"]["count_total"]


def _check_exact(child_env, tmp_path, extra_env):
    script = TARGETS / "progress_bar.py"
    env = dict(child_env, **extra_env)
    logged = subprocess.run([PY, str(script)], env=dict(env, JAX_TRANSFER_GUARD="log"),
                            capture_output=True, timeout=60, cwd=TARGETS)
    assert logged.returncode == 0, logged.stderr[-2000:]
    expected = len(GUARD_TEXT.findall(logged.stderr))
    assert expected >= 40
    # In the guarded run the guard lines were glued to the bar: the case at
    # hand. The header is abseil's (W1203 ...) from jaxlib 0.7, TSL's
    # (2026-12-03 ...: W) before: a date glued to a bar's last digits.
    assert re.search(rb"\d/\d+(?: \[[# ]*\])?(?:W\d{4} |\d{4}-\d\d-\d\d \d\d:)", logged.stderr), logged.stderr[:500]
    plain = subprocess.run([PY, str(script)], env=env, capture_output=True, timeout=60, cwd=TARGETS)
    assert plain.returncode == 0
    log = tmp_path / "run.jsonl"
    run = jaxtop_cmd("run", "--log", log, script.name, env=env, timeout=60, cwd=TARGETS)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stderr == plain.stderr
    assert run.stdout == plain.stdout
    assert _final_h2d(log) == expected


@pytest.mark.slow
@pytest.mark.parametrize("newline", ["", "1"], ids=["newline", "no-newline"])
def test_hand_drawn_bar_under_jaxtop_run(child_env, tmp_path, newline):
    _check_exact(child_env, tmp_path, {"PROGRESS_N": "30", "PROGRESS_NO_NEWLINE": newline})


@pytest.mark.slow
def test_tqdm_bar_under_jaxtop_run(child_env, tmp_path):
    pytest.importorskip("tqdm")
    _check_exact(child_env, tmp_path, {"PROGRESS_N": "40", "PROGRESS_TQDM": "1"})
