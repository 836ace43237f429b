"""The advisor judged against programs whose misses are known, recorded with
``jaxtop run --log`` (real children, real JAX on CPU).

- ``jaxtop demo``'s strategies as the oracle (tests/targets/advice_demo.py
  runs one strategy in one variant): the variant that misses a strategy
  does so at a statement of demo/strategies.py, and the advice must name
  that line; the variant that applies it must get none of its advice.
- A training loop that misses six strategies at lines marked ``# MISS
  <strategy>`` (tests/targets/advice_miss.py), and its twin that applies
  all six (tests/targets/advice_clean.py, marked ``# APPLIED <strategy>``).

Each recording is made once per module, at most two at a time (CI has 2
cores), in the order the selected tests ask for them. Some reports are read
with ``jaxtop advise FILE --json`` (the CLI), the others with the
:class:`~jaxtop.advice.Advisor` API.

The advice is judged over the steady loop: a window from the moment the
target says its loop is compiled and running (``ready t=`` of the demo,
``warm t=`` of the training loops) to its last sample. The default window
(the last minute) would hold the child's start-up too, jax's import and the
first compiles: 1.5 s on an idle machine, up to 13 s seen on a loaded
2-core one, most of the window of a loop that runs for a few seconds, in
which no rate rises (a real program runs for minutes).
"""

from __future__ import annotations

import ast
import concurrent.futures
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import PY, TARGETS, jaxtop_cmd
from jaxtop.advice.detectors.base import MIN_SPAN_S

pytestmark = pytest.mark.slow

DEMO = TARGETS / "advice_demo.py"
MISS = TARGETS / "advice_miss.py"
CLEAN = TARGETS / "advice_clean.py"
PUTS = TARGETS / "advice_puts.py"

#: Seconds of loop where the evidence is a rate. The advisor judges a rate
#: over at least 4 s of samples and wants it risen in two thirds of the
#: window's slices (of at least 2 s), the last ones included: 7 s are three
#: slices of 2.3 s or more, of which the first may pass before the advisor
#: counts a line's rises. It counts them from the line's first listing,
#: which came 0.1 to 1.2 s after the loop started, and again from the
#: moment the agent names another callee at the line (a line of two ops
#: given Python constants, ``h * 0.5 + 0.1``: 1.0 to 1.9 s after the start).
RATE_S = 7.0
#: Where the evidence is two memory profiles (5 s apart at the young
#: program's cadence, the first maybe before the loop, later when a loaded
#: machine stretches the cadence): 12 s of loop saw only one in 2 of ~4
#: runs beside other work (CI on 2 cores, 7 Dec); 18 s leaves room for three.
PUTS_S = 18.0
#: Where the evidence is the jit ledger and XLA's sizes, known once the
#: function compiled: the loop only has to run.
LEDGER_S = 2.0
#: Fragmentation is judged on the median of the holes among the live
#: buffers over the last 10 s (a buffer map about once a second, 6 to 9 of
#: them); the advisor's line is 25 %. On CPU, single maps of the demo's
#: mixed variant swing from 9 % to 69 %, and their medians over 17 runs went
#: from 21 % to 49 % (one under the line, one at 26 %); the uniform
#: variant's medians from 0 % to 31 % over 16 runs (one over the line, the
#: others 19 % at most). A longer loop would not steady them: the advisor
#: judges a level over its window's last 10 s (a third of it beyond 30 s).
FRAGMENTATION_S = 10.0
#: The run-ahead recording only has to show that it cannot be judged.
RUNAHEAD_S = 1.0
#: How long one child may take, start-up and a loaded machine included.
CHILD_TIMEOUT_S = 120
#: Children recorded at once: CI has 2 cores.
PARALLEL = 2


# -- where the advice must point -----------------------------------------------------

def _strategies_file() -> Path:
    """demo/strategies.py, found without importing it (it imports jax)."""
    spec = importlib.util.find_spec("jaxtop.demo.strategies")
    assert spec is not None and spec.origin, "jaxtop.demo.strategies is not importable"
    return Path(spec.origin).resolve()


