"""`pytest --jaxtop-budget` beside pytest's own capture fixtures: a suite
that passes plainly passes the same with the option, nothing of jaxtop's
reaches what a test captures, and the plugin adds milliseconds, not the
2-second waits on a sync marker written into a test's capfd file."""

from __future__ import annotations

import re
import textwrap

import pytest

pytest_plugins = ["pytester"]

SUITE = textwrap.dedent('''
    import logging, os, sys
    import numpy as np
    import jax.numpy as jnp

    def test_capfd_sees_nothing_of_jaxtop(capfd):
        jnp.ones(3).block_until_ready()
        jnp.asarray(np.ones(4)) + 1  # an implicit h2d: its guard line must not show
        out, err = capfd.readouterr()
        assert err == ""

    def test_capfd_sees_its_own_fd2(capfd):
        os.write(2, b"hello fd2\\n")
        assert capfd.readouterr().err == "hello fd2\\n"

    def test_capfdbinary(capfdbinary):
        os.write(2, b"bytes\\n")
        assert capfdbinary.readouterr().err == b"bytes\\n"

    def test_capsys(capsys):
        print("to stderr", file=sys.stderr)
        assert capsys.readouterr().err == "to stderr\\n"

    def test_caplog(caplog):
        logging.getLogger("x").warning("w")
        assert "w" in caplog.text

    def test_counted():
        assert float(jnp.sum(jnp.asarray(np.ones(4)))) == 4.0

    def test_fd2_written_plainly():
        os.write(2, b"plain fd2\\n")
''')


@pytest.fixture
def inner(pytester, sockdir, monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv("JAX_TRANSFER_GUARD", raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def _outcomes(result) -> dict[str, str]:
    found = re.findall(r"^(PASSED|FAILED|ERROR) test_suite\.py::(\S+)", result.stdout.str(), re.M)
    return {name: outcome for outcome, name in found}


def _section(text: str, test: str) -> str:
    """The -rA report of one test: from its header to the next one."""
    after = re.split(rf"_+ {test} _+\n", text, maxsplit=1)[1]
    return re.split(r"\n_{3,} \w", after, maxsplit=1)[0]


def test_outcomes_are_identical_with_and_without_the_budget(inner):
    plain = inner.runpytest_subprocess("-p", "no:cacheprovider", "-rA", timeout=240)
    budget = inner.runpytest_subprocess("-p", "no:cacheprovider", "-rA", "--durations=0",
                                        "--jaxtop-budget", "h2d=100", timeout=240)
    assert _outcomes(plain) == _outcomes(budget), budget.stdout.str()[-4000:]
    assert set(_outcomes(budget).values()) == {"PASSED"}, budget.stdout.str()[-4000:]
    text = budget.stdout.str()
    assert "\\x00jaxtop" not in text and "jaxtop:" not in text.split("jaxtop budget summary")[0].replace(
        "jaxtop budget", "")
    # The program's own fd-2 bytes stay with the test that wrote them.
    assert "plain fd2" in _section(text, "test_fd2_written_plainly")
    # The transfers of a test that holds fd 2 are n/a with the reason, others counted.
    assert "the test captures fd 2 itself (capfd)" in text
    assert re.search(r"h2d\s+1 <= 100: ok", _section(text, "test_counted"))
    # No phase waits on a marker that went astray (was 2.00 s per phase).
    durations = [float(s) for s in re.findall(r"^(\d+\.\d+)s (?:setup|call|teardown)", text, re.M)]
    assert durations and max(durations) < 1.5, durations
