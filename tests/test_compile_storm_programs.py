"""Compile storms in real JAX programs (tests/targets/compile_storm.py) under
`jaxtop run`: an op run eagerly over new shapes, a jitted step fed new
shapes and jit closures made in a loop are flagged within 60 s of their
first compile, with the cause the ledger knows; a model's set-up is not;
the Events list gets one event per storm; the trend is one series."""

from __future__ import annotations

import collections
import re
import subprocess
from pathlib import Path

import pytest

from conftest import TARGETS, jaxtop_cmd
from jaxtop.dashboard.ledger import LedgerStore
from jaxtop.wire import protocol
from jaxtop.wire.records import from_dict

STORM = TARGETS / "compile_storm.py"
#: Before jax 0.6.2 no compile event names its function: the passes'
#: executables do (ops among them by the compile event's stack), and the
#: same storms are flagged.
pytestmark = pytest.mark.slow


def run_storm(env: dict, tmp_path: Path, mode: str, seconds: float = 8.0) -> tuple[subprocess.CompletedProcess, list]:
    log = tmp_path / f"{mode}.jsonl"
    # At least 60 compiles, however slowly a loaded machine makes them.
    run = jaxtop_cmd("run", "--log", log, STORM, mode, "--seconds", seconds, "--min-steps", 60, env=env, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    with open(log, "rb") as f:
        return run, [r for r in protocol.iter_records(f) if r.get("type") == "sample"]


def storm_of(samples: list) -> tuple[dict | None, float | None]:
    """The first storm flag and when it came, seconds after the first compile."""
    first_compile = next((s["t"] for s in samples if (s.get("compile") or {}).get("count_total")), None)
    for s in samples:
        storm = (s.get("jit") or {}).get("storm")
        if storm:
            return storm, s["t"] - first_compile
    return None, None


def fold(samples: list) -> tuple[LedgerStore, list]:
    store = LedgerStore()
    events = [e for s in samples for e in store.feed_sample(1, from_dict(s))]
    return store, events


@pytest.mark.parametrize("mode, kind, says", [
    ("eager", "eager", r"compile storm: eager op sin compiled for \d+ shapes: run it under jit or pad shapes"),
    ("shapes", "types", r"compile storm: \d+ recompiles of step: the shape of x changed "
                        r"\(f32\[11\] → f32\[12\] → … → f32\[\d+\]\): pad or bucket shapes"),
    ("closures", "redefined", r"compile storm: <lambda> compiled \d+ times: a new function object each time "
                              r"\(jit closures created in a loop\?\)"),
])
def test_a_storm_is_flagged_within_a_minute_with_its_cause(child_env, tmp_path, mode, kind, says):
    _, samples = run_storm(child_env, tmp_path, mode)
    storm, after_s = storm_of(samples)
    assert storm is not None, [s.get("jit", {}).get("compiles_total") for s in samples]
    assert after_s <= 60.0 and storm["kind"] == kind
    assert re.match(says, storm["message"]), storm["message"]
    # The storming call's own line (the target marks each mode's with "# storm").
    call = {"eager": "jnp.sin(x)", "shapes": "jitted(x)", "closures": "jax.jit(lambda"}[mode]
    site = next(n for n, text in enumerate(STORM.read_text().splitlines(), 1)
                if text.endswith("# storm") and call in text)
    assert storm["site"] == f"{STORM}:{site}" and storm["message"].endswith(f"(compile_storm.py:{site})")
    # One event for the storm, a few recompiles before it; the step's
    # executables stay alive (a leak too), and that is the storm's event as well.
    _, events = fold(samples)
    texts = [text for kind_, text, _ in events if kind_ == "jit"]
    kinds = collections.Counter(text.split(":")[0] for text in texts)
    assert kinds["compile storm"] == 1 and sum(kinds.values()) <= 4, texts
    # The trend is one series: each whole table's points are the live counts
    # the changes carried at the same passes (ops included).
    fields = [s["jit"] for s in samples if isinstance(s.get("jit"), dict)]
    carried = {f["t"]: f["live_count"] for f in fields if not f["full"]}
    for full in (f for f in fields if f["full"]):
        for t, n in full["trend"]:
            assert carried.get(t, n) == n, (t, n, carried.get(t))


def test_the_leak_of_a_step_fed_new_shapes_names_the_shapes_not_closures(child_env, tmp_path):
    _, samples = run_storm(child_env, tmp_path, "shapes")
    leaks = [s["jit"]["leak"] for s in samples if (s.get("jit") or {}).get("leak")]
    assert leaks, "no leak flag"
    assert leaks[-1]["function"] == "jit_step"
    assert "recompiles of step: the shape of x changed (f32[11] → f32[12]" in leaks[-1]["message"]
    assert "closures" not in leaks[-1]["message"]


def test_a_models_set_up_and_steady_steps_are_no_storm(child_env, tmp_path):
    _, samples = run_storm(child_env, tmp_path, "setup", seconds=8.0)
    assert storm_of(samples)[0] is None
    store, events = fold(samples)
    view = store.view(1)
    assert view.compiles_total >= 60 and view.storm is None
    assert not any(text.startswith("compile storm") for _, text, _ in events)
