"""Budgets: the grammar and units, folding samples into measured values, the
check and its report; and real `jaxtop run --budget` children."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import NAMES_COMPILES, PY, RECOMPILES_NA, TARGETS, jaxtop_cmd
from jaxtop import budgets as b
from jaxtop import cli
from jaxtop.wire.records import from_dict

# -- the grammar ------------------------------------------------------------------


def test_the_full_example_spec_parses_and_round_trips():
    spec = "h2d=0,d2h=0,d2d=0,h2d_bytes=1MiB,compiles=3,recompiles=0,peak=2GiB,h2d_per_s=10,host_syncs=0"
    budget = b.parse_spec(spec)
    assert budget.spec() == spec
    assert b.parse_spec(budget.spec()) == budget
    values = {lim.name: lim.value for lim in budget.limits}
    assert values == {"h2d": 0, "d2h": 0, "d2d": 0, "h2d_bytes": 2**20, "compiles": 3, "recompiles": 0,
                      "peak": 2 * 2**30, "h2d_per_s": 10, "host_syncs": 0}


@pytest.mark.parametrize("text, expected", [
    ("peak=1KiB", 1024), ("peak=1KB", 1000), ("peak=1MiB", 2**20), ("peak=1MB", 10**6),
    ("peak=2GiB", 2 * 2**30), ("peak=2GB", 2 * 10**9), ("peak=1TiB", 2**40), ("peak=4096", 4096),
    ("peak=4096B", 4096), ("peak=1.5GiB", 3 * 2**29), ("peak=1.5gib", 3 * 2**29), ("peak = 3 MiB ", 3 * 2**20),
    ("peak=0.5KB", 500), ("peak=1.9B", 1),
])
def test_byte_units(text, expected):
    (limit,) = b.parse_spec(text).limits
    assert limit.value == expected


def test_spaces_and_a_trailing_comma_are_fine():
    assert b.parse_spec(" h2d = 0 , recompiles=2, ").spec() == "h2d=0,recompiles=2"


def test_rates_take_fractions_and_counts_do_not():
    assert b.parse_spec("h2d_per_s=0.5").limits[0].value == 0.5
    with pytest.raises(b.BudgetError, match="whole number"):
        b.parse_spec("compiles=1.5")


@pytest.mark.parametrize("text, message", [
    ("", "empty budget"),
    (" , ", "empty budget"),
    ("h2d", "not NAME=VALUE"),
    ("h2x=0", "unknown name 'h2x'; did you mean 'h2d'"),
    ("h2d=0,h2d=1", "h2d is given twice"),
    ("h2d=1MiB", "h2d counts implicit host-to-device transfers; it takes a whole number without a unit"),
    ("peak=2XB", "unknown unit 'XB'"),
    ("peak=-1", "must be >= 0"),
    ("peak=lots", "not a number with a unit"),
    ("peak=", "not a number"),
    ("compiles=nan", "not a number"),
    ("h2d_per_s=3MiB", "a rate is a number per second"),
])
def test_bad_specs_say_what_is_wrong(text, message):
    with pytest.raises(b.BudgetError) as exc:
        b.parse_spec(text, source="--budget")
    assert message in str(exc.value)
    assert str(exc.value).startswith("--budget")


def test_every_name_is_documented():
    doc = (TARGETS.parent.parent / "docs" / "budgets.md").read_text()
    for name in b.METRICS:
        assert f"`{name}`" in doc, name


def test_pyproject_table(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text('[project]\nname = "x"\n\n[tool.jaxtop.budget]\nh2d = 0\npeak = "2GiB"\nh2d_per_s = 1.5\n')
    budget = b.load_pyproject(path)
    assert budget.spec() == "h2d=0,peak=2GiB,h2d_per_s=1.5"
    assert "[tool.jaxtop.budget]" in budget.source
    assert b.resolve(str(path)).spec() == budget.spec()
    path.write_text('[project]\nname = "x"\n')
    assert b.load_pyproject(path) is None
    with pytest.raises(b.BudgetError, match="no \\[tool.jaxtop.budget\\] table"):
        b.resolve(str(path))
    path.write_text("[tool.jaxtop.budget]\nh2d = true\n")
    with pytest.raises(b.BudgetError, match="must be a number"):
        b.load_pyproject(path)
    path.write_text("[tool.jaxtop.budget\n")
    with pytest.raises(b.BudgetError, match="not valid TOML"):
        b.load_pyproject(path)
    with pytest.raises(b.BudgetError, match="neither limits"):
        b.resolve(str(tmp_path / "missing.toml"))


def test_pyproject_without_a_toml_reader_is_a_clear_error(tmp_path, monkeypatch):
    """Python 3.10 without tomli: say what to install."""
    path = tmp_path / "pyproject.toml"
    path.write_text("[tool.jaxtop.budget]\nh2d = 0\n")
    monkeypatch.setitem(sys.modules, "tomllib", None)
    monkeypatch.setitem(sys.modules, "tomli", None)
    with pytest.raises(b.BudgetError, match="Python 3.11\\+ or the tomli package"):
        b.load_pyproject(path)


# -- measured values and the check ----------------------------------------------------


def sample(t, h2d=0, h2d_bytes=0, unknown=0, shapes=(), compiles=0, devices=(), peak_rss=None, **fields):
    transfers = {d: {"count_total": 0, "bytes_known_total": 0, "count_bytes_unknown_total": 0}
                 for d in ("h2d", "d2h", "d2d")}
    transfers["h2d"] = {"count_total": h2d, "bytes_known_total": h2d_bytes, "count_bytes_unknown_total": unknown}
    transfers["top_shapes"] = [{"direction": "h2d", "shape": s, "count": n} for s, n in shapes]
    rec = {"type": "sample", "t": t, "seq": int(t * 10), "transfers": transfers,
           "compile": {"count_total": compiles}, "devices": list(devices),
           "process": {"rss_bytes": 1, "peak_rss_bytes": peak_rss}}
    rec.update(fields)
    return rec


def gpu(dev_id, in_use, peak):
    return {"id": dev_id, "source": "memory_stats", "bytes_in_use": in_use, "peak_bytes_in_use": peak}


def cpu(dev_id, live, scanned_t, top=None):
    rec = {"id": dev_id, "source": "live_arrays", "bytes_in_use": live,
           "live_arrays": {"bytes": live, "scanned_t": scanned_t}}
    if top is not None:
        rec["live_arrays"]["top"] = top
    return rec


def fold(spec, start, during, end, **finish):
    """``start``, ``during`` and ``end`` (sample dicts) read as the meter reads
    the agent's lines: decoded into typed records first."""
    budget = b.parse_spec(spec)
    start_reading = b.Reading.from_sample(from_dict(start)) if start is not None else None
    state = b.WindowState(budget, start_reading, start_t=start["t"] if start is not None else 100.0)
    for rec in during:
        state.observe(b.Reading.from_sample(from_dict(rec)))
    measured = state.finish(b.Reading.from_sample(from_dict(end)), end_t=end["t"], **finish)
    return b.check(budget, measured, {"what": "test", "seconds": end["t"] - state.start_t})


