"""The jit ledger in real JAX programs (tests/targets/jit_ledger*.py): what their agent recorded."""

from __future__ import annotations

import json
import re
import subprocess

import msgspec
import pytest

from conftest import NAMES_COMPILES, PY
from test_jit_ledger import AGENT_KEEPS_LEDGER, LEAK, LEDGER, call_lines, folded, jit_fields, run_with_ledger, sizes  # helpers shared with that module

#: The agent keeps the ledger itself (else the children add it in-process).
#: The model folds ``jit`` fields itself (else the tests feed a store).


# -- the probe in real JAX programs -------------------------------------------------------

@pytest.mark.slow
def test_ledger_sizes_compiles_and_reasons_match_jax(child_env, tmp_path):
    """Per executable: argument/output/alias/temp/code bytes equal to
    ``lower().compile().memory_analysis()``; compiles 1, 1 and 4; each
    recompile names the argument, the old and new types, and the call site."""
    expect = subprocess.run([PY, str(LEDGER), "expect"], env=child_env, capture_output=True, timeout=180)
    assert expect.returncode == 0, expect.stderr[-2000:]
    expected = json.loads(expect.stdout.splitlines()[-1])
    log = tmp_path / "ledger.jsonl"
    run = run_with_ledger(LEDGER, ["run"], child_env, log)
    assert run.returncode == 0, run.stderr[-2000:]
    fields = jit_fields(log)
    assert fields, "no jit field in the recording"
    last = fields[-1]
    assert last["full"] is True
    view = folded(log)
    assert view is not None and view.complete
    lines = call_lines(LEDGER)
    site = lambda key: f"{LEDGER}:{lines[key]}"

    functions = {f["name"]: f for f in last["functions"]}
    folded_functions = {f.name: f for f in view.functions}
    for name, compiles in (("matmul", 1), ("sort_rows", 1), ("step", 4)):
        key = f"jit_{name}"
        assert functions[key]["compiles"] == compiles, functions[key]
        # jax >= 0.6.2 names the function in its compile events; before, the live executables count
        assert functions[key]["compiles_source"] == ("monitoring" if NAMES_COMPILES else "executables")
        assert functions[key]["live"] == compiles
        assert folded_functions[key].compiles == compiles  # the deltas fold to the same table
        rows = [e for e in last["executables"] if e["name"] == key]
        want = [e for e in expected if e["name"] == name]
        assert sorted(sizes(r) for r in rows) == sorted(sizes(e) for e in want)
        assert sorted(sizes(msgspec.structs.asdict(r)) for r in view.executables if r.name == key) == sorted(
            sizes(e) for e in want)
    # Each executable's call site is the line whose call compiled it.
    by_args = {e["argument_bytes"]: e for e in last["executables"] if e["name"] == "jit_step"}
    for k, (shape, dtype) in enumerate([((100, 64), 4), ((200, 64), 4), ((300, 64), 4), ((300, 64), 2)]):
        assert by_args[shape[0] * shape[1] * dtype]["call_site"] == site(f"call:step:{k}")
    assert next(e for e in last["executables"] if e["name"] == "jit_matmul")["call_site"] == site("call:matmul")
    # Recompile reasons: the step calls 1..3, each naming x, its old and new type, and the line.
    step = functions["jit_step"]
    assert step["reasons_total"] == 3 and len(step["reasons"]) == 3
    seen = ["f32[100,64]"]
    for k, (reason, new) in enumerate(zip(step["reasons"], ["f32[200,64]", "f32[300,64]", "f16[300,64]"]), 1):
        assert reason["kind"] == "types"
        assert reason["arg"] == "x"
        assert reason["new"] == new
        assert reason["old"] in seen
        assert reason["call_site"] == site(f"call:step:{k}")
        seen.append(new)
    assert functions["jit_matmul"]["reasons"] == [] and functions["jit_sort_rows"]["reasons"] == []
    # The screen's order: latest first.
    assert [r.new for r in folded_functions["jit_step"].reasons] == ["f16[300,64]", "f32[300,64]", "f32[200,64]"]
    assert last["explain"]["enabled"] is True and last["explain"]["by"] == "jaxtop"
    assert last["leak"] is None and all(f.get("leak") is None for f in fields)
    assert last["live_count"] >= 6 and last["pending"] == 0


