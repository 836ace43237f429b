"""The program's own objects never run on jaxtop's agent thread.

A real child under ``jaxtop run --log``: a jitted callable object whose
``__eq__``/``__hash__`` raise off the main thread and whose
``__signature__`` sleeps 30 s, and dict keys whose ``__repr__`` counts its
calls (tests/targets/hostile_callables.py). Every line keeps its transfers,
no field turns into an error, sampling goes on at its pace, and the keys'
``__repr__`` runs no more under jaxtop than without it.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from conftest import PY, TARGETS

pytestmark = pytest.mark.slow

SECONDS = 4.0
SCRIPT = TARGETS / "hostile_callables.py"


def _marked(mark: str) -> int:
    return next(i for i, text in enumerate(SCRIPT.read_text().splitlines(), 1) if text.endswith(f"# {mark}"))


def _run(cmd, env) -> re.Match:
    proc = subprocess.run(cmd, cwd=TARGETS, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = re.search(r"reprs=(\d+) steps=(\d+)", proc.stdout)
    assert found, proc.stdout[-2000:]
    return found


def test_a_hostile_callable_keeps_its_lines_and_runs_nothing_on_the_agents_thread(child_env, tmp_path):
    log = tmp_path / "run.jsonl"
    under = _run([PY, "-m", "jaxtop", "run", "--log", str(log), str(SCRIPT), str(SECONDS)], child_env)
    plain = _run([PY, str(SCRIPT), str(SECONDS)], child_env)
    assert int(under.group(1)) == int(plain.group(1)), (under.group(0), plain.group(0))

    samples, last, errors = 0, None, []
    with open(log, "rb") as f:
        for raw in f:
            record = json.loads(raw)
            if record.get("type") != "sample":
                continue
            samples += 1
            errors += [k for k, v in record.items() if isinstance(v, dict) and "error" in v]
            if record.get("transfer_sites"):
                last = record["transfer_sites"]
    assert not errors, f"fields that failed: {sorted(set(errors))}"
    # 10 samples a second: a __signature__ that sleeps on the agent's thread would stop them.
    assert samples >= 0.6 * 10 * SECONDS, samples
    lines = {s["line"]: s for s in last["sites"] if s["direction"] == "h2d"}
    steps = int(under.group(2))
    for mark in ("HOSTILE", "PLAIN"):
        site = lines.get(_marked(mark))
        assert site is not None and site["count_total"] >= steps - 2, (mark, site, steps)
    hostile = lines[_marked("HOSTILE")]
    assert all("Key(" not in a["name"] for a in hostile["args"]), hostile["args"]


def test_a_megabyte_function_name_does_not_grow_the_recording(child_env, tmp_path):
    """Generated code names a jitted function with 1 MiB: the agent sends
    the name cut (it used to send it whole in the transfer sites and the jit
    ledger, 5 MB in 3 s), and the line still counts its transfers."""
    script = TARGETS / "long_names.py"
    line = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if text.endswith("# LONG"))
    log = tmp_path / "run.jsonl"
    proc = subprocess.run([PY, "-m", "jaxtop", "run", "--log", str(log), str(script), "3"], cwd=TARGETS,
                          env=child_env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    longest, last = 0, None

    def walk(value) -> None:
        nonlocal longest
        if isinstance(value, str):
            longest = max(longest, len(value))
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    with open(log, "rb") as f:
        for raw in f:
            record = json.loads(raw)
            walk(record)
            if record.get("transfer_sites"):
                last = record["transfer_sites"]
    assert longest <= 1100, longest
    assert log.stat().st_size < 1 << 20, log.stat().st_size
    site = next(s for s in last["sites"] if s["line"] == line)
    assert site["count_total"] > 0 and site["callee"].startswith("fff") and len(site["callee"]) <= 256