def result(report, name):
    (r,) = [r for r in report.results if r.limit.name == name]
    return r


def test_totals_are_counted_over_the_window_only():
    start = sample(100.0, h2d=7, h2d_bytes=700, shapes=[("float32[8]", 7)], compiles=4)
    during = [sample(100.1, h2d=8, h2d_bytes=800, shapes=[("float32[8]", 8)], compiles=4),
              sample(100.2, h2d=10, h2d_bytes=1000, shapes=[("float32[8]", 8), ("int32[2]", 2)], compiles=5)]
    end = sample(100.3, h2d=10, h2d_bytes=1000, shapes=[("float32[8]", 8), ("int32[2]", 2)], compiles=5)
    report = fold("h2d=2,h2d_bytes=1KB,compiles=0,h2d_per_s=100", start, during, end)
    h2d = result(report, "h2d")
    assert (h2d.status, h2d.measured.value) == ("exceeded", 3)
    assert h2d.measured.first_exceeded_s == pytest.approx(0.2)
    assert h2d.measured.data["shapes"] == [{"shape": "int32[2]", "count": 2}, {"shape": "float32[8]", "count": 1}]
    assert result(report, "h2d_bytes").measured.value == 300
    assert result(report, "h2d_bytes").status == "ok"
    assert result(report, "compiles").status == "exceeded"
    assert result(report, "compiles").measured.first_exceeded_s == pytest.approx(0.2)
    assert result(report, "h2d_per_s").measured.value == pytest.approx(10.0)
    assert [r.limit.name for r in report.exceeded] == ["h2d", "compiles"]


