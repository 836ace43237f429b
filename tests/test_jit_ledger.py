"""The jit ledger: the probe in real JAX children, the dashboard's store, the Jit screen.

Children run ``tests/targets/jit_ledger*.py``. Where the agent keeps the
ledger itself they run under ``jaxtop run --log``; before that, each child
instruments itself and adds the probe with public APIs (``--inprocess``).
The assertions are the same either way: they read the recording.
"""

from __future__ import annotations

import collections
import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PY, TARGETS, jaxtop_cmd
from jaxtop.wire import protocol
from jaxtop.dashboard.ledger import LedgerStore, describe_reason, short_site
from jaxtop.dashboard.model import Model
from jaxtop.probes.executables import CacheMissFilter, name_key, parse_cache_miss
from jaxtop.wire.records import JitReason, from_dict

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
                store.feed_sample(pid, from_dict(rec))
    return store.view(pid)


def as_reason(parsed: dict) -> JitReason:
    """A parsed cache-miss record as the dashboard reads it: a recompile
    reason of a function row, decoded from a sample."""
    sample = from_dict({"type": "sample", "t": 1.0, "jit": {"functions": [{"name": "f", "reasons": [parsed]}]}})
    assert not sample.odd, sample.odd
    (reason,) = sample.jit.functions[0].reasons
    return reason


def sizes(row) -> tuple:
    return tuple(row[k] for k in ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "code_bytes"))


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
    assert describe_reason(as_reason(r)) == f"x {old} → {new}{' (+1 more)' if len(r.get('diffs', ())) > 1 else ''} at train.py:{line}"


def test_cache_miss_other_kinds():
    assert parse_cache_miss("something else") is None
    new = parse_cache_miss(MISS_NEW)
    assert new["kind"] == "new_function" and new["key"] == "jit_step" and new["call_site"] == "/src/train.py:19"
    loop = parse_cache_miss(MISS_LOOP)
    assert loop["kind"] == "redefined" and loop["key"] == "jit__lambda"
    kw = parse_cache_miss(MISS_KWARGS)
    assert kw["kind"] == "other" and "keyword args" in kw["text"] and "arg" not in kw
    assert "keyword args" in describe_reason(as_reason(kw))


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


STATIC_FLIP = """TRACING CACHE MISS at /tmp/static.py:7 (<module>):
  all previously seen cache keys differ. For the closest previous key:
  different input pytree:
  * at input path [1]['train'], now <class 'jax._src.tree_util.Static'> with pytree metadata Static(val=False) \
and before <class 'jax._src.tree_util.Static'> with pytree metadata Static(val=True), so the pytree node metadata \
does not match"""
STATIC_OBJECT = STATIC_FLIP.replace("[1]['train']", "[0][1]").replace(
    "Static(val=False)", "Static(val=<__main__.Cfg object at 0x7fa456082ed0>)").replace(
    "Static(val=True)", "Static(val=<__main__.Cfg object at 0x7fa456059910>)")


def test_a_static_argument_flip_is_its_own_kind_worded_plainly():
    """jax words a static argument's change as a pytree-metadata difference
    (jax 0.10.2's text above): the ledger names the argument and its values,
    not the Static(val=...) repr, and says when the values print alike."""
    from jaxtop.dashboard.ledger import describe_reason

    flip = parse_cache_miss(STATIC_FLIP)
    assert (flip["kind"], flip["arg"], flip["old"], flip["new"]) == ("static", "train", "True", "False")
    assert describe_reason(as_reason(flip)) == "static argument train: True → False at static.py:7"
    obj = parse_cache_miss(STATIC_OBJECT)
    assert (obj["kind"], obj["arg"], obj["old"], obj["new"], obj["same_repr"]) == (
        "static", "#1", "a Cfg object", "a Cfg object", True)
    assert "both print alike" in describe_reason(as_reason(obj)) and "Static(" not in describe_reason(as_reason(obj))


def test_a_raw_binary_fingerprint_goes_on_the_wire_as_hex():
    """A TPU's executables give their fingerprint as a raw 32-byte digest
    (recorded on a v5e: ESC and other controls among its bytes); CPU's is
    printable text and stays as it is."""
    digest = bytes(range(0, 256, 8))
    probe = fake_probe(FakeClient(FakeExe("jit_tpu", FakeStats(), {}, None, fingerprint=digest),
                                  FakeExe("jit_cpu", FakeStats(), {}, None, fingerprint=b"a1b2c3")))
    probe.scan()
    rows = {r["name"]: r for r in probe.table()["executables"]}
    assert rows["jit_tpu"]["fingerprint"] == digest.hex()
    assert rows["jit_cpu"]["fingerprint"] == "a1b2c3"


def test_an_explanation_jaxtop_could_not_parse_keeps_what_changed_not_jaxs_preamble():
    from jaxtop.dashboard.ledger import JitReason, describe_reason

    text = ("TRACING CACHE MISS at /w/train.py:55 (main) costing 12.1 ms because:\n"
            "  for step defined at /w/train.py:20\n"
            "  a new kind of change jax words differently: the mesh axis 'data' grew from 4 to 8")
    line = describe_reason(JitReason(kind="other", text=text), site=False)
    assert line == "a new kind of change jax words differently: the mesh axis 'data' grew from 4 to 8"
