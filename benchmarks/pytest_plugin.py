"""What `pytest --jaxtop-budget` adds to each test of a suite of small jax tests.

A suite of N small tests (a jitted op on a NumPy input, an eager op, a
float() read; a few use capfd, capsys and caplog) is written to a temporary
directory and run by pytest with and without ``--jaxtop-budget``, the two
arms interleaved ``--rounds`` times (these machines are noisy: only side
by side runs compare). Per test, the time of its setup, call and teardown
is read from pytest's JUnit XML; the table gives the median per-test time
of each arm, the median of the per-test differences (what the plugin adds
to one test), the whole run's wall time, and whether every outcome was the
same in both arms.

    .venv/bin/python benchmarks/pytest_plugin.py --tests 100 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

SUITE = '''
import logging, os, sys
import numpy as np
import jax
import jax.numpy as jnp
import pytest

step = jax.jit(lambda x: x * 2 + 1)

@pytest.mark.parametrize("i", range({n}))
def test_small(i):
    x = np.full(8, float(i), np.float32)
    assert float(step(x).sum()) == 16 * i + 8

def test_capfd_is_quiet(capfd):
    jnp.ones(3).block_until_ready()
    assert capfd.readouterr().err == ""

def test_capsys(capsys):
    print("e", file=sys.stderr)
    assert capsys.readouterr().err == "e\\n"

def test_caplog(caplog):
    logging.getLogger("suite").warning("w")
    assert "w" in caplog.text
'''


def run(directory: Path, budget: bool, xml: Path) -> tuple[float, dict[str, tuple[str, float]]]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", str(directory)]
    if budget:
        cmd[4:4] = ["--jaxtop-budget", "h2d=1000,recompiles=10"]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=directory)
    wall = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        sys.exit(f"pytest failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        outcome = "failed" if case.find("failure") is not None or case.find("error") is not None else (
            "skipped" if case.find("skipped") is not None else "passed")
        out[f"{case.get('classname')}::{case.get('name')}"] = (outcome, float(case.get("time", "nan")))
    return wall, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=int, default=100, help="small tests in the suite (plus 3 capture tests)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        (directory / "test_suite.py").write_text(textwrap.dedent(SUITE.replace("{n}", str(args.tests))))
        walls: dict[bool, list[float]] = {False: [], True: []}
        per_test: dict[bool, dict[str, list[float]]] = {False: {}, True: {}}
        outcomes: dict[bool, dict[str, str]] = {False: {}, True: {}}
        for r in range(args.rounds):
            for budget in ((False, True) if r % 2 == 0 else (True, False)):
                wall, cases = run(directory, budget, directory / f"r{r}-{budget}.xml")
                walls[budget].append(wall)
                for name, (outcome, seconds) in cases.items():
                    per_test[budget].setdefault(name, []).append(seconds)
                    outcomes[budget][name] = outcome
        names = sorted(per_test[False])
        plain = [statistics.median(per_test[False][n]) for n in names]
        with_budget = [statistics.median(per_test[True][n]) for n in names]
        added = [b - a for a, b in zip(plain, with_budget)]
        same = outcomes[False] == outcomes[True]
        print(f"{len(names)} tests, {args.rounds} rounds, arms interleaved")
        print(f"{'arm':<16}{'median/test':>14}{'wall (median)':>16}")
        print(f"{'plain':<16}{statistics.median(plain) * 1e3:>11.2f} ms{statistics.median(walls[False]):>14.2f} s")
        print(f"{'--jaxtop-budget':<16}{statistics.median(with_budget) * 1e3:>11.2f} ms"
              f"{statistics.median(walls[True]):>14.2f} s")
        print(f"added per test: median {statistics.median(added) * 1e3:.2f} ms, "
              f"p90 {sorted(added)[int(0.9 * (len(added) - 1))] * 1e3:.2f} ms")
        print(f"outcomes identical: {'yes' if same else 'NO'}")
        if not same:
            for n in names:
                if outcomes[False].get(n) != outcomes[True].get(n):
                    print(f"  {n}: plain {outcomes[False].get(n)}, with budget {outcomes[True].get(n)}")
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
