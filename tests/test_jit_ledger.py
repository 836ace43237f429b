"""The jit ledger: the probe in real JAX children, the dashboard's store, the Jit screen.

Children run ``tests/targets/jit_ledger*.py``. Where the agent keeps the
ledger itself they run under ``jaxtop run --log``; before that, each child
instruments itself and adds the probe with public APIs (``--inprocess``).
The assertions are the same either way: they read the recording.
"""

from __future__ import annotations

import collections
import io
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from rich.console import Console

from conftest import PY, TARGETS, jaxtop_cmd
from jaxtop.wire import protocol
from jaxtop.dashboard.app import make_app
from jaxtop.dashboard.jit_screen import JitScreen
from jaxtop.dashboard.ledger import LedgerStore, describe_reason, short_site
from jaxtop.dashboard.model import Model
from jaxtop.dashboard.sources import PushSource
from jaxtop.probes.executables import CacheMissFilter, name_key, parse_cache_miss
from jaxtop.widgets.jit import JitLedgerTable, sort_functions

LEDGER = TARGETS / "jit_ledger.py"
LEAK = TARGETS / "jit_ledger_leak.py"
AGENT_SOURCE = Path(__file__).resolve().parents[1] / "jaxtop" / "agent" / "agent.py"
#: The agent keeps the ledger itself (else the children add it in-process).
AGENT_KEEPS_LEDGER = "JitLedgerProbe" in AGENT_SOURCE.read_text()
#: The model folds ``jit`` fields itself (else the tests feed a store).
MODEL_FOLDS = hasattr(Model(), "ledgers")


def call_lines(path: Path) -> dict[str, int]:
    """``# call:NAME`` / ``# leak`` markers of a target → line numbers."""
    out = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = re.search(r"# (call:\S+|leak)\s*$", line)
        if m:
            out[m.group(1)] = n
    return out


def run_with_ledger(script: Path, args: list[str], env: dict, log: Path, timeout: float = 180):
    if AGENT_KEEPS_LEDGER:
        return jaxtop_cmd("run", "--log", log, script, *args, env=env, timeout=timeout)
    return subprocess.run([PY, str(script), *args, "--inprocess", str(log)], env=env, capture_output=True,
                          timeout=timeout)


def jit_fields(log: Path) -> list[dict]:
    with open(log, "rb") as f:
        return [r["jit"] for r in protocol.iter_records(f) if r.get("type") == "sample" and isinstance(r.get("jit"), dict)]


def folded(log: Path, pid: int = 1):
    store = LedgerStore()
    with open(log, "rb") as f:
        for rec in protocol.iter_records(f):
            if rec.get("type") == "sample":
                store.feed_sample(pid, rec)
    return store.view(pid)


def sizes(row) -> tuple:
    return tuple(row[k] for k in ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "code_bytes"))


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
        assert functions[key]["compiles_source"] == "monitoring"  # jax >= 0.6.2 names the function
        assert functions[key]["live"] == compiles
        assert folded_functions[key].compiles == compiles  # the deltas fold to the same table
        rows = [e for e in last["executables"] if e["name"] == key]
        want = [e for e in expected if e["name"] == name]
        assert sorted(sizes(r) for r in rows) == sorted(sizes(e) for e in want)
        assert sorted(sizes(r) for r in view.executables if r["name"] == key) == sorted(sizes(e) for e in want)
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
    assert [r["new"] for r in folded_functions["jit_step"].reasons] == ["f16[300,64]", "f32[300,64]", "f32[200,64]"]
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


# -- parsing, without jax -------------------------------------------------------------------

MISS_0_4_30 = """TRACING CACHE MISS at /src/train.py:20 (<module>) because:
  for step defined at /src/train.py:14
  never seen input type signature:
    x: f32[4],  w: f32[]
  closest seen input type signature has 1 mismatches, including:
    * at x, seen f32[3], but now given f32[4]"""
MISS_0_8_3 = """TRACING CACHE MISS at /src/train.py:21:4 (main) costing 8.117 ms because:
  for step defined at /src/train.py:14
  all previously seen cache keys are different. Several previous keys are closest:
  * key with different input types:
      types now: x: i32[4], w: f32[]
        * at x, now i32[4] and before f32[3]
  * key with different input types:
      types now: x: i32[4], w: f32[]
        * at x, now i32[4] and before f32[4]"""