def test_exact_totals_win_over_a_lagging_sample():
    start, end = sample(100.0, h2d=1), sample(100.5, h2d=3)
    report = fold("h2d=2", start, [], end, exact={"h2d": 5, "d2h": 0, "d2d": 0, "compiles": 0})
    assert result(report, "h2d").measured.value == 5


def test_bytes_are_a_lower_bound_when_lines_carry_no_shape():
    report = fold("h2d_bytes=1GiB", sample(100.0), [], sample(101.0, h2d=3, h2d_bytes=64, unknown=2))
    r = result(report, "h2d_bytes")
    assert r.measured.value == 64 and r.status == "ok"
    assert "lower bound: 2 transfer(s) logged no shape" in r.measured.note


def test_uncounted_transfers_are_na_never_zero():
    report = fold("h2d=0,d2h=0,transfers=0", sample(100.0), [], sample(101.0),
                  transfer_na={"h2d": "transfers not counted: stderr capture is off"})
    assert result(report, "h2d").status == "n/a"
    assert result(report, "h2d").measured.value is None
    assert "stderr capture is off" in result(report, "h2d").measured.na
    assert result(report, "d2h").status == "ok"
    assert result(report, "transfers").status == "n/a"
    assert report.ok  # n/a does not fail...
    assert [r.limit.name for r in report.unchecked] == ["h2d", "transfers"]  # ...but is listed
    assert re.search(r"^  h2d +n/a: transfers not counted: stderr capture is off$", report.text(), re.M)


def test_host_syncs_are_not_measured_until_a_probe_sends_them():
    report = fold("host_syncs=0,host_syncs_per_step=1", sample(100.0), [], sample(101.0))
    for name in ("host_syncs", "host_syncs_per_step"):
        r = result(report, name)
        assert r.status == "n/a" and r.measured.na == "not measured by this jaxtop"
    assert re.search(r"^  host_syncs +n/a: not measured by this jaxtop$", report.text(), re.M)
    # The field plugs in: a probe that sends it is read, over the window.
    start = sample(100.0, host_syncs={"available": True, "count": 4, "per_step_max": 1})
    end = sample(101.0, host_syncs={"available": True, "count": 9, "per_step_max": 3})
    report = fold("host_syncs=2,host_syncs_per_step=2", start, [], end)
    assert (result(report, "host_syncs").measured.value, result(report, "host_syncs").status) == (5, "exceeded")
    assert result(report, "host_syncs_per_step").measured.value == 3
    # A probe that says it is not counting is n/a too.
    end = sample(101.0, host_syncs={"available": False, "reason": "off", "count": 0})
    assert result(fold("host_syncs=0", sample(100.0), [], end), "host_syncs").status == "n/a"