STRATEGIES_PY = _strategies_file()


def demo_line(cls: str, method: str, statement: str) -> int:
    """The line of demo/strategies.py where ``statement`` starts, searched
    within ``cls.method`` (the same statement may be in two methods), or
    within the module's function ``method`` where ``cls`` is empty. Exactly
    one line must match."""
    source = STRATEGIES_PY.read_text()
    tree = ast.parse(source)
    scope: Any = tree
    if cls:
        scope = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next(n for n in scope.body if isinstance(n, ast.FunctionDef) and n.name == method)
    lines = source.splitlines()
    found = [i for i in range(fn.lineno, fn.end_lineno + 1) if lines[i - 1].strip().startswith(statement)]
    assert len(found) == 1, f"{statement!r} in {cls or '<module>'}.{method} of {STRATEGIES_PY}: lines {found}"
    return found[0]


def marked_lines(path: Path, mark: str) -> dict[str, list[int]]:
    """``{strategy: [line, ...]}`` from trailing comments ``# MARK a b``."""
    out: dict[str, list[int]] = {}
    for number, text in enumerate(path.read_text().splitlines(), 1):
        m = re.search(rf"#\s*{mark}\s+([\w ]+)$", text)
        if m:
            for strategy in m.group(1).split():
                out.setdefault(strategy, []).append(number)
    return out


# -- recordings: each made once, two at a time -----------------------------------------

@dataclass(frozen=True)
class Run:
    """One child: a target and its arguments."""

    script: Path
    args: tuple[str, ...]


def _demo(strategy: str, variant: str, seconds: float) -> Run:
    return Run(DEMO, (strategy, variant, f"{seconds:g}"))


@dataclass(frozen=True)
class Recorded:
    """A finished child: its recording, exit status, output and seconds."""

    key: str
    log: Path
    returncode: int
    stdout: str
    stderr: str
    wall_s: float

    def check(self) -> None:
        assert self.returncode == 0, (
            f"{self.key}: exit {self.returncode} after {self.wall_s:.1f} s: {self.stderr[-3000:]}")
        assert self.loop_t is not None and "steps=" in self.stdout, (self.key, self.stdout[-500:],
                                                                    self.stderr[-2000:])

    @property
    def loop_t(self) -> float | None:
        """When the steady loop started, on the samples' clock: the demo's
        ``ready t=`` (its variant compiled in prepare), the training loops'
        ``warm t=`` (after their first step, which compiles)."""
        m = re.search(r"^warm t=([\d.]+)$", self.stdout, re.M) or re.search(r"^ready t=([\d.]+)$", self.stdout, re.M)
        return float(m.group(1)) if m else None

    def loop_window_s(self) -> float:
        """From the loop's start to the last sample: the window to judge."""
        last = None
        with open(self.log, "rb") as f:
            for line in f:
                if b'"sample"' in line:
                    t = json.loads(line).get("t")
                    last = t if t is not None else last
        assert last is not None and self.loop_t is not None, f"{self.key}: no sample in {self.log}"
        return last - self.loop_t