MISS_0_10_2 = """TRACING CACHE MISS at /src/train.py:22 (<module>):
  for step defined at /src/train.py:14
  all previously seen cache keys differ. For the closest previous key:
  different input types:
  * at x, now f32[4] and before f32[3]"""
MISS_NEW = """TRACING CACHE MISS at /src/train.py:19 (<module>):
  never seen function:
    step id=140201357515552 defined at /src/train.py:14"""
MISS_LOOP = """TRACING CACHE MISS at /src/loop.py:9 (<module>):
  never seen function:
    <lambda> id=140201357515552 defined at /src/loop.py:9
  but seen another function defined on the same line; maybe the function is
  being re-defined repeatedly, preventing caching?"""
MISS_KWARGS = """TRACING CACHE MISS at /src/train.py:22 (<module>) because:
  for step defined at /src/train.py:14
  never seen passing 1 positional args and 1 keyword args with keys:
    'w'
  closest seen is passing no keyword args"""


@pytest.mark.parametrize("message, old, new, line", [
    (MISS_0_4_30, "f32[3]", "f32[4]", 20), (MISS_0_8_3, "f32[3]", "i32[4]", 21), (MISS_0_10_2, "f32[3]", "f32[4]", 22),
], ids=["0.4.30", "0.6.2-0.8.3", "0.9.2-0.10.2"])
def test_cache_miss_wordings_of_every_version(message, old, new, line):
    r = parse_cache_miss(message)
    assert r["kind"] == "types" and r["arg"] == "x" and (r["old"], r["new"]) == (old, new)
    assert r["call_site"] == f"/src/train.py:{line}" and r["fn"] == "step" and r["key"] == "jit_step"
    assert r["defined_at"] == "/src/train.py:14"
    assert describe_reason(r) == f"x {old} → {new}{' (+1 more)' if len(r.get('diffs', ())) > 1 else ''} at train.py:{line}"


def test_cache_miss_other_kinds():
    assert parse_cache_miss("something else") is None
    new = parse_cache_miss(MISS_NEW)
    assert new["kind"] == "new_function" and new["key"] == "jit_step" and new["call_site"] == "/src/train.py:19"
    loop = parse_cache_miss(MISS_LOOP)
    assert loop["kind"] == "redefined" and loop["key"] == "jit__lambda"
    kw = parse_cache_miss(MISS_KWARGS)
    assert kw["kind"] == "other" and "keyword args" in kw["text"] and "arg" not in kw
    assert "keyword args" in describe_reason(kw)


def test_one_name_for_every_spelling():
    assert name_key("jit(step)") == name_key("jit_step") == "jit_step"
    assert name_key("jit(<lambda>)") == name_key("jit__lambda_") == name_key("jit__lambda") == "jit__lambda"
    assert short_site("/a/b/train.py:31") == "train.py:31" and short_site(None) is None


def test_filter_hides_only_what_jaxtop_caused():
    import logging

    got = []
    owns = [True]
    filt = CacheMissFilter(lambda msg, t: got.append(msg), lambda: owns[0], lambda: False)
    logger = logging.getLogger("jaxtop.test.jit")

    def record(msg, level=logging.WARNING):
        return logger.makeRecord(logger.name, level, __file__, 1, msg, (), None)

    assert filt.filter(record(MISS_0_10_2)) is False and got == [MISS_0_10_2]  # read, then hidden
    assert filt.filter(record("an unrelated warning")) is True
    persistent = record("PERSISTENT COMPILATION CACHE MISS for '%s' with key %r")
    assert filt.filter(persistent) is False  # it would have been DEBUG, and DEBUG is off here
    owns[0] = False  # the program asked for them: everything passes, still read
    assert filt.filter(record(MISS_0_10_2)) is True and len(got) == 2
    assert filt.filter(record("PERSISTENT COMPILATION CACHE MISS for '%s' with key %r")) is True


# -- passes over fake executables: what is n/a, and why ------------------------------------

class FakeFrame:
    def __init__(self, file_name, line_num, function_name="f"):
        self.file_name, self.line_num, self.function_name = file_name, line_num, function_name


class FakeTraceback:
    def __init__(self, *frames):
        self.frames = list(frames)