def test_a_gpu_peak_is_isolated_only_when_the_window_sets_a_new_one():
    start = sample(100.0, devices=[gpu(0, 100, 5000), gpu(1, 100, 800)])
    # A new process-wide maximum during the window: exact, with its device and time.
    during = [sample(100.2, devices=[gpu(0, 100, 5000), gpu(1, 900, 6000)])]
    end = sample(100.4, devices=[gpu(0, 100, 5000), gpu(1, 100, 6000)])
    report = fold("peak=5500", start, during, end)
    r = result(report, "peak")
    assert (r.status, r.measured.value, r.measured.data["device"]) == ("exceeded", 6000, 1)
    assert r.measured.first_exceeded_s == pytest.approx(0.2)
    # No new maximum: the window's own peak is unknown, at most the old one.
    flat = sample(100.4, devices=[gpu(0, 100, 5000), gpu(1, 100, 800)])
    within = result(fold("peak=8000", start, [], flat), "peak")
    assert within.status == "ok" and within.measured.value is None and within.measured.at_most == 5000
    assert "at most 4.88 KiB <= 7.81 KiB: ok" in fold("peak=8000", start, [], flat).text()
    unknown = result(fold("peak=1000", start, [], flat), "peak")
    assert unknown.status == "n/a" and unknown.measured.value is None
    assert "process-lifetime maximum" in unknown.measured.na
    # From the process's start (jaxtop run): the lifetime peak is the run's.
    report = fold("peak=1000", None, [], flat)
    assert result(report, "peak").measured.value == 5000


def test_a_cpu_peak_comes_from_live_array_scans_within_the_window():
    top = [{"nbytes": 4096, "dtype": "float32", "shape": "[32, 32]"}]
    start = sample(100.0, devices=[cpu(0, 50, 99.9)])
    during = [sample(100.1, devices=[cpu(0, 50, 99.9)]),  # scanned before the window: not the window's
              sample(100.2, devices=[cpu(0, 9000, 100.2, top)]),
              sample(100.3, devices=[cpu(0, 300, 100.3)])]
    end = sample(100.4, devices=[cpu(0, 300, 100.4)])
    report = fold("peak=8000,in_use=100", start, during, end)
    peak = result(report, "peak")
    assert (peak.status, peak.measured.value) == ("exceeded", 9000)
    assert "live-array bytes, sampled" in peak.measured.note
    assert any("float32[32, 32]" in line for line in peak.measured.detail)
    assert result(report, "in_use").measured.value == 300
    stale = fold("in_use=100", start, [], end, end_scanned=False)
    assert result(stale, "in_use").status == "n/a"


def test_recompiles_name_the_function_and_call_site():
    sites = [b.CompileSite("jit(step)", "train.py:12 (main)", count=3, recompiled_t=100.25),
             b.CompileSite("jit(init)", "train.py:5 (main)", count=1)]
    report = fold("recompiles=0,compiles=10", sample(100.0), [], sample(101.0), compile_sites=sites,
                  exact={"compiles": 4})
    r = result(report, "recompiles")
    assert (r.status, r.measured.value, r.measured.first_exceeded_s) == ("exceeded", 2, pytest.approx(0.25))
    assert r.measured.detail == ["jit(step) at train.py:12 (main): compiled 3 times (2 recompile(s))"]
    text = report.text()
    assert text.splitlines()[0].startswith("jaxtop budget exceeded: recompiles (test, 1.00 s; budget")
    assert "jit(step) at train.py:12 (main)" in text
    unknown = fold("recompiles=0", sample(100.0), [], sample(101.0), compile_sites=None,
                   compile_na="this jax does not name compiled functions")
    assert result(unknown, "recompiles").status == "n/a"


def test_report_json():
    report = fold("h2d=0,peak=1GiB", sample(100.0), [], sample(101.0, h2d=2, shapes=[("float32[4]", 2)]))
    data = json.loads(json.dumps(report.to_json()))
    assert data["jaxtop_budget_report"] == 1
    assert data["ok"] is False and data["exceeded"] == ["h2d"] and data["not_checked"] == ["peak"]
    h2d = data["limits"][0]
    assert h2d == {**h2d, "name": "h2d", "kind": "count", "limit": 0, "status": "exceeded", "value": 2}
    assert h2d["detail"]["shapes"] == [{"shape": "float32[4]", "count": 2}]
    assert data["limits"][1]["value"] is None and data["limits"][1]["status"] == "n/a"


