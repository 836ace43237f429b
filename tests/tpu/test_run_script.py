"""tools/tpu/run.sh, without a chip: its syntax, its help, and its chip mode
driven end to end with a stand-in Python that records how it was called.

What the chip itself answers is tests/tpu's other tests' business; this holds
the script to what it promises around them: the wheels installed into a
prefix appended to PYTHONPATH, every step run in order from a scratch
directory with ``python -P`` on the TPU (never a silent CPU fallback), each
step's status in summary.txt, and the exit status.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "tpu" / "run.sh"

#: Answers what run.sh asks of the machine's Python, and logs each call:
#: working directory, PYTHONPATH, JAX_PLATFORMS, JAXTOP_REQUIRE_TPU, arguments.
FAKE_PYTHON = r"""#!/usr/bin/env bash
printf '%s\t%s\t%s\t%s\t%s\n' "$PWD" "${PYTHONPATH:-}" "${JAX_PLATFORMS:-}" "${JAXTOP_REQUIRE_TPU:-}" "$*" >>"$FAKE_LOG"
args="$*"
prefix=${PYTHONPATH##*:}
case $args in
  *sys.version_info*) echo 3.11 ;;
  "-c import jax; print(jax.__version__)") echo 0.10.2 ;;
  *'version("libtpu")'*) echo 0.0.42.1 ;;
  "-m pip install "*) for a in "$@"; do [ "$prev" = --target ] && mkdir -p "$a/jaxtop"; prev=$a; done; echo installed ;;
  "-P -c import jax, jaxtop"*) echo "jaxtop 0.1.0 $prefix/jaxtop/__init__.py"; echo "jax 0.10.2 /machine/jax/__init__.py" ;;
  *tests/tpu/cost.py*) out=${args##*--json-out }; echo '{"rows": []}' >"$out"; echo "arrays 10,000: met" ;;
  "-P -m pytest "*) echo "9 passed" ;;
  "-P -m jaxtop demo --headless --json") echo '{"rows": []}'; exit 1 ;;
  "-P -m jaxtop.demo.headless --markdown") echo "| table |" ;;
  *benchmarks/largest_free_block.py*) echo '{"bound": true}' ;;
  *targets/fill.py*) touch "$JAXTOP_OOM_DIR/jaxtop-oom-1-20261206.json"; echo "RESOURCE_EXHAUSTED" >&2; exit 1 ;;
  "-P -m jaxtop run --log "*) echo "done 2000" ;;
  "-P -m jaxtop run "*targets/train.py*) echo "done 2200" ;;
  "-P -m jaxtop snapshot --timeout 1 "*) exit 0 ;;
  "-P -m jaxtop snapshot "*) echo "pid 1 snapshot text" ;;
  *tools/tpu/screen.py*) echo "----- ${args#*screen.py } -----" ;;
  *tests/transfer_oracle.py*) out=${args#*--json-out }; out=${out%% *}; echo '{"lines": []}' >"$out" ;;
  *tools/tpu/compare_sites.py*) echo "train.py:62 h2d 398 398" ;;
  *"benchmarks/transfer_sites.py --platform tpu"*) out=${args##*--json-out }; echo '{}' >"$out"; echo "paced sites: 0.77 %" ;;
  *) echo "fake python: unexpected call: $args" >&2; exit 99 ;;