class FakeExe:
    """Stands in for a LoadedExecutable: each API may be missing or fail."""

    def __init__(self, name, stats=None, cost=None, traceback=None, fingerprint=b"123"):
        self.name, self.stats, self.cost, self.traceback, self.fingerprint = name, stats, cost, traceback, fingerprint

    def hlo_modules(self):
        return [type("M", (), {"name": self.name})()]

    def get_compiled_memory_stats(self):
        if isinstance(self.stats, Exception):
            raise self.stats
        return self.stats

    def cost_analysis(self):
        if isinstance(self.cost, Exception):
            raise self.cost
        return self.cost


class FakeStats:
    def __init__(self, **sizes):
        for k in ("argument", "output", "alias", "temp", "generated_code"):
            setattr(self, f"{k}_size_in_bytes", sizes.get(k, 0))
            setattr(self, f"host_{k}_size_in_bytes", sizes.get(f"host_{k}", 0))


class FakeClient:
    def __init__(self, *exes):
        self.exes = list(exes)

    def live_executables(self):
        return list(self.exes)


def fake_probe(*clients, **kw):
    from jaxtop.probes.executables import JitLedgerProbe

    probe = JitLedgerProbe(interval_s=0.0, **kw)
    probe._clients = lambda: list(clients)
    return probe


def test_pass_says_na_with_the_reason_and_finds_the_users_line():
    import sysconfig

    import jaxtop.probes.executables as module

    stdlib = sysconfig.get_paths()["stdlib"]
    user = FakeTraceback(FakeFrame(module.__file__, 500, "scan"), FakeFrame(f"{stdlib}/runpy.py", 80),
                         FakeFrame("/src/train.py", 42, "main"), FakeFrame("/src/outer.py", 7))
    good = FakeExe("jit_step", FakeStats(argument=64, output=32, temp=1024, generated_code=256, host_temp=8),
                   {"flops": 10.0, "bytes accessed": 96.0}, user)
    bad = FakeExe("jit_bad", RuntimeError("UNIMPLEMENTED"), ValueError("no cost"), None, fingerprint=None)
    internal = FakeExe("jit_internal", FakeStats(), [{}], FakeTraceback(FakeFrame(f"{stdlib}/runpy.py", 1)))
    probe = fake_probe(FakeClient(good, bad, internal), object())  # the second client has no live_executables()
    probe.scan()
    table = probe.table()
    rows = {r["name"]: r for r in table["executables"]}
    g = rows["jit_step"]
    assert (g["argument_bytes"], g["output_bytes"], g["temp_bytes"], g["code_bytes"]) == (64, 32, 1024, 256)
    assert g["host"] == {"temp_bytes": 8} and g["flops"] == 10.0 and g["bytes_accessed"] == 96.0
    assert g["call_site"] == "/src/train.py:42" and g["call_fn"] == "main"  # jaxtop and stdlib frames skipped
    b = rows["jit_bad"]
    assert b["temp_bytes"] is None and "UNIMPLEMENTED" in b["stats_reason"]
    assert b["flops"] is None and "no cost" in b["cost_reason"]
    assert b["call_site"] is None and b["call_site_reason"] and b["fingerprint"] is None
    i = rows["jit_internal"]
    assert i["flops"] == 0.0 and i["call_site"] is None and "standard library" in i["call_site_reason"]
    assert table["executables_reason"] == "this jaxlib's client has no live_executables()"
    assert table["live_count"] == 3 and table["code_bytes"] == 256
    assert {f["name"]: f["compiles"] for f in table["functions"]} == {"jit_step": 1, "jit_bad": 1, "jit_internal": 1}
    assert all(f["compiles_source"] == "executables" for f in table["functions"])  # no compile events seen


def test_a_backlog_is_analysed_from_the_catch_up_credit_once():
    exes = [FakeExe(f"jit_f{k}", FakeStats(temp=k), {}, FakeTraceback(FakeFrame("/src/a.py", k))) for k in range(5)]
    probe = fake_probe(FakeClient(*exes), budget_s=0.0)  # the budget alone: one per pass
    probe.scan()
    assert probe.table()["pending"] == 0  # the credit paid for the other four in this pass
    assert 0.0 <= probe._catchup_credit_s < 1.0  # what they cost came out of it
    probe._catchup_credit_s = 0.0  # spent: back to the budget
    more = [FakeExe(f"jit_g{k}", FakeStats(temp=k), {}, FakeTraceback(FakeFrame("/src/b.py", k))) for k in range(3)]
    probe._clients = lambda: [FakeClient(*(more + exes))]
    probe.scan()
    assert probe.table()["pending"] == 2