class Recorder:
    """Records runs in a pool of :data:`PARALLEL` threads, each waiting on
    its ``jaxtop run --log`` child, in the order they were asked for."""

    def __init__(self, out: Path, env: dict[str, str]) -> None:
        self.out = out
        self.env = env
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=PARALLEL)
        self.futures: dict[str, concurrent.futures.Future] = {}
        self.reports: dict[tuple[str, str], dict[str, Any]] = {}
        self.procs: list[subprocess.Popen] = []
        self.lock = threading.Lock()
        self.closed = False

    def want(self, key: str) -> None:
        if key not in self.futures:
            self.futures[key] = self.pool.submit(self._record, key, RUNS[key])

    def get(self, key: str) -> Recorded:
        self.want(key)
        return self.futures[key].result()

    def _record(self, key: str, run: Run) -> Recorded:
        log = self.out / f"{key}.jsonl"
        start = time.monotonic()
        with self.lock:
            if self.closed:
                raise RuntimeError("the module's tests are over")
            proc = subprocess.Popen([PY, "-m", "jaxtop", "run", "--log", str(log), str(run.script), *run.args],
                                    env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self.procs.append(proc)
        try:
            stdout, stderr = proc.communicate(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        wall_s = time.monotonic() - start
        # Beside the recording, for reading a failure again.
        (self.out / f"{key}.out").write_text(f"{stdout}{stderr}exit {proc.returncode} after {wall_s:.1f} s\n")
        return Recorded(key, log, proc.returncode, stdout, stderr, wall_s)

    def report(self, key: str, how: str) -> dict[str, Any]:
        """The advice over the recording's loop, read once per way."""
        if (key, how) not in self.reports:
            self.reports[key, how] = advise(self.get(key), how)
        return self.reports[key, how]

    def close(self) -> None:
        with self.lock:
            self.closed = True
        self.pool.shutdown(wait=False, cancel_futures=True)
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        self.pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def recorder(request, tmp_path_factory):
    """The module's recordings. The children's env is conftest's
    ``child_env`` (function-scoped, so built again here): a private socket
    directory, CPU, no transfer guard from the environment. What the
    module's selected tests need is started at once, in their order."""
    sockdir = tempfile.mkdtemp(prefix="jt-")  # short: AF_UNIX paths are limited to 108 bytes
    env = dict(os.environ)
    env["JAXTOP_SOCKET_DIR"] = sockdir
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("JAX_TRANSFER_GUARD", None)
    # Under pytest's basetemp (the last few runs are kept): a failure's
    # recordings can be read again with `jaxtop advise`.
    rec = Recorder(tmp_path_factory.mktemp("advice-recordings"), env)
    here = Path(__file__).resolve()
    for item in request.session.items:
        if Path(str(item.fspath)).resolve() == here:
            for key in _needs(item):
                rec.want(key)
    yield rec
    rec.close()
    shutil.rmtree(sockdir, ignore_errors=True)


# -- reading the advice ----------------------------------------------------------------

def advise_cli(rec: Recorded, window_s: float) -> dict[str, Any]:
    """``jaxtop advise LOG --json --window S``: the one process's report."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = jaxtop_cmd("advise", rec.log, "--json", "--window", f"{window_s:.3f}", env=env, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert len(doc["processes"]) == 1, doc["processes"]
    assert doc["read"]["malformed"] == 0 and not doc["read"]["truncated"], doc["read"]
    return doc["processes"][0]


def advise_api(rec: Recorded, window_s: float) -> dict[str, Any]:
    """An :class:`Advisor` fed every record of the log, in order; its report
    in the shape ``jaxtop advise --json`` gives."""
    from jaxtop.advice import Advisor, advice_json
    from jaxtop.wire.records import decode

    advisor = Advisor(window_s=window_s)
    with open(rec.log, "rb") as f:
        for line in f:
            advisor.feed(decode(line))
    return advice_json(advisor.evaluate())


def advise(rec: Recorded, how: str) -> dict[str, Any]:
    """The report over the recording's loop, by the CLI or the API."""
    rec.check()
    window_s = rec.loop_window_s()
    return advise_cli(rec, window_s) if how == "cli" else advise_api(rec, window_s)


def of(report: dict[str, Any], strategy: str) -> list[dict[str, Any]]:
    return [a for a in report["advice"] if a["strategy"] == strategy]


def not_judged(report: dict[str, Any], strategy: str) -> list[str]:
    return [n["why"] for n in report["not_judged"] if n["strategy"] == strategy]


def brief(report: dict[str, Any]) -> list[str]:
    """The report in a few lines, for failure messages (after the first
    recording's, where this is a second look)."""
    return (report.get("first", [])
            + [f"{a['strategy']} {a['where']}: {a['evidence'][:200]}" for a in report["advice"]]
            + [f"not judged {n['strategy']}: {n['why'][:120]}" for n in report["not_judged"]]
            + [f"span {report['span_s']:.1f} s of a {report['window_s']:.1f} s window"])


def second_look(recorder: Recorder, key: str, how: str, first: dict[str, Any]) -> dict[str, Any]:
    """The report of the same variant recorded once more, for a level that
    noise can put on the wrong side of the advisor's line; the first
    report's lines ride along for a failure's message."""
    return {**recorder.report(key + "-again", how), "first": ["first recording:", *brief(first), "again:"]}


def same_file(a: str | None, b: Path) -> bool:
    return a is not None and os.path.realpath(a) == str(b.resolve())


# -- the demo as the oracle -------------------------------------------------------------

@dataclass(frozen=True)
class DemoCase:
    """A demo strategy: the variant that misses it and the one that applies
    it, the advice's strategy, and where the advice must point (a statement
    of demo/strategies.py; None: the whole program)."""

    demo: str
    advice: str
    miss: str
    fixed: str
    at: tuple[str, str, str] | None  # (class, method, statement)
    judge: str  # "cli" or "api"
    seconds: float = RATE_S
    rate: bool = True  # judged on rates: the window must hold MIN_SPAN_S of samples
    again: bool = False  # a noisy level: a variant judged wrong is recorded once more

    @property
    def keys(self) -> tuple[str, str]:
        return f"{self.demo}-{self.miss}", f"{self.demo}-{self.fixed}"


DEMO_CASES = (
    # A NumPy batch fed to the jitted step: the implicit copy's line.
    DemoCase("placement", "placement", "off", "on", ("Placement", "step", "out = self.fn(self.w, batch)"), "cli"),
    # The line whose call keeps the new state (the memory profile's site).
    # A profile comes every 5 s, the first before the loop may have started.
    DemoCase("donation", "donation", "off", "on",
             ("Donation", "step", "self.state = self.fns[variant](self.state, self.grad)"), "api", rate=False),
    # The eager concatenate recompiling at each new shape: its call. The
    # agent flags a storm at 30 compiles spread over 5 s, and the flag rides
    # on the next ledger: 7 s of a loaded 2-core machine's loop fell short
    # once, so the loop runs as long as the profiles' cases.
    DemoCase("inplace", "in_place", "off", "on",
             ("InPlace", "step", "self.grown = self.concat(self.grown, self.row)"), "cli", PUTS_S, rate=False),
    # One jitted call per item, from a comprehension.
    DemoCase("batching", "batching", "off", "on",
             ("Batching", "step", "outs = [self.one(self.w, item) for item in self.items]"), "api"),
    # The first op of _mlp given a Python constant (ops on device arrays
    # alone leave no per-call trace: the advice is at the first that does).
    DemoCase("jit", "jit", "off", "on", ("", "_mlp", "h = h * 0.5 + 0.1"), "cli"),
    # The jitted gradient's temporaries, at the line that compiled it: the
    # step's call (prepare warms it up through step, as a program's first
    # step compiles it).
    DemoCase("checkpointing", "checkpointing", "off", "on",
             ("Checkpointing", "step", "self.fns[variant](self.ws, self.x).block_until_ready()"), "api",
              LEDGER_S, rate=False),
    # "log" lets the copies through, logged: guard advice at the copy's
    # line. "disallow" refuses them: nothing to advise.
    DemoCase("guard", "guard", "log", "disallow", ("Guard", "step", "self.fn(self.x).block_until_ready()"), "cli"),
)

RUNS: dict[str, Run] = {}
for _case in DEMO_CASES:
    RUNS[_case.keys[0]] = _demo(_case.demo, _case.miss, _case.seconds)
    RUNS[_case.keys[1]] = _demo(_case.demo, _case.fixed, _case.seconds)
    if _case.again:  # recorded only when asked for
        RUNS[_case.keys[0] + "-again"] = RUNS[_case.keys[0]]
        RUNS[_case.keys[1] + "-again"] = RUNS[_case.keys[1]]
RUNS["guard-allow"] = _demo("guard", "allow", RATE_S)
RUNS["runahead-off"] = _demo("runahead", "off", RUNAHEAD_S)
RUNS["fragmentation-off"] = _demo("fragmentation", "off", FRAGMENTATION_S)
RUNS["miss"] = Run(MISS, (f"{RATE_S:g}",))
RUNS["puts"] = Run(PUTS, (f"{PUTS_S:g}",))
RUNS["puts-stacked"] = Run(PUTS, (f"{PUTS_S:g}", "stacked"))
RUNS["clean"] = Run(CLEAN, (f"{RATE_S:g}",))

#: The recordings of each test not parametrized by a DemoCase.
NEEDS = {
    "test_guard_disallow_refused_the_copies": ("guard-disallow",),
    "test_guard_allow_is_invisible": ("guard-allow",),
    "test_runahead_is_not_judged_on_cpu": ("runahead-off",),
    "test_fragmentation_is_not_judged_on_cpu": ("fragmentation-off",),
    "test_loop_misses_six_strategies_at_their_lines": ("miss",),
    "test_items_put_one_by_one_are_batching_and_stacked_are_not": ("puts", "puts-stacked"),
    "test_clean_twin_misses_none_of_the_six": ("clean",),
}


def _needs(item: Any) -> tuple[str, ...]:
    callspec = getattr(item, "callspec", None)
    case = callspec.params.get("case") if callspec is not None else None
    if isinstance(case, DemoCase):
        return case.keys
    return NEEDS.get(getattr(item, "originalname", item.name), ())


@pytest.mark.parametrize("case", DEMO_CASES, ids=lambda c: c.demo)
def test_demo_strategy_missed_and_applied(case, recorder):
    """The variant that misses the strategy gets its advice at the demo's
    own line; the variant that applies it gets none, though judged."""
    miss_key, fixed_key = case.keys
    missed = recorder.report(miss_key, case.judge)
    if case.again and not of(missed, case.advice):
        missed = second_look(recorder, miss_key, case.judge, missed)
    fixed = recorder.report(fixed_key, case.judge)
    if case.again and of(fixed, case.advice):
        fixed = second_look(recorder, fixed_key, case.judge, fixed)

    found = of(missed, case.advice)
    assert found, f"{miss_key}: no {case.advice} advice: {brief(missed)}"
    if case.at is None:
        assert all(a["file"] is None and a["line"] is None for a in found), found
    else:
        line = demo_line(*case.at)
        assert any(same_file(a["file"], STRATEGIES_PY) and a["line"] == line for a in found), (
            f"{miss_key}: {case.advice} advice not at strategies.py:{line} ({case.at[2]}): {brief(missed)}")

    assert not of(fixed, case.advice), f"{fixed_key}: {brief(fixed)}"
    # Judged, not passed over: a detector that could not judge gives no
    # advice either, and then "none" would say nothing.
    assert not not_judged(fixed, case.advice), f"{fixed_key}: {brief(fixed)}"
    if case.rate:
        assert fixed["span_s"] >= MIN_SPAN_S, f"{fixed_key}: {brief(fixed)}"


def test_guard_disallow_refused_the_copies(recorder):
    """The "disallow" variant, judged above to get no guard advice, did run
    its copies into the guard: each step's copy was refused."""
    rec = recorder.get("guard-disallow")
    rec.check()
    m = re.search(r"steps=(\d+) errors=(\d+)", rec.stdout)
    assert m and int(m.group(2)) == int(m.group(1)) > 0, rec.stdout


def test_guard_allow_is_invisible(recorder):
    """The "allow" variant copies implicitly too, but jaxtop cannot see it,
    by design: the demo's thread-local ``allow`` beats the process-wide
    ``log`` jaxtop sets to count the copies, so none is logged, none tied to
    a line, and no guard advice can come (nor placement advice)."""
    report = recorder.report("guard-allow", "cli")
    assert not of(report, "guard"), brief(report)
    assert not of(report, "placement"), brief(report)


def test_runahead_is_not_judged_on_cpu(recorder):
    """Run-ahead is memory in use beyond the live arrays: the CPU backend
    gives no allocator bytes (memory_stats() is None), so the advisor says
    it could not judge, and why, rather than that nothing queued up. (The
    default window: nothing here is a rate.)"""
    rec = recorder.get("runahead-off")
    rec.check()
    report = advise_cli(rec, 60.0)
    assert not of(report, "runahead"), brief(report)
    why = not_judged(report, "runahead")
    assert len(why) == 1 and "memory_stats" in why[0], brief(report)


def test_fragmentation_is_not_judged_on_cpu(recorder):
    """The demo's mixed sizes leave holes among its buffers on CPU (the
    demo's own holes metric), but a CPU has no device memory pool: holes
    among its buffers are the host heap's, and a real program's (Flax's
    miniGPT example: 61-86 %) read above the demo's (21-49 %). The advisor
    says it could not judge, and why; an allocator's fragmentation (a GPU's)
    is judged (tests/test_advice.py, tests/fixtures/synthetic_gpu.jsonl)."""
    rec = recorder.get("fragmentation-off")
    rec.check()
    report = advise_cli(rec, 60.0)
    assert not of(report, "fragmentation"), brief(report)
    why = not_judged(report, "fragmentation")
    assert len(why) == 1 and "no device memory pool" in why[0], brief(report)


# -- a loop that misses six, and its twin ----------------------------------------------

SIX = ("placement", "donation", "host_sync", "batching", "jit", "in_place")


@pytest.mark.parametrize("strategy", SIX)
def test_loop_misses_six_strategies_at_their_lines(strategy, recorder):
    """The strategy's advice at every line marked ``# MISS <strategy>``."""
    marks = marked_lines(MISS, "MISS")
    assert sorted(marks) == sorted(SIX), marks
    report = recorder.report("miss", "cli")
    found = of(report, strategy)
    for line in marks[strategy]:
        assert any(same_file(a["file"], MISS) and a["line"] == line for a in found), (
            f"no {strategy} advice at advice_miss.py:{line}: {brief(report)}")


def test_the_donation_fix_names_the_argument_the_step_replaces(recorder):
    """``step(params, batch)`` returns new parameters and a loss: the fix
    donates ``params`` by name (read from the compiled module), as code to
    paste, not a template."""
    report = recorder.report("miss", "cli")
    fixes = [a["fix"] for a in of(report, "donation") if same_file(a["file"], MISS)]
    assert fixes and fixes[0].startswith('jax.jit(step, donate_argnames=("params",))'), brief(report)


@pytest.mark.parametrize("strategy", SIX)
def test_clean_twin_misses_none_of_the_six(strategy, recorder):
    """The same loop with the six applied: no advice of the strategy, and
    the strategy judged. Host reads are the exception: the advisor knows the
    step's rate only from a line that copies host values into a jitted call,
    and the clean loop has none (every batch is put on the device ahead):
    its loss read every 100 steps (a few a second) is said to be not
    judged, with that reason, rather than advised on."""
    assert sorted(marked_lines(CLEAN, "APPLIED")) == sorted(SIX)
    report = recorder.report("clean", "api")
    assert report["span_s"] >= MIN_SPAN_S, brief(report)
    if strategy == "host_sync":
        assert "the step's rate is unknown" in " ".join(not_judged(report, strategy)), brief(report)
    else:
        assert not not_judged(report, strategy), brief(report)
    assert not of(report, strategy), brief(report)


def test_items_put_one_by_one_are_batching_and_stacked_are_not(recorder):
    """32 small ``jax.device_put``s a step (explicit: jax's guard logs none)
    are seen as 32 small arrays alive from the comprehension's line in the
    memory profiles: batching advice there, inferred; the same items as one
    stacked array get none."""
    (line,) = marked_lines(PUTS, "MISS")["batching"]
    report = recorder.report("puts", "api")
    found = [a for a in of(report, "batching") if same_file(a["file"], PUTS) and a["line"] == line]
    assert found and found[0]["basis"] == "inferred", brief(report)
    # 32 a step, or up to 64 where a profile caught the last step's list and the new one both alive.
    many = re.search(r"(\d+) arrays of 4 B each live from advice_puts.py", found[0]["evidence"])
    assert many and 32 <= int(many.group(1)) <= 64, brief(report)
    clean = recorder.report("puts-stacked", "api")
    assert not of(clean, "batching"), brief(clean)
