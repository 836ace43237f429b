"""Adversarial: budget files that cannot be budgets.

``--budget FILE`` (``jaxtop run``, ``pytest --jaxtop-budget``) reads a TOML
file; whatever the file is (bytes that are not UTF-8, a number of 5,000
digits, tables or arrays nested 100,000 deep, a directory, a file nobody may
read, a FIFO, a file of gigabytes), the answer is one line saying what is
wrong, exit 2 (a usage error for pytest), never a traceback, and never a
wait (a FIFO with no writer would block a plain ``open``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxtop import budgets

pytest_plugins = ["pytester"]

PY = sys.executable
HEAD = "[tool.jaxtop.budget]\n"


def _deep(kind: str, depth: int = 100_000) -> str:
    keys = ".".join(["a"] * depth)
    return {
        "arrays": HEAD + "h2d = " + "[" * depth + "]" * depth + "\n",
        "inline tables": HEAD + "h2d = " + "{a=" * depth + "1" + "}" * depth + "\n",
        "table headers": HEAD + "h2d = 0\n[" + keys + "]\n",
        "dotted keys": HEAD + "h2d = 0\n" + keys + " = 1\n",
        "the budget's own table": "[tool.jaxtop.budget." + keys + "]\n",
    }[kind]


def unreadable(path: Path) -> Path:
    """A file whose read fails. Root reads any mode, so as root: the kernel's
    view of a process's memory, which fails to read at offset 0 (EIO)."""
    if os.geteuid() == 0:
        return Path("/proc/self/mem")
    path.write_text(HEAD + "h2d = 0\n")
    path.chmod(0)
    return path


# (what the file is, how it is made in a directory, what the one line says)
CASES = [
    ("not UTF-8", lambda d: _write(d, HEAD.encode() + b'h2d = "\xff\xfe"\n'), "not UTF-8 text (byte 0xff"),
    ("a 5000-digit integer", lambda d: _write(d, f"{HEAD}h2d = {'9' * 5000}\n"), "a number of more than"),
    ("a 4000-digit integer", lambda d: _write(d, f"{HEAD}h2d = {'9' * 4000}\n"), "h2d: the limit is too big"),
    ("arrays 100k deep", lambda d: _write(d, _deep("arrays")), "nested too deeply"),
    ("inline tables 100k deep", lambda d: _write(d, _deep("inline tables")), "nested too deeply"),
    ("table headers 100k deep", lambda d: _write(d, _deep("table headers")), "nested more than 100 deep"),
    ("dotted keys 100k deep", lambda d: _write(d, _deep("dotted keys")), "nested more than 100 deep"),
    ("the budget table 100k deep", lambda d: _write(d, _deep("the budget's own table")), "nested more than 100 deep"),
    ("a directory", lambda d: _mkdir(d), "is a directory, not a TOML file"),
    ("an unreadable file", lambda d: unreadable(d / "budget.toml"), "cannot read"),
    ("a FIFO", lambda d: _mkfifo(d), "is a FIFO, not a TOML file"),
    ("a 3 GiB file", lambda d: _sparse(d, 3 << 30), "is too big for a budget file"),
]
IDS = [c[0] for c in CASES]


def _write(d: Path, data: str | bytes) -> Path:
    path = d / "budget.toml"
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def _mkdir(d: Path) -> Path:
    (d / "budget.toml").mkdir()
    return d / "budget.toml"


def _mkfifo(d: Path) -> Path:
    os.mkfifo(d / "budget.toml")
    return d / "budget.toml"


def _sparse(d: Path, size: int) -> Path:
    path = d / "budget.toml"
    with open(path, "wb") as f:
        f.write(HEAD.encode())
        f.truncate(size)  # a hole: no disk used, and nothing read when it is refused by size
    return path


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(("make", "says"), [c[1:] for c in CASES], ids=IDS)
def test_a_bad_budget_file_is_one_clear_error(tmp_path, make, says):
    path = make(tmp_path)
    started = time.monotonic()
    for read in (budgets.resolve, budgets.load_pyproject):  # --budget FILE; the plugin's pyproject.toml
        with pytest.raises(budgets.BudgetError) as exc:
            read(str(path))
        message = str(exc.value)
        assert says in message and "\n" not in message and len(message) < 400, message
    assert time.monotonic() - started < 10  # tomllib took 22 s on 100k-deep headers, minutes on dotted keys


@pytest.mark.parametrize(("make", "says"), [c[1:] for c in CASES], ids=IDS)
def test_jaxtop_run_with_a_bad_budget_file_exits_2_before_the_program(tmp_path, make, says):
    path = make(tmp_path)
    marker = tmp_path / "ran"
    res = subprocess.run([PY, "-m", "jaxtop", "run", "--budget", str(path), "-c", f"open({str(marker)!r}, 'w')"],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    line = one_line(res.stderr)
    assert res.returncode == 2, res.stderr
    assert line.startswith("jaxtop run: ") and says in line, line
    assert not marker.exists()


@pytest.mark.parametrize(("make", "says"), [c[1:] for c in CASES], ids=IDS)
def test_pytest_with_a_bad_budget_file_is_a_usage_error(pytester, monkeypatch, make, says):
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    files = pytester.path / "files"
    files.mkdir()
    path = make(files)
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--jaxtop-budget", str(path), timeout=120)
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, err
    assert "Traceback" not in err and "INTERNALERROR" not in err, err
    line = next(line for line in err.splitlines() if "--jaxtop-budget:" in line)
    assert says in line, err
