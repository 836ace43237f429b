"""``$JAXTOP_MAX_PAUSE_MS``: the live-array scan's ``jax.live_arrays()`` is
one call into jaxlib that holds the interpreter throughout (~0.2 us an
array), the one pause of jaxtop's that no piece size cuts. A program that
must never wait longer sets the variable: once a scan paused it longer, the
agent takes no more, and the stream, the screen and ``snapshot`` say so with
the figure, showing the last scan's totals.

Pure (the variable read, the snapshot's line), then a real program under
``jaxtop run`` recording its stream.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import PY, TARGETS
from jaxtop.agent.devices import MAX_PAUSE_ENV, max_pause_from_env


@pytest.mark.parametrize("text, seconds", [("", None), ("1", 0.001), (" 0.25 ", 0.00025), ("50", 0.05)])
def test_the_limit_is_read_in_milliseconds(monkeypatch, text, seconds):
    monkeypatch.setenv(MAX_PAUSE_ENV, text)
    assert max_pause_from_env() == (seconds, None)


@pytest.mark.parametrize("text", ["abc", "0", "-1", "nan", "inf", "1e9", "1ms"])
def test_a_limit_that_is_no_positive_number_is_ignored_with_the_reason(monkeypatch, text):
    monkeypatch.setenv(MAX_PAUSE_ENV, text)
    seconds, error = max_pause_from_env()
    assert seconds is None and error is not None and MAX_PAUSE_ENV in error and "ignored" in error


def _live(log) -> list[tuple]:
    """(scanned_t, held) of device 0's live arrays, sample by sample."""
    out = []
    with open(log, "rb") as f:
        for raw in f:
            record = json.loads(raw)
            for dev in record.get("devices") or ():
                if dev.get("id") == 0 and dev.get("live_arrays"):
                    out.append((dev["live_arrays"].get("scanned_t"), dev["live_arrays"].get("held")))
    return out


def _run(tmp_path, env, name: str) -> list[tuple]:
    log = tmp_path / f"{name}.jsonl"
    proc = subprocess.run([PY, "-m", "jaxtop", "run", "--log", str(log), str(TARGETS / "plain_loop.py"),
                           "--steps", "350", "--sleep", "0.01"],
                          cwd=TARGETS, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _live(log)


def test_past_the_limit_the_scans_stop_and_the_stream_says_why(child_env, tmp_path):
    # Without the limit the scans go on (else the test below tests nothing).
    free = _run(tmp_path, child_env, "free")
    assert len({t for t, _ in free if t is not None}) >= 3 and not any(held for _, held in free)
    # 0.1 us: the first scan is over it, whatever the machine.
    held = _run(tmp_path, dict(child_env, **{MAX_PAUSE_ENV: "0.0001"}), "held")
    reasons = [h for _, h in held if h]
    assert reasons, held
    assert "jax.live_arrays() held the program" in reasons[-1] and f"${MAX_PAUSE_ENV}=0.0001" in reasons[-1]
    # After the scan that went over, no other runs until the final one (an asked scan).
    times = [t for t, h in held if h]
    assert len(set(times[:-1])) == 1, times


def test_the_screen_and_snapshot_say_the_scans_stopped_and_since_when():
    """The last scan's totals, its age, and why no scan came since: in
    ``snapshot`` and on the Memory panel."""
    import io

    from rich.console import Console

    from jaxtop.dashboard.snapshot_text import snapshot_text
    from jaxtop.widgets.memory_panels import MemoryPanel
    from test_transfer_sites_dashboard import model_of, stream

    why = "no scans since: jax.live_arrays() held the program 9.6 ms at 50,000 arrays, over $JAXTOP_MAX_PAUSE_MS=1"
    records = stream()
    scanned = records[10]["t"]
    for rec in records[10:]:
        rec["devices"][0]["live_arrays"].update(scanned_t=scanned, held=why)
    snap = model_of(records).snapshot(now=0.0)
    age = records[-1]["t"] - scanned
    assert f"(scanned {age:.1f} s ago; {why})" in snapshot_text(snap)
    console = Console(width=200, record=True, file=io.StringIO(), color_system=None)
    console.print(MemoryPanel().draw(snap, 200, 12))
    assert why in console.export_text()
    for rec in records[10:]:  # an agent that scans: nothing said
        del rec["devices"][0]["live_arrays"]["held"]
    assert "no scans since" not in snapshot_text(model_of(records).snapshot(now=0.0))