def test_cache_by_identity_and_the_budget():
    exes = [FakeExe(f"jit_f{k}", FakeStats(temp=k), {}, FakeTraceback(FakeFrame("/src/a.py", k))) for k in range(5)]
    client = FakeClient(*exes)
    probe = fake_probe(client, budget_s=0.0, catchup_credit_s=0.0)  # one new executable per pass
    probe.scan()
    assert probe.table()["pending"] == 4
    for _ in range(4):
        probe.scan()
    table = probe.table()
    assert table["pending"] == 0 and len(table["executables"]) == 5
    ids = {r["name"]: r["id"] for r in table["executables"]}
    calls = collections.Counter()
    original = FakeExe.get_compiled_memory_stats

    def counting(self):
        calls[self.name] += 1
        return original(self)

    FakeExe.get_compiled_memory_stats = counting
    try:
        probe.scan()
        assert not calls  # an unchanged set is not analysed again
        # The same Python object with another traceback: a new executable
        # that took a freed one's id(). It must not pass for the old one.
        exes[0].traceback = FakeTraceback(FakeFrame("/src/b.py", 1))
        client.exes.pop(1)
        probe.scan()
        assert calls == {"jit_f0": 1}
    finally:
        FakeExe.get_compiled_memory_stats = original
    table = probe.table()
    now = {r["name"]: r["id"] for r in table["executables"]}
    assert now["jit_f0"] != ids["jit_f0"] and "jit_f1" not in now
    assert sorted(g["id"] for g in table["gone_recent"]) == sorted([ids["jit_f0"], ids["jit_f1"]])


class CountingExe(FakeExe):
    """A fake executable that counts the reads of its traceback: the per-executable
    Python work of a pass (an identity check reads it, an analysis too)."""

    reads = 0

    @property
    def traceback(self):
        CountingExe.reads += 1
        return self._tb

    @traceback.setter
    def traceback(self, value):
        self._tb = value


def counting_exes(n, prefix="jit_f"):
    return [CountingExe(f"{prefix}{k}", FakeStats(temp=k), {}, FakeTraceback(FakeFrame("/src/a.py", k)))
            for k in range(n)]


class FakeClock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def started_fake(*clients, **kw):
    """A fake probe that sample() serves (as if started), on a clock the test moves."""
    probe = fake_probe(*clients, **kw)
    probe.interval_s = kw.get("interval_s", 1.0)
    probe.active = True
    clock = probe._clock = FakeClock()
    return probe, clock


def tick_until(probe, clock, seen, limit_s, step=0.1):
    """sample() every ``step`` of the fake clock until ``seen(field)``; the time it took."""
    start = clock.t
    while clock.t - start <= limit_s + 1e-9:
        clock.t += step
        out = probe.sample()
        if out is not None and seen(out):
            return clock.t - start
    return None


def test_steady_passes_do_no_work_per_executable():
    exes = counting_exes(300)
    client = FakeClient(*exes)
    probe, clock = started_fake(client, budget_s=float("inf"), verify_every_s=1e9, full_every_s=1e9)
    analysed = []
    analyse = probe._analyse
    probe._analyse = lambda e, now: (analysed.append(e.name), analyse(e, now))[1]
    first = probe.sample()
    assert first["full"] is True and first["live_count"] == 300 and len(analysed) == 300
    assert first["pass_every_s"] >= 1.0
    CountingExe.reads = 0
    analysed.clear()
    for _ in range(50):
        probe.scan()
    # One identity check per pass (the newest executable), whatever the count.
    assert CountingExe.reads == 50 and not analysed
    assert probe.live_count() == 300 and probe.table()["pending"] == 0
    # Quiet ticks: nothing to say, and no pass before one is due.
    CountingExe.reads = 0
    passes = len(probe._trend)
    for _ in range(100):
        clock.t += 0.1
        assert probe.sample() is None
    assert len(probe._trend) - passes <= 10 and CountingExe.reads == len(probe._trend) - passes
    # A whole table with nothing changed reuses the last one's lists.
    a = probe.sample(full=True)
    b = probe.sample(full=True)
    assert a is not b and a["functions"] is b["functions"] and a["executables"] is b["executables"]
    assert len(a["executables"]) == 64 and a["executables_left_out"] == 236 and a["functions"][0]["live"] == 1
    # A new executable that took the newest one's id() (same object here,
    # another traceback): the id() list is the same, the head check sees it.
    old_id = next(r["id"] for r in probe.table()["executables"] if r["name"] == "jit_f0")
    exes[0].traceback = FakeTraceback(FakeFrame("/src/b.py", 1))
    probe.scan()
    assert analysed == ["jit_f0"]
    out = probe.sample()
    assert out["full"] is False and out["gone"] == [old_id] and [r["name"] for r in out["executables"]] == ["jit_f0"]
    c = probe.sample(full=True)
    assert c["executables"] is not b["executables"] and c["functions"] is not b["functions"]
    assert probe._ordered