def test_check_reports_a_missing_measurement_as_na():
    report = b.check(b.parse_spec("h2d=0"), {})
    assert result(report, "h2d").status == "n/a"
    assert result(report, "h2d").measured.na == "not measured by this jaxtop"


def test_sizes_read_as_everywhere_in_jaxtop_and_unknowns_as_na():
    """Three significant digits, and "n/a" (never "?") for what is unknown."""
    start = sample(100.0, devices=[gpu(0, 0, 0)])
    end = sample(100.5, devices=[gpu(0, 2**30, 2 * 2**30)])
    text = fold("peak=1.5GiB", start, [], end).text()
    assert re.search(r"^  peak  2\.00 GiB > 1\.50 GiB  peak device memory", text, re.M)
    assert b.fmt_value("bytes", None) == b.fmt_value("count", None) == b.fmt_value("rate", None) == "n/a"
    assert b.fmt_value("bytes", 3 * 2**29) == "1.50 GiB"
    # A buffer whose size was not sent.
    top = [{"dtype": "float32", "shape": "[4]"}]
    cpu_end = sample(100.4, devices=[cpu(0, 9000, 100.4, top)])
    peak = result(fold("peak=10", sample(100.0, devices=[cpu(0, 0, 99.9)]), [], cpu_end), "peak")
    assert "largest live buffers then: float32[4] n/a" in peak.measured.detail


def test_compile_sites_skip_every_frame_of_jaxtop():
    """The compile log lives in a sub-package: the frames it skips (the one
    frame filter's core libraries) are still the whole of jaxtop's, not just
    its own folder's, and a call from jaxtop alone has no call site."""
    import jaxtop
    from jaxtop.agent import agent
    from jaxtop.budgets import compile_log
    from jaxtop.probes.frames import LIBRARY

    assert all(LIBRARY.is_core(m.__file__) for m in (jaxtop, agent, compile_log))
    log = compile_log.CompileLog()

    def listener():  # where jax.monitoring's listener would be
        return log._site()

    assert listener().endswith("(test_compile_sites_skip_every_frame_of_jaxtop)")



# -- the command line ---------------------------------------------------------------


def test_run_options_and_exit_status():
    own, program = cli.split_run_argv(["--budget", "h2d=0", "--budget-report", "r.json", "x.py", "--budget", "y"])
    assert own == ["--budget", "h2d=0", "--budget-report", "r.json"]
    assert program == ["x.py", "--budget", "y"]
    args = cli.build_parser().parse_args(["run", *own])
    assert (args.budget, args.budget_report) == ("h2d=0", "r.json")
    assert cli.EXIT_BUDGET == b.EXIT_BUDGET == 3
    assert "  3    `run --budget`" in cli.EXIT_STATUS_HELP
    used = {int(line.split()[0]) for line in cli.EXIT_STATUS_HELP.splitlines()[1:] if line[:5].strip().isdigit()}
    assert sorted(used) == [0, 1, 2, 3, 130, 141, 143]


