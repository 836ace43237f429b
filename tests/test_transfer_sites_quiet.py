"""A program back from a quiet spell has its transfers tied to lines.

The agent takes its post-call hook out of a program that has made no
implicit transfer for 10 s while calling jitted functions fast (the hook
would cost every call something for nothing). The common shape of that is
training followed by evaluation on host data: the evaluation's transfers
must be named, all but the first call's (made before any transfer told the
agent to put the hook back). A real child under ``jaxtop run --log``.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import PY, TARGETS

pytestmark = pytest.mark.slow

EVALS = 30


def _last_sites(log) -> dict:
    last = None
    with open(log, "rb") as f:
        for line in f:
            record = json.loads(line)
            if record.get("type") == "sample" and record.get("transfer_sites"):
                last = record["transfer_sites"]
    assert last is not None, "no sample carried transfer_sites"
    return last


def test_after_a_quiet_spell_only_the_first_calls_transfers_go_unnamed(child_env, tmp_path):
    script = TARGETS / "quiet_then_eval.py"
    eval_line = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if text.endswith("# EVAL"))
    log = tmp_path / "run.jsonl"
    proc = subprocess.run([PY, "-m", "jaxtop", "run", "--log", str(log), str(script), "12", str(EVALS), "0.025"],
                          cwd=TARGETS, env=child_env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr[-3000:]
    sites = _last_sites(log)
    reasons = sites.get("unattributed_reasons") or {}
    at_eval = sum(s["count_total"] for s in sites["sites"]
                  if s["direction"] == "h2d" and s["line"] == eval_line and s["file"].endswith("quiet_then_eval.py"))
    lost = (sites.get("unattributed") or {}).get("h2d", 0)
    # The hook did go out (else this tests nothing), and came back after one call.
    assert any("hook was out" in r for r in reasons), sites
    assert lost <= 1 and at_eval >= EVALS - 1, (at_eval, lost, reasons)