def test_changes_show_within_the_adaptive_interval():
    exes = counting_exes(200)
    client = FakeClient(*exes)
    # A CPU share so small that any pass waits the longest: max_interval_s.
    probe, clock = started_fake(client, budget_s=float("inf"), cpu_share=1e-12, max_interval_s=5.0,
                                full_every_s=1e9, verify_every_s=1e9)
    probe.sample()
    passes = len(probe._trend)
    for _ in range(600):  # a minute of ticks, nothing changing
        clock.t += 0.1
        assert probe.sample() is None
    assert 10 <= len(probe._trend) - passes <= 13  # every max_interval_s, not every interval_s
    assert probe._gap == 5.0

    def has(name):
        return lambda out: any(r["name"] == name for r in out.get("executables") or ())

    # Compiled without a compile event (e.g. loaded from elsewhere): within the bound.
    client.exes.insert(0, CountingExe("jit_quiet", FakeStats(temp=1), {}, FakeTraceback(FakeFrame("/src/c.py", 1))))
    took = tick_until(probe, clock, has("jit_quiet"), limit_s=5.0)
    assert took is not None and took <= 5.0 + 1e-9
    # A compile event: the next pass comes after interval_s.
    for _ in range(30):
        clock.t += 0.1
        probe.sample()
    import jaxtop.probes.executables as module

    client.exes.insert(0, CountingExe("jit_loud", FakeStats(temp=2), {}, FakeTraceback(FakeFrame("/src/c.py", 2))))
    probe._on_duration(module.BACKEND_COMPILE_EVENT, 0.25, fun_name="jit(loud)")
    took = tick_until(probe, clock, has("jit_loud"), limit_s=5.0)
    assert took is not None and took <= probe.interval_s + 1e-9
    loud = next(f for f in probe.table()["functions"] if f["name"] == "jit_loud")
    assert loud["compiles"] == 1 and loud["compiles_source"] == "monitoring" and loud["live"] == 1
    # Freed executables, no event: gone within the bound as well.
    gone_name = client.exes.pop(5).name
    gone_id = next(r["id"] for r in probe.table()["executables"] if r["name"] == gone_name)
    took = tick_until(probe, clock, lambda out: gone_id in (out.get("gone") or ()), limit_s=5.0)
    assert took is not None and took <= 5.0 + 1e-9
    assert probe.live_count() == 201 and probe._ordered


def test_executables_in_another_order_and_several_clients():
    first, second = counting_exes(20, "jit_a"), counting_exes(20, "jit_b")
    a, b = FakeClient(*first), FakeClient(*second)
    probe = fake_probe(a, b, budget_s=float("inf"), verify_every_s=1e9)
    probe.scan()
    assert probe.live_count() == 40
    # New ones first in each client's list: found by the walk, order kept.
    a.exes.insert(0, CountingExe("jit_a_new", FakeStats(), {}, FakeTraceback()))
    b.exes.insert(0, CountingExe("jit_b_new", FakeStats(), {}, FakeTraceback()))
    probe.scan()
    assert probe.live_count() == 42 and probe._ordered
    assert {"jit_a_new", "jit_b_new"} <= {r["name"] for r in probe.table()["executables"]}
    # A jaxlib that lists the newest last: still found, and from then on
    # every pass checks every executable.
    b.exes.append(CountingExe("jit_b_last", FakeStats(), {}, FakeTraceback()))
    probe.scan()
    assert not probe._ordered and probe.table()["pending"] == 0
    assert "jit_b_last" in {r["name"] for r in probe.table()["executables"]}
    CountingExe.reads = 0
    probe.scan()
    assert CountingExe.reads == 43


