"""The advisor on recordings made on a TPU v5e (tests/fixtures/tpu/advice/,
`tools/tpu/run.sh chip --steps advice`, 7 Dec): what the CPU cannot show.

Run-ahead is memory in use beyond the live arrays, which only an
accelerator's allocator reports: on the chip the demo's variant that lets
steps queue ahead gets the advice, the one that blocks every few steps gets
none. The placement variant that feeds new NumPy data each call gets
placement advice saying so, its fixed twin none. The loop that misses six
strategies gets each at its marked line, its clean twin none. Each is judged
as the chip's run judged it: ``jaxtop advise --json --window 12``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from conftest import TARGETS, jaxtop_cmd
from test_advice_programs import SIX, marked_lines

ADVICE = Path(__file__).resolve().parent / "fixtures" / "tpu" / "advice"
#: The window the chip's run judged each recording over (ADVICE_WINDOW_S).
WINDOW_S = 12


def _report(name: str, child_env) -> dict[str, Any]:
    done = jaxtop_cmd("advise", ADVICE / f"{name}.jsonl.gz", "--json", "--window", WINDOW_S, env=child_env, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    (process,) = json.loads(done.stdout)["processes"]
    return process


def _of(report: dict[str, Any], strategy: str) -> list[dict[str, Any]]:
    return [a for a in report["advice"] if a["strategy"] == strategy]


def _judged(report: dict[str, Any], strategy: str) -> bool:
    return not any(n["strategy"] == strategy for n in report["not_judged"])


def _at(found: list[dict[str, Any]], script: str, line: int) -> bool:
    return any(a["file"] and os.path.basename(a["file"]) == script and a["line"] == line for a in found)


def test_queued_steps_on_the_chip_are_runahead_and_bounded_ones_are_not(child_env):
    missed = _report("runahead-off", child_env)
    (a,) = _of(missed, "runahead")
    assert "beyond the live arrays" in a["evidence"] and "calls of `train_step`" in a["evidence"], a
    assert os.path.basename(a["file"]) == "advice_demo.py"
    fixed = _report("runahead-on", child_env)
    assert not _of(fixed, "runahead") and _judged(fixed, "runahead"), fixed


def test_new_data_each_call_on_the_chip_is_put_ahead_not_once(child_env):
    missed = _report("placement-off", child_env)
    (a,) = _of(missed, "placement")
    assert "new data at each call read" in a["evidence"] and "one step ahead" in a["fix"], a
    assert "once, before the loop" not in a["fix"]
    fixed = _report("placement-on", child_env)
    assert not _of(fixed, "placement") and _judged(fixed, "placement"), fixed


@pytest.mark.parametrize("strategy", SIX)
def test_the_loop_that_misses_six_on_the_chip(strategy, child_env):
    marks = marked_lines(TARGETS / "advice_miss.py", "MISS")
    missed = _report("miss", child_env)
    for line in marks[strategy]:
        assert _at(_of(missed, strategy), "advice_miss.py", line), (strategy, line, missed["advice"])
    clean = _report("clean", child_env)
    assert not _of(clean, strategy), clean["advice"]
