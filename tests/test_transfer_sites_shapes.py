"""Programs of shapes that once lost or mislabelled their transfers' lines,
each a real child under ``jaxtop run --log``.

A program back from a quiet spell has its transfers tied to lines.

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


def _last_h2d_total(log) -> int:
    """The agent's count of implicit host-to-device transfers, from its last sample."""
    total = None
    with open(log, "rb") as f:
        for line in f:
            record = json.loads(line)
            h2d = ((record.get("transfers") or {}).get("h2d") or {}) if record.get("type") == "sample" else {}
            if h2d.get("count_total") is not None:
                total = h2d["count_total"]
    assert total is not None, "no sample counted transfers"
    return total


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


def test_a_line_that_calls_two_things_says_whose_arguments_it_shows(child_env, tmp_path):
    """A jitted function given scalars by keyword, then jnp's add given a
    NumPy array, on one line: whatever callee the line shows, the arguments
    shown are that callee's, or say whose they are."""
    script = TARGETS / "two_callees.py"
    line = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if text.endswith("# TWO"))
    log = tmp_path / "run.jsonl"
    proc = subprocess.run([PY, "-m", "jaxtop", "run", "--log", str(log), str(script), "300", "0.01"],
                          cwd=TARGETS, env=child_env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr[-3000:]
    own = {"<lambda>": {"minval", "maxval"}, "add": {"y", "ones", ""}}
    seen = 0
    with open(log, "rb") as f:
        for raw in f:
            record = json.loads(raw)
            for site in (record.get("transfer_sites") or {}).get("sites") or ():
                if site["line"] != line or site["direction"] != "h2d" or not site["args"]:
                    continue
                seen += 1
                whose = (site.get("args_of") or site["callee"]).removesuffix(" (op)")
                names = {a["name"] for a in site["args"]}
                assert whose in own and names <= own[whose], site
    assert seen, "the line's arguments were never described"


def test_a_subprocess_writing_to_the_programs_stderr_is_named_as_such(child_env, tmp_path):
    """A subprocess (as a forked child would) logs its own transfers to the
    program's stderr: they are another process's, not "a thread without
    Python code" of the program's, and the program's own line keeps its one."""
    script = TARGETS / "child_transfers.py"
    own = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if text.endswith("# OWN"))
    log = tmp_path / "run.jsonl"
    proc = subprocess.run([PY, "-m", "jaxtop", "run", "--log", str(log), str(script), "5"], cwd=TARGETS,
                          env=child_env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr[-3000:]
    sites = _last_sites(log)
    reasons = sites.get("unattributed_reasons") or {}
    assert reasons.get("made by another process writing to this program's stderr (a forked child, a subprocess)") == 5
    assert not any("without Python code" in r for r in reasons), reasons
    assert any(s["line"] == own and s["count_total"] == 1 for s in sites["sites"]), sites["sites"]


def test_generated_code_past_the_lines_kept_is_not_held(child_env, tmp_path):
    """200,000 functions made with exec, each transferring once from a file
    of its own: past the lines kept apart, nothing of the program is held
    for the agent (each call's code object was held for the notes' seconds:
    all of them alive at the end, 110 MB at 200,000), their transfers are
    counted as the rest, with the reason, and once nearly every line is
    beyond the kept ones the hook leaves for spells (it cost each call more
    than JAX's own logging), the lines made meanwhile counted with that
    reason. The program goes on for 15 s at least: a spell begins only
    after some seconds of such lines (and a fast machine makes 200,000 in
    fewer)."""
    from jaxtop.probes.transfer_keys import MAX_CODES
    from jaxtop.probes.transfer_sites import MAX_SITES
    from jaxtop.probes.transfer_spells import spell_reason

    log = tmp_path / "run.jsonl"
    proc = subprocess.run([PY, "-m", "jaxtop", "run", "--log", str(log), str(TARGETS / "generated_code.py"), "200000",
                           "host", "15"],
                          cwd=TARGETS, env=child_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    alive = int(proc.stdout.rsplit("alive=", 1)[1])
    assert alive <= MAX_CODES // 2, proc.stdout
    sites = _last_sites(log)
    reasons = sites.get("unattributed_reasons") or {}
    assert any(f"more than {MAX_SITES} lines" in r for r in reasons), reasons
    assert reasons.get(spell_reason("sealed", MAX_SITES), 0) > 0, (reasons, proc.stdout)
    # Every transfer is counted once: at its line, or as one of the rest
    # (the generated calls past the lines kept share a note while they
    # come one after the other: none is lost or counted twice).
    at_lines = sum(s["count_total"] for s in sites["sites"] if s["direction"] == "h2d")
    at_lines += (sites.get("other") or {}).get("count_total", 0)
    rest = (sites.get("unattributed") or {}).get("h2d", 0)
    counted = _last_h2d_total(log)
    assert at_lines + rest == counted >= 200_000, (at_lines, rest, counted)
    # Each function transfers once at a line of its own: a transfer tied to
    # another call's note would show as a line counted twice.
    assert all(s["count_total"] == 1 for s in sites["sites"]), [s for s in sites["sites"] if s["count_total"] != 1]