def test_functions_follow_executables_incrementally():
    big = CountingExe("jit_step", FakeStats(argument=100, temp=1000, generated_code=7), {}, FakeTraceback())
    small = CountingExe("jit_step", FakeStats(argument=10, temp=10, generated_code=5), {}, FakeTraceback())
    other = CountingExe("jit_eval", FakeStats(temp=3, generated_code=2, host_generated_code=4), {}, FakeTraceback())
    client = FakeClient(small, big, other)
    probe = fake_probe(client, budget_s=float("inf"))
    probe.scan()
    table = probe.table()
    step = next(f for f in table["functions"] if f["name"] == "jit_step")
    assert step["live"] == 2 and step["temp_bytes"] == 1000 and step["code_bytes"] == 12
    assert table["code_bytes"] == 7 + 5 + 2 + 4
    client.exes.remove(big)
    probe.scan(verify=True)
    table = probe.table()
    step = next(f for f in table["functions"] if f["name"] == "jit_step")
    assert step["live"] == 1 and step["temp_bytes"] == 10 and step["code_bytes"] == 5
    assert table["code_bytes"] == 5 + 2 + 4
    client.exes.remove(small)
    probe.scan()
    step = next(f for f in probe.table()["functions"] if f["name"] == "jit_step")
    assert step["live"] == 0 and step["temp_bytes"] is None and step["code_bytes"] is None
    assert probe.table()["code_bytes"] == 6


def test_a_new_function_is_kept_when_the_ledger_is_full():
    import jaxtop.probes.executables as module

    probe, clock = started_fake(max_functions=3)
    for name in ("a", "b", "c", "d"):
        probe._on_duration(module.BACKEND_COMPILE_EVENT, 0.1, fun_name=f"jit({name})")
        time.sleep(0.002)  # the oldest idle function goes first
    assert sorted(probe.functions()) == ["jit_b", "jit_c", "jit_d"]
    assert [f["compiles"] for f in probe.sample()["functions"] if f["name"] == "jit_d"] == [1]


def test_sample_before_start_and_when_unavailable():
    probe = fake_probe()
    assert probe.sample() is None  # not started: nothing to say
    probe.reason = "jax cannot be imported: boom"
    assert probe.sample() == {"available": False, "reason": "jax cannot be imported: boom"}
    assert probe.sample() is None  # said once per whole-table period
    assert probe.command({}) == {"jit_ledger": {"available": False, "reason": "jax cannot be imported: boom"}}


# -- the dashboard's store --------------------------------------------------------------------

T0 = 1_790_000_000.0


def exe(ident, name, temp, args=1024, out=512, code=0, site="/src/train.py:40"):
    return {"id": ident, "name": name, "fingerprint": str(ident), "argument_bytes": args, "output_bytes": out,
            "alias_bytes": 0, "temp_bytes": temp, "code_bytes": code, "peak_bytes": None, "flops": 1e6,
            "bytes_accessed": 4096.0, "call_site": site, "call_fn": "main", "first_t": T0}


def fn(name, compiles, live, temp, reasons=(), site="/src/train.py:40", args=1024, code=4096):
    return {"name": name, "compiles": compiles, "compiles_source": "monitoring", "compile_s": 0.5 * compiles,
            "live": live, "call_site": site, "defined_at": "/src/train.py:12", "first_t": T0, "last_t": T0 + 10,
            "reasons": list(reasons), "reasons_total": len(reasons), "argument_bytes": args, "output_bytes": 512,
            "alias_bytes": 0, "temp_bytes": temp, "peak_bytes": None, "flops": 2.5e9, "bytes_accessed": 1e6,
            "code_bytes": code}


def reason(t, old, new, line):
    return {"kind": "types", "call_site": f"/src/train.py:{line}", "call_fn": "main", "arg": "x", "old": old,
            "new": new, "t": t}