@pytest.mark.slow
def test_jit_closures_in_a_loop_are_flagged(child_env, tmp_path):
    """New jitted closures kept alive in a loop: the live-executable count
    climbs pass after pass and the leak flag names the line."""
    log = tmp_path / "leak.jsonl"
    seconds = "9" if AGENT_KEEPS_LEDGER else "4"  # the agent passes once a second, the in-process probe 5 times
    run = run_with_ledger(LEAK, ["--seconds", seconds], child_env, log)
    assert run.returncode == 0, run.stderr[-2000:]
    closures = int(run.stdout.split()[-1])
    fields = jit_fields(log)
    counts = [f["live_count"] for f in fields]
    assert counts[-1] - counts[0] >= 20 and counts[-1] >= closures, counts
    assert all(b >= a for a, b in zip(counts, counts[1:])), counts  # nothing freed: it only climbs
    flagged = [f["leak"] for f in fields if f.get("leak")]
    assert flagged, counts
    leak = flagged[-1]
    line = call_lines(LEAK)["leak"]
    assert leak["site"] == f"{LEAK}:{line}"
    assert re.fullmatch(rf"live executables \+\d+ in \d+ s: jit closures created in a loop\? \(jit_ledger_leak\.py:{line}\)",
                        leak["message"]), leak["message"]
    assert leak["growth"] >= 10 and leak["passes"] >= 5
    view = folded(log)
    assert view.leak is not None and view.trend_delta(3600) >= 20


def _normalized(stderr: bytes) -> bytes:
    # A cache-miss record names the function object's id(): different per run.
    return re.sub(rb"id=\d+", b"id=N", stderr)


@pytest.mark.slow
@pytest.mark.parametrize("user", ["none", "env", "update"])
def test_users_explain_setting_and_output_untouched(child_env, tmp_path, user):
    """Left alone by the program, the option is jaxtop's and its records never
    reach stderr (byte-identical to a plain run); set by the program (in the
    environment, or with jax.config.update after import), the program keeps
    its setting and its output, and the ledger still reads the reasons."""
    env = dict(child_env)
    args = ["run"]
    if user == "env":
        env["JAX_EXPLAIN_CACHE_MISSES"] = "1"
    elif user == "update":
        args.append("--user-explain")
    plain = subprocess.run([PY, str(LEDGER), *args], env=env, capture_output=True, timeout=180)
    assert plain.returncode == 0, plain.stderr[-2000:]
    log = tmp_path / "ledger.jsonl"
    run = run_with_ledger(LEDGER, args, env, log)
    assert run.returncode == 0, run.stderr[-2000:]
    if user == "none":
        assert b"TRACING CACHE MISS" not in plain.stderr
        assert run.stderr == plain.stderr  # byte for byte
    else:
        assert plain.stderr.count(b"TRACING CACHE MISS") >= 6  # the program's own explanations...
        assert _normalized(run.stderr) == _normalized(plain.stderr)  # ...all of them, as they were
    assert b"user log line before the compiles" in run.stderr
    assert run.stdout == plain.stdout  # with --user-explain: "explain True", the program's setting
    last = jit_fields(log)[-1]
    assert last["explain"] == {**last["explain"], "enabled": True, "by": "jaxtop" if user == "none" else "user"}
    step = next(f for f in last["functions"] if f["name"] == "jit_step")
    assert [r["new"] for r in step["reasons"]] == ["f32[200,64]", "f32[300,64]", "f16[300,64]"]
    assert (last["explain"]["hidden_total"] > 0) == (user == "none")