esac
"""


@pytest.fixture
def fake_chip(tmp_path):
    """(a stand-in Python, a wheels directory, where the calls are logged)."""
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "jaxtop-0.1.0-py3-none-any.whl").write_bytes(b"")
    (wheels / "rich-15.0.0-py3-none-any.whl").write_bytes(b"")
    return python, wheels, tmp_path / "calls.log"


def run_script(*args, env_extra=None, timeout=60) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_the_script_parses_and_is_executable():
    assert os.access(SCRIPT, os.X_OK)
    res = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    if shutil.which("shellcheck"):  # not on every machine: bash -n above always
        res = subprocess.run(["shellcheck", "-S", "warning", str(SCRIPT)], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout


def test_help_names_both_modes_and_every_step():
    res = run_script("--help")
    assert res.returncode == 0
    for word in ("tools/tpu/run.sh wheels DIR", "tools/tpu/run.sh chip --wheels DIR --results DIR",
                 "cost ", "tests ", "demo ", "record ", "summary.txt"):
        assert word in res.stdout
    res = run_script("chip")
    assert res.returncode == 2 and "--wheels DIR and --results DIR are needed" in res.stderr
    res = run_script("chip", "--wheels", "/nonexistent", "--results", "/tmp/x")
    assert res.returncode == 2 and "tools/tpu/run.sh wheels DIR" in res.stderr


def test_chip_mode_runs_every_step_in_order_and_reports_each(fake_chip, tmp_path):
    python, wheels, log = fake_chip
    results = tmp_path / "results"
    res = run_script("chip", "--wheels", wheels, "--results", results, "--python", python,
                     env_extra={"FAKE_LOG": str(log), "PYTHONPATH": "/machine/site"})
    # The demo step failed (a row not as expected exits 1): the run fails, the other steps still ran.
    assert res.returncode == 1, res.stdout + res.stderr
    summary = (results / "summary.txt").read_text().splitlines()
    rows = [line.split() for line in summary if line.split()[1] == "exit"]
    advice = ["advice-" + run for run in (
        "placement-off placement-on donation-off donation-on inplace-off inplace-on batching-off batching-on "
        "jit-off jit-on guard-log guard-disallow checkpointing-off checkpointing-on fragmentation-off "
        "fragmentation-on runahead-off runahead-on miss clean").split()]
    assert [r[0] for r in rows] == ["cost", "tests", "demo", "freeblock", "record", "record-oom", "sites-run",
                                    "sites-oracle", "sites", "sitescost", "screens", *advice]
    status = {r[0]: r[2] for r in rows}
    assert status == {"cost": "0", "tests": "0", "demo": "1", "freeblock": "0", "record": "0", "record-oom": "1",
                      "sites-run": "0", "sites-oracle": "0", "sites": "0", "sitescost": "0", "screens": "0",
                      **{name: "0" for name in advice}}
    # What tying transfers to lines costs, measured on the chip (the children open the TPU).
    assert (results / "sitescost.txt").read_text().strip() == "paced sites: 0.77 %"
    # The transfers per line: the same program and arguments under jaxtop and the oracle, on the chip.
    assert (results / "sites.txt").read_text().strip() == "train.py:62 h2d 398 398"
    assert (results / "sites-oracle.json").read_text().strip() == '{"lines": []}'
    assert (results / "freeblock.json").read_text().strip() == '{"bound": true}'
    assert any("record-oom: the census is in recordings/" in line for line in summary)  # the OOM is the program's point
    # The dashboards at both sizes and the snapshot's text, from processes on CPU beside the chip's owner.
    screens = (results / "screens.txt").read_text()
    assert "pid 1 snapshot text" in screens
    assert "----- 120 40 " in screens and "----- 80 24 " in screens
    assert res.stdout.rstrip().endswith("failed: demo")
    assert (results / "cost.json").read_text().strip() == '{"rows": []}'
    assert (results / "demo.md").read_text().strip() == "| table |"
    assert "jaxtop 0.1.0 " + str(results / "prefix" / "jaxtop" / "__init__.py") in (results / "env.txt").read_text()

    calls = [line.split("\t") for line in log.read_text().splitlines()]
    # The advice runs: each demo strategy at the chip's sizes, the six-miss
    # loop, each judged by jaxtop advise over the loop's newest 12 s.
    argv = [c[4] for c in calls]
    assert any("advice_demo.py runahead off 15 full" in a and "--log" in a for a in argv), argv
    assert any(a.endswith("advice_miss.py 15") for a in argv), argv
    assert sum("-m jaxtop advise --json --window 12 " in a for a in argv) == len(advice), argv
    prefix = str(results / "prefix")
    install = [c for c in calls if c[4].startswith("-m pip install")]
    assert install and install[0][4].startswith(f"-m pip install --no-index --no-deps --upgrade --target {prefix} ")
    steps = [c for c in calls if c[4].startswith("-P ")]  # the check of where jaxtop comes from, and every step
    for cwd, pythonpath, _, _, _ in steps:
        assert cwd == str(results / "work")  # never the checkout: its sources would shadow the wheel
        assert pythonpath == f"/machine/site:{prefix}"  # appended: the machine's own entries first
    by_kind = {kind: next(c for c in steps if marker in c[4]) for kind, marker in
               (("cost", "tests/tpu/cost.py"), ("tests", "-m pytest"), ("demo", "demo --headless"),
                ("record", "--log"), ("oom", "fill.py"))}
    assert by_kind["tests"][3] == "1"  # a TPU is required: no chip fails the tests, never skips them
    assert f"-m pytest {REPO}/tests/tpu --rootdir {REPO}" in by_kind["tests"][4]
    assert all(by_kind[k][2] == "tpu" for k in ("cost", "demo", "record", "oom"))  # no fallback to CPU
    assert "--sizes 10000,50000" in by_kind["cost"][4] and f"--json-out {results}/cost.json" in by_kind["cost"][4]
    # The screens: the loop on the chip, the dashboards on CPU (one process at a time may open the chip).
    loop = [c for c in steps if "-m jaxtop run " in c[4] and "targets/train.py" in c[4] and "--log" not in c[4]]
    oracle = [c for c in steps if "tests/transfer_oracle.py" in c[4]]
    assert [c[2] for c in oracle] == ["tpu"] and "--steps 200" in oracle[0][4]
    dashboards = [c for c in steps if "tools/tpu/screen.py" in c[4]]
    assert [c[2] for c in loop] == ["tpu"] and sorted(c[2] for c in dashboards) == ["cpu", "cpu"]
    assert all(c[4].endswith(f"-m jaxtop attach {c[4].split()[-1]}") for c in dashboards)


def test_dry_run_says_what_it_would_do_and_does_nothing(fake_chip, tmp_path):
    python, wheels, log = fake_chip
    results = tmp_path / "results"
    res = run_script("chip", "--wheels", wheels, "--results", results, "--python", python, "--dry-run",
                     "--steps", "tests,demo", env_extra={"FAKE_LOG": str(log)})
    assert res.returncode == 0, res.stderr
    assert "would install: " in res.stdout and f"--target {results}/prefix" in res.stdout
    would = [line for line in res.stdout.splitlines() if line.startswith("would run [")]
    assert [line.split("[")[1].split(",")[0] for line in would] == ["tests", "demo"]
    assert not (results / "prefix").exists()
    called = [line.split("\t")[4] for line in log.read_text().splitlines()]
    assert not [c for c in called if "pip install" in c or "-m pytest" in c or "demo" in c], called
    res = run_script("chip", "--wheels", wheels, "--results", results, "--python", python, "--steps", "tests,bench",
                     env_extra={"FAKE_LOG": str(log)})
    assert res.returncode == 2 and "unknown step bench" in res.stderr