def fake_fields() -> list[dict]:
    """A run whose step function recompiles for new shapes, then leaks closures."""
    base = {"pending": 0, "compiles_unattributed": 0, "explain": {"enabled": True, "by": "jaxtop", "misses_total": 5}}
    step_reasons = [reason(T0 + 2, "f32[100,64]", "f32[200,64]", 31), reason(T0 + 3, "f32[200,64]", "f32[300,64]", 32),
                    reason(T0 + 4, "f32[300,64]", "f16[300,64]", 33)]
    full = dict(base, t=T0 + 1, full=True, live_count=2, code_bytes=8192, compiles_total=2, leak=None,
                functions=[fn("jit_train_step", 1, 1, 64 << 20, args=200 << 20),
                           fn("jit_eval", 1, 1, 1 << 20, site="/src/eval.py:7")],
                executables=[exe(1, "jit_train_step", 64 << 20), exe(2, "jit_eval", 1 << 20)], trend=[[T0 + 1, 2]])
    fields = [full]
    fields.append(dict(base, t=T0 + 5, full=False, live_count=5, code_bytes=20480, compiles_total=5, leak=None,
                       functions=[fn("jit_step", 4, 3, 436800, reasons=step_reasons, site="/src/train.py:33")],
                       executables=[exe(3, "jit_step", 0), exe(4, "jit_step", 0), exe(5, "jit_step", 436800)], gone=[]))
    leak = {"since_t": T0 + 6, "from_count": 5, "count": 45, "growth": 40, "seconds": 40.0, "passes": 40,
            "site": "/src/loop.py:9", "message": "live executables +40 in 40 s: jit closures created in a loop? (loop.py:9)"}
    for k in range(1, 41):
        t = T0 + 6 + k
        rows = [fn("jit__lambda", k, k, 0, site="/src/loop.py:9", args=32, code=0)]
        fields.append(dict(base, t=t, full=False, live_count=5 + k, code_bytes=20480, compiles_total=5 + k,
                           leak=leak if k >= 5 else None, functions=rows,
                           executables=[exe(5 + k, "jit__lambda", 0, args=32, out=32, site="/src/loop.py:9")],
                           gone=[2] if k == 40 else []))
    return fields


def samples(fields, pid=4242):
    return [{"type": "sample", "t": f["t"], "seq": n, "jit": f} for n, f in enumerate(fields, 1)]


def test_store_folds_full_tables_changes_and_replies():
    store = LedgerStore()
    recs = samples(fake_fields())
    events = [e for r in recs for e in store.feed_sample(4242, r)]
    v = store.view(4242)
    assert v.complete and v.live_count == 45
    names = {f.name: f for f in v.functions}
    assert set(names) == {"jit_train_step", "jit_eval", "jit_step", "jit__lambda"}
    assert names["jit_step"].compiles == 4 and names["jit_step"].recompiles == 3
    assert [r["new"] for r in names["jit_step"].reasons] == ["f16[300,64]", "f32[300,64]", "f32[200,64]"]
    assert len(v.executables) == 44 and 2 not in {e["id"] for e in v.executables}  # executable 2 was freed
    assert [g["id"] for g in v.gone] == [2]
    assert v.trend[0] == (T0 + 1, 2) and v.trend[-1] == (T0 + 46, 45) and v.trend_delta(60) == 43
    assert v.leak["site"] == "/src/loop.py:9"
    kinds = collections.Counter(text.split(" ")[0] for kind, text, t in events if kind == "jit")
    assert kinds == {"recompile": 3, "leak?": 1}  # each reason once, the flag once
    # A reply to the jit_ledger command is a whole table.
    reply = {"type": "reply", "t": T0 + 50, "ok": True,
             "result": {"jit_ledger": dict(fake_fields()[0], t=T0 + 50, gone_recent=[exe(9, "jit_old", 5)])}}
    assert store.feed_reply(4242, reply) is True
    assert store.feed_reply(4242, {"type": "reply", "result": {"path": "x"}}) is False
    v = store.view(4242)
    assert {f.name for f in v.functions} == {"jit_train_step", "jit_eval"} and [g["id"] for g in v.gone] == [9]
    # A stream joined in the middle is incomplete until its next whole table.
    late = LedgerStore()
    late.feed_sample(7, samples(fake_fields()[10:11])[0])
    assert not late.view(7).complete and late.view(7).live_count == 14
    # n/a with the reason; forget; adopt
    na = LedgerStore()
    na.feed_sample(8, {"type": "sample", "t": T0, "jit": {"available": False, "reason": "jax too old"}})
    assert na.view(8).available is False and na.view(8).reason == "jax too old"
    store.adopt(8, na)
    assert store.view(8).reason == "jax too old"
    store.forget(8)
    assert store.view(8) is None and store.view(None).pid == 4242