def test_a_bad_budget_stops_the_run_before_the_program(child_env, tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "prog.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    run = jaxtop_cmd("run", "--budget", "h2d=1MiB", script, env=child_env)
    assert run.returncode == 2
    assert b"--budget: h2d=1MiB: h2d counts implicit host-to-device transfers" in run.stderr
    assert not marker.exists()
    run = jaxtop_cmd("run", "--no-capture", "--budget", "h2d=0", script, env=child_env)
    assert run.returncode == 2 and b"--no-capture turns transfer counting off" in run.stderr
    assert not marker.exists()


# -- real runs -------------------------------------------------------------------------

LOOP = TARGETS / "budget_loop.py"
STEPS = 7


@pytest.mark.slow
def test_a_program_within_its_budget_runs_as_usual(child_env, tmp_path):
    plain = subprocess.run([PY, str(LOOP), "device", str(STEPS)], env=child_env, capture_output=True, timeout=120)
    assert plain.returncode == 0, plain.stderr[-2000:]
    report = tmp_path / "report.json"
    run = jaxtop_cmd("run", "--budget", "h2d=0,d2h=0,recompiles=0,compiles=10,h2d_bytes=0", "--budget-report",
                     report, LOOP, "device", STEPS, env=child_env, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout == plain.stdout
    if NAMES_COMPILES:
        assert run.stderr == plain.stderr  # nothing from jaxtop
    else:  # the program's stderr, then the limit jaxtop could not check
        assert run.stderr.startswith(plain.stderr) and RECOMPILES_NA.encode() in run.stderr
    data = json.loads(report.read_text())
    assert data["ok"] is True and data["program_failed"] is False
    assert {lim["name"]: lim["value"] for lim in data["limits"]}["h2d"] == 0
    assert 1 <= {lim["name"]: lim["value"] for lim in data["limits"]}["compiles"] <= 10


@pytest.mark.slow
def test_a_program_feeding_numpy_batches_goes_over_budget(child_env, tmp_path):
    """It ends with sys.exit(0): a success, so the budget decides the status."""
    report = tmp_path / "report.json"
    run = jaxtop_cmd("run", "--budget", "h2d=0,recompiles=0", "--budget-report", report,
                     LOOP, "numpy", STEPS, env=child_env, timeout=120)
    assert run.returncode == b.EXIT_BUDGET == 3, run.stderr[-2000:]
    assert run.stdout.startswith(b"numpy: 7 steps")
    err = run.stderr.decode()
    assert err.startswith("a line of the program's own on stderr\n")
    assert "jaxtop run: budget exceeded: h2d (the run" in err
    assert re.search(rf"^  h2d +{STEPS} > 0  implicit host-to-device transfers; first over the limit [0-9.]+ s in$",
                     err, re.M)
    assert "float32[32,128] x1" in err and f"(cached call, shape not logged) x{STEPS - 1}" in err
    assert re.search(r"^  recompiles +0 <= 0: ok$", err, re.M) if NAMES_COMPILES else RECOMPILES_NA in err
    data = json.loads(report.read_text())
    assert data["exceeded"] == ["h2d"]
    h2d = data["limits"][0]
    assert h2d["value"] == STEPS and h2d["first_exceeded_s"] is not None
    assert {"shape": "float32[32,128]", "count": 1} in h2d["detail"]["shapes"]


@pytest.mark.slow
def test_a_failing_program_keeps_its_exit_status_and_traceback(child_env, tmp_path):
    plain = subprocess.run([PY, str(LOOP), "raise", str(STEPS)], env=child_env, capture_output=True, timeout=120)
    assert plain.returncode == 1
    report = tmp_path / "report.json"
    run = jaxtop_cmd("run", "--budget", "h2d=0", "--budget-report", report, LOOP, "raise", STEPS,
                     env=child_env, timeout=120)
    assert run.returncode == 1
    assert run.stdout == plain.stdout
    assert run.stderr == plain.stderr  # the traceback, and nothing from jaxtop
    assert run.stderr.rstrip().endswith(b"RuntimeError: the program's own failure")
    data = json.loads(report.read_text())  # the JSON report is still written
    assert data["program_failed"] is True and data["exceeded"] == ["h2d"]


def test_a_lower_bound_over_the_limit_is_exceeded_and_under_it_is_not_a_pass():
    from jaxtop.budgets.report import Measured, check
    from jaxtop.budgets.spec import parse_spec

    budget = parse_spec("host_syncs=2")
    over = check(budget, {"host_syncs": Measured(value=3.0, note="some reads unseen", lower_bound=True)})
    assert over.results[0].status == "exceeded" and not over.ok
    under = check(budget, {"host_syncs": Measured(value=1.0, note="some reads unseen", lower_bound=True)})
    assert under.results[0].status == "n/a" and under.unchecked
    assert "host_syncs  n/a: at least 1, some reads unseen" in under.text()
    assert under.to_json()["limits"][0]["lower_bound"] is True
    exact = check(budget, {"host_syncs": Measured(value=1.0)})
    assert exact.results[0].status == "ok"