def render_text(renderable, width=120) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def test_jit_table_renders_sorted_with_reasons_and_the_flag():
    store = LedgerStore()
    for r in samples(fake_fields()):
        store.feed_sample(4242, r)
    v = store.view(4242)
    by_temp = [f.name for f in sort_functions(v.functions, "temp")]
    assert by_temp[:2] == ["jit_train_step", "jit_eval"]
    assert [f.name for f in sort_functions(v.functions, "compiles")][0] == "jit__lambda"
    assert [f.name for f in sort_functions(v.functions, "total")][0] == "jit_train_step"
    text = render_text(JitLedgerTable(v, sort="temp"))
    assert "⚠ live executables +40 in 40 s: jit closures created in a loop? (loop.py:9)" in text
    assert "live executables 45 (+43 in 60 s)" in text
    assert text.index("jit_train_step") < text.index("jit_eval") < text.index("jit_step")
    reasons = text[text.index("Recompile reasons, latest first"):]
    assert reasons.index("x f32[300,64] → f16[300,64] at train.py:33") < reasons.index("x f32[100,64] → f32[200,64] at train.py:31")
    for width, name in ((60, "jit_step"), (80, "jit_train_step"), (200, "jit_train_step")):
        # Narrow terminals lose columns first, then the ends of long names.
        narrow = render_text(JitLedgerTable(v, sort="code"), width=width)
        assert name in narrow and "JIT LEDGER" in narrow and "⚠ live executables +40" in narrow
    assert "No jit ledger from this process yet" in render_text(JitLedgerTable(None))


# -- the Jit screen in the app ---------------------------------------------------------------------

def hello(pid):
    return {"type": "hello", "t": T0, "protocol": 1, "pid": pid, "argv": ["train.py"], "started_t": T0,
            "versions": {"jax": "0.10.2"}, "backend": "cpu", "devices": [{"id": 0, "platform": "cpu"}],
            "interval_s": 1.0, "slow_interval_s": 1.0, "transfer_capture": {"available": True}, "nvml": {"available": False, "reason": "no driver"}}


def app_with_ledger(pid=4242):
    """The app on a pushed stream with a jit ledger, and the store it folds into."""
    src = PushSource()
    app = make_app(src, refresh_s=0.05)
    return src, app


def feed(src, app, pid=4242):
    store = app.model.ledgers if MODEL_FOLDS else LedgerStore()
    src.push(pid, hello(pid), update=False)
    for rec in samples(fake_fields(), pid):
        src.push(pid, rec, update=False)
        if not MODEL_FOLDS:
            store.feed_sample(pid, rec)
    src.on_update()
    return store


async def open_jit(pilot, app, src, store, pid=4242):
    await pilot.press("J")
    await pilot.pause(0.2)
    assert isinstance(app.screen, JitScreen)
    return app.screen


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    time.tzset()


async def test_jit_screen_keys(utc):
    src, app = app_with_ledger()
    async with app.run_test(size=(120, 40)) as pilot:
        store = feed(src, app)
        screen = await open_jit(pilot, app, src, store)
        assert ("jit_ledger" in [c[1] for c in src.commands])  # opening asks for the whole table
        text = render_text(screen._renderable())
        assert "sorted by temp bytes  esc/q/j back · s sort · r refresh" in text
        await pilot.press("s")
        assert screen.sort == "total" and "sorted by total bytes" in render_text(screen._renderable())
        await pilot.press("s", "s", "s")
        assert screen.sort == "temp"
        asked = len(src.commands)
        await pilot.press("r")
        assert len(src.commands) == asked + 1 and src.commands[-1][1] == "jit_ledger"
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, JitScreen)
        await open_jit(pilot, app, src, store)
        await pilot.press("q")  # closes the screen, not the app
        await pilot.pause(0.1)
        assert not isinstance(app.screen, JitScreen) and app.is_running


def test_jit_screen_snapshot(snap_compare, utc):
    src, app = app_with_ledger()
    holder = {}

    async def run_before(pilot):
        holder["store"] = feed(src, app)
        await open_jit(pilot, app, src, holder["store"])
        app.screen.redraw()
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=(120, 40), run_before=run_before)
